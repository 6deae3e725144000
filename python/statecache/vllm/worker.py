"""The worker side: moves bytes between vLLM's KV cache tensors and the host
tier's rows, checks them, and writes / reads the shared tier
(docs/vllm.md, "How it works").

Each KV cache group's blocks are a statecache ``StateLayout`` (slot = vLLM
block id, image = the real bytes of the group's pages) moved whole to and
from the host tier's rows by the copy engine's ``HostCopyExecutor``
(``statecache.vllm.moves``). Which entries hold what is decided by the
scheduler side; a worker keeps no index, so every tensor-parallel rank files
its shard at the same entries.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from statecache.tiers import integrity
from statecache.tiers.base import MISSING, TIMED_OUT, TRUNCATED
from statecache.tiers.keys import TierKey
from statecache.tiers.ranks import rank_identity
from statecache.vllm.config import ConnectorConfig
from statecache.vllm.geometry import Geometry, UnsupportedGeometry
from statecache.vllm.metadata import Load, StateCacheMeta, Value, WorkerReport
from statecache.vllm.moves import BlockMover, block_views
from statecache.vllm.shared import open_shared_tier

log = logging.getLogger("statecache.vllm")

_HEADER_SLOT = 256


@dataclass
class _PendingLoad:
    load: Load
    # value index -> (future, header slot, header buffer)
    fetches: dict[int, tuple[cf.Future, int, np.ndarray]] = field(default_factory=dict)
    failed: bool = False


class ConnectorWorker:
    """One rank's connector state: movers over its tensors, its host rows, its
    shared-tier client."""

    def __init__(
        self,
        config: ConnectorConfig,
        geometry: Geometry,
        tp_rank: int,
        tp_size: int,
    ):
        self.config = config
        self.geometry = geometry
        self.rank, self.tp_size = rank_identity(tp_rank, tp_size)
        self.layout_ids = {kind: geometry.layout_id(kind) for kind in ("kv", "state", "tail")}
        self.num_entries = config.host_memory // geometry.entry_bytes
        self.movers: dict[int, BlockMover] = {}
        self.host: torch.Tensor | None = None
        self.rows: np.ndarray | None = None
        self.shared = None
        self._io: cf.ThreadPoolExecutor | None = None
        self._headers = np.zeros((1024, _HEADER_SLOT), dtype=np.uint8)
        self._free_headers = list(range(len(self._headers) - 1, -1, -1))
        self._writes: list[tuple[cf.Future, str, int]] = []
        self._pending: dict[str, _PendingLoad] = {}
        self._recv_done: set[str] = set()
        self._send_done: set[str] = set()  # finished requests whose blocks were held for a save
        self._recv_failed: set[str] = set()
        self._quarantine: list[tuple[str, int]] = []  # staged reads that timed out: (key, header slot)
        self._report = WorkerReport()

    # ------------------------------------------------------------- set-up --

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], kv_cache_config) -> None:
        """Builds the movers over vLLM's tensors and allocates the host rows.
        Raises UnsupportedGeometry when a tensor is not where the KV cache
        config says it is."""
        geo = self.geometry
        tensors = kv_cache_config.kv_cache_tensors
        raw: dict[int, torch.Tensor] = {}
        device = None
        for image in geo.images:
            for p in image.places:
                t = kv_caches.get(p.layer)
                if not isinstance(t, torch.Tensor):
                    raise UnsupportedGeometry(f"layer {p.layer}: registered as {type(t).__name__}, not one tensor")
                st = t.untyped_storage()
                if t.data_ptr() != st.data_ptr() + p.offset:
                    raise UnsupportedGeometry(
                        f"layer {p.layer}: its tensor starts {t.data_ptr() - st.data_ptr()} bytes into its storage, "
                        f"kv_cache_tensors[{p.tensor}] says {p.offset}"
                    )
                end = p.offset + (geo.num_blocks - 1) * p.block_stride + image.page_bytes
                if end > st.nbytes() or tensors[p.tensor].size > st.nbytes():
                    raise UnsupportedGeometry(f"layer {p.layer}: storage of {st.nbytes()} bytes ends before {end}")
                if p.tensor not in raw:
                    raw[p.tensor] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (st.nbytes(),), (1,))
                device = t.device
        assert device is not None
        pin = device.type == "cuda"
        self.host = torch.empty((max(self.num_entries, 1), geo.entry_bytes), dtype=torch.uint8, pin_memory=pin)
        self.rows = self.host.numpy()
        shared_views: dict[tuple, BlockMover] = {}
        for image in geo.images:
            sig = (image.real_bytes, tuple((p.tensor, p.offset, p.block_stride) for p in image.places))
            if sig not in shared_views:
                views = [
                    block_views(raw[p.tensor], [(p.offset, p.block_stride)], geo.num_blocks, image.page_bytes)[0]
                    for p in image.places
                ]
                shared_views[sig] = m = BlockMover(views, image.real_bytes, self.host)
                if m.entries_per_image != geo.units(image):
                    raise AssertionError(
                        f"group {image.group}: {m.entries_per_image} entries an image, not {geo.units(image)}"
                    )
            self.movers[image.group] = shared_views[sig]
        if self.config.shared is not None:
            self.shared = open_shared_tier(self.config.shared, self.config.shared_timeout_s)
            if hasattr(self.shared, "register"):
                self.shared.register(self.rows)
                self.shared.register(self._headers)
            self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="statecache-vllm-io")
        log.info(
            "statecache connector worker rank %d/%d: %d host entries of %d bytes (%.2f GB), %d movers on %s, shared=%s",
            self.rank,
            self.tp_size,
            self.num_entries,
            geo.entry_bytes,
            self.num_entries * geo.entry_bytes / 1e9,
            len(shared_views),
            device,
            self.config.shared.kind if self.config.shared else None,
        )

    # -------------------------------------------------------------- values --

    def full_key(self, v: Value) -> str:
        # a tail is a state checkpoint (plus its partial block): its own layout keeps the names apart
        kind = "state" if v.kind == "tail" else v.kind
        return TierKey(kind, self.layout_ids[v.kind], self.rank, self.tp_size, v.prefix_key).encode()

    def _images(self, v: Value):
        """(group image, block, its entries) for each image of ``v``."""
        off = 0
        groups = self.geometry.groups_of(v.kind)
        if len(v.blocks) != len(groups):
            raise ValueError(f"value {v.key}: {len(v.blocks)} blocks for {len(groups)} {v.kind} groups")
        for g, b in zip(groups, v.blocks):
            n = self.geometry.units(g)
            yield g, b, v.entries[off : off + n]
            off += n
        if off != len(v.entries):
            raise ValueError(f"value {v.key}: {len(v.entries)} entries, its images take {off}")

    def _segments(self, v: Value) -> list[np.ndarray]:
        """The value's payload: each image's bytes in its entries, in order."""
        assert self.rows is not None
        segs = []
        eb = self.geometry.entry_bytes
        for g, _b, entries in self._images(v):
            left = g.image_bytes
            for e in entries:
                n = min(left, eb)
                segs.append(self.rows[e, :n])
                left -= n
        return segs

    def _move(self, values: list[Value], store: bool) -> None:
        by_mover: dict[int, tuple[BlockMover, list]] = {}
        for v in values:
            for g, b, entries in self._images(v):
                m = self.movers[g.group]
                by_mover.setdefault(id(m), (m, []))[1].append((b, entries))
        for m, pairs in by_mover.values():
            (m.store if store else m.restore)(pairs)

    def _count(self, name: str, n: float = 1) -> None:
        c = self._report.counters
        c[name] = c.get(name, 0) + n

    # --------------------------------------------------------------- saves --

    def save(self, meta: StateCacheMeta) -> None:
        """After the forward: copies this step's values to the host rows,
        files their headers in the report, starts shared writes."""
        if not meta.saves:
            self._send_done.update(meta.finished_saves)
            return
        t0 = time.perf_counter()
        self._move(meta.saves, store=True)
        nbytes = 0
        for v in meta.saves:
            key = self.full_key(v)
            segs = self._segments(v)
            size = sum(s.nbytes for s in segs)
            header = integrity.make_header(key, size, integrity.checksum(segs))
            self._report.saved.setdefault(v.key, {})[self.rank] = header
            nbytes += size
            if meta.shared_writes and self.shared is not None and self._io is not None:
                slot = self._free_headers.pop() if self._free_headers else -1
                hb = self._header_view(slot, header)
                self._writes.append((self._io.submit(self._put, key, [hb, *segs]), v.key, slot))
        self._send_done.update(meta.finished_saves)
        self._count("bytes_saved", nbytes)
        self._count("values_saved", len(meta.saves))
        self._count("save_seconds", time.perf_counter() - t0)

    def _header_view(self, slot: int, header: bytes):
        if slot < 0:
            return np.frombuffer(header, dtype=np.uint8)
        buf = self._headers[slot, : len(header)]
        buf[:] = np.frombuffer(header, dtype=np.uint8)
        return buf

    def _put(self, key: str, segs) -> bool:
        assert self.shared is not None
        try:
            return bool(self.shared.put_many([key], [segs])[0])
        except Exception as e:  # a tier failure is a missed write (counted), never an engine failure
            log.warning("statecache: shared-tier write of %s raised %s: %s", key, type(e).__name__, e)
            return False

    # --------------------------------------------------------------- loads --

    def start_loads(self, meta: StateCacheMeta) -> None:
        """Starts this step's loads: host values are checked and copied now;
        values in the shared tier are fetched on the I/O thread first."""
        for load in meta.loads:
            if load.req_id in self._pending:
                raise AssertionError(f"request {load.req_id} has a load in flight already")
            p = _PendingLoad(load)
            self._pending[load.req_id] = p
            if load.fail:
                p.failed = True
                continue
            for i, (v, headers) in enumerate(zip(load.values, load.headers)):
                if headers is None:
                    if self.shared is None or self._io is None:
                        p.failed = True
                        continue
                    key = self.full_key(v)
                    slot = self._free_headers.pop() if self._free_headers else -1
                    hlen = integrity.header_nbytes(key)
                    hb = self._headers[slot, :hlen] if slot >= 0 else np.zeros(hlen, dtype=np.uint8)
                    p.fetches[i] = (self._io.submit(self._get, key, [hb, *self._segments(v)]), slot, hb)
                else:
                    verdict = integrity.check(headers[self.rank], self.full_key(v), self._segments(v))
                    if verdict != integrity.OK:
                        self._report.untrusted.setdefault(v.key, set()).add(self.rank)
                        self._count("loads_untrusted")
                        log.warning("statecache: host copy of %s failed its check (%s): recomputing", v.key, verdict)
                        p.failed = True
        self.poll()

    def _get(self, key: str, dests) -> int:
        assert self.shared is not None
        try:
            return int(self.shared.get_many_into([key], [dests])[0])
        except Exception as e:  # a failed read (counted) is recomputed, never an engine failure
            log.warning("statecache: shared-tier read of %s raised %s: %s", key, type(e).__name__, e)
            return -3

    def poll(self) -> None:
        """Finishes loads whose fetches are done: checks fetched values,
        copies every value of a trusted load into vLLM's blocks."""
        for req_id in list(self._pending):
            p = self._pending[req_id]
            if any(not f.done() for f, _s, _h in p.fetches.values()):
                continue
            for i, (f, slot, hb) in p.fetches.items():
                v = p.load.values[i]
                r = f.result()
                key = self.full_key(v)
                why = None
                if r == TIMED_OUT:
                    why = "timed out"
                elif r == MISSING:
                    why = "missing"
                elif r == TRUNCATED:
                    why = "wrong size"
                elif r < 0:
                    why = "failed"
                else:
                    verdict = integrity.check(bytes(hb), key, self._segments(v))
                    if verdict != integrity.OK:
                        why = verdict
                if why is None:
                    self._report.fetched.setdefault(v.key, {})[self.rank] = bytes(hb)
                    self._count("values_fetched")
                elif why == "timed out":
                    # The read may still land in these entries: they stay reserved until the tier is idle.
                    self._quarantine.append((v.key, slot))
                    slot = -1
                    p.failed = True
                else:
                    log.warning("statecache: shared copy of %s not adopted (%s): recomputing", v.key, why)
                    self._report.fetch_failed.setdefault(v.key, {})[self.rank] = why
                    self._count("loads_untrusted" if why not in ("missing", "failed") else f"loads_{why}")
                    if why not in ("missing", "failed"):
                        self._remove_shared(key)
                    p.failed = True
                if slot >= 0:
                    self._free_headers.append(slot)
            del self._pending[req_id]
            self._recv_done.add(req_id)
            if p.failed:
                self._recv_failed.add(req_id)
                continue
            t0 = time.perf_counter()
            self._move(p.load.values, store=False)
            self._count("bytes_loaded", sum(sum(s.nbytes for s in self._segments(v)) for v in p.load.values))
            self._count("values_loaded", len(p.load.values))
            self._count("load_seconds", time.perf_counter() - t0)

    def _remove_shared(self, key: str) -> None:
        """An untrusted shared copy is removed where it was found."""
        if self.shared is not None and self._io is not None:
            self._io.submit(lambda: self.shared.remove_many([key]))

    # ------------------------------------------------------------- reports --

    def get_finished(self) -> tuple[set[str], set[str], set[str]]:
        """Returns (saves of finished requests done, loads finished, loads
        failed) since the last call."""
        self.poll()
        sent, done, failed = self._send_done, self._recv_done, self._recv_failed
        self._send_done, self._recv_done, self._recv_failed = set(), set(), set()
        return sent, done, failed

    def take_report(self) -> WorkerReport | None:
        """The report of everything since the last call, or None."""
        keep = []
        for f, key, slot in self._writes:
            if not f.done():
                keep.append((f, key, slot))
                continue
            ok = f.result()
            (self._report.shared_done if ok else self._report.shared_failed).setdefault(key, set()).add(self.rank)
            self._count("shared_writes" if ok else "shared_writes_failed")
            if slot >= 0:
                self._free_headers.append(slot)
        self._writes = keep
        if self._quarantine and (self.shared is None or getattr(self.shared, "idle", lambda: True)()):
            for key, slot in self._quarantine:
                self._report.fetch_failed.setdefault(key, {})[self.rank] = "timed out"
                self._count("loads_timed_out")
                if slot >= 0:
                    self._free_headers.append(slot)
            self._quarantine = []
        if self._report.empty():
            return None
        r, self._report = self._report, WorkerReport()
        return r

    def shutdown(self) -> None:
        if self._io is not None:
            cf.wait([f for f, _k, _s in self._writes], timeout=self.config.shared_timeout_s)
            self._io.shutdown(wait=False)
        if self.shared is not None:
            self.shared.close()
