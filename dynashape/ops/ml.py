"""ONNX-ML ops (domain ai.onnx.ml): LabelEncoder, TreeEnsemble, TreeEnsembleRegressor,
ArrayFeatureExtractor, Binarizer, Scaler, Normalizer, OneHotEncoder, Imputer, FeatureVectorizer.

Numeric kernels are torch code that runs on the session device. String tensors are numpy object
arrays on the host: LabelEncoder (strings on either side, dictionary lookups) is a host op; the
other ops that accept strings (ArrayFeatureExtractor, OneHotEncoder) take a numpy path for them.

Where the spec is vague the behaviour follows onnxruntime, the implementation these models are
made for: a single tree-ensemble target gets no post transform but PROBIT, and a target no tree
voted for scores 0 (plus its base value) whatever the aggregate. Where onnxruntime departs from
the spec, we keep to the spec: TreeEnsemble's post_transform 1 is SOFTMAX and 2 LOGISTIC
(onnxruntime swaps them), a BRANCH_MEMBER test compares the feature itself (onnxruntime truncates
it to an integer), a repeated LabelEncoder key maps to its last value (onnxruntime: the first), a
NaN key matches NaN inputs, base values are added to targets with no vote too (onnxruntime: 0),
and old-style (opset 1/3) trees may list their nodes in any order (onnxruntime needs node id order).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch

from ..errors import ShapeError
from ..ir.dtypes import to_numpy
from .registry import op
from .shapes import prod, same_as_first

ML = "ai.onnx.ml"

# ---- per-node precomputation ---------------------------------------------------------------------
# Kernels get their attributes as the same objects on every call (the node holds them), so what
# is derived from attributes (lookup tables, tree arrays) is built once per node and device and
# kept here, keyed by the identity of one attribute object that the entry also holds.
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


def _cached(anchor, extra, build):
    key = (id(anchor), extra)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is anchor:
        _CACHE.move_to_end(key)
        return hit[1]
    value = build()
    _CACHE[key] = (anchor, value)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def _is_text(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _listed(v) -> list | None:
    """An INTS/FLOATS/STRINGS attribute or a TENSOR attribute as a flat Python list."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return v.reshape(-1).tolist()
    if isinstance(v, np.ndarray):
        return v.reshape(-1).tolist()
    return list(v)


# ---- LabelEncoder ----------------------------------------------------------------------------------
class _Table:
    """key -> value lookups; NaN keys match any NaN input (a dict cannot: NaN != NaN)."""

    def __init__(self, keys: list, values: list, default, dtype: np.dtype):
        if len(keys) != len(values):
            raise ValueError(f"LabelEncoder has {len(keys)} keys but {len(values)} values")
        self.map, self.nan = {}, None
        for k, v in zip(keys, values):  # a repeated key: the last one wins, as the spec says
            if isinstance(k, float) and k != k:
                self.nan = v
            else:
                self.map[k] = v
        self.default, self.dtype = default, dtype

    def __call__(self, x, out):
        flat = x.reshape(-1) if _is_text(x) else to_numpy(x).reshape(-1)
        get, default, nan = self.map.get, self.default, self.nan
        nan_hit = default if nan is None else nan
        items = [get(k, nan_hit if k != k else default) for k in flat.tolist()]
        if self.dtype == object:
            y = np.empty(len(items), dtype=object)
            y[:] = items
            return y.reshape(x.shape)
        r = torch.from_numpy(np.array(items, dtype=self.dtype).reshape(x.shape))
        return r if out is None else out.copy_(r)


def _one_of(what: str, **named):
    given = {k: v for k, v in named.items() if v is not None}
    if len(given) != 1:
        raise ValueError(f"LabelEncoder needs exactly one of the {what} attributes {sorted(named)}, got "
                         f"{sorted(given) or 'none'}")
    return next(iter(given.items()))


