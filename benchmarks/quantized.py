"""Dynamically quantized transformers (onnxruntime.quantization.quantize_dynamic): dynashape vs onnxruntime.

The models are built here from transformers configs (random weights, nothing downloaded), exported with
torch.onnx (the classic exporter), and quantized with quantize_dynamic's defaults (uint8 activations through
DynamicQuantizeLinear, int8 weights, MatMulInteger -> Cast -> Mul). Each runs over a sequence of changing
shapes: the encoders over lengths that go up and down, the T5 decoder (no KV cache) over a growing decoder
input, one token per call, as a greedy decode without cache feeds it.

Each runtime gets the machine in its turn (onnxruntime first: its session is measured, deleted and
garbage-collected before dynashape's exists); both use the same number of threads. Reported per model:
the whole sequence, warm, median over --repeat passes; the ratio dynashape / onnxruntime; and the largest
difference of dynashape's outputs from onnxruntime's at its default optimization level and with
optimizations disabled (and between those two levels of onnxruntime itself).

    python benchmarks/quantized.py [--models t5_tiny,t5_small,bert_base2] [--repeat 7] [--threads 2]
                                   [--fuse] [--new-lengths N] [--json out.json]

``--fuse`` adds the dynamic-quantization fusion pass (dynashape/compile/fuse_dynamic_quant.py) to
dynashape's fusion passes for this run, if the pass list does not hold it yet.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import print_table, write_json  # noqa: E402

CACHE = REPO / ".cache" / "generated"

T5_TINY = dict(vocab=100, d_model=64, d_kv=16, d_ff=128, layers=2, heads=4, seed=0)
T5_SMALL = dict(vocab=32128, d_model=512, d_kv=64, d_ff=2048, layers=6, heads=8, seed=0)
BERT_BASE2 = dict(vocab=1000, hidden=768, heads=12, ffn=3072, layers=2, seed=0)


# ---- model builders -------------------------------------------------------------------------------
def _tag(cfg: dict) -> str:
    import hashlib
    import json

    import onnxruntime
    import torch
    import transformers
    blob = json.dumps([cfg, torch.__version__, transformers.__version__, onnxruntime.__version__, 2], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _quantize(src: Path, dst: Path) -> None:
    import logging

    from onnxruntime.quantization import quantize_dynamic
    logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" warning
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    quantize_dynamic(str(src), str(tmp))
    os.replace(tmp, dst)
    src.unlink()  # the float model is not kept (T5-small's decoder is 230 MB)


def _export(module, args, path: Path, **kw) -> None:
    import warnings

    import torch
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(tmp), opset_version=17, dynamo=False, **kw)
    os.replace(tmp, path)


def build_t5(cfg: dict = T5_TINY, cache: Path = CACHE) -> tuple[Path, Path]:
    """(encoder, decoder) of a T5 of ``cfg``, quantize_dynamic'd; cached by config and library versions.
    Encoder: input_ids, attention_mask -> hidden. Decoder (no KV cache): decoder_input_ids,
    encoder_hidden_states, encoder_attention_mask -> logits."""
    cache.mkdir(parents=True, exist_ok=True)
    tag = _tag({"t5": cfg})
    enc_q, dec_q = cache / f"t5_{tag}_enc_int8.onnx", cache / f"t5_{tag}_dec_int8.onnx"
    if enc_q.exists() and dec_q.exists():
        return enc_q, dec_q
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(cfg["seed"])
    config = T5Config(vocab_size=cfg["vocab"], d_model=cfg["d_model"], d_kv=cfg["d_kv"], d_ff=cfg["d_ff"],
                      num_layers=cfg["layers"], num_decoder_layers=cfg["layers"], num_heads=cfg["heads"],
                      decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).eval()

    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    class Dec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
            h = self.m.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoder_hidden_states,
                               encoder_attention_mask=encoder_attention_mask, use_cache=False, return_dict=False)[0]
            return self.m.lm_head(h * (self.m.model_dim ** -0.5))

    enc_f, dec_f = cache / f"t5_{tag}_enc.onnx", cache / f"t5_{tag}_dec.onnx"
    ids = torch.randint(1, cfg["vocab"], (1, 7))
    mask = torch.ones(1, 7, dtype=torch.int64)
    _export(Enc(), (ids, mask), enc_f, input_names=["input_ids", "attention_mask"], output_names=["hidden"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "hidden": {0: "batch", 1: "seq"}})
    _export(Dec(), (torch.randint(1, cfg["vocab"], (1, 3)), torch.randn(1, 7, cfg["d_model"]), mask), dec_f,
            input_names=["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
            output_names=["logits"],
            dynamic_axes={"decoder_input_ids": {0: "batch", 1: "dec"}, "encoder_hidden_states": {0: "batch", 1: "enc"},
                          "encoder_attention_mask": {0: "batch", 1: "enc"}, "logits": {0: "batch", 1: "dec"}})
    _quantize(enc_f, enc_q)
    _quantize(dec_f, dec_q)
    return enc_q, dec_q


def build_bert(cfg: dict = BERT_BASE2, cache: Path = CACHE) -> Path:
    """A BERT encoder stack of ``cfg`` (BERT-base layer sizes), quantize_dynamic'd: input_ids,
    attention_mask -> last hidden state."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"bert_{_tag({'bert': cfg})}_int8.onnx"
    if path.exists():
        return path
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(cfg["seed"])
    config = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
                        num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"], max_position_embeddings=512)
    model = BertModel(config).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    src = path.with_name(path.name.replace("_int8", ""))
    _export(Wrap(), (torch.randint(1, cfg["vocab"], (1, 7)), torch.ones(1, 7, dtype=torch.int64)), src,
            input_names=["input_ids", "attention_mask"], output_names=["hidden"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "hidden": {0: "batch", 1: "seq"}})
    _quantize(src, path)
    return path


