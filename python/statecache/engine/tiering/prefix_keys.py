"""Which lower-tier key a value goes down or comes up under.

The engine's GPU indexes are keyed by 64-bit scheduler hashes, which an
outsider can make collide; every value below GPU memory is filed under the
full 128-bit prefix key (with layout and rank,
``statecache.tiers.keys.TierKey``), never under a hash alone: a value going
down under the key the engine filed its GPU entry under (``filed``, the block
manager's hash -> key map, read while the entry is filed), a value coming up
under the admitted sequence's own key. ``note`` keeps the chains of reported
hashes (parent, position, the key that reported them) in the tiers'
``PrefixChains``, bounded, for the placement's ranking only.
"""

from __future__ import annotations

from collections.abc import Mapping

from statecache.tiers.keys import TierKey
from statecache.tiers.placement import PrefixChains


class PrefixKeys:
    """Tier keys from prefix keys; the chains of scheduler hashes for the placement."""

    def __init__(
        self, layout_id: str, hash_block_size: int, tp_rank: int, tp_size: int, filed: Mapping[int, bytes]
    ) -> None:
        self.layout_id = layout_id
        self.hbs = hash_block_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.filed = filed
        self.chains = PrefixChains()

    def note(self, hashes, keys: bytes, first_block: int, parent: int | None = None) -> None:
        """Learns the chain of blocks ``first_block...`` (``parent``: the hash
        of block ``first_block - 1``) and the prefix keys that reported them."""
        self.chains.note(hashes, first_block, parent, [keys[16 * i : 16 * i + 16] for i in range(len(hashes))])

    def key(self, kind: str, prefix_key: bytes | None) -> str | None:
        """The tier key of the ``kind`` value ("state" or "kv") of prefix
        ``prefix_key`` (16 bytes), or None for None."""
        if prefix_key is None:
            return None
        return TierKey(kind, self.layout_id, self.tp_rank, self.tp_size, prefix_key).encode()

    def filed_key(self, kind: str, h: int) -> str | None:
        """The tier key of the GPU entry filed under ``h`` now, or None when
        the KV index holds nothing under ``h``."""
        return self.key(kind, self.filed.get(h))

    def ranking_key(self, kind: str, h: int) -> str | None:
        """The tier key the chains last saw for ``h``: for re-ranking a value
        only (a wrong one finds nothing to re-rank), never to read or write."""
        return self.key(kind, self.chains.payload(h))

    def position(self, h: int) -> int:
        """Where ``h``'s prefix ends, in hash blocks (the PAGE store's position
        unit, so its cost model applies unchanged); 0 if unknown."""
        return self.chains.position(h)