def _label_table(keys_floats, keys_int64s, keys_strings, keys_tensor, values_floats, values_int64s,
                 values_strings, values_tensor, default_float, default_int64, default_string, default_tensor):
    _, keys = _one_of("keys_*", keys_floats=keys_floats, keys_int64s=keys_int64s, keys_strings=keys_strings,
                      keys_tensor=keys_tensor)
    vname, values = _one_of("values_*", values_floats=values_floats, values_int64s=values_int64s,
                            values_strings=values_strings, values_tensor=values_tensor)
    if vname == "values_tensor":
        dtype = to_numpy(values).dtype
    else:
        dtype = {"values_floats": np.dtype(np.float32), "values_int64s": np.dtype(np.int64),
                 "values_strings": np.dtype(object)}[vname]
    if default_tensor is not None:
        default = _listed(default_tensor)[0]
    elif dtype.kind == "f":
        default = default_float
    elif dtype.kind in "iu":
        default = default_int64
    else:
        default = default_string
    return _Table(_listed(keys), _listed(values), default, dtype)


def _anchor(*keys):
    for k in keys:
        if k is not None:
            return k
    raise ValueError("LabelEncoder needs one of the keys_* attributes")


@op("LabelEncoder", 1, domain=ML, infer=same_as_first, host=True)
def _label_encoder1(x, *, classes_strings=None, default_int64=-1, default_string="_Unused", out=None):
    classes = list(classes_strings or [])
    # the table depends on the defaults too: with no classes the anchor (None) is shared by nodes
    ids = list(range(len(classes)))
    if _is_text(x):  # strings -> their index among the classes
        table = _cached(classes_strings, ("s2i", default_int64),
                        lambda: _Table(classes, ids, default_int64, np.dtype(np.int64)))
    else:  # indices -> the class strings
        table = _cached(classes_strings, ("i2s", default_string),
                        lambda: _Table(ids, classes, default_string, np.dtype(object)))
    return table(x, out)


@op("LabelEncoder", 2, domain=ML, infer=same_as_first, host=True)
def _label_encoder2(x, *, keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                    values_int64s=None, values_strings=None, default_float=-0.0, default_int64=-1,
                    default_string="_Unused", out=None):
    anchor = _anchor(keys_floats, keys_int64s, keys_strings)
    table = _cached(anchor, "le", lambda: _label_table(
        keys_floats, keys_int64s, keys_strings, None, values_floats, values_int64s, values_strings, None,
        default_float, default_int64, default_string, None))
    return table(x, out)


@op("LabelEncoder", 4, domain=ML, infer=same_as_first, host=True)
def _label_encoder4(x, *, keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
                    values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
                    default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None, out=None):
    anchor = _anchor(keys_floats, keys_int64s, keys_strings, keys_tensor)
    table = _cached(anchor, "le", lambda: _label_table(
        keys_floats, keys_int64s, keys_strings, keys_tensor, values_floats, values_int64s, values_strings,
        values_tensor, default_float, default_int64, default_string, default_tensor))
    return table(x, out)


# ---- tree ensembles ----------------------------------------------------------------------------------
# The trees of an ensemble as flat arrays over one index space of nodes and leaves. A leaf
# is a node that leads to itself, so walking every tree of every row ``depth`` steps (one vectorized
# step for all of them at once) lands each on its leaf, whatever the depths of the single trees.
# A branch is true when the comparison of x[feature] with the split is one the node's mode accepts:
# less, equal, greater (LEQ = less or equal...), "not equal" (true for NaN, as x != s is), or set
# membership; a NaN feature also goes the true way on nodes that track missing values true.
_MODE_BITS = {  # mode -> (lt, eq, gt, ne, member)
    "BRANCH_LEQ": (1, 1, 0, 0, 0), "BRANCH_LT": (1, 0, 0, 0, 0), "BRANCH_GTE": (0, 1, 1, 0, 0),
    "BRANCH_GT": (0, 0, 1, 0, 0), "BRANCH_EQ": (0, 1, 0, 0, 0), "BRANCH_NEQ": (0, 0, 0, 1, 0),
    "BRANCH_MEMBER": (0, 0, 0, 0, 1), "LEAF": (0, 0, 0, 0, 0),
}
_V5_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER"]
_V5_AGGREGATE = ["AVERAGE", "SUM", "MIN", "MAX"]
_V5_POST = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]


