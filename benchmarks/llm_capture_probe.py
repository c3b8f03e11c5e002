import sys, traceback, torch
sys.path.insert(0, '.')
from tests.models import llama
from dynashape.paged.engine import PagedEngine
cfg = {**llama.TINY, "mask_input": True, "position_ids": True}
path = str(llama.model_path(cfg))
eng = PagedEngine(path, device="cuda", block_size=8, num_blocks=64, max_rows=8, past_multiple=16, step_graphs=False,
                  static_impls="off")
for i in range(3):
    eng.add(i, [1 + i, 2, 3, 4, 5], 20)
for _ in range(3):
    eng.step()
plan = eng.scheduler.plan()
batch = eng._batch(plan.rows)
print("decode", batch.decode, batch.b, batch.p)
t = batch.tensors(eng.dev, eng._int, eng.io, scratch=eng.pool.scratch_slot)
dense = eng.dense(batch)
req = eng.model.session.create_infer_request()
eng.body(req, batch, t, dense)
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
try:
    eng.body(req, batch, t, dense)
    print("no sync in body")
except Exception:
    traceback.print_exc()
torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()
# where a capture fails: patch torch.tensor / Tensor.to / copy_ to print host->device creation in capture
orig_tensor = torch.tensor
def spy_tensor(*a, **k):
    if torch.cuda.is_current_stream_capturing() and "device" in k:
        print("torch.tensor on device inside capture:", "".join(traceback.format_stack(limit=6)[:-1]))
    return orig_tensor(*a, **k)
torch.tensor = spy_tensor
orig_to = torch.Tensor.to
def spy_to(self, *a, **k):
    if torch.cuda.is_current_stream_capturing() and self.device.type == "cpu":
        print("cpu tensor .to inside capture:", "".join(traceback.format_stack(limit=6)[:-1]))
    return orig_to(self, *a, **k)
torch.Tensor.to = spy_to
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
try:
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            eng.body(req, batch, t, dense)
    print("captured")
except Exception:
    traceback.print_exc()
