"""A paged KV cache and a continuous-batching scheduler for serving LLM decode steps (issue 39).

``blocks``: one device pool of fixed-size KV blocks, a block table per conversation.
``attention``: attention of query rows over their conversations' blocks (the torch reference).
``scheduler``: which conversations step together, prompt chunks, preemption when blocks run out.
``engine``: ``PagedEngine``, an exported ONNX decoder's steps for many conversations over the pool
(``batch``: a run's host arrays; ``step_graphs``: decode and prompt-chunk runs as CUDA graphs;
``inflight``: a step's records, its runs whose tokens are on their way, the tokens it hands out). It loads a model
session, so it is imported from ``dynashape.paged.engine``, not here.
"""

from .attention import paged_attention, write_kv
from .blocks import BlockPool, BlockTable, blocks_for_memory
from .scheduler import Plan, Scheduler, Sequence

__all__ = ["BlockPool", "BlockTable", "Plan", "Scheduler", "Sequence", "blocks_for_memory", "paged_attention",
           "write_kv"]
