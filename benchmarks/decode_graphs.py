"""Whole-step decode graphs against PyTorch eager and a hand-written static-cache model compiled
by torch.compile (issue: LLM decode at the memory-bandwidth limit).

The Llama-style decoder of the tests (``--layers``, hidden 768, 12 heads / 4 KV heads), exported
once per dtype by ``torch.onnx.export(dynamo=True)``. Greedy decode of ``--steps`` tokens after a
``--prompt``-token prompt, per batch size; each runtime decodes the same prompts:
- dynashape: the stock ONNX export, default options (on CUDA: static impls and whole-step decode
  graphs), present_* fed back as torch tensors;
- PyTorch eager: the same module;
- torch.compile: the module rewritten in the gpt-fast style (``StaticCacheLlama``: a KV cache of
  fixed capacity written with index_copy_, attention over the whole capacity with a mask, position
  as a device tensor), the decode step compiled with mode="reduce-overhead", fullgraph=True; its
  compile time (the first calls) is reported apart.
Per runtime the decode is timed ``--rounds`` times after a warm-up round (dynashape's warm-up
builds its graphs); tokens/s = batch * (steps - 1) / median seconds. The tokens are compared with
eager's. Bandwidth: bytes of weights + KV read per step over the median step time, against the
GPU's measured device-to-device copy bandwidth.

    python benchmarks/decode_graphs.py --device cuda [--dtype float32 bfloat16] [--batch 1 4 16]
                                       [--no-compile] [--memory-steps 1024] [--tiny] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone as _gone  # noqa: E402
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.common import sync as _sync  # noqa: E402
from tests.models import llama  # noqa: E402


def config(layers: int, dtype: str, mask: bool = False) -> dict:
    cfg = dict(layers=layers, hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, vocab=32000,
               rope_theta=10000.0, eps=1e-5, seed=0, dtype=dtype)
    if mask:  # the export takes an attention_mask [batch, past + new] as HF optimum's decoders do
        cfg["mask_input"] = True
    return cfg


def hf_config(layers: int) -> dict:
    """transformers' LlamaForCausalLM at the same size (tests/models/hf_llama.py), fp32."""
    return dict(layers=layers, hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, vocab=32000, seed=0,
                dtype="float32", hf=True)


def _mask(ids, past):
    """The attention_mask a caller feeds with a step: every token seen, none padded."""
    return [torch.ones(ids.shape[0], past[0].shape[2] + ids.shape[1], dtype=torch.int64, device=ids.device)]




# ---- the gpt-fast-style rewrite ------------------------------------------------------------------
class StaticCacheLlama(torch.nn.Module):
    """``tests.models.llama.Llama``'s weights and math over a KV cache of fixed capacity."""

    def __init__(self, m: llama.Llama, batch: int, capacity: int) -> None:
        super().__init__()
        self.m, self.capacity = m, capacity
        cfg = m.cfg
        dt = m.embed.weight.dtype
        dev = m.embed.weight.device
        shape = (batch, cfg["kv_heads"], capacity, cfg["head_dim"])
        self.k = [torch.zeros(shape, dtype=dt, device=dev) for _ in m.layers]
        self.v = [torch.zeros(shape, dtype=dt, device=dev) for _ in m.layers]

    def forward(self, ids, pos):  # pos: [s] positions of these tokens
        m = self.m
        x = m.embed(ids)
        freqs = pos[:, None].float() * m.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[None, None].to(x.dtype), emb.sin()[None, None].to(x.dtype)
        mask = torch.arange(self.capacity, device=ids.device)[None, :] <= pos[:, None]
        b, s, _ = x.shape
        for i, layer in enumerate(m.layers):
            a = layer.attn
            h = layer.attn_norm(x)
            q = a.q_proj(h).view(b, s, a.heads, a.head_dim).transpose(1, 2)
            k = a.k_proj(h).view(b, s, a.kv_heads, a.head_dim).transpose(1, 2)
            v = a.v_proj(h).view(b, s, a.kv_heads, a.head_dim).transpose(1, 2)
            q = q * cos + llama.rotate_half(q) * sin
            k = k * cos + llama.rotate_half(k) * sin
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v)
            g = a.heads // a.kv_heads
            kk = self.k[i].repeat_interleave(g, dim=1)
            vv = self.v[i].repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=a.head_dim ** -0.5)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, s, a.heads * a.head_dim))
            x = x + layer.mlp(layer.mlp_norm(x))
        return m.lm_head(m.norm(x))


