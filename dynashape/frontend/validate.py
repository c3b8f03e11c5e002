"""Load-time checks of a ModelProto, before it is parsed: a bad model fails when the session is
created, with an InvalidModelError that names the node (name and op type) or initializer and says
what was expected, instead of an untyped error at the first run.

Checked here (what onnxruntime's load-time checker refuses too, and no more where in doubt):

- the default domain's opset (and ai.onnx.ml's) is one that the installed onnx package knows;
- initializers (and TENSOR attributes) hold as many elements as their dims declare, of a real
  element type;
- the nodes of every graph form no cycle (and come in topological order);
- per node, against the op's ONNX schema at the model's opset (ops of other domains, and ops
  without a schema, are skipped): the number of inputs and outputs, required inputs given,
  required attributes present, attribute types (an empty list passes as any list type);
- attribute values: Cast ``to`` and the ``dtype`` attributes are TensorProto data types,
  Transpose ``perm`` is a permutation (of the input's rank, where known), and axis attributes
  lie in [-rank, rank-1] (Flatten [-rank, rank], OneHot and Unsqueeze count the output's rank)
  where the input's rank is known statically: a declared graph input, an initializer, a Constant,
  or a value_info (the model's own, or ONNX shape inference's).

Unnamed nodes are called ``{op_type}_{n}`` as the parser calls them, so messages agree.
"""

from __future__ import annotations

import math
from functools import lru_cache

import onnx
from onnx import AttributeProto as A
from onnx import TensorProto as T

from ..errors import InvalidModelError

_SKIP_DOMAINS = ("com.microsoft", "com.dynashape")
_TYPE_NAMES = {v: k for k, v in A.AttributeType.items()}
_DTYPES = {v: k for k, v in T.DataType.items() if v != T.UNDEFINED}
_LIST_TYPES = {A.FLOATS, A.INTS, A.STRINGS, A.TENSORS, A.GRAPHS, A.SPARSE_TENSORS, A.TYPE_PROTOS}
_LIST_FIELDS = {A.FLOATS: "floats", A.INTS: "ints", A.STRINGS: "strings", A.TENSORS: "tensors",
                A.GRAPHS: "graphs", A.SPARSE_TENSORS: "sparse_tensors", A.TYPE_PROTOS: "type_protos"}

# (op, attribute) -> whether 0 (unset: take the input's type) is allowed
_DTYPE_ATTRS = {("Cast", "to"): False, ("EyeLike", "dtype"): True, ("RandomNormal", "dtype"): True,
                ("RandomUniform", "dtype"): True, ("RandomNormalLike", "dtype"): True,
                ("RandomUniformLike", "dtype"): True, ("Bernoulli", "dtype"): True,
                ("Multinomial", "dtype"): True, ("QuantizeLinear", "output_dtype"): True}

# op -> (attribute, input whose rank counts (None: any input), extra): the attribute is valid in
# [-(rank + neg), rank - 1 + pos], with (neg, pos) = extra
_AXIS_ATTRS = {
    "Concat": ("axis", None, (0, 0)),
    "Gather": ("axis", 0, (0, 0)),
    "GatherElements": ("axis", 0, (0, 0)),
    "ScatterElements": ("axis", 0, (0, 0)),
    "Scatter": ("axis", 0, (0, 0)),
    "Split": ("axis", 0, (0, 0)),
    "SplitToSequence": ("axis", 0, (0, 0)),
    "ArgMax": ("axis", 0, (0, 0)),
    "ArgMin": ("axis", 0, (0, 0)),
    "TopK": ("axis", 0, (0, 0)),
    "Compress": ("axis", 0, (0, 0)),
    "Unique": ("axis", 0, (0, 0)),
    "LpNormalization": ("axis", 0, (0, 0)),
    "LayerNormalization": ("axis", 0, (0, 0)),
    "Flatten": ("axis", 0, (0, 1)),
    "OneHot": ("axis", 0, (1, 1)),
}
_SOFTMAX_LIKE = ("Softmax", "LogSoftmax", "Hardmax")  # checked from opset 13 (before, a 2-D coercion)
# ops whose (older opsets') ``axes`` attribute indexes the input: each axis in [-rank, rank-1]
_AXES_ATTR_OPS = ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2",
                  "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze")


