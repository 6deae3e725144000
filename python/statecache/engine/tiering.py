"""Tiers below GPU memory for the reference engine (docs/contract.md, "Tiers").

Order: GPU (PAGE store, KV block pool) -> host (``HostTier``) -> shared
(``MooncakeTier`` / ``RedisTier``). ``Tiering`` moves state images and KV
blocks between them by the store's offload protocol:

* store side, each pass: ``take_offload_stores`` -> copy the units out ->
  ``release_offload_store_source`` -> the write completes ->
  ``settle_offload_store`` -> ``note_stored`` unless ``was_reclaimed``;
* load side, at admission: ``reserve_transfer_units`` -> copy the image in ->
  ``adopt_transfer_units`` -> READY -> the engine's ordinary ``begin_restore``.

KV blocks that leave the GPU index go to the host tier's KV budget (or
straight to the shared tiers), so a resumed state finds its KV prefix. A host
value evicted by the ranking is demoted to the shared tiers first. Every value
below GPU memory carries its full key and an XXH3-128 checksum; a load adopts
bytes only when both match, otherwise it fails as untrusted and the prefix is
recomputed.

Units move through ``UnitMover`` (torch gather / scatter over the page
layout's tensors into host rows): synchronous on CPU; on a GPU the copies
are ordered on the current stream before the batch that reuses the units.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools

import numpy as np

import statecache
from statecache.tiers import integrity
from statecache.tiers.base import TIMED_OUT
from statecache.tiers.host import KV, STATE, HostTier
from statecache.tiers.keys import TierKey

_HEADER_SLOT = 256  # bytes reserved per value header in the registered header buffer


class UnitMover:
    """Copies whole page units between the KV tensors and host rows."""

    def __init__(self, page_layout):
        import torch

        self.torch = torch
        self.unit_bytes = page_layout.unit_bytes
        self.views = []
        for t, d in zip(page_layout.tensors, page_layout.unit_dims):
            if not t.is_contiguous():
                raise ValueError("page tensors must be contiguous for the tiers")
            n = t.shape[d]
            flat = t.reshape(-1).view(torch.uint8)
            self.views.append(flat.view(-1, n, flat.numel() // (n * max(1, int(np.prod(t.shape[:d], dtype=np.int64))))))
        if sum(v.shape[0] * v.shape[2] for v in self.views) != self.unit_bytes:
            raise AssertionError("unit mover: views do not cover one unit")
        self.device = page_layout.tensors[0].device
        self.host = None  # the host arena's (pinned) tensor, when attached

    def attach_host(self, tensor) -> None:
        """Rows inside this [entries, unit_bytes] uint8 CPU tensor are copied
        through it, so torch sees pinned memory and copies at DMA speed."""
        self.host = tensor if tensor is not None and tensor.dim() == 2 else None

    def _host_rows(self, block):
        """The attached tensor's rows under ``block`` (a 2-D numpy view), or None."""
        h = self.host
        if h is None or block is None:
            return None
        base = h.data_ptr()
        addr = block.__array_interface__["data"][0]
        first, rem = divmod(addr - base, self.unit_bytes)
        if rem or first < 0 or first + block.shape[0] > h.shape[0] or h.shape[1] != self.unit_bytes:
            return None
        return h[first : first + block.shape[0]]

    def gather(self, units) -> object:
        """``[len(units), unit_bytes]`` uint8 on the KV device."""
        torch = self.torch
        idx = torch.as_tensor(list(units), dtype=torch.long, device=self.device)
        parts = [v.index_select(1, idx).permute(1, 0, 2).reshape(len(units), -1) for v in self.views]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def scatter(self, units, data) -> None:
        torch = self.torch
        idx = torch.as_tensor(list(units), dtype=torch.long, device=self.device)
        # Synchronous: the host rows may be reused as soon as this returns.
        data = data.to(self.device)
        col = 0
        for v in self.views:
            w = v.shape[0] * v.shape[2]
            part = data[:, col : col + w].reshape(len(units), v.shape[0], v.shape[2]).permute(1, 0, 2)
            v.index_copy_(1, idx, part)
            col += w

    def to_rows(self, units, rows) -> None:
        """Units -> host rows (numpy views of ``unit_bytes`` each): one gather
        on the KV device, then one copy into consecutive rows (a DMA into the
        pinned arena on a GPU) or one per row."""
        torch = self.torch
        data = self.gather(units)
        block = _consecutive(rows, self.unit_bytes)
        pinned = self._host_rows(block)
        if pinned is not None:
            pinned.copy_(data)
            return
        if block is not None:
            torch.from_numpy(block).copy_(data)
            return
        data = data.cpu().numpy()
        for r, row in enumerate(rows):
            row[:] = data[r]

    def from_rows(self, rows, units) -> None:
        torch = self.torch
        block = _consecutive(rows, self.unit_bytes)
        data = self._host_rows(block)
        if data is None:
            data = torch.from_numpy(block if block is not None else np.stack([np.asarray(r) for r in rows]))
        self.scatter(units, data)