# ---- shape sequences ------------------------------------------------------------------------------
ENC_LENGTHS = [5, 12, 33, 64, 17, 128, 9, 48, 96, 24]


def encoder_feeds(vocab: int, lengths=ENC_LENGTHS, batch: int = 1, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(1, vocab, (batch, n)).astype(np.int64),
             "attention_mask": np.ones((batch, n), np.int64)} for n in lengths]


def decoder_feeds(vocab: int, d_model: int, steps: int = 24, enc_len: int = 32, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    enc = rng.standard_normal((1, enc_len, d_model)).astype(np.float32)
    ids = rng.integers(1, vocab, (1, steps)).astype(np.int64)
    return [{"decoder_input_ids": ids[:, :n], "encoder_hidden_states": enc,
             "encoder_attention_mask": np.ones((1, enc_len), np.int64)} for n in range(1, steps + 1)]


def cases(names: list[str]) -> list[tuple[str, Path, list[dict]]]:
    out = []
    for name in names:
        if name.startswith("t5_"):
            cfg = {"t5_tiny": T5_TINY, "t5_small": T5_SMALL}[name]
            enc, dec = build_t5(cfg)
            out.append((f"{name}_enc", enc, encoder_feeds(cfg["vocab"])))
            out.append((f"{name}_dec", dec, decoder_feeds(cfg["vocab"], cfg["d_model"])))
        elif name == "bert_base2":
            out.append((name, build_bert(BERT_BASE2), encoder_feeds(BERT_BASE2["vocab"])))
        else:
            raise SystemExit(f"unknown model {name!r}")
    return out


# ---- runtimes -------------------------------------------------------------------------------------
def ort_session(path, threads: int, optimize: bool = True):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def add_fusion_pass() -> bool:
    """Put fuse_dynamic_quant into the fusion pass list for this process (before fuse_linear) when
    the list does not hold it yet. False when the pass does not exist."""
    try:
        from dynashape.compile import fuse_dynamic_quant, pipeline
    except ImportError:
        return False
    names = [n for n, _ in pipeline.FUSION_PASSES]
    if "fuse_dynamic_quant" not in names:
        at = names.index("fuse_linear") if "fuse_linear" in names else 0
        pipeline.FUSION_PASSES.insert(at, ("fuse_dynamic_quant", fuse_dynamic_quant.fuse_dynamic_quant))
    return True


def measure(run, feeds_seq: list[dict], repeat: int) -> tuple[float, list]:
    """``run(None, feeds)`` over the sequence: (median seconds of a warm pass, the first pass's outputs)."""
    outs = [run(None, f) for f in feeds_seq]  # first pass: compiles / specializes / warms caches
    for f in feeds_seq:
        run(None, f)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for f in feeds_seq:
            run(None, f)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), outs