def validate_model(proto: onnx.ModelProto) -> None:
    """Raise InvalidModelError for what would fail (or run wrongly) later; return otherwise."""
    opsets = _check_opsets(proto)
    _Validator(opsets).graph(proto.graph, {}, set(), 0)


def _check_opsets(proto: onnx.ModelProto) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for o in proto.opset_import:
        opsets["" if o.domain == "ai.onnx" else o.domain] = o.version
    newest = onnx.defs.onnx_opset_version()
    v = opsets.get("")
    if v is not None and v > newest:
        raise InvalidModelError(f"the model declares opset {v} of the default domain 'ai.onnx'; the installed "
                                f"onnx package ({onnx.__version__}) supports opsets up to {newest}")
    ml = opsets.get("ai.onnx.ml")
    newest_ml = _newest("ai.onnx.ml")
    if ml is not None and newest_ml is not None and ml > newest_ml:
        raise InvalidModelError(f"the model declares opset {ml} of domain 'ai.onnx.ml'; the installed onnx "
                                f"package ({onnx.__version__}) supports opsets up to {newest_ml}")
    opsets.setdefault("", 1)
    return opsets


def _newest(domain: str) -> int | None:
    try:
        return onnx.defs.C.schema_version_map()[domain][1]
    except Exception:  # noqa: BLE001  an onnx without the map: no check
        return None


@lru_cache(maxsize=4096)
def _schema(op_type: str, domain: str, opset: int):
    if domain.startswith(_SKIP_DOMAINS):
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001  no schema (a custom op, or too new for the opset): no checks
        return None


def _count_nodes(g: onnx.GraphProto) -> int:
    """Nodes of ``g`` and of its subgraphs, as the parser counts them to name unnamed nodes."""
    total = 0
    for n in g.node:
        total += 1 + sum(_count_nodes(sg) for sg in _subgraphs(n))
    return total


