"""Memory dependencies (basic and out-of-order passes) and the memory pool built on them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

from dynashape.compile import compile_graph
from dynashape.compile.memory_deps import (
    BasicMemoryDeps,
    OwnedValue,
    basic_memory_dependencies,
    out_of_order_memory_dependencies,
)
from dynashape.frontend.options import ParseOptions
from dynashape.frontend.parse import parse_model, prepare_proto
from dynashape.memory.pool import MemoryPool

# ---- helpers ------------------------------------------------------------------------------------


def compiled(nodes, inputs, outputs, inits=(), opset=18):
    """Compile a model given as onnx.helper nodes; inputs/outputs are (name, shape) pairs."""
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in outputs],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return compile_graph(parse_model(prepare_proto(m), ParseOptions())).graph


def flat_shape():
    return onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat")


def node_index(graph, out_name):
    return next(i for i, n in enumerate(graph.nodes) if any(v is not None and v.name == out_name for v in n.outputs))


class FakeEngine:
    """Hands out slices of one arena and reuses freed bytes first-fit, as a real allocator reuses
    addresses: a value left on memory the pool gave back shows up as an overlap (or a wrong
    result) instead of going unnoticed on a tensor of its own. Records what it was asked."""

    ALIGN = 16

    def __init__(self, arena_bytes: int = 1 << 20):
        self.allocated: list[tuple[int, torch.dtype, str]] = []
        self.released: list[int] = []
        self.arena = torch.empty(arena_bytes, dtype=torch.uint8)
        self.free_list: list[tuple[int, int]] = [(0, arena_bytes)]  # (offset, size), by offset
        self.live: dict[int, int] = {}  # offset in the arena -> size

    def allocate(self, numel, dtype, alloc_type="device"):
        self.allocated.append((numel, dtype, alloc_type))
        size = -(-max(numel * dtype.itemsize, 1) // self.ALIGN) * self.ALIGN
        for i, (off, free) in enumerate(self.free_list):
            if free >= size:
                self.free_list[i:i + 1] = [(off + size, free - size)] if free > size else []
                self.live[off] = size
                return self.arena[off:off + numel * dtype.itemsize].view(dtype)
        raise MemoryError("FakeEngine arena exhausted")

    def release(self, buf):
        self.released.append(buf.numel() * buf.element_size())
        off = buf.storage_offset() * buf.element_size()
        size = self.live.pop(off)
        self.free_list = sorted([*self.free_list, (off, size)])
        merged = []
        for o, n in self.free_list:  # coalesce neighbours so big requests can reuse them
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free_list = merged


def follow_moves(pool, held: dict) -> None:
    """Keep ``held`` (requester -> its tensor) pointing at the memory the pool moved it to."""
    def moved(user, record):
        old = held[user]
        held[user] = record[:old.numel() * old.element_size()].view(old.dtype)
    pool.on_move = moved


def interval_deps(intervals: dict[str, tuple[int, int]]) -> BasicMemoryDeps:
    """Basic deps from explicit live intervals: conflicts are interval overlaps."""
    owned = {n: OwnedValue(n, a, b, True) for n, (a, b) in intervals.items()}
    return BasicMemoryDeps(owned, {n: frozenset({n}) for n in owned}, 1 + max(b for _, b in intervals.values()))


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def overlap(r1, r2) -> bool:
    return r1[0] < r2[1] and r2[0] < r1[1]


# ---- the basic pass -----------------------------------------------------------------------------


def test_chain_neighbours_conflict_and_distant_values_do_not():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
                  helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])],
                 [("x", [4])], [("y", [4])])
    d = basic_memory_dependencies(g)
    assert d.roots == ("a", "b", "c")  # y is a graph output: the caller gets it, no pooling
    assert [d.live_interval(n) for n in d.roots] == [(0, 1), (1, 2), (2, 3)]
    assert d.conflicts("a", "b") and d.conflicts("b", "c")  # input and output of one node
    assert not d.conflicts("a", "c")
    assert not d.conflicts("a", "a")
    assert d.conflict_set("b") == {"a", "c"}
    with pytest.raises(KeyError, match="owns no memory"):
        d.conflicts("a", "y")


def test_views_extend_the_lifetime_of_their_root():
    # a is read only through the view chain r1 -> r2, at the last Add: it must outlive b
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]),
                  helper.make_node("Reshape", ["a", "flat"], ["r1"]),
                  helper.make_node("Identity", ["r1"], ["r2"]),
                  helper.make_node("Tanh", ["x"], ["b"]),
                  helper.make_node("Neg", ["b"], ["c"]),
                  helper.make_node("Add", ["r2", "c"], ["y"])],
                 [("x", [4])], [("y", [4])], inits=[flat_shape()])
    d = basic_memory_dependencies(g)
    assert set(d.owned) == {"a", "b", "c"}  # views own nothing
    assert d.aliases_of("r1") == d.aliases_of("r2") == {"a"}
    assert d.live_interval("a") == (node_index(g, "a"), node_index(g, "y"))
    assert d.conflicts("a", "b") and d.conflicts("a", "c")
    assert d.conflicts("b", "a")  # symmetric
    with pytest.raises(KeyError):
        d.live_interval("r1")


def test_a_view_that_is_a_graph_output_keeps_its_root_to_the_end():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]),
                  helper.make_node("Reshape", ["a", "flat"], ["y"]),
                  helper.make_node("Tanh", ["x"], ["b"]),
                  helper.make_node("Neg", ["b"], ["z"])],
                 [("x", [4])], [("y", [4]), ("z", [4])], inits=[flat_shape()])
    d = basic_memory_dependencies(g)
    assert d.live_interval("a") == (0, len(g.nodes))  # read when the outputs are collected
    assert d.conflicts("a", "b")


def test_outputs_of_one_node_conflict_even_when_unused():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]),
                  helper.make_node("Split", ["a"], ["s0", "s1"], axis=0, num_outputs=2),
                  helper.make_node("Neg", ["s0"], ["y"])],
                 [("x", [4])], [("y", [2])])
    d = basic_memory_dependencies(g)
    i = node_index(g, "s0")
    assert d.live_interval("s1") == (i, i)  # never read, but written by the Split
    assert d.conflicts("s0", "s1") and d.conflicts("a", "s1") and d.conflicts("a", "s0")


def test_shape_of_values_and_constants_own_no_memory():
    idx = onnx.numpy_helper.from_array(np.array([0], np.int64), "idx")
    g = compiled([helper.make_node("Shape", ["x"], ["s"]),
                  helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
                  helper.make_node("Cast", ["d"], ["df"], to=TP.FLOAT),
                  helper.make_node("Mul", ["x", "df"], ["y"])],
                 [("x", ["N"])], [("y", ["N"])], inits=[idx])
    d = basic_memory_dependencies(g)
    assert "s" not in d.owned and "d" not in d.owned and "idx" not in d.owned
    assert "df" in d.owned


def test_a_value_written_into_a_concat_storage_starts_the_storage_lifetime():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]),
                  helper.make_node("Neg", ["x"], ["b"]),
                  helper.make_node("Tanh", ["x"], ["c"]),
                  helper.make_node("Concat", ["a", "c"], ["cat"], axis=0),
                  helper.make_node("Sigmoid", ["cat"], ["y"])],
                 [("x", [4])], [("y", [8]), ("b", [4])])
    plain = basic_memory_dependencies(g)
    assert plain.live_interval("cat") == (3, 4)
    merged = basic_memory_dependencies(g, written_into={"a": "cat", "c": "cat"})
    # a is written into cat's storage at node 0: the storage lives from there (a itself, when
    # it has no slot and a buffer of its own, keeps its interval)
    assert merged.live_interval("cat") == (0, 4) and merged.live_interval("a") == (0, 3)


def test_fresh_result_ops_own_memory_but_bypass_the_pool():
    # LeakyRelu's kernel returns torch's result (writes_out False); NonZero is data-dependent
    g = compiled([helper.make_node("LeakyRelu", ["x"], ["a"]),
                  helper.make_node("NonZero", ["a"], ["nz"]),
                  helper.make_node("Cast", ["nz"], ["c"], to=TP.FLOAT),
                  helper.make_node("Sigmoid", ["c"], ["y"])],
                 [("x", [4])], [("y", None)])
    d = basic_memory_dependencies(g)
    assert not d.is_pooled("a") and not d.is_pooled("nz")
    assert d.is_pooled("c")
    assert d.roots == ("c",)
    assert d.conflicts("nz", "c")  # still part of the relation


def test_a_sequence_holds_its_tensors_alive():
    # SequenceAt may hand back a itself: a lives as long as what comes out of the sequence is read
    g = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["a"]),
         helper.make_node("SequenceConstruct", ["a"], ["seq"]),
         helper.make_node("SequenceAt", ["seq", "zero"], ["t"]),
         helper.make_node("Tanh", ["x"], ["b"]),
         helper.make_node("Add", ["t", "b"], ["y"])],
        "seq", [helper.make_tensor_value_info("x", TP.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [4])],
        initializer=[onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    graph = compile_graph(parse_model(prepare_proto(m), ParseOptions())).graph
    d = basic_memory_dependencies(graph)
    assert d.live_interval("a")[1] == node_index(graph, "y")
    assert d.conflicts("a", "b")
    assert not d.is_pooled("t") and "a" in d.aliases_of("t")


def test_subgraph_reads_count_for_the_outer_lifetime():
    # the If's branches read outer a; its result may be a itself (Identity in a branch)
    then_g = helper.make_graph([helper.make_node("Identity", ["a"], ["o1"])], "then", [],
                               [helper.make_tensor_value_info("o1", TP.FLOAT, [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", TP.FLOAT, [4])])
    g = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["a"]),
         helper.make_node("Tanh", ["x"], ["b"]),
         helper.make_node("If", ["cond"], ["o"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Neg", ["b"], ["c"]),
         helper.make_node("Add", ["o", "c"], ["y"])],
        "ifm", [helper.make_tensor_value_info("x", TP.FLOAT, [4]), helper.make_tensor_value_info("cond", TP.BOOL, [])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    graph = compile_graph(parse_model(prepare_proto(m), ParseOptions())).graph
    d = basic_memory_dependencies(graph)
    assert d.live_interval("a") == (node_index(graph, "a"), node_index(graph, "y"))
    assert d.conflicts("a", "c")
    assert not d.is_pooled("o") and d.aliases_of("o") == {"a", "o"}


def test_a_kernel_without_out_may_return_its_input():
    # an output of unknown dtype: the runtime calls the kernel with out=None, and a same-type Cast
    # then returns its input tensor itself
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["t"], to=TP.FLOAT),
                  helper.make_node("Tanh", ["x"], ["b"]), helper.make_node("Add", ["t", "b"], ["y"])],
                 [("x", [3])], [("y", [3])])
    assert basic_memory_dependencies(g).live_interval("a") == (0, 1)
    g.values["t"].elem_type = 0
    d = basic_memory_dependencies(g)
    assert not d.is_pooled("t") and d.aliases_of("t") == {"a", "t"}
    assert d.live_interval("a") == (0, node_index(g, "y")) and d.conflicts("a", "b")


# ---- the out-of-order pass ----------------------------------------------------------------------


def two_branches():
    #   x -> a -> a2 \
    #   x -> b -> b2 -> y = a2 + b2
    return compiled([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["a2"]),
                     helper.make_node("Tanh", ["x"], ["b"]), helper.make_node("Neg", ["b"], ["b2"]),
                     helper.make_node("Add", ["a2", "b2"], ["y"])],
                    [("x", [4])], [("y", [4])])


def test_parallel_branches_conflict_only_out_of_order():
    g = two_branches()
    basic, ooo = basic_memory_dependencies(g), out_of_order_memory_dependencies(g)
    assert [n.outputs[0].name for n in g.nodes] == ["a", "a2", "b", "b2", "y"]
    # in order, a is dead before b is written; run concurrently, they may be live together
    assert not basic.conflicts("a", "b") and ooo.conflicts("a", "b")
    assert not basic.conflicts("a", "b2") and ooo.conflicts("a", "b2")
    assert basic.conflicts("a2", "b") and ooo.conflicts("a2", "b")
    assert ooo.live_interval("a") == basic.live_interval("a")


def test_out_of_order_allows_reuse_along_a_path():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
                  helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])],
                 [("x", [4])], [("y", [4])])
    ooo = out_of_order_memory_dependencies(g)
    assert not ooo.conflicts("a", "c")  # every reader of a is an ancestor of c's producer
    assert ooo.conflicts("a", "b") and ooo.conflicts("b", "c")


def test_out_of_order_scales_to_thousands_of_nodes():
    # a long chain with a skip connection every 10 nodes: 2000 nodes
    nodes, prev = [], "x"
    for i in range(2000):
        ins = [prev, f"v{i - 10}"] if i >= 10 and i % 10 == 0 else [prev]
        nodes.append(helper.make_node("Add" if len(ins) == 2 else "Neg", ins, [f"v{i}"]))
        prev = f"v{i}"
    nodes.append(helper.make_node("Neg", [prev], ["y"]))
    g = compiled(nodes, [("x", [4])], [("y", [4])])
    ooo, basic = out_of_order_memory_dependencies(g), basic_memory_dependencies(g)
    assert len(ooo.roots) == 2000
    assert ooo.conflicts("v10", "v20")  # v10 is read by the Add at 20
    assert not ooo.conflicts("v11", "v13")
    assert ooo.conflict_set("v1000") == basic.conflict_set("v1000")  # a chain has no concurrency


# ---- the pool -----------------------------------------------------------------------------------


def test_pool_takes_the_smallest_record_that_fits():
    deps = interval_deps({"a": (0, 1), "b": (0, 1), "c": (0, 1), "d": (2, 3), "e": (2, 3)})
    pool = MemoryPool(FakeEngine(), deps)
    bufs = {n: pool.get(n, k, torch.uint8) for n, k in (("a", 100), ("b", 400), ("c", 200))}
    assert pool.stats()["new_records"] == 3
    d = pool.get("d", 150, torch.uint8, dynamic=False)
    assert d.data_ptr() == bufs["c"].data_ptr()  # 200 bytes: the smallest of those >= 150
    e = pool.get("e", 90, torch.uint8)
    assert e.data_ptr() == bufs["a"].data_ptr()
    st_ = pool.stats()
    assert st_["reuses"] == 2 and st_["records"] == 3 and st_["record_bytes"] == 700


def test_conflicting_requesters_never_share():
    deps = interval_deps({"a": (0, 2), "b": (1, 3), "c": (3, 4)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a = pool.get("a", 64, torch.float32)
    b = pool.get("b", 16, torch.float32)  # a's record would fit: it conflicts
    assert not overlap(byte_range(a), byte_range(b))
    c = pool.get("c", 60, torch.float32)  # conflicts with b only: shares a's record
    assert c.data_ptr() == a.data_ptr()
    assert [x[0] for x in eng.allocated] == [256, 64]
    assert all(x[1] is torch.uint8 for x in eng.allocated)


def test_dynamic_requests_must_use_more_than_half_of_the_record():
    deps = interval_deps({"big": (0, 1), "x": (2, 3), "y": (2, 3), "s": (2, 3), "d": (4, 5)})
    pool = MemoryPool(FakeEngine(), deps)
    big = pool.get("big", 1000, torch.uint8)
    x = pool.get("x", 500, torch.uint8)
    assert x.data_ptr() != big.data_ptr()  # exactly half: not more
    assert pool.get("y", 501, torch.uint8).data_ptr() == big.data_ptr()
    assert pool.stats()["new_records"] == 2

    pool = MemoryPool(FakeEngine(), deps)
    big = pool.get("big", 1000, torch.uint8)
    # a static request may pin any record that fits; a dynamic one of the same size may not
    assert pool.get("s", 100, torch.uint8, dynamic=False).data_ptr() == big.data_ptr()
    assert pool.get("d", 100, torch.uint8).data_ptr() != big.data_ptr()


def test_release_then_reuse_and_dtype_views():
    deps = interval_deps({"a": (0, 1), "b": (0, 1)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a = pool.get("a", 10, torch.float32)
    assert a.dtype == torch.float32 and a.shape == (10,)
    with pytest.raises(ValueError):
        pool.release("a", torch.empty(10))  # not its record
    with pytest.raises(KeyError):
        pool.release("b", a)  # b holds nothing
    pool.release("a", a.view(2, 5))
    b = pool.get("b", 5, torch.int64)  # same 40 bytes, another dtype
    assert b.dtype == torch.int64 and b.numel() == 5 and b.data_ptr() == a.data_ptr()
    assert len(eng.allocated) == 1 and pool.stats()["reuses"] == 1


def test_a_second_get_keeps_a_fitting_record_and_frees_an_emptied_one_first():
    deps = interval_deps({"a": (0, 1), "b": (0, 1)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a1 = pool.get("a", 100, torch.uint8)
    a2 = pool.get("a", 300, torch.uint8)  # grew: nobody else used the old record, it went first
    assert eng.released == [100] and pool.stats()["records"] == 1
    assert pool.get("a", 200, torch.uint8).data_ptr() == a2.data_ptr()  # shrank within the rule: kept
    pool.get("a", 100, torch.uint8)  # 300 >= 2 x 100: the record goes back, a new one comes
    assert eng.released == [100, 300] and [n for n, _, _ in eng.allocated] == [100, 300, 100]
    assert pool.stats()["records"] == 1
    assert a1.numel() == 100
    pool.release("a", pool.get("a", 100, torch.uint8))
    assert pool.free_unused() == 100
    assert pool.stats()["records"] == 0 and pool.free_unused() == 0


def test_a_shared_record_grows_for_all_its_users_when_nothing_else_fits():
    # a and b never meet (they share a record); c meets both
    deps = interval_deps({"a": (0, 1), "b": (2, 3), "c": (0, 3)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    held = {"a": pool.get("a", 100, torch.uint8), "b": pool.get("b", 24, torch.float32)}
    held["c"] = pool.get("c", 50, torch.uint8)
    follow_moves(pool, held)
    assert held["a"].data_ptr() == held["b"].data_ptr() and pool.stats()["records"] == 2
    held["a"] = pool.get("a", 300, torch.uint8)
    # one record of 300 for a and b, not a new one beside the old: the old went back first
    st_ = pool.stats()
    assert st_["records"] == 2 and st_["grown_records"] == 1 and st_["record_bytes"] == 350
    assert eng.released == [100]
    assert held["b"].data_ptr() == held["a"].data_ptr()  # b was told where its memory is now
    assert held["b"].dtype == torch.float32 and held["b"].numel() == 24
    assert not overlap(byte_range(held["a"]), byte_range(held["c"]))


def test_a_fitting_record_is_preferred_to_growing_a_shared_one():
    deps = interval_deps({"a": (0, 1), "b": (2, 3), "z": (4, 5), "c": (0, 5)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a = pool.get("a", 100, torch.uint8)
    pool.get("b", 90, torch.uint8)  # shares a's record
    pool.get("c", 400, torch.uint8)  # conflicts with everyone: its own record
    z = pool.get("z", 350, torch.uint8, dynamic=False)  # a record of 350 that a may share
    assert z.data_ptr() != a.data_ptr() and pool.stats()["records"] == 3
    assert pool.get("a", 300, torch.uint8).data_ptr() == z.data_ptr()
    assert pool.stats()["grown_records"] == 0 and eng.released == []


def test_release_free_if_unused_frees_only_an_emptied_record():
    deps = interval_deps({"a": (0, 1), "b": (2, 3), "c": (0, 3)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a = pool.get("a", 100, torch.uint8)
    b = pool.get("b", 80, torch.uint8)  # shares a's record: their lifetimes do not overlap
    c = pool.get("c", 50, torch.uint8)
    assert b.data_ptr() == a.data_ptr() and pool.stats()["records"] == 2
    pool.release("a", a, free_if_unused=True)  # b still uses the record: it stays
    assert eng.released == [] and pool.stats()["records"] == 2
    pool.release("b", b, free_if_unused=True)  # now empty: back to the engine at once
    assert eng.released == [100] and pool.stats()["records"] == 1
    assert pool.get("c", 50, torch.uint8).data_ptr() == c.data_ptr()  # the other record is intact


def test_allocation_types_keep_separate_records():
    deps = interval_deps({"a": (0, 1), "b": (2, 3)})
    eng = FakeEngine()
    pool = MemoryPool(eng, deps)
    a = pool.get("a", 64, torch.uint8, alloc_type="host")
    b = pool.get("b", 64, torch.uint8)
    assert a.data_ptr() != b.data_ptr()
    assert [x[2] for x in eng.allocated] == ["host", "device"]


def test_unknown_requesters_and_negative_sizes_are_refused():
    pool = MemoryPool(FakeEngine(), interval_deps({"a": (0, 1)}))
    with pytest.raises(KeyError, match="owns no memory"):
        pool.get("nope", 4, torch.float32)
    with pytest.raises(ValueError):
        pool.get("a", -1, torch.float32)


def test_pool_over_a_compiled_graph_shares_along_a_chain():
    g = compiled([helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
                  helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Tanh", ["c"], ["d"]),
                  helper.make_node("Sigmoid", ["d"], ["y"])],
                 [("x", [4])], [("y", [4])])
    pool = MemoryPool(FakeEngine(), basic_memory_dependencies(g))
    bufs = {n: pool.get(n, 16, torch.float32) for n in ("a", "b", "c", "d")}
    # ping-pong between two records
    assert bufs["a"].data_ptr() == bufs["c"].data_ptr() and bufs["b"].data_ptr() == bufs["d"].data_ptr()
    assert bufs["a"].data_ptr() != bufs["b"].data_ptr()
    assert pool.stats()["new_records"] == 2


# ---- property: random DAGs ----------------------------------------------------------------------

_UNARY = ("Sigmoid", "Neg", "LeakyRelu")  # LeakyRelu's result is adopted: an owned value the pool never sees
_DTYPES = (torch.float32, torch.uint8, torch.float16, torch.int64)


@st.composite
def random_dags(draw):
    """A model on 1-D float tensors: (nodes, inits, output names). Values are combined only when
    their lengths agree, so every model compiles."""
    lengths = {"x": 4, "z": 4}
    order = ["x", "z"]
    nodes, users = [], {"x": 0, "z": 0}
    for i in range(draw(st.integers(3, 30))):
        kind = draw(st.sampled_from(("unary", "add", "reshape", "identity", "concat", "split")))
        a = draw(st.sampled_from(order))
        out = f"v{i}"
        if kind == "add":
            same = [v for v in order if lengths[v] == lengths[a]]
            ins, outs, lens = [a, draw(st.sampled_from(same))], [out], [lengths[a]]
            op = helper.make_node("Add", ins, outs)
        elif kind == "concat":
            ins = [a] + draw(st.lists(st.sampled_from(order), min_size=1, max_size=2))
            outs, lens = [out], [sum(lengths[v] for v in ins)]
            op = helper.make_node("Concat", ins, outs, axis=0)
            if lens[0] > 64:  # keep sizes small
                continue
        elif kind == "split" and lengths[a] % 2 == 0:
            ins, outs, lens = [a], [f"{out}a", f"{out}b"], [lengths[a] // 2] * 2
            op = helper.make_node("Split", ins, outs, axis=0, num_outputs=2)
        elif kind == "reshape":
            ins, outs, lens = [a, "flat"], [out], [lengths[a]]
            op = helper.make_node("Reshape", ins, outs)
        elif kind == "identity":
            ins, outs, lens = [a], [out], [lengths[a]]
            op = helper.make_node("Identity", ins, outs)
        else:
            ins, outs, lens = [a], [out], [lengths[a]]
            op = helper.make_node(draw(st.sampled_from(_UNARY)), ins, outs)
        nodes.append(op)
        for v in ins:
            users[v] = users.get(v, 0) + 1
        for v, n in zip(outs, lens):
            lengths[v], users[v] = n, 0
            order.append(v)
    produced = order[2:]
    sinks = [v for v in produced if users[v] == 0]
    extra = draw(st.lists(st.sampled_from(produced), max_size=3)) if produced else []
    outputs = list(dict.fromkeys(sinks + extra)) or ["x"]
    if outputs == ["x"]:  # no node at all: give the model one
        nodes.append(helper.make_node("Neg", ["x"], ["v0"]))
        outputs, lengths["v0"] = ["v0"], 4
    return nodes, [(o, [lengths[o]]) for o in outputs]


def compile_dag(spec):
    nodes, outputs = spec
    return compiled(nodes, [("x", [4]), ("z", [4])], outputs, inits=[flat_shape()])


def assign_rounds(graph, deps, data, rounds=2):
    """Walk the nodes in order as the runtime does, for a few runs of changing sizes: a root
    asks the pool again whenever its request outgrows its buffer. After each get, no value that
    conflicts with the requester may hold overlapping bytes."""
    pool = MemoryPool(FakeEngine(), deps)
    held: dict[str, torch.Tensor] = {}
    follow_moves(pool, held)
    for _ in range(rounds):
        for node in graph.nodes:
            for v in node.outputs:
                if v is None or v.name not in deps.roots:
                    continue
                dtype = data.draw(st.sampled_from(_DTYPES))
                numel = data.draw(st.integers(0, 40))
                old = held.get(v.name)
                if old is not None and old.numel() * old.element_size() >= numel * dtype.itemsize:
                    continue  # enough capacity: the runtime keeps its buffer
                held[v.name] = t = pool.get(v.name, numel, dtype, dynamic=data.draw(st.booleans()))
                assert t.numel() == numel and t.dtype == dtype
                for other, u in held.items():
                    if other != v.name and deps.conflicts(v.name, other):
                        assert not overlap(byte_range(t), byte_range(u)), (v.name, other)
    return held


def check_pairs(deps, held, related):
    names = sorted(held)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if related(a, b):
                assert not overlap(byte_range(held[a]), byte_range(held[b])), (a, b)


def intervals_overlap(deps):
    def rel(a, b):
        (a0, a1), (b0, b1) = deps.live_interval(a), deps.live_interval(b)
        return a0 <= b1 and b0 <= a1
    return rel


_PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(random_dags(), st.data())
def test_property_basic_deps_keep_overlapping_lifetimes_apart(spec, data):
    g = compile_dag(spec)
    deps = basic_memory_dependencies(g)
    held = assign_rounds(g, deps, data)
    check_pairs(deps, held, intervals_overlap(deps))


@_PROPERTY
@given(random_dags(), st.data())
def test_property_out_of_order_deps_keep_conflicts_apart(spec, data):
    g = compile_dag(spec)
    ooo, basic = out_of_order_memory_dependencies(g), basic_memory_dependencies(g)
    names = list(ooo.owned)
    for i, a in enumerate(names):  # the out-of-order relation contains the in-order one
        for b in names[i + 1:]:
            assert ooo.conflicts(a, b) >= basic.conflicts(a, b), (a, b)
            assert ooo.conflicts(a, b) == ooo.conflicts(b, a)
    held = assign_rounds(g, ooo, data)
    check_pairs(ooo, held, ooo.conflicts)


@_PROPERTY
@given(random_dags(), st.data())
def test_property_release_after_last_use_is_safe_in_order(spec, data):
    """Scoped use, as a one-shot run would do: release each root right after its last reader.
    Nothing handed out later may overlap a value whose lifetime it meets."""
    g = compile_dag(spec)
    deps = basic_memory_dependencies(g)
    pool = MemoryPool(FakeEngine(), deps)
    given_out: dict[str, tuple[int, int]] = {}
    live: dict[str, torch.Tensor] = {}
    for i, node in enumerate(g.nodes):
        for v in node.outputs:
            if v is not None and v.name in deps.roots:
                live[v.name] = t = pool.get(v.name, data.draw(st.integers(1, 40)), torch.float32,
                                            dynamic=data.draw(st.booleans()))
                given_out[v.name] = byte_range(t)
        for name in [n for n in live if deps.live_interval(n)[1] == i]:
            pool.release(name, live.pop(name))
    rel = intervals_overlap(deps)
    names = sorted(given_out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if rel(a, b):
                assert not overlap(given_out[a], given_out[b]), (a, b)
    # left: the roots a graph output aliases (live to the end, so one record each); the rest is free
    pool.free_unused()
    assert pool.stats()["records"] == len(live)
    assert all(deps.live_interval(n)[1] == len(g.nodes) for n in live)


# ---- property: execute with pooled buffers and compare with fresh tensors ------------------------

_KERNELS = {
    "Sigmoid": torch.sigmoid, "Neg": torch.neg, "LeakyRelu": torch.nn.functional.leaky_relu, "Add": torch.add,
    "Concat": lambda *xs: torch.cat(xs, 0), "Split": lambda x: torch.chunk(x, 2),
    "Reshape": lambda x: x.reshape(-1), "Identity": lambda x: x,
}


_VIEWS = ("Reshape", "Identity")


def run_graph(graph, order, feeds, pool=None, held=None, slack=None):
    """Run the nodes in ``order``. With a pool, every pooled root is written into its pool buffer
    (grown through the pool when too small), which is filled with NaN before its node reads the
    inputs: a node whose input shares bytes with its output, or a value overwritten before its
    last reader, shows up as a wrong result."""
    vals = dict(feeds)
    for i in order:
        node = graph.nodes[i]
        ins = [vals[v.name] for v in node.inputs if v is not None and not v.is_const]
        fn = _KERNELS[node.op_type]
        if pool is not None:
            shapes = [r.shape for r in _as_tuple(fn(*ins))]  # a first call only to learn the sizes
            bufs = {}
            for v, shape in zip(node.outputs, shapes):
                if v.name in pool.deps.roots:
                    n = shape.numel()
                    if held.get(v.name) is None or held[v.name].numel() < n:
                        held[v.name] = pool.get(v.name, n + slack(), torch.float32)
                    bufs[v.name] = held[v.name][:n].view(shape).fill_(float("nan"))
        res = _as_tuple(fn(*ins))
        for v, r in zip(node.outputs, res):
            if pool is not None and v.name in bufs:
                r = bufs[v.name].copy_(r)
            elif node.op_type not in _VIEWS:
                r = r.clone()  # as in the runtime, only views alias (torch.chunk returns views)
            vals[v.name] = r
    return [vals[v.name].clone() for v in graph.outputs]


def _as_tuple(r):
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def random_topological_order(graph, data):
    producer = {id(v): i for i, n in enumerate(graph.nodes) for v in n.outputs if v is not None}
    preds = [{producer[id(v)] for v in n.inputs if v is not None and id(v) in producer} for n in graph.nodes]
    done, order = set(), []
    while len(order) < len(graph.nodes):
        ready = [i for i in range(len(graph.nodes)) if i not in done and preds[i] <= done]
        i = data.draw(st.sampled_from(ready))
        order.append(i)
        done.add(i)
    return order


def check_execution(graph, deps, order, data):
    pool, held = MemoryPool(FakeEngine(), deps), {}
    follow_moves(pool, held)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    for _ in range(3):  # runs of one network: buffers persist, some grow
        feeds = {"x": torch.randn(4, generator=gen), "z": torch.randn(4, generator=gen)}
        expected = run_graph(graph, range(len(graph.nodes)), feeds)
        got = run_graph(graph, order, feeds, pool, held, slack=lambda: data.draw(st.integers(0, 8)))
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e)


@_PROPERTY
@given(random_dags(), st.data())
def test_property_in_order_execution_on_pooled_buffers_is_correct(spec, data):
    g = compile_dag(spec)
    check_execution(g, basic_memory_dependencies(g), range(len(g.nodes)), data)


@_PROPERTY
@given(random_dags(), st.data())
def test_property_any_topological_order_is_correct_with_out_of_order_deps(spec, data):
    g = compile_dag(spec)
    check_execution(g, out_of_order_memory_dependencies(g), random_topological_order(g, data), data)
