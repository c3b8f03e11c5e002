"""What keeps a paged engine decode run from being captured as a CUDA graph (issue 39; CUDA only).

The tests' tiny Llama (attention_mask and position_ids inputs) steps three conversations, then one
decode run's device work (``PagedEngine.body``) is run again on fixed buffers: once under
``torch.cuda.set_sync_debug_mode("error")`` (a read of the device raises where it happens), once
inside a capture with spies that print where a host tensor is made or moved to the device (what a
capture cannot record). It found the KV append that took a root shared by several layers' pasts
for one storage (kv_append.py ``_past_storage``); step_graphs.py then captured every key.

    python benchmarks/llm_capture_probe.py
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402


def spy(name: str, make):
    """``make`` wrapped: where it is called during a capture is printed."""
    def wrapped(*a, **k):
        if torch.cuda.is_current_stream_capturing():
            print(f"{name} inside the capture:\n" + "".join(traceback.format_stack(limit=6)[:-1]))
        return make(*a, **k)
    return wrapped


def main() -> None:
    cfg = {**llama.TINY, "mask_input": True, "position_ids": True}
    eng = PagedEngine(str(llama.model_path(cfg)), device="cuda", block_size=8, num_blocks=64, max_rows=8,
                      past_multiple=16, step_graphs=False, static_impls="off")
    for i in range(3):
        eng.add(i, [1 + i, 2, 3, 4, 5], 20)
    for _ in range(3):
        eng.step()
    batch = eng._batch(eng.scheduler.plan().rows)
    t = batch.tensors(eng.dev, eng._int, eng.io, scratch=eng.pool.scratch_slot)
    dense = eng.dense(batch)
    req = eng.model.session.create_infer_request()
    eng.body(req, batch, t, dense)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eng.body(req, batch, t, dense)
        print("no read of the device in a decode run")
    except Exception:  # noqa: BLE001  printed: what the probe is for
        traceback.print_exc()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    torch.tensor = spy("torch.tensor", torch.tensor)
    torch.Tensor.to = spy("Tensor.to", torch.Tensor.to)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            eng.body(req, batch, t, dense)
        print("captured")
    except Exception:  # noqa: BLE001
        traceback.print_exc()


if __name__ == "__main__":
    main()