# ---- decode loops --------------------------------------------------------------------------------
def greedy_past(step, prompt, cfg, steps, dev):
    """(seconds of steps - 1 decode steps, tokens) for a step(ids, past) -> (logits, past)."""
    b = prompt.shape[0]
    past = [torch.zeros(b, cfg["kv_heads"], 0, cfg["head_dim"], dtype=llama.dtype_of(cfg), device=dev)
            for _ in range(2 * cfg["layers"])]
    logits, past = step(prompt, past)
    tok = logits[:, -1:].argmax(-1)
    toks = [tok]
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        logits, past = step(tok, past)
        tok = logits[:, -1:].argmax(-1)
        toks.append(tok)
    _sync(dev)
    return time.perf_counter() - t0, torch.cat(toks, 1).cpu()


def greedy_static(model: StaticCacheLlama, decode, prompt, steps, dev):
    n = prompt.shape[1]
    for c in model.k + model.v:
        c.zero_()
    with torch.no_grad():
        logits = model(prompt, torch.arange(n, device=dev))
        tok = logits[:, -1:].argmax(-1)
        toks = [tok]
        _sync(dev)
        t0 = time.perf_counter()
        for i in range(steps - 1):
            pos = torch.tensor([n + i], device=dev)
            logits = decode(tok, pos)
            tok = logits[:, -1:].argmax(-1).clone()
            toks.append(tok)
        _sync(dev)
    return time.perf_counter() - t0, torch.cat(toks, 1).cpu()


