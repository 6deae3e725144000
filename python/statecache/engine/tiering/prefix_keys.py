"""Which lower-tier key a scheduler hash stands for.

The engine's GPU indexes are keyed by 64-bit scheduler hashes; every value
below GPU memory is filed under the full 128-bit prefix key (with layout and
rank, ``statecache.tiers.keys.TierKey``). ``PrefixKeys`` keeps the mapping the
engine reports through ``note_keys``, bounded.
"""

from __future__ import annotations

import itertools

from statecache.tiers.keys import TierKey

_MAX_KNOWN = 1 << 21  # hashes remembered; past this the oldest half is forgotten


class PrefixKeys:
    """scheduler hash -> (128-bit prefix key, tokens the prefix covers)."""

    def __init__(self, layout_id: str, hash_block_size: int, tp_rank: int, tp_size: int) -> None:
        self.layout_id = layout_id
        self.hbs = hash_block_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.known: dict[int, tuple[bytes, int]] = {}

    def note(self, hashes, keys: bytes, first_block: int) -> None:
        """Learns the prefix keys of blocks ``first_block...``."""
        for i, h in enumerate(hashes):
            self.known[h] = (keys[16 * i : 16 * i + 16], (first_block + i + 1) * self.hbs)
        if len(self.known) > _MAX_KNOWN:
            for h in list(itertools.islice(self.known, len(self.known) // 2)):
                del self.known[h]

    def key(self, kind: str, h: int) -> str | None:
        """The tier key of ``h``'s ``kind`` value ("state" or "kv"), or None
        when ``h`` was never reported."""
        k = self.known.get(h)
        if k is None:
            return None
        return TierKey(kind, self.layout_id, self.tp_rank, self.tp_size, k[0]).encode()

    def position(self, h: int) -> int:
        """Where ``h``'s prefix ends, in hash blocks (the PAGE store's position
        unit, so its cost model applies unchanged); 0 if unknown."""
        k = self.known.get(h)
        return k[1] // self.hbs if k else 0
