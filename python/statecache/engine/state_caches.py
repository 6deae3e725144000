"""The state side of one backend: where live slots come from, and which caches
keep checkpoints. Chosen by the backend's ``StateTransfer`` (docs/contract.md,
"Words", "Objects"):

* ``fork(n)``: a ``StateSlotPool`` is both the slot allocator and the only
  checkpoint cache.
* ``copy(layout_id)``: a ``StateSlotPool`` under ``none()`` only allocates
  live slots; a ``PagedStateCheckpointCoordinator`` keeps PAGE images in
  units of the KV ``BlockPool``.
* ``replay()``: slots only; every KV hit is resumable.
* ``none()``: slots only, and the slot pool caps every hit to 0.
"""

from __future__ import annotations

import math

import statecache
from statecache.logs import DegradationMonitor


class StateCaches:
    """The slot allocator plus the list of caches that vote on hits
    (``voters``) and receive checkpoints."""

    def __init__(self, transfer, slot_pool, coordinator=None, hash_block_size: int = 16):
        self.transfer = transfer
        self.slot_pool = slot_pool
        self.coordinator = coordinator
        self.hash_block_size = hash_block_size
        self.forks = bool(transfer.forks)
        self.pages = coordinator is not None
        # logs offload backlog overflow and reclaimed pins, polled each pass
        self.degradations = DegradationMonitor(coordinator) if self.pages else None
        if self.pages:
            self.voters = [coordinator]
        elif transfer.replays:
            self.voters = []
        else:
            self.voters = [slot_pool]

    @classmethod
    def build(
        cls,
        transfer,
        num_slots: int,
        hash_block_size: int,
        block_pool=None,
        spec=None,
        enabled: bool = True,
        max_num_seqs: int | None = None,
    ) -> StateCaches:
        if transfer.copies:
            if block_pool is None or spec is None:
                raise ValueError("a copy transfer needs block_pool and spec for PAGE images")
            slots = statecache.StateSlotPool(
                num_slots, statecache.StateTransfer.none(), hash_block_size=hash_block_size, enabled=enabled
            )
            coord = statecache.PagedStateCheckpointCoordinator(
                block_pool, spec, enabled, readable_midstep=transfer.readable_midstep
            )
            if transfer.readable_midstep:
                # midstep stores must fit the runner's per-batch op staging
                coord.attach_midstep_scratch(slots, statecache.checkpoint_copy_ops_per_batch(max_num_seqs or num_slots))
            return cls(transfer, slots, coord, hash_block_size)
        slots = statecache.StateSlotPool(num_slots, transfer, hash_block_size=hash_block_size, enabled=enabled)
        return cls(transfer, slots, None, hash_block_size)

    @property
    def successor_room(self) -> float:
        """Room the forward after a checkpoint must cover; ``inf`` when no
        cache can keep anything."""
        if not self.voters or self.transfer.replays or self.transfer.kind == "none":
            return math.inf
        return max(float(c.successor_room) for c in self.voters)

    @property
    def readable_midstep(self) -> bool:
        """Whether the backend reads interior states and some cache keeps them."""
        return bool(self.transfer.readable_midstep) and bool(self.voters)

    def resumable_hit(self, seq, hit: int, hashes) -> int:
        """Cap ``hit`` with every voter until it stops shrinking (0 absorbs)."""
        while hit > 0:
            capped = hit
            for cache in self.voters:
                capped = cache.resumable_hit(seq, capped, hashes)
                if capped == 0:
                    return 0
            if capped == hit:
                return hit
            hit = capped
        return 0

    def unindex(self, h: int) -> None:
        """Drops the checkpoint filed under ``h`` from every voter (its KV block left)."""
        for cache in self.voters:
            cache.unindex(h)

    # ------------------------------ pass hooks ------------------------------ #

    def top_of_pass(self) -> None:
        """Step 1 of a pass: drop issued pins, make last batch's stores READY, log
        degradations seen since the last pass."""
        self.slot_pool.release_pins()
        if self.coordinator is not None:
            self.coordinator.complete_previous_batch()
        if self.degradations is not None:
            self.degradations.poll()

    def take_ops(self) -> StateOps:
        """Step 3 of a pass: drains this batch's maintenance ops (relocations,
        PAGE stores and restores); returns them as ``StateOps``."""
        relocations = tuple(self.slot_pool.take_relocations())
        stores, restores = (), ()
        if self.coordinator is not None:
            stores, restores = self.coordinator.take_checkpoint_ops()
        return StateOps(relocations, (), tuple(stores), tuple(restores))

    def checkpoint_fates(self) -> dict[str, int]:
        """The voters' ``checkpoint_fates()`` summed key by key."""
        out: dict[str, int] = {}
        for cache in self.voters:
            for k, v in cache.checkpoint_fates().items():
                out[k] = out.get(k, 0) + v
        return out


class StateOps:
    """One batch's state maintenance ops, in the order the runner executes
    them before the forward: relocations, group copies, PAGE stores, PAGE
    restores."""

    __slots__ = ("relocations", "copies", "stores", "restores")

    def __init__(self, relocations=(), copies=(), stores=(), restores=()):
        self.relocations = relocations
        self.copies = copies
        self.stores = stores
        self.restores = restores

    def __bool__(self) -> bool:
        return bool(self.relocations or self.copies or self.stores or self.restores)

    def __repr__(self) -> str:
        return (
            f"StateOps(relocations={len(self.relocations)}, copies={len(self.copies)}, "
            f"stores={len(self.stores)}, restores={len(self.restores)})"
        )