def _consecutive(rows, unit_bytes: int):
    """``rows`` as one 2-D view when they are consecutive full rows of one
    buffer, else None."""
    if not rows or any(r.nbytes != unit_bytes or r.ndim != 1 or r.strides != (1,) for r in rows):
        return None
    first = rows[0].__array_interface__["data"][0]
    for i, r in enumerate(rows):
        if r.__array_interface__["data"][0] != first + i * unit_bytes:
            return None
    # Every row was checked to start where the previous one ends, so one
    # strided view over the first covers exactly their bytes.
    return np.lib.stride_tricks.as_strided(rows[0], shape=(len(rows), unit_bytes), strides=(unit_bytes, 1))


class _Job:
    """An offload whose shared-tier write (and, when the host only stages,
    the copy out of the units) runs on the I/O thread."""

    __slots__ = ("op", "h", "key", "future", "pinned", "source_done", "source_released")

    def __init__(self, op, h, key, pinned: bool, source_done: bool):
        self.op, self.h, self.key, self.future = op, h, key, None
        self.pinned = pinned
        self.source_done = source_done  # the units were read (set by the I/O thread)
        self.source_released = source_done


class Tiering:
    """Host and shared tiers under one engine's PAGE store and KV pool.

    ``tiers``: at most one ``HostTier`` (first) and any shared tiers, in the
    order lookups ask them. ``shared_writes``: ``"demote"`` (a host value goes
    to the shared tiers when the host evicts it, and at ``flush()``) or
    ``"through"`` (every value also goes to the shared tiers when written).
    Entries are named by 128-bit prefix keys, never by a 64-bit hash alone:
    what goes down by the key ``block_manager`` filed the GPU entry under,
    what comes up by the admitted sequence's own key.
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
        tp_rank: int = 0,
        tp_size: int = 1,
        max_inflight: int = 16,
        offload_timeout_s: float = 10.0,
        shared_writes: str | None = None,
        kv: bool = True,
    ):
        tiers = list(tiers)
        if not tiers:
            raise ValueError("tiers must name at least one tier")
        hosts = [t for t in tiers if isinstance(t, HostTier)]
        if len(hosts) > 1 or (hosts and tiers[0] is not hosts[0]):
            raise ValueError("tiers: at most one HostTier, and it comes first")
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
        if shared_writes not in (None, "demote", "through"):
            raise ValueError(f"shared_writes={shared_writes!r} must be 'demote' or 'through'")
        self.caches = caches
        self.coord = caches.coordinator
        self.bm = block_manager
        self.pool = block_manager.pool
        self.mover = UnitMover(page_layout)
        self.unit_bytes = self.mover.unit_bytes
        self.upc = self.coord.store.units_per_checkpoint
        self.layout_id = layout_id
        self.hbs = hash_block_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.max_inflight = max_inflight
        self.offload_timeout_s = offload_timeout_s
        self.kv = kv
        self.shared = [t for t in tiers if not isinstance(t, HostTier)]
        if hosts:
            self.host, self.staging_only = hosts[0], False
        else:
            # Shared tiers only: a small host arena stages values for the I/O.
            self.host = HostTier((max_inflight + 4) * self.upc * self.unit_bytes, self.unit_bytes)
            self.staging_only = True
        if hasattr(self.host._owner, "data_ptr"):
            self.mover.attach_host(self.host._owner)
        if self.host.entry_bytes != self.unit_bytes:
            raise ValueError(
                f"HostTier entry_bytes={self.host.entry_bytes} must equal the page unit size {self.unit_bytes}"
            )
        self.shared_writes = shared_writes or ("through" if self.staging_only else "demote")
        if self.shared and not self.staging_only and self.shared_writes == "demote":
            self.host.on_evict = self._demote
        self.headers = np.zeros((4 * max_inflight + 64, _HEADER_SLOT), dtype=np.uint8)
        for t in self.shared:
            if hasattr(t, "register"):
                t.register(self.host.rows)
                t.register(self.headers)
        self.index = statecache.StateOffloadIndex()
        self.coord.attach_offload(self.index)
        self._eviction_model = None
        self._sync_eviction_model()
        self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="statecache-tiers")
        self._jobs: list[_Job] = []
        self._quarantine: list[tuple[object, str]] = []  # (tier, host key) of timed-out reads
        self._owner_ids = itertools.count()
        self.known: dict[int, int] = {}  # scheduler hash -> tokens its prefix covers (ranking only)
        self._kv_blocks: dict[int, int] = {}  # published hash -> block
        self._kv_pending: list[tuple[int, int, bytes]] = []  # (hash, block, prefix key) to copy down
        self._loaded_from: dict[int, str] = {}
        self.counters = {
            k: 0
            for k in (
                "state_offloaded",
                "state_offload_failed",
                "state_loaded_host",
                "state_loaded_shared",
                "kv_offloaded",
                "kv_loaded_host",
                "kv_loaded_shared",
                "loads_untrusted",
                "loads_missing",
                "loads_failed",
                "demoted",
                "shared_writes_failed",
                "probes",
            )
        }

    # ------------------------------ keys ----------------------------------- #

    def note_keys(self, hashes, keys: bytes, first_block: int) -> None:
        """Learns where the prefixes of blocks ``first_block...`` end."""
        for i, h in enumerate(hashes):
            self.known[h] = (first_block + i + 1) * self.hbs
        if len(self.known) > (1 << 21):  # bounded: forget the oldest half
            for h in list(itertools.islice(self.known, len(self.known) // 2)):
                del self.known[h]

    def key(self, kind: str, prefix_key: bytes | None) -> str | None:
        if prefix_key is None:
            return None
        return TierKey(kind, self.layout_id, self.tp_rank, self.tp_size, prefix_key).encode()

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    # ---------------------------- store side ------------------------------- #

    def top_of_pass(self) -> None:
        """After ``complete_previous_batch``: retire finished writes, reclaim
        stale pins, start new offloads. Never raises for a tier's failure."""
        self._sync_eviction_model()
        self.flush_kv()
        self._retire_jobs()
        self.coord.reclaim_stale_offload_pins(self.offload_timeout_s)
        self._release_quarantine()
        for op, units in self.coord.take_offload_stores(self.max_inflight):
            self._offload(op, units)

    def _position(self, h: int) -> int:
        """Where ``h``'s prefix ends, in hash blocks (the PAGE store's
        position unit, so its cost model applies unchanged); 0 if unknown."""
        return self.known.get(h, 0) // self.hbs

    def _sync_eviction_model(self) -> None:
        """The host arena ranks with the PAGE store's cost model (one model
        for every tier); copied when the store's changes."""
        m = self.coord.eviction_policy
        if m != self._eviction_model:
            self.host.arena.set_eviction_policy(**m)
            self._eviction_model = m

    def _offload(self, op, units) -> None:
        h = op.prefix_hash
        key = self.key("state", self.bm.filed.get(h))  # the image's own prefix
        rows = None
        if key is not None and not self.host.arena.contains(key):
            rows = self.host.reserve(key, len(units) * self.unit_bytes, self._position(h), STATE)
        if rows is None:
            self.coord.release_offload_store_source(op)
            self.coord.settle_offload_store(op)
            if key is not None and self.host.arena.contains(key):
                self.index.note_stored(h)  # already below: nothing to write
            else:
                self.index.note_store_failed(h)
                self._count("state_offload_failed")
            return
        self.index.note_store_started(h)
        if self.staging_only:
            # Copy and write on the I/O thread: the units stay pinned until the
            # copy is known done, and a copy that overran its pin is reclaimed.
            job = _Job(op, h, key, pinned=False, source_done=False)
            job.future = self._io.submit(self._copy_and_write, job, list(units), rows)
            self._jobs.append(job)
            return
        self.mover.to_rows(units, rows)
        self.coord.release_offload_store_source(op)
        header = integrity.make_header(key, len(rows) * self.unit_bytes, integrity.checksum(rows))
        self.host.seal(key, header)
        if self.shared_writes == "through":
            self.host.arena.pin(key)
            job = _Job(op, h, key, pinned=True, source_done=True)
            job.future = self._io.submit(self._write_shared, key, rows, header)
            self._jobs.append(job)
            return
        self._settle(op, h, key, True)

    def _copy_and_write(self, job, units, rows) -> bool:
        self.mover.to_rows(units, rows)
        job.source_done = True
        header = integrity.make_header(job.key, len(rows) * self.unit_bytes, integrity.checksum(rows))
        return self._write_shared(job.key, rows, header)

    def _settle(self, op, h: int, key: str, ok: bool) -> None:
        self.coord.settle_offload_store(op)
        if self.coord.was_reclaimed(op):
            # The units were taken back before the copy was known done: the
            # bytes written may be anything, so nothing is indexed.
            self.index.note_store_failed(h, untrusted=True)
            self.host.abort(key)
            for t in self.shared:
                t.remove_many([key])
            self._count("state_offload_failed")
        elif ok:
            self.index.note_stored(h)
            self._count("state_offloaded")
        else:
            self.index.note_store_failed(h)
            self._count("state_offload_failed")

    def _write_shared(self, key, rows, header) -> bool:
        """On the I/O thread: one value to every shared tier."""
        ok = False
        hb = self._header_buffer(0, header)
        for t in self.shared:
            try:
                ok = t.put_many([key], [[hb, *rows]])[0] or ok
            except Exception:
                pass
        return ok

    def _header_buffer(self, slot: int, header: bytes):
        buf = self.headers[slot, : len(header)]
        buf[:] = np.frombuffer(header, dtype=np.uint8)
        return buf

    def _retire_jobs(self) -> None:
        keep = []
        for job in self._jobs:
            if job.source_done and not job.source_released:
                self.coord.release_offload_store_source(job.op)
                job.source_released = True
            if not job.future.done():
                keep.append(job)
                continue
            try:
                ok = bool(job.future.result())
            except Exception:
                ok = False
            if not ok:
                self._count("shared_writes_failed")
            if job.pinned:
                self.host.arena.unpin(job.key)
            if self.staging_only:
                self.host.abort(job.key)
            self._settle(job.op, job.h, job.key, ok or not self.staging_only)
        self._jobs = keep

    def _release_quarantine(self) -> None:
        keep = []
        for tier, key in self._quarantine:
            if getattr(tier, "idle", lambda: True)():
                self.host.abort(key)
            else:
                keep.append((tier, key))
        self._quarantine = keep

    def _demote(self, batch) -> None:
        """Host eviction hook: the evicted values go to the shared tiers."""
        for key, rows, _nbytes, meta in batch:
            if not meta:
                continue
            for t in self.shared:
                try:
                    if t.put_many([key], [[self._header_buffer(1, meta), *rows]])[0]:
                        self._count("demoted")
                        continue
                except Exception:
                    pass
                self._count("shared_writes_failed")

    def flush(self) -> None:
        """Writes every host value to the shared tiers (a graceful shutdown,
        so another engine can resume from them)."""
        self.wait_writes()
        if not self.shared or self.staging_only:
            return
        for k in self.host.arena.keys():
            key = k.decode()
            got = self.host.read(key)
            if got is None:
                continue
            rows, nbytes, meta = got
            try:
                for t in self.shared:
                    t.put_many([key], [[self._header_buffer(1, meta), *rows]])
            except Exception:
                self._count("shared_writes_failed")
            finally:
                self.host.unpin(key)

    def wait_writes(self, timeout_s: float | None = None) -> None:
        """Waits for the shared-tier writes in flight, then retires them."""
        cf.wait([j.future for j in self._jobs], timeout=timeout_s or self.offload_timeout_s)
        self._retire_jobs()

    # ----------------------------- KV blocks ------------------------------- #

    def note_published(self, block: int, h: int) -> None:
        self._kv_blocks[h] = block
        if self.kv and self.shared_writes == "through":
            self._kv_pending.append((h, block, self.bm.filed.get(h)))

    def on_kv_evict(self, h: int) -> None:
        """A KV block left the GPU index; its bytes stay intact until something
        writes the block, and ``flush_kv`` runs before anything does."""
        block = self._kv_blocks.pop(h, None)
        if block is None or not self.kv or self.shared_writes == "through":
            return
        self._kv_pending.append((h, block, self.bm.filed.get(h)))  # filed until this returns

    def flush_kv(self) -> None:
        """Copies the KV blocks queued since the last flush down, with one
        gather for all of them. Runs at the top of a pass, before the forward
        and before a tier load writes units."""
        if not self._kv_pending:
            return
        pending, self._kv_pending = self._kv_pending, []
        to_shared = self.staging_only or self.shared_writes == "through"
        klass = STATE if self.staging_only else KV
        has_room = self.staging_only or self.host.arena.class_stats(KV)["budget_entries"] > 0
        items, blocks, seen = [], [], set()
        for h, block, prefix_key in pending:
            key = self.key("kv", prefix_key)
            if key is None or key in seen or self.host.arena.contains(key):
                continue
            seen.add(key)
            rows = self.host.reserve(key, self.unit_bytes, self._position(h), klass) if has_room else None
            sealed = rows is not None
            if rows is None:
                if not (self.shared and to_shared):
                    continue
                rows = [np.empty(self.unit_bytes, dtype=np.uint8)]  # no host room: stage once
            items.append((key, rows, sealed))
            blocks.append(block)
        if not items:
            return
        self.mover.to_rows(blocks, [r for _, rows, _ in items for r in rows])
        headers = []
        for key, rows, sealed in items:
            header = integrity.make_header(key, self.unit_bytes, integrity.checksum(rows))
            headers.append(header)
            if sealed:
                self.host.seal(key, header)
        self._count("kv_offloaded", len(items))
        if to_shared:
            slots = len(self.headers) - 8  # slots 0-7 serve single values
            for lo in range(0, len(items), slots):
                chunk = items[lo : lo + slots]
                values = [[self._header_buffer(8 + j, headers[lo + j]), *rows] for j, (_, rows, _) in enumerate(chunk)]
                for t in self.shared:
                    try:
                        ok = t.put_many([k for k, _, _ in chunk], values)
                        self._count("shared_writes_failed", len(ok) - sum(ok))
                    except Exception:
                        self._count("shared_writes_failed", len(chunk))
        if self.staging_only:
            for key, _, sealed in items:
                if sealed:
                    self.host.abort(key)

    # ----------------------------- load side ------------------------------- #

    def _read(self, key: str, nbytes: int, klass: int):
        """The payload rows of ``key`` from the cheapest tier that holds a
        trusted copy, pinned in the host arena (``unpin`` when done), or None.
        Untrusted copies are removed where they were found."""
        got = self.host.read(key)
        if got is not None:
            rows, n, meta = got
            if n == nbytes and integrity.check(meta, key, rows, nbytes) == integrity.OK:
                return rows, "host"
            self.host.unpin(key)
            self.host.abort(key)
            self._count("loads_untrusted")
        for t in self.shared:
            rows = self.host.reserve(key, nbytes, 0, klass if not self.staging_only else STATE)
            if rows is None:
                return None
            hlen = integrity.header_nbytes(key)
            hb = self.headers[3, :hlen]
            try:
                r = t.get_many_into([key], [[hb, *rows]])[0]
            except Exception:
                r = -3
            if r == TIMED_OUT:
                self._quarantine.append((t, key))  # the read may still land there
                self._count("loads_failed")
                continue
            if r < 0:
                self.host.abort(key)
                self._count("loads_missing" if r == -1 else "loads_failed")
                if r == -2:  # the stored value has another size: never adoptable
                    self._count("loads_untrusted")
                    t.remove_many([key])
                continue
            verdict = integrity.check(hb, key, rows, nbytes)
            if verdict != integrity.OK:
                self.host.abort(key)
                self._count("loads_untrusted")
                t.remove_many([key])
                continue
            # Keep the verified copy on the host (unless it only stages).
            self.host.seal(key, bytes(hb))
            if self.staging_only:
                self.host.arena.pin(key)
                self.host.abort(key)  # freed at unpin
                return rows, t.name
            self.host.arena.pin(key)
            return rows, t.name
        return None

    def discover(self, seq, upto: int) -> None:
        """Asks the shared tiers which of ``seq``'s first ``upto`` boundaries
        they hold that this engine does not know of (one batch call)."""
        if not self.shared or upto <= getattr(seq, "_tier_probed", 0):
            return
        lo = getattr(seq, "_tier_probed", 0)
        seq._tier_probed = upto
        pairs = [
            (h, self.key("state", k))
            for h, k in zip(seq.hashes[lo:upto], seq.prefix_keys[lo:upto])
            if not self.index.could_serve(h) and not self.coord.contains(h)
        ]
        if not pairs:
            return
        self._count("probes")
        for t in self.shared:
            try:
                found = t.contains_many([k for _, k in pairs])
            except Exception:
                continue
            for (h, _), f in zip(pairs, found):
                if f:
                    self.index.note_stored(h)

    def kv_extend(self, seq, gpu_hit: int, limit: int) -> int:
        """Blocks after the GPU KV hit that the tiers hold, loaded into GPU
        blocks and published (cached, unreferenced). Returns the new hit."""
        if not self.kv:
            return gpu_hit
        hashes, keys, bm = seq.hashes, seq.prefix_keys, self.bm
        want = []
        for i in range(gpu_hit, limit):
            if self.pool.lookup(hashes[i]) >= 0 and not bm.holds(hashes[i], keys[i]):
                break  # another prefix's block under this hash: ours cannot be indexed
            want.append((i, self.key("kv", keys[i])))
        if not want:
            return gpu_hit
        present = [bm.holds(hashes[i], keys[i]) or self.host.arena.contains(k) for i, k in want]
        if self.shared and not all(present):
            miss = [k for (_, k), p in zip(want, present) if not p]
            got = {}
            for t in self.shared:
                try:
                    got.update({k: f for k, f in zip(miss, t.contains_many(miss)) if f})
                except Exception:
                    pass
            present = [p or got.get(k, False) for (_, k), p in zip(want, present)]
        n = 0
        while n < len(want) and present[n]:
            n += 1
        if n == 0:
            return gpu_hit
        # Hold the GPU-hit blocks so making room for the loads cannot evict them.
        held = [self.pool.lookup(h) for h in hashes[:gpu_hit]]
        self.pool.incref(held)
        loaded = 0
        try:
            for i, key in want[:n]:
                on_gpu = self.pool.lookup(hashes[i])
                if on_gpu >= 0 and not bm.holds(hashes[i], keys[i]):
                    break  # indexed by another prefix since the scan
                if on_gpu >= 0:  # still cached on the GPU past the gap: hold it
                    self.pool.incref([on_gpu])
                    held.append(on_gpu)
                    loaded += 1
                    continue
                if not self._blocks_free(1):
                    break
                got = self._read(key, self.unit_bytes, KV)
                if got is None:
                    break
                rows, where = got
                try:
                    block = self.pool.allocate(1)[0]
                    held.append(block)  # held until every load is done
                    self.flush_kv()  # the allocation may have evicted a block queued to go down
                    self.mover.from_rows(rows, [block])
                finally:
                    self.host.unpin(key)
                if not bm.publish_block(block, hashes[i], keys[i]):
                    raise AssertionError("a tier load published a hash the GPU index holds")
                self._kv_blocks[hashes[i]] = block
                self._count("kv_loaded_host" if where == "host" else "kv_loaded_shared")
                loaded += 1
        finally:
            self.pool.free(list(reversed(held)))
        return gpu_hit + loaded

    def _blocks_free(self, n: int) -> bool:
        return self.coord.ensure_free_units(n)

    def load_state(self, h: int, prefix_key: bytes) -> bool:
        """Brings the image of prefix ``prefix_key`` from a tier into the PAGE
        store under ``h`` (READY); False when no tier has a trusted copy or no
        units are free. The caller holds ``h``'s KV block, filed under that key."""
        if self.coord.contains(h):
            return True
        key = self.key("state", prefix_key)
        if key is None or not self.index.request_load(h):
            return False
        nbytes = self.upc * self.unit_bytes
        untrusted = self.counters["loads_untrusted"]
        got = self._read(key, nbytes, STATE)
        if got is None:
            # Every copy was missing or failed its check (and was removed).
            self.index.fail_load(h, missing=True, untrusted=self.counters["loads_untrusted"] > untrusted)
            return False
        rows, where = got
        owner = ("statecache-tier-load", next(self._owner_ids))
        try:
            units = self.coord.reserve_transfer_units(owner)
            if units is None:
                self.index.abandon_load(h)
                return False
            try:
                self.flush_kv()  # the reservation may have evicted blocks queued to go down
                self.mover.from_rows(rows, units)
            except Exception:
                self.coord.release_transfer_units(owner)
                raise
        finally:
            self.host.unpin(key)
        if not self.coord.adopt_transfer_units(owner, h):
            self.index.abandon_load(h)
            return self.coord.contains(h)
        self.index.complete_load(h)
        self._count("state_loaded_host" if where == "host" else "state_loaded_shared")
        self._loaded_from[h] = where
        return True

    def source_of(self, h: int) -> str:
        """Where the image a resume starts from came from: "gpu", "host" or
        the shared tier's name (forgotten once asked)."""
        return self._loaded_from.pop(h, "gpu")

    # ------------------------------ checks --------------------------------- #

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
        pinned = {j.key for j in self._jobs if j.pinned} | {k for _, k in self._quarantine}
        for k in arena.keys():
            key = k.decode()
            if arena.pins(key) and key not in pinned:
                raise AssertionError(f"host entry {key} is pinned with no job holding it")

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
        self.wait_writes()
        # A write stuck on an unreachable server is left to its thread.
        self._io.shutdown(wait=not self._jobs)
        self.coord.attach_offload(None)


def attach_tiers(engine, tiers, *, page_layout=None, tp_rank: int = 0, tp_size: int = 1, **options) -> Tiering:
    """Builds the engine's ``Tiering`` over its runner's page layout."""
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
