"""Tiers below GPU memory for the reference engine (docs/contract.md, "Tiers").

``Tiering`` implements the engine's ``TierHooks`` over real tiers; the
simulator's ``SimTiers`` implements the same hooks without bytes.
"""

from .hooks import HOOKS, TierHooks
from .mover import UnitMover, _consecutive
from .tiering import Tiering, attach_tiers

__all__ = ["HOOKS", "TierHooks", "Tiering", "UnitMover", "_consecutive", "attach_tiers"]
