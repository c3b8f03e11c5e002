"""Static impls against the dynamic path and against PyTorch eager of the same model, over
sequences of changing shapes (issue: implementations, CUDA graphs that survive shape changes).

Models, each built from a config with seeded random weights and exported here with
``torch.onnx.export(dynamo=True)`` with dynamic dims (nothing downloaded):
- ``bert``: transformers' BERT-base (12 layers, hidden 768) over a repeating sequence of
  (batch, seq) shapes; ``resnet``: torchvision's ResNet-50 over batches 1, 8, 3, 16, 1;
- ``decode``: the Llama-style decoder of the tests at 12 layers / hidden 768, greedy decode of
  ``--steps`` tokens from an 8-token prompt, batch 1 and 4; the tokens of each runtime are
  compared with eager's.
Runtimes, in one process: PyTorch eager (no_grad; TF32 off, as dynashape's fp32), dynashape
with static impls off (the dynamic path), dynashape with its default (``static_impls="auto"``:
async CUDA graphs on CUDA, off on CPU) and with ``"sync"`` (built in the call that asks).
Peers (``--peers``, BERT and ResNet-50): ``torch.compile`` of the same module, as a user would
write it (default mode with ``dynamic=True``, and ``mode="reduce-overhead"``: inductor with CUDA
graphs per shape), its compile time in the first pass's column; onnx2torch (the other "ONNX on
torch" project), which converts an ONNX file to a torch.fx module: it supports opsets up to 17
and no ``Reshape(allowzero=1)``, so it gets the same module exported by the TorchScript exporter
at opset 17 (a model it cannot convert is reported with the converter's error).
``--precision torch-default`` leaves torch's own defaults (cuDNN convolutions in TF32, matrix
products in fp32) for every runtime instead of strict fp32.
Each runtime runs the whole sequence ``--repeats`` times, the runtimes interleaved pass by pass
(decode: round by round); a shape's steady time is the median of its calls from the third pass
on (a static impl is built when a key comes back: the second pass builds, the third replays);
background compilation is waited for after the first pass. "First call" is the first call at
each new shape in a fresh session, over that shape's steady dynamic-path time.

    python benchmarks/static_impls.py --device cuda [--models bert resnet decode] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone as _gone  # noqa: E402
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.common import sync as _sync  # noqa: E402

BERT_SHAPES = [(1, 16), (4, 64), (2, 128), (8, 32), (1, 128), (16, 64)]
RESNET_BATCHES = [1, 8, 3, 16, 1]
MODES = {"dynashape dynamic": "off", "dynashape static (auto)": "auto", "dynashape static (sync)": "sync"}
PEERS = ("compile", "compile-ro", "onnx2torch")




def _timed(fn, dev):
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return time.perf_counter() - t0, out


def _static_stats(sess) -> dict:
    out = {k: v for k, v in sess.stats().items()
           if "static" in k or "impl" in k or "region" in k or k == "kernel_lines"}
    if sess.compiled.refusals:
        out["refusals"] = list(sess.compiled.refusals)[-3:]
    return out


# ---- models ------------------------------------------------------------------------------------
def bert_model(layers: int):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                     vocab_size=30522, max_position_embeddings=512)

    class Wrap(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = BertModel(cfg, add_pooling_layer=False)

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids, attention_mask=attention_mask, return_dict=False)[0]
    return Wrap().eval()


def resnet_model():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def export(model, args, names, dynamic, path) -> None:
    with torch.no_grad():
        torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=dynamic, input_names=names,
                          output_names=["out"], external_data=False)


def export_legacy(model, args, names, axes, path) -> str | None:
    """The TorchScript exporter at opset 17, for onnx2torch (None if this torch has none)."""
    try:
        with torch.no_grad():
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17, input_names=names,
                              output_names=["out"], dynamic_axes=axes)
        return path
    except Exception as e:  # noqa: BLE001
        print("TorchScript export failed:", e)
        return None


# ---- a sequence of shapes ------------------------------------------------------------------------
def run_sequence(call, feeds_list, repeats, dev):
    """Seconds per call, per position of the sequence, per pass; and the last outputs."""
    times = [[] for _ in feeds_list]
    outs = [None] * len(feeds_list)
    for _ in range(repeats):
        for i, feeds in enumerate(feeds_list):
            t, out = _timed(lambda feeds=feeds: call(feeds), dev)
            times[i].append(t)
            outs[i] = out
    return times, outs


def peer_calls(eager, legacy_path, peers, dev, data_errors) -> dict:
    """The peers' callables: torch.compile of the same module, onnx2torch of its ONNX export.
    A peer that cannot run the model is left out and its error recorded."""
    calls = {}

    def no_grad(fn):
        def call(feeds):
            with torch.no_grad():
                return fn(*feeds)
        return call
    if "compile" in peers:
        calls["torch.compile (dynamic)"] = no_grad(torch.compile(eager, dynamic=True))
    if "compile-ro" in peers:
        # its outputs live in CUDA-graph memory that the next replay overwrites: cloned, as
        # torch's documentation tells a caller who keeps them (dynashape hands out copies too)
        ro = torch.compile(eager, mode="reduce-overhead")
        calls["torch.compile (reduce-overhead)"] = no_grad(lambda *a: ro(*a).clone())
    if "onnx2torch" in peers and legacy_path is not None:
        try:
            import onnx
            import onnx2torch
            calls["onnx2torch"] = no_grad(onnx2torch.convert(_identities_as_initializers(onnx.load(legacy_path)))
                                          .to(dev).eval())
        except Exception as e:  # noqa: BLE001  reported, not hidden
            data_errors["onnx2torch"] = f"{type(e).__name__}: {e}"[:300]
            print("onnx2torch cannot run this model:", data_errors["onnx2torch"])
    return calls


def _identities_as_initializers(model):
    """The TorchScript exporter shares equal weights through Identity nodes (BatchNorm folded into
    a convolution with default statistics gives every such conv the same bias); onnx2torch wants
    a Conv's weight and bias as initializers: each Identity of an initializer becomes a copy of it."""
    inits = {i.name: i for i in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            copy = type(inits[node.input[0]])()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            model.graph.initializer.append(copy)
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def shapes_table(name, eager, path, feeds_list, labels, repeats, dev, data, peers=(), legacy_path=None):
    """Every runtime's passes over the sequence, interleaved pass by pass (the machines are
    shared and noisy: noise then hits all runtimes alike)."""
    calls, sessions = {}, {}

    def eager_call(feeds):
        with torch.no_grad():
            return eager(*feeds)
    calls["PyTorch eager"] = eager_call
    errors: dict[str, str] = {}
    calls.update(peer_calls(eager, legacy_path, peers, dev, errors))
    for label, mode in MODES.items():
        if label.endswith("(auto)") and dynashape.runtime.static_mode.static_mode("auto", dev) is None:
            continue  # auto is off here: the dynamic row says it
        sess = sessions[label] = dynashape.InferenceSession(path, device=str(dev), static_impls=mode)
        names = [i.name for i in sess.get_inputs()]
        calls[label] = lambda feeds, sess=sess, names=names: sess.run(None, dict(zip(names, feeds)))[0]
    times = {k: [[] for _ in feeds_list] for k in calls}
    outs_by = {}
    for p in range(repeats):
        for label, call in calls.items():
            t, outs_by[label] = run_sequence(call, feeds_list, 1, dev)
            for i, x in enumerate(t):
                times[label][i] += x
        if p == 0:  # steady state: background compilation done
            for sess in sessions.values():
                if sess.compiled.context is not None:
                    sess.compiled.context.wait(600)
    results = {}
    for label in calls:
        steady = [statistics.median(t[2:]) for t in times[label]]
        results[label] = {"steady_ms": [x * 1e3 for x in steady], "first_ms": [t[0] * 1e3 for t in times[label]],
                          "sequence_ms": sum(steady) * 1e3, "first_pass_s": sum(t[0] for t in times[label])}
        if label in sessions:
            results[label]["stats"] = _static_stats(sessions[label])
            print(label, results[label]["stats"])
    del sessions, calls
    _gone()
    ref = outs_by["PyTorch eager"]
    for label in results:
        out = [o[0] if isinstance(o, (tuple, list)) else o for o in outs_by[label]]
        results[label]["max_abs_diff_vs_eager"] = max(float((a - b).abs().max()) for a, b in zip(out, ref))
    dyn = results["dynashape dynamic"]["steady_ms"]
    # first call at a new shape: each shape's first occurrence after the session's first call
    new = [i for i, lab in enumerate(labels) if i and lab not in labels[:i]]
    rows = []
    for label, r in results.items():
        r["first_over_steady_dynamic"] = {labels[i]: r["first_ms"][i] / dyn[i] for i in new}
        rows.append([name, label, r["sequence_ms"], results["PyTorch eager"]["sequence_ms"] / r["sequence_ms"],
                     max(r["first_over_steady_dynamic"].values()) if label != "PyTorch eager" and new else "",
                     r["first_pass_s"], r["max_abs_diff_vs_eager"]])
    for label, err in errors.items():
        rows.append([name, label, "cannot convert", "", "", "", err[:60]])
    per_shape = [[lab] + [f"{x:.2f}" for x in r["steady_ms"]] for lab, r in results.items()]
    data[name] = {"shapes": labels, "results": results, "errors": errors}
    print_table(f"{name}: steady ms per call at each shape", ["runtime", *labels], per_shape)
    return rows


def bench_bert(dev, repeats, layers, shapes, data, peers=()):
    model = bert_model(layers).to(dev)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "bert.onnx")
    b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=512)
    args = (torch.randint(0, 30522, (2, 7)), torch.ones(2, 7, dtype=torch.int64))
    export(model.cpu(), args, ["input_ids", "attention_mask"], {"input_ids": {0: b, 1: s},
                                                                "attention_mask": {0: b, 1: s}}, path)
    legacy = None
    if "onnx2torch" in peers:
        legacy = export_legacy(model, args, ["input_ids", "attention_mask"],
                               {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                               os.path.join(tmp, "bert_opset17.onnx"))
    model.to(dev)
    g = torch.Generator().manual_seed(1)
    feeds = []
    for bb, ss in shapes:
        ids = torch.randint(0, 30522, (bb, ss), generator=g)
        mask = torch.ones(bb, ss, dtype=torch.int64)
        mask[:, ss - ss // 4:] = torch.randint(0, 2, (bb, ss // 4), generator=g)  # some padding
        feeds.append((ids.to(dev), mask.to(dev)))
    return shapes_table(f"BERT-base ({layers} layers)", model, path, feeds, [f"{a}x{b}" for a, b in shapes],
                        repeats, dev, data, peers, legacy)


def bench_resnet(dev, repeats, batches, data, peers=()):
    model = resnet_model()
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "resnet50.onnx")
    export(model, (torch.randn(2, 3, 224, 224),), ["x"], {"x": {0: torch.export.Dim("batch", min=1, max=64)}}, path)
    legacy = None
    if "onnx2torch" in peers:
        legacy = export_legacy(model, (torch.randn(2, 3, 224, 224),), ["x"], {"x": {0: "batch"}},
                               os.path.join(tmp, "resnet50_opset17.onnx"))
    model.to(dev)
    g = torch.Generator().manual_seed(2)
    feeds = [(torch.randn(b, 3, 224, 224, generator=g).to(dev),) for b in batches]
    return shapes_table("ResNet-50", model, path, feeds, [str(b) for b in batches], repeats, dev, data, peers, legacy)


# ---- greedy decode ---------------------------------------------------------------------------------
def bench_decode(dev, steps, batches, data, layers):
    from benchmarks.decode_graphs import greedy_past
    from tests.models import llama
    cfg = dict(layers=layers, hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, vocab=32000,
               rope_theta=10000.0, eps=1e-5, seed=0)
    path = str(llama.model_path(cfg))
    names = llama.input_names(cfg)
    eager = llama.build(cfg).to(dev)
    rows = []
    data["decode"] = {}
    for batch in batches:
        prompt = torch.randint(0, cfg["vocab"], (batch, 8), generator=torch.Generator().manual_seed(batch)).to(dev)
        steps_by, sessions = {}, {}

        def eager_step(ids, past):
            with torch.no_grad():
                out = eager(ids, *past)
            return out[0], list(out[1:])
        steps_by["PyTorch eager"] = eager_step
        for label, mode in MODES.items():
            if label.endswith("(auto)") and dynashape.runtime.static_mode.static_mode("auto", dev) is None:
                continue
            sess = sessions[label] = dynashape.InferenceSession(path, device=str(dev), static_impls=mode)

            def step(ids, past, sess=sess):
                out = sess.run(None, dict(zip(names, [ids, *past])))
                return out[0], out[1:]
            steps_by[label] = step
        per_round = {k: [] for k in steps_by}
        toks_by = {}
        for k in range(4):  # interleaved rounds; the first warms up (and builds the static impls)
            if k == 1:  # steady state: background compilation done
                for sess in sessions.values():
                    if sess.compiled.context is not None:
                        sess.compiled.context.wait(600)
            for label, step in steps_by.items():
                t, toks_by[label] = greedy_past(step, prompt, cfg, steps, dev)
                per_round[label].append(t)
        res = {label: {"tokens_per_s": batch * (steps - 1) / statistics.median(per_round[label][1:]),
                       "tokens": toks_by[label]} for label in steps_by}
        for label, sess in sessions.items():
            res[label]["stats"] = _static_stats(sess)
            print(f"decode batch {batch}", label, res[label]["stats"])
        del sessions, steps_by
        _gone()
        ref = res["PyTorch eager"]
        for label, r in res.items():
            same = float((r["tokens"] == ref["tokens"]).float().mean())
            rows.append([f"decode batch {batch}", label, r["tokens_per_s"], r["tokens_per_s"] / ref["tokens_per_s"],
                         "", "", f"tokens equal to eager: {same:.3f}"])
            data["decode"][f"{label} batch {batch}"] = {"tokens_per_s": r["tokens_per_s"], "same_tokens": same,
                                                        "stats": r.get("stats", {})}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", nargs="+", default=["bert", "resnet", "decode"])
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--bert-layers", type=int, default=12)
    ap.add_argument("--bert-shapes", default=None, help="e.g. 1x16,4x64 (default: six shapes up to 16x128)")
    ap.add_argument("--resnet-batches", default=None, help="e.g. 1,8,3,16,1")
    ap.add_argument("--decode-layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", default=None,
                    help=f"comma-separated, of {','.join(PEERS)} (default: all on CUDA, none on CPU; 'none')")
    ap.add_argument("--precision", choices=["fp32", "torch-default"], default="fp32",
                    help="fp32: TF32 off everywhere; torch-default: torch's defaults (cuDNN convolutions in TF32)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False  # eager in fp32, as dynashape runs it
    dev = torch.device(args.device)
    peers = (args.peers or (",".join(PEERS) if dev.type == "cuda" else "none")).split(",")
    data = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "precision": args.precision, "peers": peers,
            "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32}}
    rows = []
    if "bert" in args.models:
        shapes = (BERT_SHAPES if not args.bert_shapes
                  else [tuple(map(int, x.split("x"))) for x in args.bert_shapes.split(",")])
        rows += bench_bert(dev, args.repeats, args.bert_layers, shapes, data, peers)
    if "resnet" in args.models:
        batches = RESNET_BATCHES if not args.resnet_batches else [int(x) for x in args.resnet_batches.split(",")]
        rows += bench_resnet(dev, args.repeats, batches, data, peers)
    if "decode" in args.models:
        rows += bench_decode(dev, args.steps, args.batch, data, args.decode_layers)
    print_table(f"static impls, {data['device']}, {args.precision}",
                ["model", "runtime", "sequence ms / tokens/s", "x eager", "first call / steady dynamic (max)",
                 "first pass s", "max |diff| vs eager"], rows)
    write_json(args.json, data)


if __name__ == "__main__":
    main()
