"""Helpers shared by the dynashape command's modules (cli.py, bench.py): parsing shapes and
dims, loading a model with typed errors, random feeds, rich tables. Here so that cli.py and
bench.py both import them and not each other."""

from __future__ import annotations

import os

import numpy as np

from .errors import DynashapeError, InvalidModelError


class UsageExit(SystemExit):
    """A bad command-line value: exit code 2, the message said once, no traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _version() -> str:
    try:
        from . import __version__
        return __version__
    except ImportError:
        from importlib.metadata import version
        return version("dynashape")


# ---------------------------------------------------------------------------------------------------------------
# parsing helpers


def _parse_dims(text: str) -> tuple[int, ...]:
    parts = text.replace("x", ",").split(",") if text else []
    try:
        dims = tuple(int(p) for p in parts if p.strip() != "")
    except ValueError as e:
        raise UsageExit(f"dynashape: bad dims {text!r}; write them as 1x3x224x224 or 1,3,224,224") from e
    if any(d < 0 for d in dims):
        raise UsageExit(f"dynashape: bad dims {text!r}; dims cannot be negative")
    return dims


def _parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, eq, dims = text.partition("=")
    if not eq or not name:
        raise UsageExit(f"dynashape: bad --shape {text!r}; write it as NAME=DIMS, e.g. x=1x3x224x224")
    return name, _parse_dims(dims)


def _parse_shapes(items) -> dict[str, tuple[int, ...]]:
    return dict(_parse_shape_arg(s) for s in items or ())


def _parse_range(text: str):
    from .shape import Dimension
    lo, _, hi = text.partition(":")
    try:
        return Dimension(int(lo), int(hi) if hi else None)
    except (ValueError, DynashapeError) as e:
        raise UsageExit(f"dynashape: bad range {text!r}; write it as MIN:MAX (or MIN: for no upper bound)") from e


def _parse_dynamic_dim(text: str):
    """NAME=AXIS:MIN:MAX -> (name, axis, Dimension)."""
    from .shape import Dimension
    name, eq, rest = text.partition("=")
    parts = rest.split(":")
    try:
        if not eq or not name or len(parts) != 3:
            raise ValueError
        axis, lo, hi = int(parts[0]), int(parts[1]), (int(parts[2]) if parts[2] else None)
        return name, axis, Dimension(lo, hi)
    except (ValueError, DynashapeError) as e:
        raise UsageExit(f"dynashape: bad --dynamic-dim {text!r}; write it as NAME=AXIS:MIN:MAX, e.g. x=0:1:32") from e


def load_checked(model):
    """The ModelProto of ``model``; anything the loader raises untyped (a protobuf ParseError for a .json
    path, ...) becomes an InvalidModelError."""
    from .frontend.parse import load_model_proto
    try:
        return load_model_proto(model)
    except DynashapeError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise InvalidModelError(f"model file {str(model)!r} is not an ONNX model: {type(e).__name__}: {first}") from e


def _model_ranks(model) -> dict[str, int | None]:
    proto = load_checked(model)
    inits = {i.name for i in proto.graph.initializer}
    out = {}
    for v in proto.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        out[v.name] = len(t.shape.dim) if t.HasField("shape") else None
    return out


def dynamic_dims_option(model, items) -> dict | None:
    """--dynamic-dim NAME=AXIS:MIN:MAX (repeatable) as the session option dynamic_dims: the named axes
    widened, the others (None) kept as the model declares them."""
    if not items:
        return None
    ranks = _model_ranks(model)
    out: dict[str, list] = {}
    for text in items:
        name, axis, dim = _parse_dynamic_dim(text)
        if name not in ranks:
            raise UsageExit(f"dynashape: --dynamic-dim names {name!r}, which is not an input of the model; "
                            f"its inputs are {sorted(ranks)}")
        rank = ranks[name]
        if rank is None:
            raise UsageExit(f"dynashape: --dynamic-dim {text!r}: input {name!r} has no declared rank")
        if not -rank <= axis < rank:
            raise UsageExit(f"dynashape: --dynamic-dim {text!r}: input {name!r} has rank {rank}")
        out.setdefault(name, [None] * rank)[axis % rank] = dim
    return out


def check_names(given, known, what: str) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise UsageExit(f"dynashape: {what} names {unknown}, which the model's inputs are not; "
                        f"its inputs are {list(known)}")


def _random_input(name: str, elem_type: int, shape, rng, int_high: int):
    from .ir import np_dtype
    dt = np_dtype(elem_type) if elem_type else np.dtype(np.float32)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0, int_high, size=shape).astype(dt)
    return rng.uniform(-1, 1, size=shape).astype(dt)


def input_shape(arg, shapes: dict, guess: bool = False, later: int = 2) -> tuple[int, ...]:
    """The shape of one input: given, static, or (``guess``) a typical value: a dynamic dim's
    optimal value, else 2 for the input's first dynamic axis (a batch, most often) and ``later``
    for the others, within the dim's range; else a usage error."""
    shape = shapes.get(arg.name)
    ps = arg.partial_shape
    if shape is None and ps is not None and not ps.is_static and guess:
        first = next(i for i, d in enumerate(ps) if not d.is_static)
        shape = tuple(d.min if d.is_static else _typical(d, 2 if i == first else later) for i, d in enumerate(ps))
    if shape is None:
        if ps is None or not ps.is_static:
            raise UsageExit(f"dynashape: input {arg.name!r} has dynamic shape {ps}; give it with "
                            f"--shape {arg.name}=DIMS")
        shape = ps.to_static()
    return tuple(shape)


