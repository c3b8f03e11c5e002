"""Token regions: a transformer's per-token work cut apart from what mixes its tokens.

A transformer encoder's values are ``[batch, seq, ...]``, so the regions of ``regions.py`` (runs of
items over one symbol set) hold a whole layer, attention included, keyed by the exact ``(batch,
seq)``: with text of any length on every call no key comes back and no static impl ever serves.
Most of a layer treats its tokens apart (the projections, the MLP, the residual adds, the norms:
``align.rowwise`` along ``(batch, seq)``, proven from the values' shapes and the ops'
semantics); only the attention core (and the mask it reads) mixes the tokens of a sequence.

``cut`` splits such a run into consecutive parts: each stretch of token-wise items that holds a
product over a constant weight becomes a region of its own, whose static impls are aligned along
the tokens (``align.plan`` kind "tokens"): built once for a bucket of ``batch * seq`` as rows
``[T, 1, ...]`` and serving every shape whose token count fits (``runtime/aligned.py``); the
items between (the attention core, the mask) are regions keyed as before, run by the dynamic
impl when their exact shape is new. A BERT layer then replays two graphs around one attention
call whatever the shape.

Which regions qualify, and why others don't:
- qualify: every value carrying ``batch`` or ``seq`` has them as its first two dims, in this
  order, and fixed sizes behind; element-wise ops, views keeping both leading dims, norms and
  softmax over later axes, products over constant weights (one row per token), embedding lookups;
- not: attention (scores ``[batch, heads, seq, seq]``), a mask (``[batch, 1, seq, seq]``), a
  position embedding added as ``[1, seq, H]`` (a token's row depends on its position, which
  padding to ``[T, 1]`` would lose), anything reducing over ``seq`` or reshaping it away; a stretch
  with no product (its cost grows with the padding, and it saves few launches); a product over
  ``[batch * seq, H]`` (GPT-2's flattened rows: its leading dim is an expression, not the pair).

Status: off by default (DYNASHAPE_TOKEN_BUCKETS). On an H200, BERT-base at a random (batch 1-32,
seq 8-384) per call (benchmarks/new_shapes_gpu.py, results/new_shapes_tokens_h200_2026-11-29.json):
the cut and the buckets work (397 graphs over 26 token regions, 1,419 replays, no host sync, every
output within 1.5e-6 of eager) but the calls were 0.67-0.73x eager, against 1.32x without them
in the same run. Found: the first graphs are untimed and their products ran IEEE float32 (the
error shows it: 1.4e-6 against the split products' 5.9e-6), 2x slower than the split TF32 ones
the dynamic path takes at large token counts, and tuned rebuilds, which wait for the queue to
settle, replaced 29 of 397; a private memory pool per graph held 70 GB; 31 buckets x 13 regions
is beyond the impl cache's 300 (97 evictions). The IEEE products come from where the graphs are
built: a build on the compile worker never splits (``split_tf32.building``: the split's TF32
switch is process-wide). Built in the calls (static_impls="sync"), with split products, a token
graph set is what this path is for: BERT-base 9.8 / 7.4 / 1.6 / 33 ms at (16, 200) / (8, 300) /
(2, 40) / (32, 384) against the dynamic path's 12.3 / 10.0 / 4.5 / 31.6 and eager's 18.5 / 13.1 /
12.3 / 60.4 (benchmarks/token_probe.py). Next: split products that a background capture may take
(a TF32 product that needs no process-wide switch), fewer graphs (coarser buckets above a few
thousand tokens, a layer's two token regions in one key), and an impl cache sized for them.
"""

from __future__ import annotations

import os

from ..errors import OptionsError
from .align import PRODUCTS, _has_const_weight, rowwise
from .regions import MIN_KERNELS


def cuts(device) -> bool:
    """Whether runs are cut into token regions: DYNASHAPE_TOKEN_BUCKETS '0' (default), 'auto' (on
    CUDA, where their static impls are graphs), '1' (any device: the CPU tests of this path).
    Off by default: measured on an H200 (BERT-base at a random shape per call) the token graphs
    made the calls slower, 0.67-0.73x eager against 1.32x without them (docs/benchmarks.md)."""
    text = os.environ.get("DYNASHAPE_TOKEN_BUCKETS", "0")
    if text not in ("auto", "0", "1"):
        raise OptionsError(f"DYNASHAPE_TOKEN_BUCKETS={text!r}: expected 'auto', '1' or '0'")
    return text == "1" or (text == "auto" and device.type == "cuda")


def cut_for(items, dims_of, canon, input_symbols):
    """The ``cut`` of ``regions.partition`` for these items (see the module docstring)."""

    def cut(its: list[int], syms: frozenset[str]) -> list[list[int]]:
        candidates = sorted(x for x in syms if x in input_symbols)
        if len(candidates) != 2:
            return [its]
        for lead in (tuple(candidates), tuple(reversed(candidates))):
            parts = split(its, [rowwise(items[i].node, lead, dims_of, canon) for i in its],
                          [_product(items[i].node) for i in its])
            if len(parts) > 1:
                return parts
        return [its]
    return cut


def _product(node) -> bool:
    return node is not None and node.op_type in PRODUCTS and _has_const_weight(node)


def split(its: list[int], tokenwise: list[bool], product: list[bool]) -> list[list[int]]:
    """``its`` in consecutive parts: each maximal stretch of token-wise items with a product among
    them (and at least ``MIN_KERNELS`` items) alone, the rest between them together; one part
    when nothing qualifies or everything does."""
    stretches: list[tuple[int, int]] = []  # [start, end) of qualifying stretches
    k = 0
    while k < len(its):
        if not tokenwise[k]:
            k += 1
            continue
        j = k
        while j < len(its) and tokenwise[j]:
            j += 1
        if any(product[k:j]) and j - k >= MIN_KERNELS:
            stretches.append((k, j))
        k = j
    if not stretches or stretches == [(0, len(its))]:
        return [its]
    parts: list[list[int]] = []
    at = 0
    for a, b in stretches:
        if a > at:
            parts.append(its[at:a])
        parts.append(its[a:b])
        at = b
    if at < len(its):
        parts.append(its[at:])
    return parts