class _Forest:
    def __init__(self, *, feat, split, modes, true_next, false_next, missing, sets, votes, roots, n_targets,
                 dtype, device):
        n = len(modes)
        bits = np.array([_MODE_BITS[m] for m in modes], dtype=bool).reshape(n, 5)
        leaf = np.array([m == "LEAF" for m in modes], dtype=bool)
        self.depth = _depth(true_next, false_next, roots, leaf)

        def t(a, dt=torch.int64):
            return torch.as_tensor(np.asarray(a), device=device).to(dt)

        self.feat, self.split = t(feat), t(np.asarray(split, dtype=np.float64), dtype)
        self.lt, self.eq, self.gt, self.ne = (t(bits[:, k], torch.bool) for k in range(4))
        self.true_next, self.false_next = t(true_next), t(false_next)
        self.missing = t(missing, torch.bool)
        self.roots = t(roots)
        self.n_trees, self.n_targets = len(roots), n_targets
        # member sets as rows padded with NaN (equal to nothing); row 0 is the empty set of other nodes
        self.sets = None
        if any(bits[:, 4]):
            width = max(len(s) for s in sets.values())
            rows = np.full((len(sets) + 1, width), np.nan)
            row_of = np.zeros(n, dtype=np.int64)
            for r, (i, members) in enumerate(sorted(sets.items()), start=1):
                rows[r, :len(members)] = members
                row_of[i] = r
            self.sets, self.set_row = t(rows, dtype), t(row_of)
        # votes: per node (target, weight) pairs, padded with votes for a dropped extra target
        width = max([len(v) for v in votes] + [1])
        tg = np.full((n, width), n_targets, dtype=np.int64)
        w = np.zeros((n, width), dtype=np.float64)
        for i, vs in enumerate(votes):
            for k, (target, weight) in enumerate(vs):
                if not 0 <= target < n_targets:
                    raise ValueError(f"tree ensemble target id {target} is out of range for {n_targets} targets")
                tg[i, k], w[i, k] = target, weight
        self.vote_target, self.vote_weight = t(tg), t(w, dtype)

    def leaves(self, x: torch.Tensor) -> torch.Tensor:
        """The leaf each tree reaches for each row of x: (N, n_trees) node indices."""
        node = self.roots.expand(x.shape[0], -1)
        for _ in range(self.depth):
            v = x.gather(1, self.feat[node])
            s = self.split[node]
            eq = v == s
            cond = (self.lt[node] & (v < s)) | (self.gt[node] & (v > s)) | (self.eq[node] & eq) | (self.ne[node] & ~eq)
            if self.sets is not None:
                cond |= (v.unsqueeze(-1) == self.sets[self.set_row[node]]).any(-1)
            cond |= self.missing[node] & torch.isnan(v)
            node = torch.where(cond, self.true_next[node], self.false_next[node])
        return node

    def scores(self, x: torch.Tensor, aggregate: str, base: list | None) -> torch.Tensor:
        node = self.leaves(x)
        n = x.shape[0]
        tg = self.vote_target[node].reshape(n, -1)
        w = self.vote_weight[node].reshape(n, -1)
        width = self.n_targets + 1  # the extra column collects the padding votes
        if aggregate in ("SUM", "AVERAGE"):
            acc = torch.zeros(n, width, dtype=w.dtype, device=x.device).scatter_add_(1, tg, w)
            if aggregate == "AVERAGE":
                acc /= self.n_trees
        elif aggregate in ("MIN", "MAX"):
            start = math.inf if aggregate == "MIN" else -math.inf
            acc = torch.full((n, width), start, dtype=w.dtype, device=x.device)
            acc.scatter_reduce_(1, tg, w, "amin" if aggregate == "MIN" else "amax")
            voted = torch.zeros(n, width, dtype=torch.int32, device=x.device).scatter_add_(
                1, tg, torch.ones_like(tg, dtype=torch.int32))
            acc = torch.where(voted > 0, acc, 0)  # a target no tree voted for: 0
        else:
            raise ValueError(f"unknown aggregate_function {aggregate!r}")
        acc = acc[:, :self.n_targets]
        if base is not None and len(base) == self.n_targets:
            acc = acc + torch.tensor(base, dtype=acc.dtype, device=acc.device)
        return acc


