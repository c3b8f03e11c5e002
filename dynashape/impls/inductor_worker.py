"""The compile process: inductor's lowering, code generation and C++ compilation of CPU regions,
away from the process that serves calls (impls/compile_process.py starts and talks to it).

Why a process: inductor spends seconds per region, most of it in Python. On a thread of the
serving process it holds the GIL for those seconds, and every torch op of the serving thread
releases and re-acquires the GIL, so calls crawl while a build runs (measured on the 2-core
CPU: a decode step stalled for the whole build); inline, the call that asked waits for it.
Here it runs on one thread, beside the calls, at the serving process's priority: niced, it got no
time at all while a decode loop kept both cores of a 2-core machine busy (no build done in 16 s).

Run as a script (``python inductor_worker.py``: it imports torch only, not dynashape). Protocol
on stdin/stdout: messages of an 8-byte little-endian length and a pickle. A request is
``{"gm": functional aten GraphModule (its constants included), "inputs": [input metas],
"output_meta": its output node's metadata}``; the
reply ``("ok", CompiledFxGraph prepared for serialization, shared constant names)`` or
``("error", traceback text)``. EOF on stdin ends the process.
"""

from __future__ import annotations

import pickle
import struct
import sys
import traceback


def dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def write_message(stream, obj) -> None:
    """``obj`` pickled, or bytes that are a pickle already."""
    data = obj if isinstance(obj, bytes) else dumps(obj)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def read_message(stream):
    """The next message, or None at EOF."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)  # noqa: S301  our own parent's messages over a private pipe


def example_inputs(metas: list) -> list:
    """Tensors with the sizes, strides, dtypes and aliasing of the region's live-ins: views of
    one storage per storage the live-ins share (arena views of one block stay views of one
    block), at the same offsets, so inductor sees the layout and alignment the calls will have."""
    import torch
    storages: dict[int, torch.UntypedStorage] = {}
    for m in metas:
        if m["storage"] not in storages:
            storages[m["storage"]] = torch.UntypedStorage(m["storage_nbytes"])
    out = []
    for m in metas:
        t = torch.empty(0, dtype=m["dtype"])
        t.set_(storages[m["storage"]], m["offset"], m["size"], m["stride"])
        out.append(t)
    return out


def compile_request(req: dict):
    import torch
    from torch._inductor.compile_fx import compile_fx_inner
    gm = req["gm"]
    gm.graph.find_nodes(op="output")[0].meta.update(req.get("output_meta") or {})
    cg = compile_fx_inner(gm, example_inputs(req["inputs"]), is_inference=True)
    # constants that are the graph's own attributes (the weights) go back by name, not by value:
    # the parent has them already
    shared = []
    for name, value in list((cg.constants or {}).items()):
        if isinstance(value, torch.Tensor) and getattr(gm, name, None) is value:
            shared.append(name)
            cg.constants[name] = None
    cg.prepare_for_serialization()
    return cg, shared


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # anything printed by the libraries goes to stderr, never into the replies
    sys.stdout = sys.stderr
    import torch
    import torch._inductor.compile_fx  # noqa: F401  (seconds, once: before the first request)
    import torch._inductor.config as config
    torch.set_num_threads(1)
    config.compile_threads = 1  # no pool of compile processes under this one
    while True:
        req = read_message(stdin)
        if req is None:
            return
        try:
            reply = ("ok", *compile_request(req))
        except Exception:  # noqa: BLE001  every failure goes back to the parent, which counts it
            reply = ("error", traceback.format_exc())
        write_message(stdout, reply)


if __name__ == "__main__":
    main()