def new_lengths(run, feeds_seq: list[dict], more: list[dict]) -> float:
    """Seconds of one pass over ``more`` after the sequence: every shape of it new to the session
    (a decoder's second generation growing past the first), where the warm passes meet shapes
    they have met."""
    for f in feeds_seq:
        run(None, f)
    t0 = time.perf_counter()
    for f in more:
        run(None, f)
    return time.perf_counter() - t0


def max_diff(a: list, b: list) -> float:
    return max(float(np.abs(np.asarray(x[0], np.float64) - np.asarray(y[0], np.float64)).max()) for x, y in zip(a, b))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="t5_tiny,t5_small,bert_base2")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fuse", action="store_true", help="add the fuse_dynamic_quant pass for this run")
    p.add_argument("--new-lengths", type=int, default=0,
                   help="a T5 decoder: also time N more lengths after the sequence's, each new to the session")
    p.add_argument("--json", default=None)
    opts = p.parse_args(argv)

    import torch
    torch.set_num_threads(opts.threads)
    if opts.fuse and not add_fusion_pass():
        print("(no fuse_dynamic_quant pass in this tree: --fuse ignored)")
    rows, results = [], {}
    for name, path, feeds in cases(opts.models.split(",")):
        sess = ort_session(path, opts.threads, optimize=False)
        ref_noopt = [sess.run(None, f) for f in feeds]
        del sess
        sess = ort_session(path, opts.threads)
        t_ort, ref = measure(sess.run, feeds, opts.repeat)
        del sess
        gc.collect()

        import dynashape
        ds = dynashape.InferenceSession(str(path))
        t_ds, got = measure(ds.run, feeds, opts.repeat)
        del ds
        gc.collect()
        fresh = {}
        if opts.new_lengths and name.endswith("_dec"):
            cfg = {"t5_tiny": T5_TINY, "t5_small": T5_SMALL}[name[:-4]]
            longer = decoder_feeds(cfg["vocab"], cfg["d_model"], steps=len(feeds) + opts.new_lengths)[len(feeds):]
            sess = ort_session(path, opts.threads)
            f_ort = new_lengths(sess.run, feeds, longer)
            del sess
            gc.collect()
            ds = dynashape.InferenceSession(str(path))
            f_ds = new_lengths(ds.run, feeds, longer)
            del ds
            gc.collect()
            fresh = {"new_lengths": opts.new_lengths, "new_lengths_onnxruntime_s": f_ort,
                     "new_lengths_dynashape_s": f_ds, "new_lengths_ratio": f_ds / f_ort}
            print(f"{name}: {opts.new_lengths} lengths new to the session: onnxruntime {f_ort * 1e3:.1f} ms, "
                  f"dynashape {f_ds * 1e3:.1f} ms, ratio {f_ds / f_ort:.2f}")
        r = {"onnxruntime_s": t_ort, "dynashape_s": t_ds, "ratio": t_ds / t_ort, **fresh,
             "diff_vs_ort_default": max_diff(got, ref), "diff_vs_ort_noopt": max_diff(got, ref_noopt),
             "ort_default_vs_noopt": max_diff(ref, ref_noopt), "points": len(feeds)}
        results[name] = r
        rows.append([name, len(feeds), t_ort * 1e3, t_ds * 1e3, r["ratio"], r["diff_vs_ort_default"],
                     r["diff_vs_ort_noopt"], r["ort_default_vs_noopt"]])
    show = print_table
    try:
        import rich  # noqa: F401
    except ImportError:  # a bare machine: plain rows
        def show(title, columns, rows):
            print(title)
            print("  ".join(columns))
            for r in rows:
                print("  ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in r))
    show(f"quantize_dynamic models, whole shape sequence (ms, median of {opts.repeat}), "
                f"{opts.threads} threads{', fused' if opts.fuse else ''}",
                ["model", "points", "onnxruntime", "dynashape", "ratio", "|ds-ort|", "|ds-ort noopt|",
                 "|ort-ort noopt|"], rows)
    write_json(opts.json, {"threads": opts.threads, "repeat": opts.repeat, "fuse": opts.fuse, "results": results})


if __name__ == "__main__":
    main()