def copy_bandwidth(dev) -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    x = torch.empty(256 * 2 ** 20, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    _sync(dev)
    return 2 * x.numel() * 4 * 20 / (time.perf_counter() - t0)


def bench(cfg, dev, batches, prompt_len, steps, rounds, compiled: bool, bw: float, rows, data):
    if cfg.get("hf"):  # an HF decoder as users export it: its eager is transformers' own forward
        from tests.models import hf_llama

        path, names, eager = str(hf_llama.model_path(cfg)), hf_llama.input_names(cfg), hf_llama.build(cfg).to(dev)
        embed, compiled = eager.model.model.embed_tokens, False
    else:
        path, names, eager = str(llama.model_path(cfg)), llama.input_names(cfg), llama.build(cfg).to(dev)
        embed = eager.embed
    weight_bytes = sum(p.numel() * p.element_size() for p in eager.parameters())
    weight_bytes -= embed.weight.numel() * embed.weight.element_size()  # a lookup reads one row
    itemsize = embed.weight.element_size()
    size = f"{cfg['layers']} layers"
    if cfg["hidden"] != 768:
        size = f"test decoder ({size}, hidden {cfg['hidden']})"
    label = f"{size} {cfg['dtype']}" + (" attention_mask" if cfg.get("mask_input") else "")
    label = f"HF LlamaForCausalLM {cfg['layers']} layers {cfg['dtype']}" if cfg.get("hf") else label
    mask = _mask if cfg.get("mask_input") or cfg.get("hf") else (lambda ids, past: [])
    for batch in batches:
        prompt = torch.randint(0, cfg["vocab"], (batch, prompt_len),
                               generator=torch.Generator().manual_seed(batch)).to(dev)
        res = {}
        sess = dynashape.InferenceSession(path, device=str(dev))

        def ds_step(ids, past, sess=sess):
            out = sess.run(None, dict(zip(names, [ids, *mask(ids, past), *past])))
            return out[0], out[1:]

        def eager_step(ids, past, eager=eager):
            with torch.no_grad():
                out = eager(ids, *mask(ids, past), *past)
            return out[0], list(out[1:])
        for name, step in (("dynashape", ds_step), ("PyTorch eager", eager_step)):
            times, toks = [], None
            for _ in range(rounds + 1):
                t, toks = greedy_past(step, prompt, cfg, steps, dev)
                times.append(t)
            res[name] = {"s": statistics.median(times[1:]), "tokens": toks}
        st = sess.stats()
        res["dynashape"]["stats"] = {k: v for k, v in st.items() if k.startswith("decode_graph")}
        res["dynashape"]["refusals"] = list(sess.compiled.refusals)[-4:]
        sess = ds_step = None  # the session and its memory go before the next runtime is timed
        _gone()
        if compiled:
            static = StaticCacheLlama(eager, batch, prompt_len + steps)
            decode = torch.compile(static, mode="reduce-overhead", fullgraph=True)
            t0 = time.perf_counter()
            greedy_static(static, decode, prompt, 4, dev)  # compiles, then records its graphs
            compile_s = time.perf_counter() - t0
            times = []
            for _ in range(rounds + 1):
                t, toks = greedy_static(static, decode, prompt, steps, dev)
                times.append(t)
            res["torch.compile (static cache)"] = {"s": statistics.median(times[1:]), "tokens": toks,
                                                   "compile_s": compile_s}
            del static, decode
            torch._dynamo.reset()
            _gone()
        ref = res["PyTorch eager"]
        mean_ctx = prompt_len + steps / 2
        kv_bytes = 2 * cfg["layers"] * batch * cfg["kv_heads"] * mean_ctx * cfg["head_dim"] * itemsize
        for name, r in res.items():
            tps = batch * (steps - 1) / r["s"]
            step_s = r["s"] / (steps - 1)
            frac = (weight_bytes + kv_bytes) / step_s / bw
            same = float((r["tokens"] == ref["tokens"]).float().mean())
            rows.append([label, f"batch {batch}", name, tps, tps / (batch * (steps - 1) / ref["s"]), frac, same,
                         r.get("compile_s", "")])
            data.setdefault(label, {})[f"{name} batch {batch}"] = {
                "tokens_per_s": tps, "x_eager": tps / (batch * (steps - 1) / ref["s"]), "bandwidth_fraction": frac,
                "same_tokens_as_eager": same, "compile_s": r.get("compile_s"), "stats": r.get("stats"),
                "refusals": r.get("refusals")}
            if "stats" in r:
                print(label, batch, r["stats"], r["refusals"], flush=True)
    del eager
    _gone()


def memory_run(cfg, dev, steps: int, data) -> None:
    """Peak device memory over a long decode, against weights + KV storage, and where the
    engine allocated."""
    path = str(llama.model_path(cfg))
    names = llama.input_names(cfg)
    _gone()
    free0 = torch.cuda.mem_get_info(dev)[0]
    sess = dynashape.InferenceSession(path, device=str(dev))
    weights = sum(t.numel() * t.element_size() for t in llama.build(cfg).parameters())
    past = [torch.zeros(1, cfg["kv_heads"], 0, cfg["head_dim"], dtype=llama.dtype_of(cfg), device=dev)
            for _ in range(2 * cfg["layers"])]
    tok = torch.randint(0, cfg["vocab"], (1, 16), device=dev)
    low, allocs_at, device_allocs_at = free0, [], []
    last_allocs = last_dev = None
    for i in range(steps):
        out = sess.run(None, dict(zip(names, [tok, *past])))
        past = out[1:]
        tok = out[0][:, -1:].argmax(-1)
        st = sess.stats()
        if last_allocs is not None and st.get("allocations", 0) != last_allocs:
            allocs_at.append(i)
        last_allocs = st.get("allocations", 0)
        n_dev = torch.cuda.memory_stats(dev).get("num_device_alloc", 0)  # cudaMalloc calls of torch's allocator
        if last_dev is not None and n_dev != last_dev:
            device_allocs_at.append(i)
        last_dev = n_dev
        if i % 8 == 0:
            _sync(dev)
            low = min(low, torch.cuda.mem_get_info(dev)[0])
    _sync(dev)
    low = min(low, torch.cuda.mem_get_info(dev)[0])
    cap = past[0].untyped_storage().nbytes() // past[0].element_size() // (cfg["kv_heads"] * cfg["head_dim"])
    kv = 2 * cfg["layers"] * cfg["kv_heads"] * cfg["head_dim"] * cap * llama.dtype_of(cfg).itemsize
    peak = free0 - low
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _cuda_tensors()}
    big = sorted(((t.untyped_storage().nbytes(), tuple(t.shape), str(t.dtype)) for t in _cuda_tensors()),
                 reverse=True)
    seen, largest = set(), []
    for n, shape, dt in big:  # by storage: views of one storage once
        if (n, shape) not in seen and len(largest) < 10:
            seen.add((n, shape))
            largest.append([n, shape, dt])
    data["memory"] = {"python_visible_cuda_bytes": sum(storages.values()), "largest_tensors": largest,
                      "steps": steps, "peak_bytes": peak, "weights_bytes": weights,
                      "kv_storage_bytes": kv,
                      "peak_over_weights_plus_kv": peak / (weights + kv), "engine_allocations_at_steps": allocs_at,
                      "torch_device_allocations_at_steps": device_allocs_at,
                      "torch_allocated_bytes": torch.cuda.memory_allocated(dev),
                      "torch_reserved_bytes": torch.cuda.memory_reserved(dev),
                      "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
                      "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
                      # what the runtime holds at its peak (its buffers, graph pools, storages,
                      # weights: all through torch's allocator), without the CUDA libraries' code
                      "allocator_peak_over_weights_plus_kv": torch.cuda.max_memory_reserved(dev) / (weights + kv),
                      "engine": {k: v for k, v in sess.stats().items() if k.startswith("device_")},
                      "static_bytes": sess.stats().get("static_bytes"),
                      "stats": {k: v for k, v in sess.stats().items() if k.startswith("decode_graph")}}
    print("memory", data["memory"], flush=True)


