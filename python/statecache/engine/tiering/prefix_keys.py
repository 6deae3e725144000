"""Which lower-tier key a scheduler hash stands for.

The engine's GPU indexes are keyed by 64-bit scheduler hashes; every value
below GPU memory is filed under the full 128-bit prefix key (with layout and
rank, ``statecache.tiers.keys.TierKey``). ``PrefixKeys`` keeps the keys the
engine reports through ``note_keys`` in the tiers' ``PrefixChains`` (which
also know each block's parent and position, for the placement), bounded.
"""

from __future__ import annotations

from statecache.tiers.keys import TierKey
from statecache.tiers.placement import PrefixChains


class PrefixKeys:
    """scheduler hash -> 128-bit prefix key, position and parent."""

    def __init__(self, layout_id: str, hash_block_size: int, tp_rank: int, tp_size: int) -> None:
        self.layout_id = layout_id
        self.hbs = hash_block_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.chains = PrefixChains()

    def note(self, hashes, keys: bytes, first_block: int, parent: int | None = None) -> None:
        """Learns the prefix keys of blocks ``first_block...`` (``parent``:
        the hash of block ``first_block - 1``)."""
        self.chains.note(hashes, first_block, parent, [keys[16 * i : 16 * i + 16] for i in range(len(hashes))])

    def key(self, kind: str, h: int) -> str | None:
        """The tier key of ``h``'s ``kind`` value ("state" or "kv"), or None
        when ``h`` was never reported."""
        k = self.chains.payload(h)
        if k is None:
            return None
        return TierKey(kind, self.layout_id, self.tp_rank, self.tp_size, k).encode()

    def position(self, h: int) -> int:
        """Where ``h``'s prefix ends, in hash blocks (the PAGE store's position
        unit, so its cost model applies unchanged); 0 if unknown."""
        return self.chains.position(h)
