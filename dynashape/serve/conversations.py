"""Conversations a replica holds for decode loops: their KV state, by key, with an idle timeout.

A conversation is a dedicated InferRequest (its own arena and KV storages, so that interleaved
conversations do not evict each other's in-place caches) plus the state fed back each step.
Dropping one frees its memory: the request and its tensors have no other owner.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Conversation:
    request: object                      # the InferRequest that runs its steps
    state: dict = field(default_factory=dict)  # past input -> the tensor fed next step
    length: int = 0                      # tokens in its cache
    steps: int = 0
    last_used: float = 0.0


class ConversationStore:
    def __init__(self, timeout_s: float, max_live: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.max_live, self.clock = timeout_s, max_live, clock
        self.live: OrderedDict[str, Conversation] = OrderedDict()
        self.lock = threading.Lock()
        self.expired = self.evicted = 0

    def get(self, key: str) -> Conversation | None:
        with self.lock:
            conv = self.live.get(key)
            if conv is not None:
                conv.last_used = self.clock()
                self.live.move_to_end(key)
            return conv

    def put(self, key: str, conv: Conversation) -> None:
        with self.lock:
            conv.last_used = self.clock()
            self.live[key] = conv
            self.live.move_to_end(key)
            while len(self.live) > self.max_live:
                self.live.popitem(last=False)
                self.evicted += 1

    def drop(self, key: str) -> bool:
        with self.lock:
            return self.live.pop(key, None) is not None

    def sweep(self) -> int:
        """Free the conversations idle longer than the timeout; how many went."""
        now = self.clock()
        with self.lock:
            old = [k for k, c in self.live.items() if now - c.last_used > self.timeout_s]
            for k in old:
                del self.live[k]
            self.expired += len(old)
            return len(old)

    def stats(self) -> dict:
        with self.lock:
            return {"live": len(self.live), "expired": self.expired, "evicted": self.evicted,
                    "tokens": sum(c.length for c in self.live.values())}
