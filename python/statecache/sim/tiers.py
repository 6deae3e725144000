"""Tiers below GPU memory in the simulator: capacity and bandwidth, no bytes.

The engine's hooks (``TierHooks``) are served here by the same store
protocol the real ``engine.tiering.Tiering`` follows
(``take_offload_stores`` -> ``release_offload_store_source`` ->
``settle_offload_store`` -> ``note_stored``; loads through
``reserve_transfer_units`` -> ``adopt_transfer_units``), with the real C++
``HostArena`` keeping each tier's entries and the same placement
(``statecache.tiers.placement``): KV blocks and state images in one byte
budget per tier, ranked together by the PAGE store's cost model per byte of
the whole prefix, each KV block with the deepest state it leads to; loads
stop at the deepest resumable boundary. Nothing is copied: a load moves the
simulated clock by its bytes over the tier's bandwidth; offloads ride a side
stream and are not charged. Entries are named by the
128-bit prefix key (the one the engine filed the GPU entry under, or the
admitted sequence's own), as the real tiers name them.
"""

from __future__ import annotations

import statecache
from statecache.engine.tiering.hooks import TierHooks
from statecache.tiers.placement import PrefixChains, TierPlacement, blocks_to_load

STATE, KV = 0, 1
_KLASS = {"state": STATE, "kv": KV}


