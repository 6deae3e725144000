"""Tiers below GPU memory in the simulator: capacity and bandwidth, no bytes.

The engine's hooks (``BlockManager.tiering``) are served here by the same
store protocol the real ``engine.tiering.Tiering`` follows
(``take_offload_stores`` -> ``release_offload_store_source`` ->
``settle_offload_store`` -> ``note_stored``; loads through
``reserve_transfer_units`` -> ``adopt_transfer_units``), with the real C++
``HostArena`` keeping each tier's entries (ranked with the PAGE store's own
eviction cost model, separate state and KV budgets). Nothing is copied: a
load moves the simulated clock by its bytes over the tier's bandwidth;
offloads ride a side stream and are not charged. Entries are named by the
128-bit prefix key (the one the engine filed the GPU entry under, or the
admitted sequence's own), as the real tiers name them.
"""

from __future__ import annotations

import statecache
from statecache.engine.tiering.hooks import TierHooks

STATE, KV = 0, 1


class SimTiers(TierHooks):
    """Host and shared tiers of ``host_bytes`` / ``shared_bytes`` (each split
    ``kv_share`` for KV blocks, the rest for state images)."""

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
        kv_share: float = 0.5,
        max_inflight: int = 64,
    ):
        self.coord = engine.caches.coordinator
        self.bm = engine.block_manager
        self.pool = engine.block_manager.pool
        self.runner = runner
        self.block_bytes = block_bytes
        self.upc = units_per_checkpoint
        self.hbs = engine.config.hash_block_size
        self.max_inflight = max_inflight
        self.bw = {"host": host_gbps * 1e9, "shared": remote_gbps * 1e9}
        self.tiers = {}
        for name, size in (("host", host_bytes), ("shared", shared_bytes)):
            if size:
                kv = int(size * kv_share) // block_bytes * block_bytes
                self.tiers[name] = statecache.HostArena(block_bytes, size, [size - kv, kv])
        self.index = statecache.StateOffloadIndex()
        self.coord.attach_offload(self.index)
        self.positions: dict[int, int] = {}
        self._eviction_model = None
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

    @staticmethod
    def _split(key: bytes) -> tuple[str, bytes, int]:
        """kind, prefix key and scheduler hash of an entry's key."""
        return key[:-16].decode(), key[-16:], statecache.scheduler_hash(key[-16:])

    # ---- the engine's hooks ----
    def note_keys(self, hashes, keys, first_block) -> None:
        for i, h in enumerate(hashes):
            self.positions[h] = (first_block + i + 1) * self.hbs

    def note_published(self, block, h) -> None:
        pass

    def flush_kv(self) -> None:
        pass  # no bytes: an evicted block is taken down when it is evicted

    def top_of_pass(self) -> None:
        m = self.coord.eviction_policy  # every tier ranks with the store's model
        if m != self._eviction_model:
            for arena in self.tiers.values():
                arena.set_eviction_policy(**m)
            self._eviction_model = m
        for op, units in self.coord.take_offload_stores(self.max_inflight):
            prefix_key = self.bm.filed.get(op.prefix_hash)  # the image's own prefix
            stored = prefix_key is not None and self._put("state", op.prefix_hash, prefix_key, len(units), STATE)
            self.coord.release_offload_store_source(op)
            self.coord.settle_offload_store(op)
            if stored and not self.coord.was_reclaimed(op):
                self.index.note_stored(op.prefix_hash)
                self.counters["state_offloaded"] += 1
            else:
                self.index.note_store_failed(op.prefix_hash)

    def on_kv_evict(self, h: int) -> None:
        prefix_key = self.bm.filed.get(h)  # filed until this returns
        if prefix_key is not None and self._put("kv", h, prefix_key, 1, KV):
            self.counters["kv_offloaded"] += 1

    def _put(self, kind, h, prefix_key, count, klass, tier="host") -> bool:
        arena = self.tiers.get(tier)
        if arena is None:
            return tier == "host" and self._put(kind, h, prefix_key, count, klass, "shared")
        key = self._key(kind, prefix_key)
        if arena.contains(key):
            arena.lookup(key)
            return True
        victims = arena.victims(klass, count)
        if victims is None:
            return False
        if tier == "host":  # demote what the host evicts
            for v in victims:
                vkind, vkey, vh = self._split(v)
                n = len(arena.lookup(v, False)[0])
                if self._put(vkind, vh, vkey, n, klass, "shared"):
                    self.counters["demoted"] += 1
                elif vkind == "state":
                    self.index.forget(vh)
        elif klass == STATE:
            for v in victims:
                vh = self._split(v)[2]
                if not self.tiers["host"].contains(v) if "host" in self.tiers else True:
                    self.index.forget(vh)
        # position in hash blocks, the store's unit
        got = arena.allocate(key, klass, count, count * self.block_bytes, self.positions.get(h, 0) // self.hbs)
        if got is None:
            return False
        arena.seal(key, b"")
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
        # The GPU hit is held so that making room for loads cannot evict it.
        held = [self.pool.lookup(h) for h in hashes[:gpu_hit]]
        self.pool.incref(held)
        try:
            for i in range(gpu_hit, limit):
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
        return self._loaded_from.pop(h, "gpu")

    def stats(self) -> dict:
        return dict(self.counters)

    def close(self) -> None:
        pass
