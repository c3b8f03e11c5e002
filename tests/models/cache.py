"""The on-disk cache of exported / prepared test models: ``<repo>/.cache/models/``.

A file's name carries a hash of everything that decides its content (the builder's config, the
torch / transformers / onnx versions, and the source of the builder module), so a repeated test
run reuses it and a changed builder or library writes a new one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("DYNASHAPE_MODEL_CACHE", REPO / ".cache" / "models"))
# A folder written by ``python -m tests.models.export_all``: its ``<name>.onnx`` files are used
# as they are, whatever the local torch version (for a machine that cannot export them itself).
PREBUILT_ENV = "DYNASHAPE_MODELS_DIR"


def prebuilt(name: str) -> Path | None:
    d = os.environ.get(PREBUILT_ENV)
    if d and (Path(d) / f"{name}.onnx").exists():
        return Path(d) / f"{name}.onnx"
    return None


def versions() -> dict:
    import onnx
    import torch

    out = {"torch": torch.__version__, "onnx": onnx.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # the llama and CNN models do not need it
        out["transformers"] = None
    return out


def config_hash(config: dict, module=None) -> str:
    """A short hash of the config, the library versions and (when given) the module's source."""
    payload = {"config": config, "versions": versions()}
    if module is not None:
        payload["source"] = hashlib.sha256(inspect.getsource(module).encode()).hexdigest()
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cached(name: str, config: dict, write: Callable[[Path], None], module=None,
           cache_dir: Path | None = None) -> Path:
    """Path of ``<name>-<hash>.onnx``; ``write(path)`` makes it when it is not there yet.

    When $DYNASHAPE_MODELS_DIR holds ``<name>.onnx``, that file is returned instead.
    The file is written under a temporary name and renamed, so concurrent test processes never
    see half a file.
    """
    if cache_dir is None and prebuilt(name) is not None:
        return prebuilt(name)
    d = Path(cache_dir or CACHE_DIR)
    d.mkdir(parents=True, exist_ok=True)
    # the config's own short hash in the name too: a file is pruned only by a newer build of the same
    # config (another builder or library), never by another config of the same model (the llama
    # tests use several at once: one test's export removed the file another test's fixture held)
    variant = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:8]
    path = d / f"{name}-{variant}-{config_hash(config, module)}.onnx"
    if path.exists():
        return path
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".onnx", dir=d)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        _prune(d, f"{name}-{variant}", path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _prune(d: Path, name: str, keep: Path) -> None:
    """Remove the files of ``name`` (a model and its config) made with another hash (an older
    builder or library), and files named before configs were told apart (no config hash)."""
    base = name.rsplit("-", 1)[0]
    pattern = re.compile(f"(?:{re.escape(name)}|{re.escape(base)})" + r"-[0-9a-f]{16}\.onnx")
    for old in d.iterdir():
        if old != keep and pattern.fullmatch(old.name):
            try:
                old.unlink()
            except OSError:  # another process got there first
                pass
