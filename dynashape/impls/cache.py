"""ImplCache: the static impls of one compiled model, least recently used first out.

A key is (request token, region, values of the region's key symbols): a static impl reads and
writes the buffers of one request's arena at the addresses it was built for, so it belongs to
that request and that arena plan (the token); the values of the symbols fix every shape in it.
Capacity 300 by default as in the design notes (0: unbounded), ``impl_cache_size=`` or
``DYNASHAPE_IMPL_CACHE``. Thread-safe: requests on several threads share one cache.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict

DEFAULT_CAPACITY = 300


def capacity_from(option: int | None) -> int:
    if option is not None:
        return int(option)
    return int(os.environ.get("DYNASHAPE_IMPL_CACHE", DEFAULT_CAPACITY))


class ImplCache:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"impl cache capacity must be >= 0 (0: unbounded), got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.stats: Counter = Counter()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def get(self, key):
        with self._lock:
            impl = self._items.get(key)
            if impl is None:
                self.stats["impl_cache_misses"] += 1
                return None
            self._items.move_to_end(key)
            self.stats["impl_cache_hits"] += 1
            return impl

    def peek(self, key):
        """The impl under ``key`` or None, counting nothing and keeping its place."""
        with self._lock:
            return self._items.get(key)

    def put(self, key, impl) -> None:
        with self._lock:
            self._items[key] = impl
            self._items.move_to_end(key)
            while self.capacity and len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.stats["impl_cache_evictions"] += 1

    def drop(self, token) -> int:
        """Forget the impls of one request token (its arena was planned anew: their addresses
        are gone). Returns how many."""
        with self._lock:
            keys = [k for k in self._items if k[0] == token]
            for k in keys:
                del self._items[k]
            self.stats["impl_cache_dropped"] += len(keys)
            return len(keys)

    def summary(self) -> dict:
        with self._lock:
            base = dict.fromkeys(("impl_cache_hits", "impl_cache_misses", "impl_cache_evictions",
                                  "impl_cache_dropped"), 0)
            return {**base, **self.stats, "impl_cache_size": len(self._items), "impl_cache_capacity": self.capacity}
