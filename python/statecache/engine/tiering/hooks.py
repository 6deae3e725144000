"""The hooks the reference engine calls on its tiers below GPU memory.

``BlockManager.tiering`` (and ``Engine.tiering``) holds an object with these
methods; the engine calls nothing else on it. Two implement it: the engine's
:class:`~statecache.engine.tiering.Tiering` (real bytes, real tiers) and the
simulator's :class:`~statecache.sim.tiers.SimTiers` (capacity and bandwidth,
no bytes). Hashes are the engine's 64-bit scheduler hashes; positions are in
hash blocks. A hash is a name, not a key: a tier files a value going down
under the 128-bit prefix key the block manager filed the GPU entry under
(``BlockManager.filed``, read while the hook runs) and looks a value coming
up by the sequence's own (``seq.prefix_keys``).

When the engine calls them, within one pass:

1. ``top_of_pass`` first (after the previous batch completed): retire
   finished writes, start new offloads.
2. at admission, per waiting sequence: ``kv_extend`` -> ``discover`` ->
   ``load_state`` (with the hit's KV blocks held) -> ``source_of`` once the
   state was attached;
3. while computing: ``note_keys`` when a sequence's block hashes grow,
   ``note_published`` when a block's KV is indexed, ``on_kv_evict`` when one
   leaves the GPU index;
4. ``flush_kv`` before the forward (evicted blocks go down before the forward
   can overwrite them).

None of them raises for a tier's failure: a failed offload is counted and
forgotten, a failed load makes the engine recompute.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TierHooks(Protocol):
    """The engine's side of the tiers (see the module docstring for when each
    runs). Implementations subclass it (every hook is abstract) or match it
    structurally (``isinstance(obj, TierHooks)``)."""

    @abstractmethod
    def note_keys(self, hashes: Sequence[int], keys: bytes, first_block: int, parent: int | None = None) -> None:
        """Learns the 128-bit prefix keys (16 bytes each, concatenated) of the
        blocks ``first_block, first_block + 1, ...`` whose scheduler hashes are
        ``hashes``; ``parent`` is the hash of block ``first_block - 1`` (None
        for the first block)."""

    @abstractmethod
    def note_published(self, block: int, h: int) -> None:
        """GPU block ``block`` is now indexed under ``h`` (its prefix key is
        ``BlockManager.filed[h]``)."""

    @abstractmethod
    def on_kv_evict(self, h: int) -> None:
        """The KV block filed under ``h`` left the GPU index; its bytes stay
        intact until the next ``flush_kv``, its prefix key is
        ``BlockManager.filed[h]`` until this returns."""

    @abstractmethod
    def flush_kv(self) -> None:
        """Takes the KV blocks evicted since the last call down to the tiers."""

    @abstractmethod
    def top_of_pass(self) -> None:
        """Retires finished offloads and starts new ones."""

    @abstractmethod
    def kv_extend(self, seq: Any, gpu_hit: int, limit: int) -> int:
        """Extends ``seq``'s GPU KV hit of ``gpu_hit`` blocks (up to ``limit``)
        with blocks the tiers hold, loaded into GPU blocks and published.
        Returns the new hit in blocks."""

    @abstractmethod
    def discover(self, seq: Any, upto: int) -> None:
        """Learns which state images of ``seq``'s first ``upto`` boundaries
        the shared tiers hold (so the store's index can offer them)."""

    @abstractmethod
    def load_state(self, h: int, prefix_key: bytes) -> bool:
        """Brings the state image of prefix ``prefix_key`` into the PAGE store
        under ``h`` (READY); the caller holds ``h``'s KV block, filed under that
        key. Returns False when no tier has a trusted copy or no room."""

    @abstractmethod
    def source_of(self, h: int) -> str:
        """Where the image a resume at ``h`` started from came from: ``"gpu"``,
        ``"host"`` or a shared tier's name (forgotten once asked)."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters of offloads, loads and failures (a new dict)."""

    @abstractmethod
    def close(self) -> None:
        """Finishes or abandons the writes in flight; the engine is closing."""


#: the hook names, for checks that the engine calls nothing else
HOOKS = tuple(sorted(TierHooks.__abstractmethods__))
