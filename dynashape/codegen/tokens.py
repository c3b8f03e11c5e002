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
seq 8-384) per call (benchmarks/new_shapes_gpu.py; docs/benchmarks.md, "GPU: token regions"): the
cut and the buckets work (no host sync, outputs within 5.9e-6 of eager, no padded row leaks), and
a token graph set built in the calls is 1.3-2.9x the dynamic path per shape (benchmarks/
token_probe.py), but at a random shape per call the calls were 0.78x eager against 1.41x without
token regions, in the same minutes. Fixed on the way: the graphs' products ran IEEE float32 (a
build on the compile worker never switches cuBLAS's process-wide TF32 on), now split in Triton
inside a token build (``split_tf32.flag_free_builds``); 31 buckets were 403 graphs, beyond the
impl cache, now 21 up to 6,144 tokens (``runtime/aligned.py`` ``MAX_TOKENS``). Not understood yet:
why the replays lose at random shapes while each shape's replay wins (the 273 builds' 2.5 s on
the worker beside 150 calls, the untimed first graphs, the copies into padded live-ins are the
suspects); a memory pool shared by a request's token graphs (torch's allocator asserted in the
one attempt).
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
