"""`StateStoreOperationId`: the identity of one attempt to store a hash in a tier."""

from __future__ import annotations

from operator import index as _index
from typing import Any


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return _index(value)


class StateStoreOperationId(tuple[int, int]):
    """``(prefix_hash, generation)`` as a real tuple.

    A tuple so that it hashes, compares, unpacks and serializes exactly like the
    pair callers already key reports by; the generation separates a hash stored
    again after an eviction from the earlier attempt whose report may still be
    on the wire.
    """

    __slots__ = ()
    __module__ = "statecache"

    def __new__(cls, prefix_hash: Any, generation: Any) -> StateStoreOperationId:
        """Raises TypeError for a non-int (or bool), ValueError for generation < 0."""
        h = _as_int(prefix_hash, "prefix_hash")
        g = _as_int(generation, "generation")
        if g < 0:
            raise ValueError(f"generation={g} must be >= 0")
        return tuple.__new__(cls, (h, g))

    @property
    def prefix_hash(self) -> int:
        return self[0]

    @property
    def generation(self) -> int:
        return self[1]

    def __getnewargs__(self) -> tuple[int, int]:
        return (self[0], self[1])

    def __repr__(self) -> str:
        return f"StateStoreOperationId(prefix_hash={self[0]}, generation={self[1]})"