def _depth(true_next, false_next, roots, leaf) -> int:
    """The most branch steps from a root to a leaf (iterative: trees may be deeper than Python's
    recursion limit)."""
    memo: dict[int, int] = {}
    limit = len(leaf) + 1
    best = 0
    for r in roots:
        stack = [int(r)]
        while stack:
            i = stack[-1]
            if i in memo:
                stack.pop()
            elif leaf[i]:
                memo[i] = 0
                stack.pop()
            else:
                kids = (int(true_next[i]), int(false_next[i]))
                todo = [k for k in kids if k not in memo]
                if todo:
                    if len(stack) > limit:
                        raise ValueError("the tree ensemble's node links form a cycle")
                    stack.extend(todo)
                else:
                    memo[i] = 1 + max(memo[k] for k in kids)
                    stack.pop()
        best = max(best, memo[int(r)])
    return best


def _post_transform(y: torch.Tensor, post: str) -> torch.Tensor:
    if post == "NONE":
        return y
    if post == "PROBIT":
        return math.sqrt(2) * torch.erfinv(2 * y - 1)
    if y.shape[-1] == 1:
        return y  # onnxruntime applies no other transform to a single score
    if post == "LOGISTIC":
        return torch.sigmoid(y)
    if post == "SOFTMAX":
        return torch.softmax(y, -1)
    if post == "SOFTMAX_ZERO":  # softmax over the non-zero scores; zeros stay zero
        nz = y.abs() > 1e-7
        e = torch.where(nz, torch.exp(y - y.amax(-1, keepdim=True)), 0)
        return e / e.sum(-1, keepdim=True)
    raise ValueError(f"unknown post_transform {post!r}")


def _compute_dtype(x: torch.Tensor, wide: bool) -> torch.dtype:
    return torch.float64 if wide or x.dtype == torch.float64 else torch.float32


def _tree5_shape(shapes, values, *, n_targets=None, **_attrs):
    if len(shapes[0]) != 2:
        raise ShapeError(f"TreeEnsemble takes [N, F] input, got rank {len(shapes[0])}")
    return [(shapes[0][0], n_targets)]


def _forest_v5(nodes_featureids, nodes_splits, nodes_modes, nodes_truenodeids, nodes_falsenodeids,
               nodes_trueleafs, nodes_falseleafs, nodes_missing_value_tracks_true, membership_values,
               leaf_targetids, leaf_weights, tree_roots, n_targets, dtype, device) -> _Forest:
    n_int, n_leaf = len(nodes_featureids), len(leaf_targetids)
    modes = [_V5_MODES[m] for m in _listed(nodes_modes)]

    def link(ids, is_leaf):  # a leaf id points past the interior nodes
        return [n_int + i if lf else i for i, lf in zip(ids, is_leaf)]

    own = list(range(n_int, n_int + n_leaf))
    sets: dict[int, list[float]] = {}
    if "BRANCH_MEMBER" in modes:
        if membership_values is None:
            raise ValueError("TreeEnsemble has BRANCH_MEMBER nodes but no membership_values")
        groups, cur = [], []
        for v in _listed(membership_values):  # the sets, in node order, each ended by a NaN
            if v != v:
                groups.append(cur)
                cur = []
            else:
                cur.append(v)
        members = [i for i, m in enumerate(modes) if m == "BRANCH_MEMBER"]
        if len(groups) < len(members):
            raise ValueError(f"membership_values holds {len(groups)} sets for {len(members)} BRANCH_MEMBER nodes")
        sets = dict(zip(members, groups))
    missing = list(nodes_missing_value_tracks_true or [0] * n_int)
    weights = _listed(leaf_weights)
    return _Forest(
        feat=list(nodes_featureids) + [0] * n_leaf, split=_listed(nodes_splits) + [0.0] * n_leaf,
        modes=modes + ["LEAF"] * n_leaf,
        true_next=link(nodes_truenodeids, nodes_trueleafs) + own,
        false_next=link(nodes_falsenodeids, nodes_falseleafs) + own,
        missing=missing + [0] * n_leaf, sets=sets,
        votes=[[]] * n_int + [[(t, w)] for t, w in zip(leaf_targetids, weights)],
        roots=list(tree_roots), n_targets=n_targets, dtype=dtype, device=device)


