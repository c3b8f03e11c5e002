"""Small C kernels for loops that torch can only run as many tiny calls (ops/csrc/*.c).

Some ops are a loop of steps whose arithmetic is a few microseconds while each torch call costs
about as much: DynamicQuantizeLSTM's recurrence is ~25 calls a step. Such a loop is written once
in plain C (no torch headers: it compiles in about a second), built with the system's C compiler
for this CPU the first time a process needs it, kept in a cache directory, and called through
ctypes (which lets go of the GIL). Its threads are OpenMP's, on torch's own libgomp (dq_lstm.c
says why).

Where no compiler is found, the build fails, or ``DYNASHAPE_NATIVE=0`` is set, the ops keep their
torch path; ``counters()`` says which was used how often (a session's ``stats()`` shows them), so
the fallback is never silent.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path

_SRC = Path(__file__).with_name("csrc")
# -ffp-contract=off: a fused multiply-add rounds differently from torch's separate kernels
_FLAGS = ["-O3", "-ffp-contract=off", "-fPIC", "-shared"]
# OpenMP where the compiler has it: torch's libgomp.so.1 serves (see dq_lstm.c); without, one thread
_OPENMP = ["-fopenmp"]

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}
_counts: Counter = Counter()


# os.environ.get costs ~1.5 us (it encodes the key and decodes the value); the kernels ask on every
# call, so the raw value is read from the mapping's own dict and its meaning kept per value
_ENV = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("DYNASHAPE_NATIVE") if _ENV is not None and hasattr(os.environ, "encodekey") else None
_MEANING: dict = {}


def enabled() -> bool:
    raw = _ENV.get(_ENV_KEY) if _ENV_KEY is not None else os.environ.get("DYNASHAPE_NATIVE")
    on = _MEANING.get(raw)
    if on is None:
        text = raw.decode() if isinstance(raw, bytes) else (raw or "1")
        on = _MEANING[raw] = text.strip().lower() not in ("0", "off", "false", "no")
    return on


def _cache_dir() -> Path:
    base = os.environ.get("DYNASHAPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dynashape")
    return Path(base) / "native"


@functools.cache
def cpuinfo(field: str) -> str:
    """The first processor's ``field`` in /proc/cpuinfo (``vendor_id``, ``flags``, ...), or "" (read
    once a field a process)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpu_tag() -> str:
    """What -march=native depends on: the CPU's flags (a cache shared by machines stays right)."""
    import platform
    return cpuinfo("flags") or cpuinfo("Features") or platform.processor() or platform.machine()


def build(name: str, arch: str = "native", cache: Path | None = None) -> ctypes.CDLL:
    """Compile ops/csrc/<name>.c for ``-march=<arch>`` (cached) and load it; OSError when it cannot."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise OSError("no C compiler (cc, gcc or clang) on PATH")
    flags = [f"-march={arch}", *_FLAGS]
    src = b"".join(f.read_bytes() for f in [_SRC / f"{name}.c", *sorted(_SRC.glob("*.h"))])  # what it includes
    key = hashlib.sha256(b"\0".join([src, " ".join(flags + _OPENMP).encode(), cc.encode(), _cpu_tag().encode()]))
    out = (cache or _cache_dir()) / f"{name}-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            err = ""
            for extra in (_OPENMP, []):
                r = subprocess.run([cc, *flags, *extra, "-o", tmp, str(_SRC / f"{name}.c"), "-lm"],
                                   capture_output=True, text=True, timeout=120)
                if not r.returncode:
                    break
                err = r.stderr.strip()[-400:]
            else:
                raise OSError(f"{cc} failed: {err}")
            os.replace(tmp, out)  # atomic: processes building at once each end with a whole file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(out))


def library(name: str) -> ctypes.CDLL | None:
    """The built ops/csrc/<name>.c, or None (disabled, or it cannot be built: ``why(name)``)."""
    if not enabled():
        return None
    lib = _libs.get(name, False)
    if lib is not False:
        return lib
    with _lock:
        if name not in _libs:
            try:
                _libs[name] = build(name)
            except (OSError, subprocess.SubprocessError) as e:
                _libs[name] = None
                _why[name] = str(e)
        return _libs[name]


def function(name: str, symbol: str, argtypes: str, restype=None, fallbacks: str | None = None):
    """``symbol`` of ``library(name)`` with its C signature set, or None. ``argtypes``: one letter
    an argument, ``i`` int64_t, ``d`` double, ``p`` a pointer; ``restype`` a ctypes type or None (void).
    ``fallbacks``: where None comes back, ``<fallbacks>_torch_fallbacks`` is counted (the caller's
    torch path runs instead)."""
    lib = library(name)
    if lib is None:
        if fallbacks is not None:
            count(f"{fallbacks}_torch_fallbacks")
        return None
    fn = getattr(lib, symbol)
    if fn.argtypes is None:
        kinds = {"i": ctypes.c_int64, "d": ctypes.c_double, "p": ctypes.c_void_p}
        fn.argtypes = [kinds[c] for c in argtypes]
        fn.restype = restype
    return fn


def buffer(out, shape, dtype):
    """``out`` where it is a contiguous CPU-side tensor of ``shape`` and ``dtype`` (a C pass can
    write its elements in order), else a new one: where the runtime's buffer fits, a kernel
    writes into it instead of allocating."""
    import torch
    if type(out) is torch.Tensor and out.dtype is dtype and out.shape == shape and out.is_contiguous():
        return out
    return torch.empty(shape, dtype=dtype)


def dense_pair(x, out, dtype):
    """(x, y) for a C pass over a tensor's elements in memory order: x as it lies when it is dense
    (contiguous, or channels-last: a CNN's activations, whose layout the next convolution wants
    kept), else a contiguous copy; y ``out`` when it has x's shape, strides and ``dtype``, else a
    new tensor laid out as x. Element i of one storage is element i of the other."""
    import torch
    if not (x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))):
        x = x.contiguous()
    if out is None or out.dtype != dtype or out.shape != x.shape or out.stride() != x.stride():
        out = torch.empty_like(x, dtype=dtype)  # preserve_format keeps a dense x's strides
    return x, out


def why(name: str) -> str:
    """Why ``library(name)`` is None ("" when it is not)."""
    if not enabled():
        return "DYNASHAPE_NATIVE=0"
    return _why.get(name, "")


def count(key: str) -> None:
    _counts[key] += 1


def counters() -> dict:
    """Calls of each native kernel and of its torch fallback in this process."""
    return dict(_counts)
