"""dynashape/options.py is the one table of what a user may set: every field of SessionOptions is
in it with a doc and a cost, its default is accepted by its own check and by InferenceSession, and
the session accepts exactly these names as keywords. The environment variables the package reads
(found in its syntax trees) are exactly those the fields and ENVIRONMENT document, each with who
it is for."""

from __future__ import annotations

import ast
import copy
import pathlib
import pickle
from dataclasses import fields

import numpy as np
import pytest

import dynashape
from dynashape import errors
from dynashape.errors import OptionsError
from dynashape.options import (
    ENVIRONMENT,
    OPTION_FIELDS,
    OPTION_NAMES,
    ORT_FIELDS,
    ROLES,
    Options,
    default_of,
    describe,
)
from tests.helpers import add_chain

PACKAGE = pathlib.Path(dynashape.__file__).parent


@pytest.mark.parametrize("f", fields(Options), ids=[f.name for f in fields(Options)])
def test_each_option_is_documented_and_its_default_accepted(f):
    assert len(f.metadata["doc"]) > 20 and len(f.metadata["cost"]) >= 5, "each field says what it does and costs"
    assert f.metadata["expect"].ok(f.default), "the default passes the field's own check"
    sess = dynashape.InferenceSession(add_chain(2), **{f.name: f.default})
    x, b = np.ones((3, 4), np.float32), np.full((1, 4), 0.5, np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "b": b})[0], x + 1.0)
    so = dynashape.SessionOptions()  # and set through SessionOptions
    setattr(so, f.name, f.default)
    np.testing.assert_allclose(dynashape.InferenceSession(add_chain(2), so).run(None, {"x": x, "b": b})[0], x + 1.0)


def test_every_field_of_session_options_is_in_the_table():
    so = dynashape.SessionOptions()
    held = {n for n in vars(so) if not n.startswith("_")}
    assert held == set(ORT_FIELDS), "an attribute of SessionOptions that the table does not document"
    methods = {n for n in dir(type(so)) if not n.startswith("_")}
    assert methods == {"options", "add_free_dimension_override_by_name", "add_free_dimension_override_by_denotation",
                       "add_session_config_entry", "get_session_config_entry"}
    assert not set(OPTION_FIELDS) & set(ORT_FIELDS), "a name in both tables"
    for name, f in {**OPTION_FIELDS, **ORT_FIELDS}.items():
        assert getattr(so, name) == default_of(f)
        assert f.metadata["expect"].ok(default_of(f)), name
        assert len(f.metadata["doc"]) > 10, name
    assert so.options() == {}, "a field left alone reaches no session"


def test_session_options_refuse_unknown_fields_and_bad_values():
    so = dynashape.SessionOptions()
    with pytest.raises(errors.UnknownOptionError, match=r"no field 'static_impl'.*did you mean static_impls"):
        so.static_impl = "off"
    with pytest.raises(AttributeError):  # getattr(so, name, default) keeps working for code that probes
        so.no_such_field  # noqa: B018
    assert getattr(so, "no_such_field", 7) == 7
    cases = [("static_impls", "sometimes", "'auto', 'async', 'sync', 'off'"), ("threads", -1, "int >= 0"),
             ("fusion", "yes", "True or False"), ("kv_bucket", 20, "multiple of 16"),
             ("log_severity_level", 7, "-1 to 4"), ("graph_optimization_level", "all", "GraphOptimizationLevel"),
             ("intra_op_num_threads", 1.5, "int"), ("enable_mem_pattern", 1, "True or False")]
    for name, value, expected in cases:
        with pytest.raises(OptionsError, match=rf"SessionOptions\.{name} = .*expected .*{expected}"):
            setattr(so, name, value)
        assert getattr(so, name) == default_of({**OPTION_FIELDS, **ORT_FIELDS}[name]), "a refused value is not kept"
    so.static_impls = "off"
    assert so.options() == {"static_impls": "off"} and "static_impls='off'" in repr(so)
    del so.static_impls
    assert so.static_impls == "auto" and so.options() == {}
    assert dynashape.SessionOptions(threads=1, fusion=False).options() == {"threads": 1, "fusion": False}
    so.intra_op_num_threads, so.fusion = np.int64(3), np.bool_(False)  # numpy scalars, as pybind takes them
    assert type(so.intra_op_num_threads) is int and so.fusion is False
    so.static_impls, so.intra_op_num_threads = "sync", 2
    del so.fusion
    for twin in (copy.deepcopy(so), pickle.loads(pickle.dumps(so))):  # a copy carries both kinds of field
        assert twin.options() == {"static_impls": "sync"} and twin.intra_op_num_threads == 2