@op("TreeEnsemble", 5, domain=ML, infer=_tree5_shape)
def _tree_ensemble(x, *, nodes_featureids, nodes_splits, nodes_modes, nodes_truenodeids, nodes_falsenodeids,
                   nodes_trueleafs, nodes_falseleafs, leaf_targetids, leaf_weights, tree_roots, n_targets=None,
                   aggregate_function=1, post_transform=0, nodes_hitrates=None,
                   nodes_missing_value_tracks_true=None, membership_values=None, out=None):
    if n_targets is None:
        raise ValueError("TreeEnsemble needs n_targets")
    cdt = _compute_dtype(x, False)
    forest = _cached(leaf_weights, (x.device, cdt), lambda: _forest_v5(
        nodes_featureids, nodes_splits, nodes_modes, nodes_truenodeids, nodes_falsenodeids, nodes_trueleafs,
        nodes_falseleafs, nodes_missing_value_tracks_true, membership_values, leaf_targetids, leaf_weights,
        tree_roots, n_targets, cdt, x.device))
    y = forest.scores(x.to(cdt), _V5_AGGREGATE[aggregate_function], None)
    r = _post_transform(y, _V5_POST[post_transform]).to(x.dtype)
    return r if out is None else out.copy_(r)


def _forest_v3(nodes_treeids, nodes_nodeids, nodes_featureids, values, nodes_modes, nodes_truenodeids,
               nodes_falsenodeids, nodes_missing_value_tracks_true, target_treeids, target_nodeids, target_ids,
               weights, n_targets, dtype, device) -> _Forest:
    pos = {(t, i): k for k, (t, i) in enumerate(zip(nodes_treeids, nodes_nodeids))}
    n = len(pos)
    if n != len(nodes_treeids):
        raise ValueError("a (tree id, node id) pair appears twice among the nodes")
    leaf = [m == "LEAF" for m in nodes_modes]

    def link(ids):
        try:
            return [k if lf else pos[(t, i)] for k, (t, i, lf) in enumerate(zip(nodes_treeids, ids, leaf))]
        except KeyError as e:
            raise ValueError(f"a branch leads to the unknown (tree id, node id) {e.args[0]}") from None

    votes: list[list] = [[] for _ in range(n)]
    for t, i, target, w in zip(target_treeids, target_nodeids, target_ids, weights):
        votes[pos[(t, i)]].append((target, w))
    roots = {}  # the root of a tree is its smallest node id
    for (t, i), k in pos.items():
        if t not in roots or i < nodes_nodeids[roots[t]]:
            roots[t] = k
    return _Forest(feat=[0 if lf else f for f, lf in zip(nodes_featureids, leaf)], split=values,
                   modes=list(nodes_modes), true_next=link(nodes_truenodeids), false_next=link(nodes_falsenodeids),
                   missing=list(nodes_missing_value_tracks_true or [0] * n), sets={}, votes=votes,
                   roots=[roots[t] for t in sorted(roots)], n_targets=n_targets, dtype=dtype, device=device)


def _regressor_shape(shapes, values, *, n_targets=None, **_attrs):
    s = shapes[0]
    return [(s[0] if len(s) == 2 else 1, n_targets)]


