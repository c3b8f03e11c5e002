"""The disk cache (``cache_dir=``): what a build measured, kept for the next process.

OpenVINO's CACHE_DIR and TensorRT's timing cache keep what is slow to find out. Here that is the
form each product and convolution was timed fastest in (``ops/specialise.py``: cuBLAS, cuDNN,
Winograd, an unfolded product... per op, shapes, dtype and layout): a CUDA static impl's build
spends most of its time timing them (ResNet-50: ~1-2 s a batch bucket). With the cache, a second
process's builds only run the region once and capture it.

It also keeps the input shapes whose calls asked for a static impl (a batch bucket's shape for a
bucketed region: ``note_shape``), up to ``MAX_SHAPES``, first asked first: a CUDA session loaded
with the cache builds them at load (api.py ``_prebuild``, as the optimal values), so the second
process's first call at such a shape replays a graph instead of running the dynamic impl.

One JSON file per model and device: its name holds a hash of the model's structure (ops,
attributes, the initializers' names, types and shapes; not their values, which no choice
depends on) and of the device, torch's and CUDA's versions. A file that cannot be read, or that
names another model, device or version, is ignored with a ``DiskCacheWarning`` and rewritten at
the next save; a write goes to a temporary file first and is renamed, so a reader never sees
half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

import onnx
import torch

from ..ops import specialise

FORMAT = 1
MAX_SHAPES = 32  # input shapes kept for the next process's load


class DiskCacheWarning(UserWarning):
    """A cache file was ignored (unreadable, another format, model, device or version)."""


def model_hash(proto: onnx.ModelProto) -> str:
    """A hash of what the forms depend on: the graph's structure and its constants' shapes."""
    h = hashlib.sha256()
    for n in proto.graph.node:
        h.update(f"{n.domain}:{n.op_type}|{','.join(n.input)}|{','.join(n.output)}|".encode())
        for a in n.attribute:
            if a.type != onnx.AttributeProto.GRAPH:
                h.update(a.SerializeToString())
    for t in proto.graph.initializer:
        h.update(f"{t.name}:{t.data_type}:{tuple(t.dims)}|".encode())
    for v in list(proto.graph.input) + list(proto.graph.output):
        h.update(v.SerializeToString())
    return h.hexdigest()


def device_tag(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{name}|torch {torch.__version__}|cuda {torch.version.cuda}"


def _encode(x):
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).removeprefix("torch.")}
    if isinstance(x, (tuple, list)):
        return {"tuple": [_encode(v) for v in x]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot store a {type(x).__name__} in the disk cache")


def _decode(x):
    if isinstance(x, dict):
        if "dtype" in x:
            dt = getattr(torch, x["dtype"])
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"not a dtype: {x['dtype']!r}")
            return dt
        return tuple(_decode(v) for v in x["tuple"])
    return x


class DiskCache:
    def __init__(self, folder: str | os.PathLike, proto: onnx.ModelProto, device: torch.device) -> None:
        self.folder = Path(folder)
        self.tag = device_tag(device)
        self.model = model_hash(proto)
        key = hashlib.sha256(f"{self.model}|{self.tag}".encode()).hexdigest()[:20]
        self.path = self.folder / f"dynashape-{key}.json"
        self.loaded = 0  # forms read from the file
        self.saves = 0
        self._saved = (-1, -1)  # how many forms and shapes the last save wrote
        self._lock = threading.Lock()
        self.shapes: list[tuple] = []  # input shapes (tuples of ints per input) asked to build for

    def load(self) -> int:
        """Merge the file's forms into the process's choices; how many (0 with a warning when
        the file is there but cannot be used)."""
        if not self.path.exists():
            return 0
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != FORMAT or data.get("model") != self.model or data.get("device") != self.tag:
                raise ValueError("written for another format, model, device or version")
            entries = {_decode(k): str(form) for k, form in data["forms"]}
            shapes = [tuple(tuple(int(d) for d in shape) for shape in combo) for combo in data.get("shapes", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"dynashape: ignoring the cache file {self.path} ({type(e).__name__}: {e}); it will be "
                          "written anew", DiskCacheWarning, stacklevel=2)
            return 0
        specialise.remember(entries)
        self.loaded = len(entries)
        with self._lock:
            for combo in shapes[:MAX_SHAPES]:
                if combo not in self.shapes:
                    self.shapes.append(combo)
        return self.loaded

    def note_shape(self, combo: tuple) -> None:
        """An input shape (one tuple of ints per input) whose call asked for a static impl;
        written at the next save."""
        with self._lock:
            if combo not in self.shapes and len(self.shapes) < MAX_SHAPES:
                self.shapes.append(combo)

    def save(self) -> bool:
        """Write the process's chosen forms (when there are new ones since the last save)."""
        with self._lock:
            forms = specialise.choices()
            if (len(forms), len(self.shapes)) == self._saved:
                return False
            data = {"format": FORMAT, "model": self.model, "device": self.tag,
                    "forms": [[_encode(k), v] for k, v in forms.items()],
                    "shapes": [[list(s) for s in combo] for combo in self.shapes]}
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".dynashape-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
            self._saved = (len(forms), len(self.shapes))
            self.saves += 1
            return True

    def stats(self) -> dict:
        return {"disk_cache_forms_loaded": self.loaded, "disk_cache_saves": self.saves,
                "disk_cache_shapes": len(self.shapes)}