def test_a_keyword_wins_over_the_field_and_the_field_over_onnxruntimes():
    from dynashape.session_options import resolve
    so = dynashape.SessionOptions()
    so.graph_optimization_level = dynashape.GraphOptimizationLevel.ORT_DISABLE_ALL  # fusion=False
    so.intra_op_num_threads = 2
    assert resolve(so, {}) == {"fusion": False, "threads": 2}
    so.fusion = True  # dynashape's field wins over what onnxruntime's stands for
    so.static_impls = "off"
    assert resolve(so, {"static_impls": "sync"}) == {"fusion": True, "threads": 2, "static_impls": "sync"}
    so.add_free_dimension_override_by_name("N", 3)
    so.dim_params = {"M": dynashape.Dimension(1, 4)}
    dims = resolve(so, {"dim_params": {"N": dynashape.Dimension(2, 2)}})["dim_params"]
    assert dims["M"] == dynashape.Dimension(1, 4) and dims["N"] == dynashape.Dimension(2, 2)
    so.use_deterministic_compute = True
    assert resolve(so, {})["deterministic"] is True


# environment variables ------------------------------------------------------------------------
# Uses of os.environ that read no single variable: (module, what the line does), with why.
WHOLE_ENVIRONMENT = {
    # the compile worker inherits the environment, with one thread (impls/compile_process.py)
    ("impls/compile_process.py", "dict(os.environ, OMP_NUM_THREADS='1')"),
    # the raw mapping behind os.environ, read with the encoded key of DYNASHAPE_NATIVE, which the
    # same module also reads through os.environ.get (ops/native.py: a faster read per call)
    ("ops/native.py", "getattr(os.environ, '_data', None)"),
    ("ops/native.py", "hasattr(os.environ, 'encodekey')"),
}


