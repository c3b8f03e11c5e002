"""regions.partition on hand-made items: what bounds a region, how short runs join, live-ins,
refreshes and live-outs (a pure function of the items)."""

from __future__ import annotations

from dynashape.codegen.regions import Item, Member, partition

SYMVARS = {"batch": "s_batch", "past": "s_past"}
B, BP = frozenset({"batch"}), frozenset({"batch", "past"})


def items_of(*specs):
    return [Item(list(lines), object() if node else None, syms, bounding=bounding)
            for lines, syms, node, bounding in specs]


def test_attention_keyed_by_the_past_stays_alone_and_the_rest_is_keyed_by_batch():
    members = {"buf_a": Member(B, True), "buf_b": Member(B, True), "pos_d": Member(BP, False, B)}
    items = items_of(
        (["t_a = torch.mul(x_ids, pos_d, out=buf_a)"], B, True, False),
        (["t_q = torch.neg(buf_a)"], B, True, False),
        (["t_k = st.kv[0](x_past, t_q)"], BP, True, False),  # KV append: bounds
        (["t_att = k_attn(t_q, t_k)"], BP, True, False),     # alone: no neighbour covers past
        (["t_o = torch.matmul(t_att, c_w, out=buf_b)"], B, True, False),
        (["t_y = torch.relu(buf_b)"], B, True, False),
    )
    regions = partition(items, members, SYMVARS, ["x_ids", "x_past"], ["t_y"], cuda=True)
    static = [r for r in regions if r.static]
    assert [r.items for r in static] == [[0, 1], [4, 5]]
    assert all(r.syms == B for r in static)
    first, second = static
    # position ids made from the past: refreshed before a replay; the input too; the arena buffer read in place
    assert dict(zip(first.live_in, first.refresh)) == {"x_ids": True, "pos_d": True, "buf_a": False}
    assert first.live_out == ["t_q"]
    assert second.live_in == ["t_att", "buf_b"] and second.refresh == [True, False]
    assert second.live_out == ["t_y"] and second.results == [True]


def test_writes_outside_the_arena_and_host_transfers_bound_regions():
    members = {"buf": Member(B, True)}
    items = items_of(
        (["t_out = st.out(0, (s_batch, 4))", "t_out = torch.relu(x, out=t_out)"], B, True, False),
        (["t_a = torch.neg(x)"], B, True, False),
        (["torch.add(x, x, out=t_a)"], B, True, False),  # into another line's result: not replayable
        (["t_b = torch.neg(x)", "t_b.add_(x)"], B, True, False),  # its own result: fine
        (["t_c = t_b.to(DEV, non_blocking=True)"], B, True, False),  # a host transfer on CUDA
        (["t_d = torch.exp(t_b, out=buf)"], B, True, False),
    )
    ok_cuda = partition(items, members, SYMVARS, ["x"], [], cuda=True)
    assert [r.items for r in ok_cuda] == [[1], [3], [5]]  # every replayable stretch is one item long
    assert not any(r.static for r in ok_cuda)
    ok_cpu = partition(items, members, SYMVARS, ["x"], [], cuda=False)
    assert [r.items for r in ok_cpu] == [[1], [3, 4, 5]] and ok_cpu[1].static


def test_symbol_locals_read_by_a_region_join_its_key():
    items = items_of((["t_a = x.view((s_batch, s_past))"], frozenset(), True, False),
                     (["t_b = torch.neg(t_a)"], frozenset(), True, False))
    (r,) = partition(items, {}, SYMVARS, ["x"], ["t_b"], cuda=True)
    assert r.syms == BP and r.live_in == ["x"] and r.live_out == ["t_b"]