def _tree_regressor(x, *, aggregate_function="SUM", base_values=None, base_values_as_tensor=None, n_targets=None,
                    nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                    nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                    nodes_truenodeids=None, nodes_values=None, nodes_values_as_tensor=None, post_transform="NONE",
                    target_ids=None, target_nodeids=None, target_treeids=None, target_weights=None,
                    target_weights_as_tensor=None, out=None):
    if n_targets is None:
        raise ValueError("TreeEnsembleRegressor needs n_targets")
    wide = nodes_values_as_tensor is not None or target_weights_as_tensor is not None
    # onnxruntime compares features in the splits' type: float32 unless the splits are given as doubles
    cdt = _compute_dtype(x, wide)
    values = _listed(nodes_values_as_tensor if nodes_values_as_tensor is not None else nodes_values)
    weights = _listed(target_weights_as_tensor if target_weights_as_tensor is not None else target_weights)
    forest = _cached(nodes_modes, (x.device, cdt), lambda: _forest_v3(
        nodes_treeids, nodes_nodeids, nodes_featureids, values, nodes_modes, nodes_truenodeids, nodes_falsenodeids,
        nodes_missing_value_tracks_true, target_treeids or [], target_nodeids or [], target_ids or [],
        weights or [], n_targets, cdt, x.device))
    base = _listed(base_values_as_tensor if base_values_as_tensor is not None else base_values)
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    y = _post_transform(forest.scores(x2.to(cdt), aggregate_function, base), post_transform).to(torch.float32)
    return y if out is None else out.copy_(y)


op("TreeEnsembleRegressor", 1, domain=ML, infer=_regressor_shape)(_tree_regressor)
op("TreeEnsembleRegressor", 3, domain=ML, infer=_regressor_shape)(_tree_regressor)


# ---- ArrayFeatureExtractor ----------------------------------------------------------------------------
def _afe_shape(shapes, values, **_attrs):
    x, idx = shapes
    k = prod(idx)
    return [(1, k) if len(x) == 1 else (*x[:-1], k)]


@op("ArrayFeatureExtractor", 1, domain=ML, infer=_afe_shape)
def _array_feature_extractor(x, y, *, out=None):
    n = x.shape[-1] if x.ndim else 0
    if _is_text(x):
        idx = to_numpy(y).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"ArrayFeatureExtractor indices {idx.tolist()} are out of range for {n} features")
        r = x[..., idx]
        return r.reshape(1, -1) if x.ndim == 1 else r
    idx = y.reshape(-1).to(x.device)
    # check on the host side of a sync: an out-of-range index on a GPU is a device assert
    if idx.numel() and bool((idx < 0).any() | (idx >= n).any()):
        raise IndexError(f"ArrayFeatureExtractor indices {idx.tolist()} are out of range for {n} features")
    r = x.index_select(-1, idx)
    if x.dim() == 1:
        r = r.reshape(1, -1)
    return r if out is None else out.copy_(r)


# ---- Binarizer, Scaler, Normalizer, Imputer ---------------------------------------------------------
@op("Binarizer", 1, domain=ML, infer=same_as_first)
def _binarizer(x, *, threshold=0.0, out=None):
    r = (x > threshold).to(x.dtype)
    return r if out is None else out.copy_(r)


def _per_feature(v: list, x: torch.Tensor, what: str, dtype) -> torch.Tensor | float:
    """A per-feature attribute (one value for all, or one per feature of the last axis)."""
    if len(v) == 1:
        return v[0]
    if x.dim() == 0 or len(v) != x.shape[-1]:
        raise ShapeError(f"{what} has {len(v)} values for {x.shape[-1] if x.dim() else 1} features")
    return torch.tensor(v, dtype=dtype, device=x.device)


@op("Scaler", 1, domain=ML, infer=same_as_first)
def _scaler(x, *, offset=None, scale=None, out=None):
    f = x.to(torch.float32)
    if offset:
        f = f - _per_feature(offset, x, "Scaler offset", torch.float32)
    if scale:
        f = f * _per_feature(scale, x, "Scaler scale", torch.float32)
    return f if out is None else out.copy_(f)


