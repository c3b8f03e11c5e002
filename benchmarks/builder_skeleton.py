"""A model builder's folder carried without its weights (experiment tooling): the device machine
takes 64 MiB of files and has no onnxruntime-genai, so a 1B model's folder cannot travel. ``strip``
keeps the graph exactly as the builder wrote it, its small initializers (rotary caches, norms,
shapes: at most ``--keep`` bytes each) and the folder's configs; ``fill`` makes the large ones again
with random values of their kind (packed 4-bit weights and zero points random bytes, block scales
uniform in [0.005, 0.02], float weights normal with std 0.02): the builder's model with other random
weights, for speed measurements (the weights were random to begin with).

    python benchmarks/builder_skeleton.py strip FOLDER OUT [--keep 1048576]
    python benchmarks/builder_skeleton.py fill OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

RECIPE = "skeleton.json"


def strip(folder: Path, out: Path, keep: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.suffix != ".onnx" and not f.name.endswith(".data"):
            shutil.copy(f, out / f.name)
    model = onnx.load(str(folder / "model.onnx"))
    kept, dropped = [], []
    for t in model.graph.initializer:
        if t.raw_data and len(t.raw_data) > keep:
            dropped.append({"name": t.name, "dtype": int(t.data_type), "dims": list(t.dims)})
        else:
            kept.append(t)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    onnx.save(model, str(out / "model.onnx"))
    (out / RECIPE).write_text(json.dumps(dropped))
    print(f"{len(kept)} initializers kept, {len(dropped)} to make again; {sum(f.stat().st_size for f in out.iterdir())}"
          " bytes")


def fill(out: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    model = onnx.load(str(out / "model.onnx"))
    for r in json.loads((out / RECIPE).read_text()):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(r["dtype"])
        shape = tuple(r["dims"])
        if dtype == np.uint8:
            v = rng.integers(0, 256, shape, dtype=np.uint8)
        elif r["name"].endswith("scales"):
            v = rng.uniform(0.005, 0.02, shape).astype(dtype)
        else:
            v = (rng.standard_normal(shape) * 0.02).astype(dtype)
        model.graph.initializer.append(numpy_helper.from_array(v, r["name"]))
    onnx.save(model, str(out / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    print(f"filled {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["strip", "fill"])
    ap.add_argument("folder")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--keep", type=int, default=1 << 20)
    args = ap.parse_args()
    if args.what == "strip":
        strip(Path(args.folder), Path(args.out), args.keep)
    else:
        fill(Path(args.folder))


if __name__ == "__main__":
    sys.exit(main())
