"""The client of the compile process (inductor_worker.py): one process per serving process,
started at the first CPU build and kept (importing torch and inductor there costs seconds once),
shared by every session. A build sends the region's functional graph and its live-ins' metadata,
waits for the compiled module (the waiting thread releases the GIL), and loads it here: the
module's source and its C++ library are on disk by then (inductor's code cache), so loading is
an import of a few milliseconds.

A process that died or cannot start is an error of that build (counted and reported by the
caller as a refusal); the next build starts a new process.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

import torch

from . import inductor_worker

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inductor_worker.py")


class CompileProcessError(RuntimeError):
    """The compile process failed to compile a region (its traceback is the message) or died."""


class CompileProcess:
    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.builds = 0
        self.starts = 0

    def start(self) -> None:
        """Start the process now (it loads torch and inductor before its first request)."""
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self._proc = subprocess.Popen([sys.executable, _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env)
        self.starts += 1
        return self._proc

    def compile(self, request: bytes, gm: torch.fx.GraphModule):
        """The compiled function of ``gm`` (``request``: see ``request()``), loaded and callable
        (inductor's boxed convention: ``fn(list_of_tensors)``)."""
        with self._lock:
            proc = self._start()
            try:
                inductor_worker.write_message(proc.stdin, request)
                reply = inductor_worker.read_message(proc.stdout)
            except (BrokenPipeError, OSError) as e:
                reply = None
                why = f"{type(e).__name__}: {e}"
            else:
                why = "it exited"
            if reply is None:
                self.close()
                raise CompileProcessError(f"the compile process failed ({why})")
            self.builds += 1
        if reply[0] != "ok":
            raise CompileProcessError(reply[1].strip().splitlines()[-1] + "\n" + reply[1])
        _, cg, shared = reply
        return load(cg, shared, gm)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()


def request(gm: torch.fx.GraphModule, metas: list, out_meta: dict) -> bytes:
    """A compile request, pickled in the thread that traced ``gm`` (pickling a graph module
    generates its Python code: FX work, kept out of the worker thread). ``metas``: the live-ins'
    sizes, strides, dtypes and storages; ``out_meta``: the output node's metadata inductor reads
    (node metadata does not travel with a pickled graph)."""
    return inductor_worker.dumps({"gm": gm, "inputs": metas, "output_meta": out_meta})


def load(cg, shared: list[str], gm: torch.fx.GraphModule):
    """Make a compiled graph from the compile process callable here, as inductor's own cache
    does when it finds a graph on disk; the weights it shares with ``gm`` are ``gm``'s tensors."""
    from torch._inductor.output_code import CompiledFxGraphConstants
    from torch._inductor.utils import BoxedBool
    for name in shared:
        cg.constants[name] = getattr(gm, name)
    cg.after_deserialization(CompiledFxGraphConstants())
    # realigns live-ins whose addresses the compiled code assumed aligned (a copy where not)
    cg.post_compile([], CompiledFxGraphConstants(),
                    {"cudagraphs": BoxedBool(False), "is_backward": False, "is_inference": True,
                     "boxed_forward_device_index": None})
    return cg.current_callable


_process: CompileProcess | None = None
_process_lock = threading.Lock()
_warm = threading.Event()  # prewarm's imports are done


def prewarm() -> None:
    """At the making of a CPU session with static impls: the compile process starts (it imports
    torch and inductor meanwhile), and a thread here imports what a trace needs (~2 s of imports
    the first trace would otherwise hold the serving thread for)."""
    def work():
        try:
            process().start()
            import torch._inductor.compile_fx  # noqa: F401
            import torch.fx.experimental.proxy_tensor  # noqa: F401
        except Exception:  # noqa: BLE001  the first build then meets (and reports) the same failure
            pass
        finally:
            _warm.set()
    if not _warm.is_set():
        threading.Thread(target=work, name="dynashape-prewarm", daemon=True).start()


def warmed() -> bool:
    """Whether ``prewarm``'s imports are done: an async session traces no region before, since a
    trace that started earlier would wait for the imports in the serving thread (1.7 s in the
    tiny decoder's second step, against 0.5 s once they are done)."""
    return _warm.is_set()


def process() -> CompileProcess:
    """The serving process's compile process (started at its first build)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = CompileProcess()
            atexit.register(_process.close)
        return _process
