"""A Python client over a deployment's handle: typed errors, and retries that never answer twice.

A request whose replica dies before answering is sent again to another replica (Ray restarts the
dead one); its id goes with it and must come back with the answer, so every call returns exactly
one answer, for that request. Decode steps are not retried: the conversation's cache died with
its replica, and ``ConversationLostError`` says to start it again.
"""

from __future__ import annotations

import uuid

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError

from ..errors import ConversationLostError, DynashapeError, ExecutionError, ServerBusyError

_REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


def _unwrap(e: RayTaskError) -> Exception:
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, DynashapeError) else e


class Client:
    def __init__(self, handle, *, retries: int = 3, timeout_s: float = 120.0) -> None:
        self.handle, self.retries, self.timeout_s = handle, retries, timeout_s
        self.retried = 0

    def infer(self, feeds: dict) -> dict:
        rid = uuid.uuid4().hex
        last: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                reply = self.handle.infer_tagged.remote(feeds, rid).result(timeout_s=self.timeout_s)
            except BackPressureError as e:
                raise ServerBusyError(f"the deployment's queue is full: {e}") from e
            except RayTaskError as e:
                if isinstance(getattr(e, "cause", None), _REPLICA_GONE):
                    last = e
                    self.retried += 1
                    continue
                raise _unwrap(e) from e
            except _REPLICA_GONE as e:
                last = e
                self.retried += 1
                continue
            if reply["request_id"] != rid:
                raise ExecutionError(f"answer for request {reply['request_id']} came back to {rid}")
            return reply["outputs"]
        raise ExecutionError(f"request {rid}: no replica answered after {self.retries} retries: {last}")

    def step(self, key: str, feeds: dict, start: bool = False) -> dict:
        try:
            return self.handle.options(multiplexed_model_id=key).step.remote(feeds, start).result(
                timeout_s=self.timeout_s)
        except BackPressureError as e:
            raise ServerBusyError(f"the deployment's queue is full: {e}") from e
        except RayTaskError as e:
            raise _unwrap(e) from e
        except _REPLICA_GONE as e:
            raise ConversationLostError(f"conversation {key!r}: its replica died during the step; start it "
                                        "again with start=True") from e

    def stats(self) -> dict:
        return self.handle.stats.remote().result(timeout_s=self.timeout_s)