def _is_environ(node) -> bool:
    """os.environ, or environ imported from os."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
             and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ"))


def _is_getenv(node) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr == "getenv" and isinstance(node.value, ast.Name)
             and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "getenv"))


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's top-level NAME = "literal" assignments (a variable's name kept in a constant)."""
    out = {}
    for st in tree.body:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
        value = getattr(st, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


def environment_reads(source: str, module: str) -> tuple[set[str], list[str]]:
    """The variables a module's source reads: os.environ.get(K), os.environ[K], K in os.environ,
    os.getenv(K), os.environ.encodekey(K), K a literal or a module constant; and the uses of the
    environment it cannot name (neither a read of a known variable nor in WHOLE_ENVIRONMENT)."""
    tree = ast.parse(source)
    consts = _constants(tree)
    names, unknown, seen = set(), [], set()

    def name_of(arg):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return consts.get(arg.id)
        return None

    def read(key_node, use):
        name = name_of(key_node)
        if name is None:
            unknown.append(f"{module}: {ast.unparse(use)}")
        else:
            names.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_environ(node.func.value) \
                and node.func.attr in ("get", "encodekey", "__getitem__", "__contains__") and node.args:
            read(node.args[0], node)
            seen.add(id(node.func.value))
        elif isinstance(node, ast.Call) and _is_getenv(node.func) and node.args:
            read(node.args[0], node)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            read(node.slice, node)
            seen.add(id(node.value))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators) \
                and all(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
            read(node.left, node)
            seen.update(id(c) for c in node.comparators)
    for node in ast.walk(tree):  # any other use of os.environ: only the listed whole-environment ones
        if isinstance(node, ast.Call) and any(_is_environ(a) and id(a) not in seen for a in node.args):
            seen.update(id(a) for a in node.args)
            if (module, ast.unparse(node)) not in WHOLE_ENVIRONMENT:
                unknown.append(f"{module}: {ast.unparse(node)}")
    for node in ast.walk(tree):
        if _is_environ(node) and id(node) not in seen:
            unknown.append(f"{module}: os.environ used at line {node.lineno}")
    return names, unknown


def package_environment_reads() -> tuple[set[str], list[str]]:
    names, unknown = set(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        n, u = environment_reads(path.read_text(), path.relative_to(PACKAGE).as_posix())
        names |= n
        unknown += u
    return names, unknown


def documented_environment() -> set[str]:
    assert all(role in ROLES and len(doc) > 20 for role, doc in ENVIRONMENT.values())
    from_options = {f.metadata["env"] for f in fields(Options) if f.metadata.get("env")}
    assert not from_options & set(ENVIRONMENT), "documented twice: as an option's and in ENVIRONMENT"
    return from_options | set(ENVIRONMENT)


def test_every_environment_variable_read_is_documented_and_every_documented_one_read():
    read, unknown = package_environment_reads()
    assert not unknown, f"environment uses whose variable the test cannot name: {unknown}"
    documented = documented_environment()
    assert not read - documented, f"read but documented nowhere in dynashape/options.py: {sorted(read - documented)}"
    assert not documented - read, f"documented but read nowhere: {sorted(documented - read)}"
    assert all(name in describe() for name in documented)


def test_the_environment_scan_finds_every_form_of_read():
    # the scan itself, on a module that reads in each form: each is found, and what it cannot name
    # (a computed key, the environment handed on whole) is reported
    source = """
import os
from os import environ, getenv
KEY = "V_CONST"
a = os.environ.get("V_GET", "1")
b = os.environ["V_ITEM"]
c = "V_IN" in os.environ
d = os.getenv("V_GETENV")
e = os.environ.get(KEY)
f = environ.get("V_BARE")
g = getenv("V_BARE_GETENV")
h = os.environ.encodekey("V_ENCODED")
i = os.environ.get("V_" + str(a))
j = dict(os.environ, X="1")
k = os.environ
"""
    names, unknown = environment_reads(source, "m.py")
    assert names == {"V_GET", "V_ITEM", "V_IN", "V_GETENV", "V_CONST", "V_BARE", "V_BARE_GETENV", "V_ENCODED"}
    assert unknown == ["m.py: os.environ.get('V_' + str(a))", "m.py: dict(os.environ, X='1')",
                       "m.py: os.environ used at line 15"]


def test_the_session_accepts_exactly_these_names():
    with pytest.raises(OptionsError, match="known options are"):
        dynashape.InferenceSession(add_chain(2), speed="max")
    for name in ("memory_pool", "inplace_concat", "decided_ifs", "malloc_tuning", "allow_tf32"):
        with pytest.raises(OptionsError, match=rf"{name}='no': expected True or False"):  # bool('no') is True
            dynashape.InferenceSession(add_chain(2), **{name: "no"})
    assert "max_buffer_bytes" in OPTION_NAMES and "threads" in OPTION_NAMES
    assert all(name in describe() for name in OPTION_NAMES)


def test_precompile_traces_at_load_and_is_validated():
    from onnx import TensorProto as TP
    from onnx import helper

    g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "S"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "S"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    lazy = dynashape.InferenceSession(m, precompile=False)
    assert len(lazy.compiled.specs) == 0
    generic = dynashape.InferenceSession(m)  # "auto" on the CPU: the generic specialization only
    assert len(generic.compiled.specs) == 1 and generic.compiled.stats["specializations_precompiled"] == 1
    eager = dynashape.InferenceSession(m, precompile=True)
    traced = eager.compiled.stats["shape_program_traces"]
    assert traced >= 1 and eager.compiled.stats["specializations_precompiled"] >= 2
    for shape in [(3, 5), (1, 4), (6, 1)]:  # served by what was traced at load: no trace at the call
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(eager.run(None, {"x": x})[0], x * x)
    assert eager.compiled.stats["shape_program_traces"] == traced
    with pytest.raises(OptionsError, match="precompile"):
        dynashape.InferenceSession(m, precompile="sometimes")


def test_precompile_retries_image_sides_at_multiples_of_32():
    """A model whose sides must be multiples of its stride refuses the generic primes: the sides are
    traced again at 32 times them, and a call at another multiple of 32 runs without a trace."""
    from onnx import TensorProto as TP
    from onnx import helper

    # a 2x2 pool of stride 2, twice, then the input's quarter-size Resize back, added: the sides
    # must be multiples of 4 for the shapes to match
    scales = helper.make_tensor("sc", TP.FLOAT, [4], [1.0, 1.0, 4.0, 4.0])
    nodes = [helper.make_node("MaxPool", ["x"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p2", "", "sc"], ["r"], mode="nearest"),
             helper.make_node("Add", ["x", "r"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 2, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [scales])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = dynashape.InferenceSession(m)
    st = sess.compiled.stats
    assert st["precompile_failures"] == 1 and st["specializations_precompiled"] == 1
    traced = st["shape_program_traces"]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 2, 64, 96)).astype(np.float32)
    import onnxruntime as ort
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want)
    assert sess.compiled.stats["shape_program_traces"] == traced


def test_precompile_on_the_cpu_leaves_a_decoder_alone():
    """A decoder fed its past starts with a prompt and one-token steps, not the generic shape: the
    CPU's default traces nothing at load for it (True still does)."""
    from onnx import TensorProto as TP
    from onnx import helper

    g = helper.make_graph([helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=1)], "g",
                          [helper.make_tensor_value_info("past_key", TP.FLOAT, [1, "P", 4]),
                           helper.make_tensor_value_info("k", TP.FLOAT, [1, "S", 4])],
                          [helper.make_tensor_value_info("present_key", TP.FLOAT, [1, "T", 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert "specializations_precompiled" not in dynashape.InferenceSession(m).compiled.stats
    assert dynashape.InferenceSession(m, precompile=True).compiled.stats["specializations_precompiled"] >= 1
