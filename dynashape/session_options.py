"""``dynashape.SessionOptions``: onnxruntime's SessionOptions and dynashape's own options in one
object, every field typed and documented in dynashape/options.py (docs/options.md); and
``resolve``, how a session turns it and its keywords into the options it runs with.

    so = dynashape.SessionOptions()
    so.static_impls = "off"                  # dynashape's field
    so.intra_op_num_threads = 2              # onnxruntime's: threads=2
    dynashape.InferenceSession(path, so, providers=["CPUExecutionProvider"], verbose=1)  # a keyword wins

Setting a field that does not exist, or a value the field does not take, is an OptionsError that
names the field and what it takes, at the assignment, not at the session that reads it.
"""

from __future__ import annotations

import difflib

import numpy as np

from .errors import OptionsError, UnknownOptionError
from .options import OPTION_FIELDS, ORT_FIELDS, check, default_of
from .ort_enums import GraphOptimizationLevel
from .shape import Dimension


class SessionOptions:
    """onnxruntime.SessionOptions with dynashape's fields besides (docs/options.md). Only the
    dynashape fields given a value reach the session: a field left alone keeps the session's
    default, which an operator's environment variable may still override."""

    def __init__(self, **fields) -> None:
        object.__setattr__(self, "_set", {})  # dynashape's fields given a value
        object.__setattr__(self, "_config", {})  # add_session_config_entry's
        for name, f in ORT_FIELDS.items():
            object.__setattr__(self, name, default_of(f))
        for name, value in fields.items():
            setattr(self, name, value)

    def __getattr__(self, name: str):
        # reached only for names the object does not hold: dynashape's fields, at their default
        # until set ("_" names: a copy or pickle asking before __init__ ran)
        f = OPTION_FIELDS.get(name)
        if f is None or name.startswith("_"):
            raise UnknownOptionError(_unknown(name))
        return self._set.get(name, default_of(f))

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, np.generic):  # np.int64(4) from a computation: the int it holds, as pybind takes it
            value = value.item()
        if name in OPTION_FIELDS:
            check(name, value)
            self._set[name] = value
            return
        if name not in ORT_FIELDS:
            raise UnknownOptionError(_unknown(name))
        check(name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        """``del so.field``: dynashape's field back to the session's default."""
        if name not in OPTION_FIELDS:
            raise UnknownOptionError(f"SessionOptions.{name}: only dynashape's fields can be reset with del")
        self._set.pop(name, None)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._set.items())
        return f"SessionOptions({given})"

    def options(self) -> dict:
        """dynashape's fields that were given a value (the keywords they stand for)."""
        return dict(self._set)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the model's symbolic dim ``dim_name`` to ``dim_value`` (dynashape's
        ``dim_params={dim_name: Dimension(dim_value, dim_value)}``)."""
        self.free_dimension_overrides_by_name[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        """Accepted and recorded, with no effect: dynashape does not read dim denotations."""
        self.free_dimension_overrides_by_denotation[str(dim_denotation)] = int(dim_value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Stored (get_session_config_entry reads it back); no entry changes dynashape's behaviour."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise OptionsError(f"SessionOptions has no config entry {key!r}")
        return self._config[key]


def _unknown(name: str) -> str:
    near = difflib.get_close_matches(name, list(OPTION_FIELDS) + list(ORT_FIELDS), n=3)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return f"SessionOptions has no field {name!r}{hint}; its fields are listed in docs/options.md"


def resolve(so, options: dict) -> dict:
    """The options a session runs with: what onnxruntime's fields of ``so`` stand for, then
    dynashape's fields set on ``so``, then the keywords ``options``, each later one winning
    (``dim_params`` merge entry by entry). ``so`` may be onnxruntime's own SessionOptions."""
    if so is None:
        return options
    if not hasattr(so, "graph_optimization_level") or not hasattr(so, "intra_op_num_threads"):
        raise OptionsError(f"sess_options: expected dynashape.SessionOptions (or a device name as the second "
                           f"argument), got {type(so).__name__}")
    ours = so.options() if isinstance(so, SessionOptions) else {}
    out = {**_from_onnxruntime(so), **ours, **options}
    dims = [d for d in (_from_onnxruntime(so).get("dim_params"), ours.get("dim_params"), options.get("dim_params"))
            if d is not None]
    if len(dims) > 1:
        for d in dims:
            if not isinstance(d, dict):
                raise OptionsError(f"dim_params: expected a dict, got {type(d).__name__}")
        out["dim_params"] = {k: v for d in dims for k, v in d.items()}
    return out


def _from_onnxruntime(so) -> dict:
    """The dynashape options that onnxruntime's fields of ``so`` stand for (docs/options.md)."""
    out = {}
    if int(so.graph_optimization_level) == int(GraphOptimizationLevel.ORT_DISABLE_ALL):
        out["fusion"] = False
    if so.intra_op_num_threads and so.intra_op_num_threads > 0:
        out["threads"] = int(so.intra_op_num_threads)
    level = getattr(so, "log_severity_level", 2)
    if level is not None and 0 <= int(level) <= 1:  # onnxruntime's 0 verbose, 1 info: the engine's log levels 2 and 1
        out["verbose"] = 2 if int(level) == 0 else 1
    if getattr(so, "use_deterministic_compute", False):
        out["deterministic"] = True
    if so.enable_profiling:
        out["enable_profiling"] = True
        out["profile_file_prefix"] = so.profile_file_prefix
    fixed = getattr(so, "free_dimension_overrides_by_name", None)
    if fixed:
        out["dim_params"] = {k: Dimension(v, v) for k, v in fixed.items()}
    return out
