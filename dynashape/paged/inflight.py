"""A paged engine step's records: a conversation's sampling options, a launched run whose tokens are
on their way to the host (``Inflight``), the tokens a step hands out (``Event``), and the small
predicates the step's launch and commit share."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import OptionsError


@dataclass
class Sampling:
    """A conversation's search options (onnxruntime-genai's names)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)

    def check(self) -> None:
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise OptionsError(f"sampling {self}: expected temperature > 0, 0 < top_p <= 1, top_k >= 0, "
                               "repetition_penalty > 0")


@dataclass
class Inflight:
    """A launched step: its plan, the keys of its sampling rows and their tokens (on the device, and
    on their way to ``host``; ``event`` marks their arrival), ``index``: key -> place in ``tokens``."""

    plan: object
    keys: list
    tokens: torch.Tensor
    host: torch.Tensor
    event: object
    index: dict


def decode_row(r) -> bool:
    """A row of one position after a past: a decode run's (a prompt's last position of one included)."""
    return r.end - r.start == 1 and r.start > 0


def mark(dev):
    """An event at the current stream's work so far (None on the CPU, whose work is done when launched)."""
    if dev.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def ready(inf: Inflight) -> bool:
    """Whether the run's tokens are in (without waiting)."""
    return inf.event is None or inf.event.query()


@dataclass
class Event:
    """A token made for a conversation by a step; ``finished``: its last."""

    key: object
    token: int
    finished: bool