class SimTiers(TierHooks):
    """Host and shared tiers of ``host_bytes`` / ``shared_bytes``, each one
    byte budget for KV blocks and state images (``kv_share``: an optional
    fixed split instead, that share of each tier for KV blocks and the rest
    for state images)."""

    def __init__(
        self,
        engine,
        runner,
        block_bytes: int,
        units_per_checkpoint: int,
        host_bytes: int,
        shared_bytes: int,
        host_gbps: float,
        remote_gbps: float,
        kv_share: float | None = None,
        max_inflight: int = 64,
    ):
        self.caches = engine.caches
        self.coord = engine.caches.coordinator
        self.bm = engine.block_manager
        self.pool = engine.block_manager.pool
        self.runner = runner
        self.block_bytes = block_bytes
        self.upc = units_per_checkpoint
        self.max_inflight = max_inflight
        self.bw = {"host": host_gbps * 1e9, "shared": remote_gbps * 1e9}
        self.chains = PrefixChains()
        self.tiers = {}
        self.placements: dict[str, TierPlacement] = {}
        for name, size in (("host", host_bytes), ("shared", shared_bytes)):
            if size:
                if kv_share is None:
                    budgets = [None, None]
                else:
                    kv = int(size * kv_share) // block_bytes * block_bytes
                    budgets = [size - kv, kv]
                arena = statecache.HostArena(block_bytes, size, budgets)
                self.tiers[name] = arena
                self.placements[name] = TierPlacement(arena, self.chains, self._ranking_key)
        self.index = statecache.StateOffloadIndex()
        self.coord.attach_offload(self.index)
        self._loaded_from: dict[int, str] = {}
        self.counters = {
            k: 0
            for k in (
                "state_offloaded",
                "kv_offloaded",
                "demoted",
                "state_loaded_host",
                "state_loaded_shared",
                "kv_loaded_host",
                "kv_loaded_shared",
                "load_seconds",
            )
        }
        self._owner = 0

    @staticmethod
    def _key(kind: str, prefix_key: bytes) -> bytes:
        return kind.encode() + prefix_key

    def _ranking_key(self, kind: str, h: int) -> bytes | None:
        """The entry key the chains last saw for ``h``: to re-rank only."""
        pk = self.chains.payload(h)
        return None if pk is None else self._key(kind, pk)

    @staticmethod
    def _split(key: bytes) -> tuple[str, bytes, int]:
        """kind, prefix key and scheduler hash of an entry's key."""
        return key[:-16].decode(), key[-16:], statecache.scheduler_hash(key[-16:])

    # ---- the engine's hooks ----
    def note_keys(self, hashes, keys, first_block, parent=None) -> None:
        self.chains.note(hashes, first_block, parent, [keys[16 * i : 16 * i + 16] for i in range(len(hashes))])

    def note_published(self, block, h) -> None:
        pass

    def flush_kv(self) -> None:
        pass  # no bytes: an evicted block is taken down when it is evicted

    def top_of_pass(self) -> None:
        m = self.coord.eviction_policy  # every tier ranks with the store's model
        for p in self.placements.values():
            p.use_model(m, self.block_bytes, self.pool.num_blocks * self.block_bytes)
        for op, units in self.coord.take_offload_stores(self.max_inflight):
            prefix_key = self.bm.filed.get(op.prefix_hash)  # the image's own prefix
            stored = prefix_key is not None and self._put("state", op.prefix_hash, prefix_key, len(units))
            self.coord.release_offload_store_source(op)
            self.coord.settle_offload_store(op)
            if stored and not self.coord.was_reclaimed(op):
                self.index.note_stored(op.prefix_hash)
                self.counters["state_offloaded"] += 1
            else:
                self.index.note_store_failed(op.prefix_hash)

    def on_kv_evict(self, h: int) -> None:
        prefix_key = self.bm.filed.get(h)  # filed until this returns
        if prefix_key is not None and self._put("kv", h, prefix_key, 1):
            self.counters["kv_offloaded"] += 1

    def _put(self, kind, h, prefix_key, count, tier="host") -> bool:
        arena = self.tiers.get(tier)
        if arena is None:
            return tier == "host" and self._put(kind, h, prefix_key, count, "shared")
        key = self._key(kind, prefix_key)
        placement = self.placements[tier]
        if arena.contains(key):
            arena.lookup(key)
            if kind == "state":
                placement.state_stored(h)
            return True
        klass = _KLASS[kind]
        victims = arena.victims(klass, count)
        if victims is None:
            return False
        for v in victims:  # any class may make room: the one budget
            vkind, vkey, vh = self._split(v)
            if tier == "host" and self._put(vkind, vh, vkey, len(arena.lookup(v, False)[0]), "shared"):
                self.counters["demoted"] += 1  # demoted, still findable below
            elif vkind == "state" and not any(a.contains(v) for t, a in self.tiers.items() if t != tier):
                self.index.forget(vh)
        got = arena.allocate(key, klass, count, count * self.block_bytes, placement.position(kind, h))
        if got is None:
            return False
        arena.seal(key, b"")
        if kind == "state":
            placement.state_stored(h)
        return True

    def _where(self, kind, prefix_key):
        key = self._key(kind, prefix_key)
        for name, arena in self.tiers.items():
            if arena.contains(key):
                arena.lookup(key)
                return name
        return None

    def _charge(self, where: str, nbytes: int) -> None:
        s = nbytes / self.bw[where]
        self.runner.now_s += s
        self.counters["load_seconds"] += s

    def discover(self, seq, upto) -> None:
        pass

    def kv_extend(self, seq, gpu_hit: int, limit: int) -> int:
        hashes, keys, n, bm = seq.hashes, seq.prefix_keys, gpu_hit, self.bm
        present = []
        for i in range(gpu_hit, limit):
            h, k = hashes[i], keys[i]
            if self.pool.lookup(h) >= 0:
                if not bm.holds(h, k):
                    break  # another prefix's block under this hash: ours cannot be indexed
                present.append(True)
            else:
                present.append(any(a.contains(self._key("kv", k)) for a in self.tiers.values()))
        want = blocks_to_load(gpu_hit, present, lambda m: self.caches.resumable_hit(seq, m, hashes))
        # The GPU hit is held so that making room for loads cannot evict it.
        held = [self.pool.lookup(h) for h in hashes[:gpu_hit]]
        self.pool.incref(held)
        try:
            for i in range(gpu_hit, gpu_hit + want):
                h, k = hashes[i], keys[i]
                b = self.pool.lookup(h)
                if b >= 0:
                    if not bm.holds(h, k):
                        break  # another prefix's block under this hash
                    self.pool.incref([b])
                    held.append(b)
                    n += 1
                    continue
                where = self._where("kv", k)
                if where is None or not self.coord.ensure_free_units(1):
                    break
                b = self.pool.allocate(1)[0]
                held.append(b)
                if not bm.publish_block(b, h, k):
                    raise AssertionError("a tier load published a hash the GPU index holds")
                self._charge(where, self.block_bytes)
                self.counters[f"kv_loaded_{where}"] += 1
                n += 1
        finally:
            self.pool.free(list(reversed(held)))
        return n

    def load_state(self, h: int, prefix_key: bytes) -> bool:
        if self.coord.contains(h):
            return True
        where = self._where("state", prefix_key)
        if where is None or not self.index.request_load(h):
            if where is None:
                self.index.forget(h)
            return False
        self._owner += 1
        owner = ("sim-tier-load", self._owner)
        if self.coord.reserve_transfer_units(owner) is None:
            self.index.abandon_load(h)
            return False
        if not self.coord.adopt_transfer_units(owner, h):
            self.index.abandon_load(h)
            return self.coord.contains(h)
        self.index.complete_load(h)
        self._charge(where, self.upc * self.block_bytes)
        self.counters[f"state_loaded_{where}"] += 1
        self._loaded_from[h] = where
        return True

    def source_of(self, h: int) -> str:
        for p in self.placements.values():
            p.used(h)  # the copies below a resumed prefix stay fresh
        return self._loaded_from.pop(h, "gpu")

    def stats(self) -> dict:
        return dict(self.counters)

    def close(self) -> None:
        pass
