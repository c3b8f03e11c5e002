"""ShapePredictor: guess how large an output will grow, so a reallocation buys room for several.

Allocating device memory is slow, and outputs whose shapes grow step by step (an LLM's KV cache,
a sequence that lengthens by one token per run) would otherwise reallocate on every run. On each
reallocation the predictor looks at the last three shapes recorded for the output and proposes a
larger shape to allocate instead:

* iterations mode: the shape grew by the same small step twice in a row, so allocate room for
  the next ``iters`` steps (``current + step * iters``);
* ratio mode: otherwise allocate ``ratio`` times the current element count, as a flat shape
  ``(n, 1, ..., 1)`` of the same rank (only the element count of a buffer matters);
* custom mode: the caller forces growth of ``custom_count`` along ``custom_dim`` (the KV-cache
  path), with no history needed.

One predictor per infer request; it is not thread-safe (a request runs on one thread).

History keys: the integrator passes ``"<node name>"`` for output 0 and ``"<node name>_out<i>"``
for output ``i > 0`` (see :func:`history_key`). The history is meant to hold shape *changes*:
call :meth:`ShapePredictor.predict` only on the reallocation path (when the output shape
changed), passing ``can_reuse_buffer=True`` when the current buffer is already large enough, so
that the shape is recorded without a prediction.

Options come from a session option or the environment variable
``DYNASHAPE_MEM_PREALLOCATION_OPTIONS`` (``"iters max_iter_bytes max_dim_diff ratio"``, as
OpenVINO's ``OV_GPU_MemPreallocationOptions``); ``"0 0 0 1.0"`` disables preallocation.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

from ..errors import OptionsError

ENV_VAR = "DYNASHAPE_MEM_PREALLOCATION_OPTIONS"
EXPECTED_FORM = "'iters max_iter_bytes max_dim_diff ratio' (e.g. '10 16384 2 1.1'; '0 0 0 1.0' disables it)"
HISTORY_LEN = 3  # shapes kept per key: two deltas are needed to see a fixed step

Shape = tuple[int, ...]
NO_PREDICTION: tuple[bool, Shape] = (False, ())


def history_key(node_name: str, output_index: int = 0) -> str:
    """The predictor key of a node's output: the node name for output 0, ``name_out<i>`` after.

    (A node literally named ``"x_out1"`` shares its key with output 1 of node ``"x"``, as in
    OpenVINO; the only cost is a worse prediction for those two outputs.)
    """
    return node_name if output_index == 0 else f"{node_name}_out{output_index}"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class PredictorOptions:
    """Preallocation settings; the defaults are OpenVINO's GPU plugin defaults.

    Construction validates: the three counts are ints >= 0, ``ratio`` a finite number >= 0
    (ratio mode is on only when ``ratio > 1.0``); anything else raises OptionsError.
    """

    iters: int = 10  # next_iters_preallocation_count: steps of room bought in iterations mode
    max_iter_bytes: int = 16384  # max_per_iter_size: largest one-step growth slice, in bytes
    max_dim_diff: int = 2  # max_per_dim_diff: largest per-dim step that iterations mode accepts
    ratio: float = 1.1  # buffers_preallocation_ratio: growth factor of ratio mode

    def __post_init__(self) -> None:
        for name in ("iters", "max_iter_bytes", "max_dim_diff"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise OptionsError(f"preallocation option {name} must be an int >= 0, got {v!r}")
        r = self.ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise OptionsError(f"preallocation option ratio must be a finite number >= 0, got {r!r}")
        object.__setattr__(self, "ratio", float(r))  # frozen: normalise an int ratio once

    @property
    def enabled(self) -> bool:
        """False when neither mode can grow a buffer ("0 0 0 1.0"): then nothing is ever predicted,
        not even on the custom (KV-cache) path, so allocations are exact."""
        return not (self.iters == 0 and self.ratio <= 1.0)

    @staticmethod
    def parse(text: str) -> PredictorOptions:
        """Parse ``"iters max_iter_bytes max_dim_diff ratio"`` (whitespace separated)."""
        if not isinstance(text, str):
            raise OptionsError(f"preallocation options must be a string of the form {EXPECTED_FORM}, got {text!r}")
        parts = text.split()
        if len(parts) != 4:
            raise OptionsError(f"malformed preallocation options {text!r}: {len(parts)} value(s), "
                               f"expected 4 in the form {EXPECTED_FORM}")
        try:
            # int() refuses "2.5", float() accepts "nan"/"inf", which validation then refuses
            return PredictorOptions(*(int(p) for p in parts[:3]), float(parts[3]))
        except ValueError as e:  # OptionsError is a ValueError too
            raise OptionsError(f"malformed preallocation options {text!r}: {e}; "
                               f"expected the form {EXPECTED_FORM}") from e

    @staticmethod
    def from_env_or(value=None) -> PredictorOptions:
        """Options from an explicit value, else from ``DYNASHAPE_MEM_PREALLOCATION_OPTIONS``, else defaults.

        Precedence: an explicit value (a session option) wins over the environment, which wins over
        the defaults; the environment is read at each call. ``value`` may be None, an options string,
        a PredictorOptions, or a dict of field names to values. An unset or blank variable counts as
        unset; a malformed one raises OptionsError naming the variable.
        """
        if value is None:
            env = os.environ.get(ENV_VAR, "")
            if not env.strip():
                return PredictorOptions()
            try:
                return PredictorOptions.parse(env)
            except OptionsError as e:
                raise OptionsError(f"environment variable {ENV_VAR}: {e}") from e
        if isinstance(value, PredictorOptions):
            return value
        if isinstance(value, str):
            return PredictorOptions.parse(value)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(PredictorOptions)}
            unknown = sorted(map(str, set(value) - known))
            if unknown:
                raise OptionsError(f"unknown preallocation option(s) {unknown}; known are {sorted(known)}")
            return PredictorOptions(**value)
        raise OptionsError(f"preallocation options must be None, a string of the form {EXPECTED_FORM}, "
                           f"a PredictorOptions or a dict, got {type(value).__name__}")


def _nbytes(numel: int, bitwidth: int) -> int:
    return -(-numel * bitwidth // 8)  # ceil: sub-byte types (int4) round up to whole bytes


class ShapePredictor:
    """Per-request shape history and preallocation proposals (see the module docstring).

    ``can_preallocate(nbytes)`` is an optional capacity check (e.g. "fits in 90% of device
    memory"); it is asked about the byte size of every prediction before it is returned.
    ``options=None`` means the defaults; the integrator passes
    ``PredictorOptions.from_env_or(session_option)`` to honour the session option and environment.
    """

    def __init__(self, options: PredictorOptions | None = None,
                 can_preallocate: Callable[[int], bool] | None = None) -> None:
        self.options = PredictorOptions() if options is None else options
        self.can_preallocate = can_preallocate
        self._history: dict[str, deque[Shape]] = {}
        self._stats = dict.fromkeys(
            ("calls", "reused", "predictions_made", "iterations_mode", "ratio_mode", "custom_mode",
             "refused_by_capacity", "rank_resets"), 0)

    def predict(self, key: str, shape: Iterable[int], bitwidth: int, can_reuse_buffer: bool,
                custom_count: int = -1, custom_dim: int = -1) -> tuple[bool, Shape]:
        """Record ``shape`` for ``key`` and propose a shape to allocate instead, or ``(False, ())``.

        Steps, in order:

        1. record the shape (history of at most 3 per key); a shape whose rank differs from the
           recorded ones resets the key's history to just this shape. If ``can_reuse_buffer``,
           stop: ``(False, ())``.
        2. ``custom_dim >= 0 and custom_count > 0``: the shape with ``custom_count`` added to
           ``shape[custom_dim]``, no history needed (the KV-cache path). ``custom_dim`` out of
           range raises ValueError (a scalar has no dim to grow).
        3. fewer than 3 shapes recorded: ``(False, ())``.
        4. ``d0``/``d1``: the last two per-dim deltas. Iterations mode needs ``d0 == d1``, no
           negative delta, ``d0`` not all zero, every ``d0[i] <= max_dim_diff``, and the growth
           slice (current dim where ``d0[i] == 0``, else 1) at most ``max_iter_bytes`` bytes.
        5. iterations mode: ``current + d0 * N``, N = ``custom_count`` if > 0 else ``iters``
           (N == 0 switches iterations mode off).
        6. otherwise, if ``ratio > 1.0``: ``(floor(numel * ratio), 1, ..., 1)`` of the same rank.
        7. otherwise ``(False, ())``.

        Where OpenVINO has no rule: a prediction must hold *more* elements than the current shape,
        else it is no prediction (``(False, ())``): a scalar or a tiny tensor in ratio mode
        (``floor(1 * 1.1) == 1``), and any shape with 0 elements that stays empty, gain nothing
        from it, and the caller then allocates exactly. Disabled options never predict, on any
        path. Last, ``can_preallocate(ceil(numel * bitwidth / 8))`` must agree, else ``(False, ())``.
        """
        cur = tuple(int(d) for d in shape)
        if bitwidth <= 0 or any(d < 0 for d in cur):
            raise ValueError(f"predict({key!r}): bad shape {cur} or bitwidth {bitwidth}")
        self._stats["calls"] += 1
        hist = self._record(key, cur)
        if can_reuse_buffer:
            self._stats["reused"] += 1
            return NO_PREDICTION
        if not self.options.enabled:
            return NO_PREDICTION
        mode, pred = self._propose(key, hist, cur, bitwidth, custom_count, custom_dim)
        if pred is None or math.prod(pred) <= math.prod(cur):
            return NO_PREDICTION
        if self.can_preallocate is not None and not self.can_preallocate(_nbytes(math.prod(pred), bitwidth)):
            self._stats["refused_by_capacity"] += 1
            return NO_PREDICTION
        self._stats[mode] += 1
        self._stats["predictions_made"] += 1
        return True, pred

    def _record(self, key: str, cur: Shape) -> deque[Shape]:
        hist = self._history.get(key)
        if hist is None:
            hist = self._history[key] = deque(maxlen=HISTORY_LEN)
        elif hist and len(hist[-1]) != len(cur):
            # OpenVINO treats a rank change as an error; the old shapes say nothing about the new
            # rank, so start the key afresh (the next two reallocations are exact again).
            hist.clear()
            self._stats["rank_resets"] += 1
        hist.append(cur)
        return hist

    def _propose(self, key: str, hist: deque[Shape], cur: Shape, bitwidth: int,
                 custom_count: int, custom_dim: int) -> tuple[str, Shape | None]:
        if custom_dim >= 0 and custom_count > 0:
            if custom_dim >= len(cur):
                raise ValueError(f"predict({key!r}): custom_dim {custom_dim} is out of range for shape {cur}")
            return "custom_mode", cur[:custom_dim] + (cur[custom_dim] + custom_count,) + cur[custom_dim + 1:]
        if len(hist) < HISTORY_LEN:
            return "", None
        n = custom_count if custom_count > 0 else self.options.iters
        d0 = self._fixed_step(hist, cur, bitwidth)
        if d0 is not None and n > 0:
            return "iterations_mode", tuple(c + d * n for c, d in zip(cur, d0))
        if self.options.ratio > 1.0 and cur:
            flat = math.floor(math.prod(cur) * self.options.ratio)
            return "ratio_mode", (flat,) + (1,) * (len(cur) - 1)
        return "", None

    def _fixed_step(self, hist: deque[Shape], cur: Shape, bitwidth: int) -> Shape | None:
        """The per-dim step when the last three shapes grew by the same small step, else None."""
        s2, s1, s0 = hist  # oldest first; s0 is cur
        d0 = tuple(a - b for a, b in zip(s0, s1))
        d1 = tuple(a - b for a, b in zip(s1, s2))
        # d0 == d1 makes "no negative delta" a check of d0 alone.
        if d0 != d1 or not any(d0) or any(d < 0 or d > self.options.max_dim_diff for d in d0):
            return None
        # One iteration adds a slice: full extent on the dims that do not grow, 1 on those that do.
        slice_numel = math.prod(c if d == 0 else 1 for c, d in zip(cur, d0))
        if _nbytes(slice_numel, bitwidth) > self.options.max_iter_bytes:
            return None
        return d0

    def stats(self) -> dict:
        """Counters since construction: ``predictions_made`` (True results), per mode counts,
        ``calls``, ``reused``, ``refused_by_capacity``, ``rank_resets``, and ``keys`` tracked now."""
        return {**self._stats, "keys": len(self._history)}

    def reset(self, key: str | None = None) -> None:
        """Forget the history of ``key``, or of every key when None; counters are kept."""
        if key is None:
            self._history.clear()
        else:
            self._history.pop(key, None)
