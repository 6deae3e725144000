"""Reference engine: KV prefix cache + state checkpoints + a continuous-batching
scheduler that follows the pass protocol (docs/contract.md, "The pass", "Reference
engine"). Torch-free; the model runner is plugged in (``statecache.models``) or
absent (the simulator)."""

from .adaptive import AdaptiveCheckpointPolicy, CostModel
from .block_manager import SOURCE_FORK, SOURCE_NONE, SOURCE_PAGE, Admission, BlockManager
from .placement import (
    ANCHOR,
    DEMAND,
    LADDER,
    AnchorLadderDemand,
    Boundary,
    EvictionPolicy,
    GuessFirstLRU,
    PlacementContext,
    PlacementPolicy,
    PlainLRU,
    feasible_positions,
    prompt_end_anchor,
)
from .scheduler import Batch, BatchItem, Engine, EngineConfig, Request
from .state_caches import StateCaches, StateOps

__all__ = [
    "AdaptiveCheckpointPolicy",
    "CostModel",
    "ANCHOR",
    "DEMAND",
    "LADDER",
    "Admission",
    "AnchorLadderDemand",
    "Batch",
    "BatchItem",
    "BlockManager",
    "Boundary",
    "Engine",
    "EngineConfig",
    "EvictionPolicy",
    "GuessFirstLRU",
    "PlacementContext",
    "PlacementPolicy",
    "PlainLRU",
    "Request",
    "SOURCE_FORK",
    "SOURCE_NONE",
    "SOURCE_PAGE",
    "StateCaches",
    "StateOps",
    "feasible_positions",
    "prompt_end_anchor",
]
