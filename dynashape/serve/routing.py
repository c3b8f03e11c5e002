"""Which replica gets a request: conversations by their key, the rest to the less loaded of two.

A conversation's KV cache lives on one replica, so every step must go there. Ray's multiplexed
routing only prefers the replica that reported the key (the report lags, so a quick second step
can land elsewhere: seen in tests), so the key picks its replica by rendezvous hashing over the
running replicas: deterministic, and when a replica dies only its own conversations move (and
hear ``ConversationLostError``). Requests without a key get Serve's usual power of two choices.
Each routing task fulfils exactly its own request (no FIFO mixin), so a key never borrows a
replica chosen for another.
"""

from __future__ import annotations

import hashlib
import random

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica


def rendezvous(key: str, replica_ids: list[str]) -> str:
    """The replica id with the highest hash of (key, id): stable while the set is."""
    return max(replica_ids, key=lambda r: hashlib.blake2b(f"{key}\0{r}".encode(), digest_size=8).digest())


class ConversationRouter(RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        if key:
            by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
            return [[by_id[rendezvous(key, sorted(by_id))]]]
        if len(candidate_replicas) <= 2:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        return [random.sample(candidate_replicas, 2)]
