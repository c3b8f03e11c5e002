"""Forms derived from a weight tensor (packed, transformed, planned: the update_weights step),
kept per tensor object while it lives and is not written to.

A model's constant weights are the same tensor objects call after call, so a kernel derives its
form of one once: keyed by the tensor's identity (and a ``slot`` when one weight has several
forms), valid while the tensor's ``_version`` and the caller's ``tag`` (what else the form was
made from) are unchanged, and dropped when the tensor dies. A form must not hold the tensor's
Python object, nor a view of it (a view keeps its base's object alive): the tensor would never
die and its forms would stay for good. A form that needs the values holds ``w.detach()``, an alias
of the storage without the object.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch


class WeightCache:
    def __init__(self) -> None:
        self._items: dict[tuple, tuple] = {}  # (id(w), slot) -> (weakref, version, tag, form)

    def get(self, w: torch.Tensor, make: Callable[[], Any], slot: Hashable = None, tag: Any = None) -> Any:
        """The form of ``w`` that ``make()`` derives, made once while ``w`` and ``tag`` stay the same."""
        key = (id(w), slot)
        hit = self._items.get(key)
        if hit is not None and hit[0]() is w and hit[1] == w._version and hit[2] == tag:
            return hit[3]
        form = make()
        try:  # (the callback holds the dict, not self: alive at exit)
            ref = weakref.ref(w, lambda _r, k=key, items=self._items: items.pop(k, None))
        except TypeError:  # a tensor that takes no weak reference: not kept
            return form
        self._items[key] = (ref, w._version, tag, form)
        return form

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, weight_id: int) -> bool:
        """Whether a form of the weight with this ``id`` is kept."""
        return any(k[0] == weight_id for k in self._items)


class ConstantsCache:
    """Values derived from a few small tensors (scales, zero points, biases), kept per the tensors'
    identities: a model's constants come as the same tensors every call, and reading or combining
    them (``item()``, float32 arithmetic, a one-element tensor) costs microseconds a call that the
    kernel does not. An entry holds its tensors (they are small), so that their ids stay theirs
    while it is kept; their versions tell a write. Tensors made per call (not constants) miss and
    fill the cache, which is emptied when it reaches ``limit`` entries."""

    def __init__(self, limit: int = 1024) -> None:
        self._items: dict[tuple, tuple] = {}
        self.limit = limit

    def get(self, tensors: tuple, make: Callable[[], Any], tag: Hashable = None) -> Any:
        """``make()`` for these tensors (None allowed among them) and ``tag``, made once while they stay.
        (An entry holds its tensors: while it is there, no other object can have their ids, so a
        key that matches names the same tensors.)"""
        key = (*map(id, tensors), tag)
        versions = tuple([None if t is None else t._version for t in tensors])
        hit = self._items.get(key)
        if hit is not None and hit[1] == versions:
            return hit[2]
        value = make()
        if len(self._items) >= self.limit:
            self._items.clear()
        self._items[key] = (tensors, versions, value)
        return value
