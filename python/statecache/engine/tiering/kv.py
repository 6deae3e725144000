"""The KV side: KV blocks that leave the GPU index go down, and come back to
extend a hit.

A block evicted from the GPU index keeps its bytes until something writes
the block; ``flush`` copies every block queued since the last flush down
(one gather for all), before the forward or a tier load can overwrite them.
They go to the host tier's KV budget, or straight to the shared tiers
(``shared_writes="through"`` sends every published block there). ``extend``
loads the blocks after a GPU KV hit that the tiers hold into fresh GPU
blocks and publishes them, so a resumed state finds its KV prefix.
"""

from __future__ import annotations

import numpy as np

from statecache.tiers import integrity
from statecache.tiers.host import KV, STATE
from statecache.tiers.placement import blocks_to_load

from .stack import TIER_ERRORS, TierStack


class KVBlocks:
    """KV blocks between the GPU ``BlockPool`` and the tiers."""

    def __init__(
        self,
        stack: TierStack,
        *,
        block_manager,
        coordinator,
        mover,
        keys,
        placement,
        loads,
        enabled: bool,
        all_ranks=None,
    ):
        self.stack = stack
        self.all_ranks = all_ranks  # see Loads.all_ranks
        self.placement = placement
        self.bm = block_manager  # publishes and checks blocks by their full prefix key
        self.pool = block_manager.pool
        self.coord = coordinator
        self.mover = mover
        self.keys = keys
        self.loads = loads
        self.enabled = enabled
        self.blocks: dict[int, int] = {}  # published hash -> block
        self.pending: list[tuple[int, int, str | None]] = []  # (hash, block, tier key) to copy down

    def note_published(self, block: int, h: int) -> None:
        self.blocks[h] = block
        if self.enabled and self.stack.shared_writes == "through":
            self.pending.append((h, block, self.keys.filed_key("kv", h)))

    def on_evict(self, h: int) -> None:
        """A KV block left the GPU index; its bytes stay intact until something
        writes the block, and ``flush`` runs before anything does."""
        block = self.blocks.pop(h, None)
        if block is None or not self.enabled or self.stack.shared_writes == "through":
            return
        self.pending.append((h, block, self.keys.filed_key("kv", h)))  # filed until this returns

    def flush(self) -> None:
        """Copies the KV blocks queued since the last flush down, with one
        gather for all of them. Runs at the top of a pass, before the forward
        and before a tier load writes units."""
        if not self.pending:
            return
        stack, host = self.stack, self.stack.host
        pending, self.pending = self.pending, []
        to_shared = stack.staging_only or stack.shared_writes == "through"
        klass = STATE if stack.staging_only else KV
        has_room = stack.staging_only or host.arena.class_stats(KV)["budget_entries"] > 0
        items, blocks, seen = [], [], set()
        for h, block, key in pending:
            if key is None or key in seen or host.arena.contains(key):
                continue
            seen.add(key)
            rows = host.reserve(key, stack.unit_bytes, self.placement.position("kv", h), klass) if has_room else None
            sealed = rows is not None
            if rows is None:
                if not (stack.shared and to_shared):
                    continue
                rows = [np.empty(stack.unit_bytes, dtype=np.uint8)]  # no host room: stage once
            items.append((key, rows, sealed))
            blocks.append(block)
        if not items:
            return
        self.mover.to_rows(blocks, [r for _, rows, _ in items for r in rows])
        headers = []
        for key, rows, sealed in items:
            header = integrity.make_header(key, stack.unit_bytes, integrity.checksum(rows))
            headers.append(header)
            if sealed:
                host.seal(key, header)
        stack.count("kv_offloaded", len(items))
        if to_shared:
            slots = len(stack.headers) - 8  # slots 0-7 serve single values
            for lo in range(0, len(items), slots):
                chunk = items[lo : lo + slots]
                values = [[stack.header_buffer(8 + j, headers[lo + j]), *rows] for j, (_, rows, _) in enumerate(chunk)]
                for t in stack.shared:
                    try:
                        ok = t.put_many([k for k, _, _ in chunk], values)
                        stack.count("shared_writes_failed", len(ok) - sum(ok))
                    except TIER_ERRORS as e:
                        stack.failed("shared_writes_failed", "put", t, e, len(chunk))
        if stack.staging_only:
            for key, _, sealed in items:
                if sealed:
                    host.abort(key)

    def extend(self, seq, gpu_hit: int, limit: int, resumable) -> int:
        """Blocks after the GPU KV hit that the tiers hold, up to the deepest
        boundary ``resumable(n)`` finds a state for (``blocks_to_load``),
        loaded into GPU blocks and published (cached, unreferenced). Returns
        the new hit."""
        if not self.enabled:
            return gpu_hit
        stack, host = self.stack, self.stack.host
        hashes, prefix_keys, bm = seq.hashes, seq.prefix_keys, self.bm
        want = []
        for i in range(gpu_hit, limit):
            if self.pool.lookup(hashes[i]) >= 0 and not bm.holds(hashes[i], prefix_keys[i]):
                break  # another prefix's block under this hash: ours cannot be indexed
            want.append((i, self.keys.key("kv", prefix_keys[i])))
        if not want:
            return gpu_hit
        present = [bm.holds(hashes[i], prefix_keys[i]) or host.arena.contains(k) for i, k in want]
        if stack.shared and not all(present):
            miss = [k for (_, k), p in zip(want, present) if not p]
            got = {}
            for t in stack.shared:
                try:
                    got.update({k: f for k, f in zip(miss, t.contains_many(miss)) if f})
                except TIER_ERRORS as e:
                    stack.failed(None, "contains", t, e, len(miss))
            present = [p or got.get(k, False) for (_, k), p in zip(want, present)]
        if self.all_ranks is not None:  # a block below GPU memory counts only with every rank's shard
            below = [i for (i, _), p in zip(want, present) if p and self.pool.lookup(hashes[i]) < 0]
            every = dict(zip(below, self.all_ranks("kv", [prefix_keys[i] for i in below])))
            present = [p and every.get(i, True) for (i, _), p in zip(want, present)]
        n = blocks_to_load(gpu_hit, present, resumable)
        if n == 0:
            return gpu_hit
        # Hold the GPU-hit blocks so making room for the loads cannot evict them.
        held = [self.pool.lookup(h) for h in hashes[:gpu_hit]]
        self.pool.incref(held)
        loaded = 0
        try:
            for i, key in want[:n]:
                on_gpu = self.pool.lookup(hashes[i])
                if on_gpu >= 0 and not bm.holds(hashes[i], prefix_keys[i]):
                    break  # indexed by another prefix since the scan
                if on_gpu >= 0:  # still cached on the GPU past the gap: hold it
                    self.pool.incref([on_gpu])
                    held.append(on_gpu)
                    loaded += 1
                    continue
                if not self.coord.ensure_free_units(1):
                    break
                got = self.loads.read(key, stack.unit_bytes, KV)
                if got is None:
                    break
                rows, where = got
                try:
                    block = self.pool.allocate(1)[0]
                    held.append(block)  # held until every load is done
                    self.flush()  # the allocation may have evicted a block queued to go down
                    self.mover.from_rows(rows, [block])
                finally:
                    host.unpin(key)
                if not bm.publish_block(block, hashes[i], prefix_keys[i]):
                    raise AssertionError("a tier load published a hash the GPU index holds")
                self.blocks[hashes[i]] = block
                stack.count("kv_loaded_host" if where == "host" else "kv_loaded_shared")
                loaded += 1
        finally:
            self.pool.free(list(reversed(held)))
        return gpu_hit + loaded
