"""Spare room for a KV cache's storage: how many positions a new storage holds beyond the ones
it needs now, so that the next steps append in place (``kv_growth=`` session option)."""

from __future__ import annotations

import math


def growth_openvino(total: int, index: int) -> int:
    """OpenVINO's KV-cache rule: 128 spare positions, staggered by the concat's index."""
    return 128 + index % 64


def growth_geometric(total: int, index: int) -> int:
    """Ours: a quarter of the current length, at least 128 positions, staggered by index so that
    the layers of a model do not all grow at the same step. Long sequences grow O(log n) times
    instead of n/128 times, for at most ~25% spare room."""
    return max(128, math.ceil(total / 4)) + (index % 16) * 8


GROWTH = {"openvino": growth_openvino, "geometric": growth_geometric}