def _typical(d, v: int) -> int:
    return d.optimals[0] if d.optimals else max(d.min, v if d.max is None else min(v, d.max))


def random_feeds(sess, shapes: dict, rng, int_high: int, given: dict | None = None, guess: bool = False,
                 later: int = 2) -> dict:
    feeds = dict(given or {})
    for arg in sess.get_inputs():
        if arg.name in feeds:
            continue
        spec = next(s for s in sess._specs if s.name == arg.name)
        feeds[arg.name] = _random_input(arg.name, spec.elem_type, input_shape(arg, shapes, guess, later), rng,
                                        int_high)
    return feeds


def _feeds(sess, args, guess: bool = False, later: int = 2) -> dict:
    """Feeds from --inputs and --shape, random where not given; ``guess``: a dynamic dim not
    given takes a typical value (``input_shape``) instead of an error."""
    known = [a.name for a in sess.get_inputs()]
    shapes = _parse_shapes(args.shape)
    check_names(shapes, known, "--shape")
    feeds = {}
    if getattr(args, "inputs", None):
        try:
            feeds = dict(np.load(args.inputs))
        except (OSError, ValueError) as e:
            raise UsageExit(f"dynashape: cannot read --inputs {args.inputs!r}: {e}") from e
        check_names(feeds, known, f"the keys of {args.inputs}")
    rng = np.random.default_rng(getattr(args, "seed", 0))
    return random_feeds(sess, shapes, rng, getattr(args, "int_high", 10), feeds, guess, later)


def _session(args):
    from . import InferenceSession
    load_checked(args.model)
    opts = {}
    if getattr(args, "default_dynamic_dim", None):
        opts["default_dynamic_dim"] = _parse_range(args.default_dynamic_dim)
    if getattr(args, "dim_param", None):
        opts["dim_params"] = {}
        for p in args.dim_param:
            k, eq, v = p.partition("=")
            if not eq:
                raise UsageExit(f"dynashape: bad --dim-param {p!r}; write it as SYMBOL=MIN:MAX")
            opts["dim_params"][k] = _parse_range(v)
    dd = dynamic_dims_option(args.model, getattr(args, "dynamic_dim", None))
    if dd:
        opts["dynamic_dims"] = dd
    return InferenceSession(args.model, device=getattr(args, "device", "cpu"), **opts)


def _console():
    """A console; written to a file or a pipe, a wide one (rich's default of 80 columns would fold names)."""
    from rich.console import Console
    con = Console()
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(width=200)
    return con


def _table(title: str, cols, numeric=(), **kw):
    """A table whose name columns fold (never cut) and whose ``numeric`` columns never wrap."""
    from rich.table import Table
    t = Table(title=title, **kw)
    for col in cols:
        if col in numeric:
            t.add_column(col, no_wrap=True, justify="right")
        else:
            t.add_column(col, no_wrap=False, overflow="fold")
    return t


# ---------------------------------------------------------------------------------------------------------------
# commands
