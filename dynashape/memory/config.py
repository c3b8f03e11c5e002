"""The memory options of a session (the memory issue's), shared by both executors."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import OptionsError
from .growth import GROWTH
from .predictor import PredictorOptions, ShapePredictor

MEMORY_DEPS = ("in_order", "out_of_order")  # the memory-dependency passes the interpreter's pool can use


@dataclass(frozen=True)
class MemoryConfig:
    """Session options of the memory issue (all have defaults)."""

    pool: bool = True
    memory_deps: str = "in_order"
    predictor: PredictorOptions = field(default_factory=PredictorOptions.from_env_or)
    inplace_concat: bool = True
    kv_growth: str = "geometric"

    @staticmethod
    def make(options: dict) -> MemoryConfig:
        deps = options.get("memory_deps", "in_order")
        if deps not in MEMORY_DEPS:
            raise OptionsError(f"memory_deps={deps!r}: expected one of {sorted(MEMORY_DEPS)}")
        growth = options.get("kv_growth", "geometric")
        if growth not in GROWTH:
            raise OptionsError(f"kv_growth={growth!r}: expected one of {sorted(GROWTH)}")
        return MemoryConfig(pool=bool(options.get("memory_pool", True)), memory_deps=deps,
                            predictor=PredictorOptions.from_env_or(options.get("preallocation")),
                            inplace_concat=bool(options.get("inplace_concat", True)), kv_growth=growth)

    def make_predictor(self, engine) -> ShapePredictor | None:
        if not self.predictor.enabled:
            return None
        return ShapePredictor(self.predictor, engine.can_preallocate)