@op("Normalizer", 1, domain=ML, infer=same_as_first)
def _normalizer(x, *, norm="MAX", out=None):
    f = x.to(torch.float32)
    if norm == "MAX":
        d = f.amax(-1, keepdim=True)
    elif norm == "L1":
        d = f.abs().sum(-1, keepdim=True)
    elif norm == "L2":
        d = f.square().sum(-1, keepdim=True).sqrt()
    else:
        raise ValueError(f"Normalizer norm must be MAX, L1 or L2, got {norm!r}")
    r = torch.where(d == 0, f, f / d)  # a zero divisor leaves the row as it is
    return r if out is None else out.copy_(r)


@op("Imputer", 1, domain=ML, infer=same_as_first)
def _imputer(x, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
             replaced_value_int64=0, out=None):
    if x.is_floating_point():
        values, old = imputed_value_floats, replaced_value_float
    else:
        values, old = imputed_value_int64s, replaced_value_int64
    if not values:
        raise ValueError("Imputer needs imputed_value_floats for float input, imputed_value_int64s for integers")
    new = _per_feature(values, x, "Imputer imputed values", x.dtype)
    hit = torch.isnan(x) if isinstance(old, float) and math.isnan(old) else x == old
    r = torch.where(hit, new, x)
    return r if out is None else out.copy_(r)


# ---- OneHotEncoder, FeatureVectorizer --------------------------------------------------------------
def _onehot_shape(shapes, values, *, cats_int64s=None, cats_strings=None, **_attrs):
    return [(*shapes[0], len(cats_int64s or cats_strings or []))]


@op("OneHotEncoder", 1, domain=ML, infer=_onehot_shape)
def _one_hot_encoder(x, *, cats_int64s=None, cats_strings=None, zeros=1, out=None):
    if _is_text(x):
        if not cats_strings:
            raise ValueError("OneHotEncoder on strings needs cats_strings")
        pos = {c: i for i, c in enumerate(cats_strings)}
        idx = torch.tensor([pos.get(s, -1) for s in x.reshape(-1).tolist()], dtype=torch.int64).reshape(x.shape)
        device = out.device if out is not None else torch.device("cpu")
        idx, n = idx.to(device), len(cats_strings)
    else:
        if not cats_int64s:
            raise ValueError("OneHotEncoder on numbers needs cats_int64s")
        cats = torch.tensor(cats_int64s, dtype=torch.int64, device=x.device)
        v = x.to(torch.int64)  # float input is truncated to an integer category
        hit = v.unsqueeze(-1) == cats
        idx = torch.where(hit.any(-1), hit.to(torch.int8).argmax(-1), -1)
        n = len(cats_int64s)
    unknown = idx < 0
    if not zeros and bool(unknown.any()):
        raise ValueError("OneHotEncoder met a category that is not in its list (zeros=0)")
    r = torch.nn.functional.one_hot(idx.clamp_min(0), n).to(torch.float32) * (~unknown).unsqueeze(-1)
    return r if out is None else out.copy_(r)


def _fv_shape(shapes, values, *, inputdimensions=None, **_attrs):
    first = shapes[0]
    return [(first[0] if len(first) >= 2 else 1, sum(inputdimensions or []))]


@op("FeatureVectorizer", 1, domain=ML, infer=_fv_shape)
def _feature_vectorizer(*xs, inputdimensions=None, out=None):
    dims = list(inputdimensions or [])
    if len(dims) != len(xs):
        raise ValueError(f"FeatureVectorizer has {len(xs)} inputs but {len(dims)} inputdimensions")
    rows = xs[0].shape[0] if xs[0].dim() >= 2 else 1
    parts = []
    for x, d in zip(xs, dims):
        m = x.reshape(rows, -1).to(torch.float32)
        # an input narrower than its declared dimension is padded with zeros, a wider one cut
        parts.append(torch.nn.functional.pad(m, (0, max(d - m.shape[1], 0)))[:, :d])
    r = torch.cat(parts, 1)
    return r if out is None else out.copy_(r)