def eager_memory_run(cfg, dev, steps: int, data) -> None:
    """The same decode's peak device memory with PyTorch eager of the module, measured the same
    way (in a process that has allocated nothing before): what the CUDA libraries cost anyone."""
    _gone()
    free0 = torch.cuda.mem_get_info(dev)[0]
    model = llama.build(cfg).to(dev)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    past = [torch.zeros(1, cfg["kv_heads"], 0, cfg["head_dim"], dtype=llama.dtype_of(cfg), device=dev)
            for _ in range(2 * cfg["layers"])]
    tok = torch.randint(0, cfg["vocab"], (1, 16), device=dev)
    low = free0
    with torch.no_grad():
        for i in range(steps):
            out = model(tok, *past)
            past, tok = list(out[1:]), out[0][:, -1:].argmax(-1)
            if i % 8 == 0:
                _sync(dev)
                low = min(low, torch.cuda.mem_get_info(dev)[0])
    _sync(dev)
    low = min(low, torch.cuda.mem_get_info(dev)[0])
    data["eager_memory"] = {"steps": steps, "peak_bytes": free0 - low, "weights_bytes": weights,
                            "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
                            "torch_reserved_bytes": torch.cuda.memory_reserved(dev),
                            "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(dev)}
    print("eager memory", data["eager_memory"], flush=True)


def _cuda_tensors():
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.is_cuda:
                yield o
        except Exception:  # noqa: BLE001  objects that fail isinstance checks
            continue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--memory-steps", type=int, default=0)
    ap.add_argument("--eager-memory", action="store_true", help="with --memory-steps: eager's instead")
    ap.add_argument("--mask", action="store_true", help="the export with an attention_mask input")
    ap.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM exported (fp32)")
    ap.add_argument("--tiny", action="store_true", help="the tests' small decoder (2 layers, hidden 64)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    bw = float("nan")
    data = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "prompt": args.prompt,
            "steps": args.steps}
    if dev.type == "cuda":
        torch.cuda.init()
    rows: list = []
    if args.memory_steps:  # first, in a process that has allocated nothing: free memory says the truth
        run_memory = eager_memory_run if args.eager_memory else memory_run
        run_memory(config(args.layers, args.dtype[0]), dev, args.memory_steps, data)
    if dev.type == "cuda":
        bw = copy_bandwidth(dev)
        data["copy_bandwidth_GBps"] = bw / 1e9
        _gone()
    for dt in ["float32"] if args.hf else args.dtype:  # transformers' model is exported in fp32
        cfg = hf_config(args.layers) if args.hf else config(args.layers, dt, args.mask)
        if args.tiny:
            cfg = {**llama.TINY, "dtype": dt}
        bench(cfg, dev, args.batch, args.prompt, args.steps, args.rounds, not args.no_compile, bw, rows, data)
    print_table(f"greedy decode, {args.steps} tokens after {args.prompt}, {data['device']}",
                ["model", "batch", "runtime", "tokens/s", "x eager", "fraction of bandwidth limit",
                 "tokens equal to eager", "compile s"], rows)
    write_json(args.json, data)


if __name__ == "__main__":
    main()
