"""Write every exported test model to a folder: ``python -m tests.models.export_all OUTDIR [--cnn]``.

OUTDIR gets ``hf-gpt2.onnx``, ``hf-bert.onnx``, ``llama.onnx`` (exported with this machine's
torch; about 1 MB each) and ``manifest.json`` (the configs and library versions). With ``--cnn``
also the prepared CNNs ``cnn-<name>-<variant>.onnx`` (about 350 MB): they need no torch export,
only onnx and onnxruntime, so any machine can rebuild them itself.

Point DYNASHAPE_MODELS_DIR at the folder on another machine and the tests use these files
instead of exporting with that machine's torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from . import cnn, llama, transformers_models
from .cache import versions


def export_all(outdir: Path, with_cnn: bool = False) -> list[Path]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in transformers_models.MODELS:
        dst = outdir / f"hf-{name}.onnx"
        shutil.copyfile(transformers_models.model_path(name), dst)
        written.append(dst)
    dst = outdir / "llama.onnx"
    shutil.copyfile(llama.model_path(), dst)
    written.append(dst)
    if with_cnn:
        written += cnn.export_all(outdir)
    manifest = {"versions": versions(), "transformers_models": transformers_models.TINY,
                "llama": llama.TINY, "files": sorted(p.name for p in written)}
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return written


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--cnn", action="store_true", help="also the prepared CNNs (large)")
    args = ap.parse_args(argv)
    for p in export_all(args.outdir, with_cnn=args.cnn):
        print(p)


if __name__ == "__main__":
    main()