def _subgraphs(n: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in n.attribute:
        if a.type == A.GRAPH:
            out.append(a.g)
        elif a.type == A.GRAPHS:
            out.extend(a.graphs)
    return out


def _rank(tp: onnx.TypeProto) -> int | None:
    if tp.HasField("tensor_type") and tp.tensor_type.HasField("shape"):
        return len(tp.tensor_type.shape.dim)
    return None


def _where(name: str, n: onnx.NodeProto) -> str:
    return f"node {name!r} ({n.op_type})"


class _Validator:
    def __init__(self, opsets: dict[str, int]) -> None:
        self.opsets = opsets

    # ---- a graph ---------------------------------------------------------------------------------
    def graph(self, g: onnx.GraphProto, outer_ranks: dict[str, int], outer_names: set[str], counter: int) -> None:
        names, starts = [], []
        for n in g.node:
            names.append(n.name or f"{n.op_type}_{counter}")
            starts.append(counter + 1)
            counter += 1 + sum(_count_nodes(sg) for sg in _subgraphs(n))

        for t in g.initializer:
            _check_tensor(t, f"initializer {t.name!r}")
        local = {t.name for t in g.initializer} | {sp.values.name for sp in g.sparse_initializer}
        local |= {vi.name for vi in g.input}
        _check_order(g, names, local, outer_names)

        ranks = dict(outer_ranks)
        defined = set(local)
        for n in g.node:
            defined.update(o for o in n.output if o)
        for name in defined:  # a name of this graph hides the outer one (the parser looks here first)
            ranks.pop(name, None)
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            r = _rank(vi.type)
            if r is not None:
                ranks[vi.name] = r
        for t in g.initializer:
            ranks[t.name] = len(t.dims)
        for sp in g.sparse_initializer:
            ranks[sp.values.name] = len(sp.dims)
        for n in g.node:
            r = _constant_rank(n)
            if r is not None and n.output and n.output[0]:
                ranks[n.output[0]] = r

        scope = outer_names | defined
        for n, name, start in zip(g.node, names, starts):
            self.node(n, name, ranks)
            for sg in _subgraphs(n):
                self.graph(sg, ranks, scope, start)
                start += _count_nodes(sg)

    # ---- a node ----------------------------------------------------------------------------------
    def node(self, n: onnx.NodeProto, name: str, ranks: dict[str, int]) -> None:
        where = _where(name, n)
        domain = "" if n.domain == "ai.onnx" else n.domain
        attrs: dict[str, onnx.AttributeProto] = {}
        for a in n.attribute:
            if a.name in attrs:
                raise InvalidModelError(f"{where}: attribute {a.name!r} is given twice")
            attrs[a.name] = a
            if a.type == A.TENSOR and not a.ref_attr_name:
                _check_tensor(a.t, f"{where}: attribute {a.name!r}")
        opset = self.opsets.get(domain)
        schema = None if opset is None else _schema(n.op_type, domain, opset)
        if schema is None:
            return
        _check_arity(n, where, schema, opset)
        for aname, spec in schema.attributes.items():
            if spec.required and aname not in attrs:
                raise InvalidModelError(f"{where}: required attribute {aname!r} ({_type_name(spec.type)}) is "
                                        f"missing (opset {opset})")
        for a in attrs.values():
            spec = schema.attributes.get(a.name)
            if spec is None or a.ref_attr_name or a.type == A.UNDEFINED:
                continue  # unknown attributes are resolve_ops's to refuse; refs and untyped, the parser's
            expected = int(spec.type.value) if hasattr(spec.type, "value") else int(spec.type)
            if expected == A.UNDEFINED or a.type == expected:
                continue
            if a.type in _LIST_TYPES and expected in _LIST_TYPES and not getattr(a, _LIST_FIELDS[a.type]):
                continue  # an empty list: what its element type is cannot matter
            raise InvalidModelError(f"{where}: attribute {a.name!r} is {_TYPE_NAMES.get(a.type, a.type)}"
                                    f"{_shown(a)}, but {n.op_type} (opset {opset}) expects "
                                    f"{_type_name(spec.type)}")
        if domain == "":
            _check_values(n, where, attrs, ranks, opset)


def _type_name(t) -> str:
    v = int(t.value) if hasattr(t, "value") else int(t)
    return _TYPE_NAMES.get(v, str(v))


def _shown(a: onnx.AttributeProto) -> str:
    if a.type == A.FLOAT:
        return f" ({a.f!r})"
    if a.type == A.INT:
        return f" ({a.i})"
    if a.type == A.STRING:
        return f" ({a.s.decode('utf-8', errors='replace')!r})"
    if a.type in (A.FLOATS, A.INTS):
        vals = list(a.floats if a.type == A.FLOATS else a.ints)
        return f" ({vals})" if len(vals) <= 8 else ""
    return ""


def _check_arity(n: onnx.NodeProto, where: str, schema, opset: int) -> None:
    ni, no = len(n.input), len(n.output)
    if not schema.min_input <= ni <= schema.max_input:
        raise InvalidModelError(f"{where} has {ni} input(s); {n.op_type} (opset {opset}) expects "
                                f"{_arity(schema.min_input, schema.max_input)}")
    if not schema.min_output <= no <= schema.max_output:
        raise InvalidModelError(f"{where} has {no} output(s); {n.op_type} (opset {opset}) expects "
                                f"{_arity(schema.min_output, schema.max_output)}")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, formal in enumerate(schema.inputs):
        if i < ni and not n.input[i] and formal.option == single:
            raise InvalidModelError(f"{where}: input {i} ({formal.name!r}) is required but given as ''")


def _arity(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    if hi >= 2**31 - 1:
        return f"at least {lo}"
    return f"{lo} to {hi}"


def _constant_rank(n: onnx.NodeProto) -> int | None:
    if n.op_type != "Constant" or n.domain not in ("", "ai.onnx"):
        return None
    for a in n.attribute:
        if a.name == "value" and a.type == A.TENSOR:
            return len(a.t.dims)
        if a.name in ("value_float", "value_int", "value_string"):
            return 0
        if a.name in ("value_floats", "value_ints", "value_strings"):
            return 1
        if a.name == "sparse_value" and a.type == A.SPARSE_TENSOR:
            return len(a.sparse_tensor.dims)
    return None


# ---- attribute values ----------------------------------------------------------------------------
def _check_values(n: onnx.NodeProto, where: str, attrs: dict, ranks: dict[str, int], opset: int) -> None:
    op = n.op_type
    for aname, a in attrs.items():
        key = (op, aname)
        if key in _DTYPE_ATTRS and a.type == A.INT:
            ok = a.i in _DTYPES or (a.i == 0 and _DTYPE_ATTRS[key])
            if not ok:
                raise InvalidModelError(f"{where}: attribute {aname!r} is {a.i}, which is not a TensorProto data "
                                        f"type (expected a TensorProto.DataType: {_dtype_range()})")

    def rank_of(i: int | None) -> tuple[str, int] | None:
        names = [x for x in n.input if x] if i is None else ([n.input[i]] if i < len(n.input) and n.input[i] else [])
        for x in names:
            if x in ranks:
                return x, ranks[x]
        return None

    if op == "Transpose" and "perm" in attrs and attrs["perm"].type == A.INTS and attrs["perm"].ints:
        perm = list(attrs["perm"].ints)
        k = len(perm)
        known = rank_of(0)
        if sorted(p + k if p < 0 else p for p in perm) != list(range(k)):
            raise InvalidModelError(f"{where}: attribute 'perm' is {perm}, which is not a permutation of "
                                    f"{list(range(k))}")
        if known is not None and known[1] != k:
            raise InvalidModelError(f"{where}: attribute 'perm' is {perm} ({k} axes), but input {known[0]!r} "
                                    f"has rank {known[1]}")

    spec = _AXIS_ATTRS.get(op)
    if op in _SOFTMAX_LIKE and opset >= 13:
        spec = ("axis", 0, (0, 0))
    if spec is not None and spec[0] in attrs and attrs[spec[0]].type == A.INT:
        aname, idx, (neg, pos) = spec
        known = rank_of(idx)
        if known is not None:
            _axis_in_range(where, aname, [attrs[aname].i], known, neg, pos)
    if (op in _AXES_ATTR_OPS or op == "Unsqueeze") and "axes" in attrs and attrs["axes"].type == A.INTS:
        axes = list(attrs["axes"].ints)
        known = rank_of(0)
        if axes and known is not None:
            extra = len(axes) if op == "Unsqueeze" else 0  # Unsqueeze's axes index the output
            _axis_in_range(where, "axes", axes, known, extra, extra)


def _axis_in_range(where: str, aname: str, axes: list[int], known: tuple[str, int], neg: int, pos: int) -> None:
    value, rank = known
    lo, hi = -(rank + neg), rank - 1 + pos
    if hi < lo or (rank == 0 and neg == pos == 0):
        return  # a scalar: leave it to the op
    bad = [a for a in axes if not lo <= a <= hi]
    if bad:
        shown = axes[0] if len(axes) == 1 and aname == "axis" else axes
        raise InvalidModelError(f"{where}: attribute {aname!r} is {shown}, outside [{lo}, {hi}] for input "
                                f"{value!r} of rank {rank}")


def _dtype_range() -> str:
    lo, hi = min(_DTYPES), max(_DTYPES)
    return f"{lo} ({_DTYPES[lo]}) to {hi} ({_DTYPES[hi]}), e.g. 7 (INT64)"


# ---- tensors -------------------------------------------------------------------------------------
_SUB_BYTE_BITS = {T.INT4: 4, T.UINT4: 4, T.FLOAT4E2M1: 4}
for _name, _bits in (("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(T, _name):
        _SUB_BYTE_BITS[getattr(T, _name)] = _bits
_INT32_PACKED = {k: 8 // b for k, b in _SUB_BYTE_BITS.items() if b in (2, 4)}  # elements per int32_data entry


def _check_tensor(t: onnx.TensorProto, what: str) -> None:
    dims = list(t.dims)
    if t.data_type not in _DTYPES:
        raise InvalidModelError(f"{what} has data type {t.data_type}, which is not a TensorProto data type")
    if any(d < 0 for d in dims):
        raise InvalidModelError(f"{what} declares shape {dims}, with a negative dimension")
    if t.data_location == T.EXTERNAL or t.HasField("segment"):
        return  # the data lies elsewhere (read by the loader, which checks its size)
    n = math.prod(dims)
    dt = t.data_type
    if t.HasField("raw_data"):
        nbytes = len(t.raw_data)
        bits = _SUB_BYTE_BITS.get(dt)
        if bits is None:
            try:
                item = onnx.helper.tensor_dtype_to_np_dtype(dt).itemsize
            except Exception:  # noqa: BLE001  a type without a numpy dtype: no check
                return
            if nbytes == n * item:
                return
            held = f"{nbytes // item} elements ({nbytes} bytes of raw data)" if nbytes % item == 0 else \
                f"{nbytes} bytes of raw data, not a whole number of {item}-byte elements"
            expect = f"{n * item} bytes"
        else:
            if nbytes == (n * bits + 7) // 8:
                return
            held = f"{nbytes * 8 // bits} elements ({nbytes} bytes of raw data)"
            expect = f"{(n * bits + 7) // 8} bytes"
        raise InvalidModelError(f"{what} declares shape {dims} ({n} elements, {expect}) but holds {held}")
    try:
        field = onnx.helper.tensor_dtype_to_field(dt)
    except Exception:  # noqa: BLE001
        return
    count = len(getattr(t, field))
    if dt in (T.COMPLEX64, T.COMPLEX128):
        want, per = 2 * n, 0.5
    elif dt in _INT32_PACKED:
        k = _INT32_PACKED[dt]
        want, per = (n + k - 1) // k, k
    else:
        want, per = n, 1
    if count != want:
        raise InvalidModelError(f"{what} declares shape {dims} ({n} elements) but holds {int(count * per)} "
                                f"elements (in {field})")


# ---- node order ----------------------------------------------------------------------------------
def _free_names(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from its enclosing scopes."""
    local = {t.name for t in g.initializer} | {sp.values.name for sp in g.sparse_initializer}
    local |= {vi.name for vi in g.input}
    for n in g.node:
        local.update(o for o in n.output if o)
    free = set()
    for n in g.node:
        free.update(i for i in n.input if i and i not in local)
        for sg in _subgraphs(n):
            free.update(x for x in _free_names(sg) if x not in local)
    return free


def _reads(n: onnx.NodeProto) -> list[str]:
    names = [i for i in n.input if i]
    for sg in _subgraphs(n):
        names.extend(sorted(_free_names(sg)))
    return names


def _check_order(g: onnx.GraphProto, names: list[str], local: set[str], outer: set[str]) -> None:
    """Nodes read only what earlier nodes (or inputs, initializers, outer scopes) produce; when
    not, say whether the nodes form a cycle (naming it) or are only out of order."""
    producer: dict[str, int] = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if o and o not in local:
                producer.setdefault(o, i)
    seen = set(local)
    late = None
    reads = []
    for i, n in enumerate(g.node):
        r = [x for x in _reads(n) if x not in local and x not in outer]
        reads.append(r)
        if late is None:
            for x in r:
                if x not in seen and producer.get(x, -1) >= i:
                    late = (i, x)
                    break
        seen.update(o for o in n.output if o)
    if late is None:
        return
    deps = [{producer[x] for x in r if x in producer} for r in reads]
    users: list[list[int]] = [[] for _ in g.node]
    indeg = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, k in enumerate(indeg) if k == 0]
    while ready:
        j = ready.pop()
        for i in users[j]:
            indeg[i] -= 1
            if indeg[i] == 0:
                ready.append(i)
    left = {i for i, k in enumerate(indeg) if k > 0}
    label = g.name or "main"
    if not left:
        i, x = late
        j = producer[x]
        raise InvalidModelError(f"node {names[i]!r} ({g.node[i].op_type}) of graph {label!r} reads {x!r}, which "
                                f"node {names[j]!r} ({g.node[j].op_type}) produces after it: the nodes must be "
                                f"in topological order")
    # every node left waits on another node left: walk back until a node repeats
    start = min(left)
    path, pos = [start], {start: 0}
    while True:
        nxt = min(d for d in deps[path[-1]] if d in left)
        if nxt in pos:
            cycle = path[pos[nxt]:]
            break
        pos[nxt] = len(path)
        path.append(nxt)
    cycle.reverse()  # data flows from a producer to its reader
    cycle.append(cycle[0])
    shown = " -> ".join(f"{names[i]!r} ({g.node[i].op_type})" for i in cycle)
    raise InvalidModelError(f"graph {label!r} has a cycle: nodes {shown}; each reads what the one before "
                            f"it produces")
