"""Tiers below GPU memory (docs/contract.md, "Tiers"): a host-memory tier and shared tiers
on Mooncake Store or Redis, behind one batch-first interface.

``MooncakeTier`` and ``RedisTier`` import their client libraries lazily; a
missing one raises ImportError naming the extra to install
(``pip install 'statecache[mooncake]'`` / ``'statecache[redis]'``).
"""

from typing import TYPE_CHECKING

from .base import FAILED, MISSING, TIMED_OUT, TRUNCATED, Tier, TierError
from .host import HostTier
from .keys import TierKey

__all__ = [
    "FAILED",
    "HostTier",
    "MISSING",
    "MooncakeTier",
    "RedisTier",
    "TIMED_OUT",
    "TRUNCATED",
    "Tier",
    "TierError",
    "TierKey",
]


if TYPE_CHECKING:  # imported on first use at run time (their clients are optional)
    from .mooncake_tier import MooncakeTier as MooncakeTier
    from .redis_tier import RedisTier as RedisTier


def __getattr__(name: str) -> type[Tier]:
    if name == "MooncakeTier":
        from .mooncake_tier import MooncakeTier

        return MooncakeTier
    if name == "RedisTier":
        from .redis_tier import RedisTier

        return RedisTier
    raise AttributeError(f"module 'statecache.tiers' has no attribute {name!r}")
