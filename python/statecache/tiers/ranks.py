"""Tensor-parallel ranks in the tiers (docs/contract.md, "Tiers").

Each rank stores its own shard of a state image or KV block under its own
key (``TierKey(kind, layout_id, tp_rank, tp_size, prefix_key)``). Two rules,
each decided here only:

* **Identity.** Where a rank's identity matters (anything that writes or
  reads shards), ``tp_size > 1`` needs an explicit ``tp_rank``: no silent
  rank 0 (``rank_identity``).
* **All or nothing.** A prefix is resumable from the tiers only when every
  rank's shard is held (``every_rank_holds``): one rank resuming while
  another recomputes would run the ranks on different states. The engine's
  ``Tiering`` asks this before it loads; a connector's scheduler asks it
  before it promises a hit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .keys import TierKey


def rank_identity(tp_rank: int | None, tp_size: int) -> tuple[int, int]:
    """Returns ``(tp_rank, tp_size)``, checked: ``tp_rank`` may be left None
    only when ``tp_size`` is 1. Raises ValueError naming the argument."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size={tp_size!r} must be an int >= 1")
    if tp_rank is None:
        if tp_size > 1:
            raise ValueError(f"tp_rank is required when tp_size={tp_size} > 1 (each rank writes its own shards)")
        return 0, 1
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank!r} must be an int in [0, tp_size={tp_size})")
    return tp_rank, tp_size


def shard_keys(kind: str, layout_id: str, tp_size: int, prefix_key: bytes) -> list[str]:
    """Every rank's key for one value, rank 0 first."""
    return [TierKey(kind, layout_id, r, tp_size, prefix_key).encode() for r in range(tp_size)]


def every_rank_holds(
    held: Callable[[list[str]], Sequence[bool]],
    kind: str,
    layout_id: str,
    tp_size: int,
    prefix_keys: Sequence[bytes],
) -> list[bool]:
    """Per prefix key: whether every rank's shard is held. ``held(keys)``
    answers per key whether some tier holds it (one call for all of them)."""
    keys = [k for p in prefix_keys for k in shard_keys(kind, layout_id, tp_size, p)]
    if not keys:
        return []
    got = list(held(keys))
    if len(got) != len(keys):
        raise ValueError(f"held answered {len(got)} keys for {len(keys)}")
    return [all(got[i * tp_size : (i + 1) * tp_size]) for i in range(len(prefix_keys))]
