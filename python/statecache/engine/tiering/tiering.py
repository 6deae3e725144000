"""``Tiering``: the engine's tiers below GPU memory, one object behind the
``TierHooks`` the engine calls (docs/contract.md, "Tiers").

Order: GPU (PAGE store, KV block pool) -> host (``HostTier``) -> shared
(``MooncakeTier`` / ``RedisTier``). The pieces, one module each: prefix keys
(``prefix_keys``), the unit mover (``mover``), the tiers and their shared
bookkeeping (``stack``), the store side (``store``), the KV side (``kv``) and
the load side (``load``). Every value below GPU memory carries its full key
and an XXH3-128 checksum; a load adopts bytes only when both match.
"""

from __future__ import annotations

import statecache
from statecache.logs import logger
from statecache.tiers.placement import TierPlacement
from statecache.tiers.ranks import every_rank_holds, rank_identity

from .hooks import TierHooks
from .kv import KVBlocks
from .load import Loads
from .mover import UnitMover
from .prefix_keys import PrefixKeys
from .stack import TIER_ERRORS, TierStack
from .store import StateOffloads


class Tiering(TierHooks):
    """Host and shared tiers under one engine's PAGE store and KV pool.

    ``tiers``: at most one ``HostTier`` (first) and any shared tiers, in the
    order lookups ask them. ``shared_writes``: ``"demote"`` (a host value goes
    to the shared tiers when the host evicts it, and at ``flush()``) or
    ``"through"`` (every value also goes to the shared tiers when written).
    Values are named by 128-bit prefix keys, never by a 64-bit hash alone:
    what goes down by the key ``block_manager`` filed the GPU entry under,
    what comes up by the admitted sequence's own key (``prefix_keys``).
    ``tp_rank`` / ``tp_size``: this rank's identity; ``tp_rank`` is required when ``tp_size > 1``, and a
    prefix is then loaded only when every rank's shard is held
    (``statecache.tiers.ranks``).
    """

    def __init__(
        self,
        tiers,
        *,
        caches,
        block_manager,
        page_layout,
        layout_id: str,
        hash_block_size: int,
        tp_rank: int | None = None,
        tp_size: int = 1,
        max_inflight: int = 16,
        offload_timeout_s: float = 10.0,
        shared_writes: str | None = None,
        kv: bool = True,
    ):
        if caches.coordinator is None:
            raise ValueError("tiers need PAGE checkpoints (a copy StateTransfer)")
        if not isinstance(max_inflight, int) or isinstance(max_inflight, bool) or max_inflight <= 0:
            raise ValueError(f"max_inflight={max_inflight!r} must be a positive int")
        if (
            isinstance(offload_timeout_s, bool)
            or not isinstance(offload_timeout_s, (int, float))
            or not offload_timeout_s > 0
        ):
            raise ValueError(f"offload_timeout_s={offload_timeout_s!r} must be a positive number")
        self.caches = caches
        self.coord = caches.coordinator
        self.pool = block_manager.pool
        self.mover = UnitMover(page_layout)
        self.unit_bytes = self.mover.unit_bytes
        self.upc = self.coord.store.units_per_checkpoint
        self.layout_id = layout_id
        tp_rank, tp_size = rank_identity(tp_rank, tp_size)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.max_inflight = max_inflight
        self.offload_timeout_s = offload_timeout_s
        self.keys = PrefixKeys(layout_id, hash_block_size, tp_rank, tp_size, block_manager.filed)
        self.stack = TierStack(
            tiers,
            unit_bytes=self.unit_bytes,
            units_per_checkpoint=self.upc,
            max_inflight=max_inflight,
            shared_writes=shared_writes,
        )
        self.host, self.shared = self.stack.host, self.stack.shared
        if self.shared and not block_manager.deployment_key.configured:
            logger.warning(
                "shared tiers under a deployment key drawn at random for this process: no other process "
                "can resume what this one writes; engines sharing a tier configure one key "
                "(EngineConfig.hash_seed / hash_salt, a secret: docs/operations.md)"
            )
        self.counters = self.stack.counters
        self.mover.attach_host(self.host._owner)  # the arena's tensor (pinned with a GPU) or array
        self.index = statecache.StateOffloadIndex()
        self.placement = TierPlacement(self.host.arena, self.keys.chains, self.keys.ranking_key)
        self.stores = StateOffloads(
            self.stack,
            coordinator=self.coord,
            index=self.index,
            mover=self.mover,
            keys=self.keys,
            placement=self.placement,
            offload_timeout_s=offload_timeout_s,
        )
        if self.shared and not self.stack.staging_only and self.stack.shared_writes == "demote":
            self.host.on_evict = self.stores.demote
        self.stack.register_buffers()
        self.coord.attach_offload(self.index)
        self._sync_eviction_model()
        self.loads = Loads(
            self.stack,
            coordinator=self.coord,
            index=self.index,
            mover=self.mover,
            keys=self.keys,
            before_unit_write=self.flush_kv,
            all_ranks=self.every_rank_holds if tp_size > 1 else None,
        )
        self.kv_blocks = KVBlocks(
            self.stack,
            block_manager=block_manager,
            coordinator=self.coord,
            mover=self.mover,
            keys=self.keys,
            placement=self.placement,
            loads=self.loads,
            enabled=kv,
            all_ranks=self.every_rank_holds if tp_size > 1 else None,
        )

    # ------------------------------ the hooks ------------------------------ #

    def note_keys(self, hashes, keys: bytes, first_block: int, parent: int | None = None) -> None:
        self.keys.note(hashes, keys, first_block, parent)

    def key(self, kind: str, h: int) -> str | None:
        """The tier key of the ``kind`` value of the GPU entry filed under
        ``h`` now, or None when nothing is filed there."""
        return self.keys.filed_key(kind, h)

    def top_of_pass(self) -> None:
        """After ``complete_previous_batch``: retire finished writes, reclaim
        stale pins, start new offloads. Never raises for a tier's failure."""
        self._sync_eviction_model()
        self.flush_kv()
        self.stores.retire()
        self.coord.reclaim_stale_offload_pins(self.offload_timeout_s)
        self.stores.note_reclaims()  # before admission can reuse a reclaimed unit
        self.loads.release_quarantine()
        for op, units in self.coord.take_offload_stores(self.max_inflight):
            self.stores.offload(op, units)

    def note_published(self, block: int, h: int) -> None:
        self.kv_blocks.note_published(block, h)

    def on_kv_evict(self, h: int) -> None:
        self.kv_blocks.on_evict(h)

    def flush_kv(self) -> None:
        self.kv_blocks.flush()

    def kv_extend(self, seq, gpu_hit: int, limit: int) -> int:
        hashes = seq.hashes

        def resumable(n: int) -> int:
            self.loads.discover(seq, n)  # the shared tiers' states count as resumable
            return self.caches.resumable_hit(seq, n, hashes)

        return self.kv_blocks.extend(seq, gpu_hit, limit, resumable)

    def discover(self, seq, upto: int) -> None:
        self.loads.discover(seq, upto)

    def load_state(self, h: int, prefix_key: bytes) -> bool:
        return self.loads.load_state(h, prefix_key)

    def source_of(self, h: int) -> str:
        self.placement.used(h)  # the host copies of a resumed prefix stay fresh
        return self.loads.source_of(h)

    def stats(self) -> dict:
        d = dict(self.counters)
        for k, v in self.index.stats().items():
            d[f"index_{k}"] = v
        d["host"] = self.host.stats()
        for t in self.shared:
            d[t.name] = t.stats()
        return d

    def close(self) -> None:
        self.flush_kv()
        self.stores.close()
        self.coord.attach_offload(None)

    # ------------------------------- others -------------------------------- #

    def held(self, keys: list[str]) -> list[bool]:
        """Per key: whether the host tier or a shared tier holds it."""
        out = [self.host.arena.contains(k) for k in keys]
        miss = [i for i, f in enumerate(out) if not f]
        for t in self.shared:
            if not miss:
                break
            try:
                found = t.contains_many([keys[i] for i in miss])
            except TIER_ERRORS as e:
                self.stack.failed(None, "contains", t, e, len(miss))
                continue
            for i, f in zip(miss, found):
                out[i] = out[i] or bool(f)
            miss = [i for i in miss if not out[i]]
        return out

    def every_rank_holds(self, kind: str, prefix_keys) -> list[bool]:
        """Per 16-byte prefix key: whether every rank's shard of its ``kind``
        value is held below GPU memory (False for None)."""
        pks = list(prefix_keys)
        known = [i for i, p in enumerate(pks) if p is not None]
        got = every_rank_holds(self.held, kind, self.layout_id, self.tp_size, [pks[i] for i in known])
        out = [False] * len(pks)
        for i, f in zip(known, got):
            out[i] = f
        return out

    def _sync_eviction_model(self) -> None:
        """The host arena ranks with the PAGE store's cost model (one model
        for every tier, per byte of the whole prefix: a KV block is one
        unit); copied when the store's changes."""
        self.placement.use_model(self.coord.eviction_policy, self.unit_bytes, self.pool.num_blocks * self.unit_bytes)

    def flush(self) -> None:
        """Writes every host value to the shared tiers (a graceful shutdown,
        so another engine can resume from them)."""
        self.stores.flush()

    def wait_writes(self, timeout_s: float | None = None) -> None:
        """Waits for the shared-tier writes in flight, then retires them."""
        self.stores.wait_writes(timeout_s)

    def check_conservation(self) -> None:
        """Every page unit and host entry is accounted for (between passes)."""
        pool, store = self.pool, self.coord.store
        pool.check_consistency()
        held = sum(len(r.unit_ids) for r in store.records.values())
        if pool.num_reserved != held:
            raise AssertionError(f"page units: {pool.num_reserved} reserved, records hold {held}")
        if pool.num_free + pool.num_kv_blocks + pool.num_reserved != pool.num_blocks:
            raise AssertionError(
                f"page units: free {pool.num_free} + kv {pool.num_kv_blocks} + reserved "
                f"{pool.num_reserved} != {pool.num_blocks}"
            )
        arena = self.host.arena
        arena.check_consistency()
        pinned = self.stores.pinned_keys() | {k for _, k in self.loads.quarantine}
        for k in arena.keys():
            key = k.decode()
            if arena.pins(key) and key not in pinned:
                raise AssertionError(f"host entry {key} is pinned with no job holding it")


def attach_tiers(
    engine, tiers, *, page_layout=None, tp_rank: int | None = None, tp_size: int = 1, **options
) -> Tiering:
    """Builds the engine's ``Tiering`` over its runner's page layout
    (``tp_rank`` required when ``tp_size > 1``)."""
    runner = engine.runner
    executor = getattr(runner, "executor", None)
    if page_layout is None:
        if executor is None:
            raise ValueError(
                "tiers need the runner's page layout: pass "
                "tier_options={'page_layout': ...} for a runner without an executor"
            )
        page_layout = executor.page_layout
    layout_id = getattr(runner, "layout_id", None) or engine.caches.coordinator.store.spec.layout_id
    t = Tiering(
        tiers,
        caches=engine.caches,
        block_manager=engine.block_manager,
        page_layout=page_layout,
        layout_id=layout_id,
        hash_block_size=engine.config.hash_block_size,
        tp_rank=tp_rank,
        tp_size=tp_size,
        **options,
    )
    engine.block_manager.tiering = t
    return t
