"""Keys of lower-tier entries (docs/contract.md, "Tiers"): ``(layout_id, tp_rank, tp_size,
prefix key)``, where the prefix key is the 128-bit chained content key of the
token prefix (``statecache.chain_block_keys``), never the 64-bit scheduler
hash alone. ``kind`` separates state images from KV blocks."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("state", "kv")


@dataclass(frozen=True)
class TierKey:
    kind: str
    layout_id: str
    tp_rank: int
    tp_size: int
    prefix_key: bytes

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {KINDS}")
        if not isinstance(self.layout_id, str) or not self.layout_id or "/" in self.layout_id:
            raise ValueError(f"layout_id={self.layout_id!r} must be a non-empty str without '/'")
        for name in ("tp_rank", "tp_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0")
        if self.tp_size < 1 or self.tp_rank >= self.tp_size:
            raise ValueError(f"tp_rank={self.tp_rank} must be in [0, tp_size={self.tp_size})")
        if not isinstance(self.prefix_key, bytes) or len(self.prefix_key) != 16:
            raise ValueError(f"prefix_key must be 16 bytes, got {self.prefix_key!r}")

    def encode(self) -> str:
        """Returns the key as the str the backends store it under. Raises nothing."""
        return f"statecache/v1/{self.kind}/{self.layout_id}/tp{self.tp_rank}-{self.tp_size}/{self.prefix_key.hex()}"

    __str__ = encode
