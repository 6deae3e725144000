"""The store side: state images offloaded from the PAGE store to the tiers.

Each pass, by the store's offload protocol: ``take_offload_stores`` -> copy
the units out -> ``release_offload_store_source`` -> the write completes ->
``settle_offload_store`` -> ``note_stored`` unless ``was_reclaimed``. With a
host tier the copy and the seal happen at once and only shared writes run on
the I/O thread; with shared tiers alone (the host arena only stages) the
copy runs there too, and the units stay pinned until it is known done; a copy
whose pin was reclaimed first is never written (``note_reclaims``). Host
values the host ranking evicts are demoted to the shared tiers first
(``shared_writes="demote"``), and ``flush`` writes every host value down.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading

from statecache.logs import logger
from statecache.tiers import integrity
from statecache.tiers.host import STATE

from .stack import TIER_ERRORS, TierStack


class _Job:
    """An offload whose shared-tier write (and, when the host only stages,
    the copy out of the units) runs on the I/O thread."""

    __slots__ = ("op", "h", "key", "future", "pinned", "source_done", "source_released", "reclaimed")

    def __init__(self, op, h, key, pinned: bool, source_done: bool):
        self.op, self.h, self.key, self.future = op, h, key, None
        self.pinned = pinned
        self.source_done = source_done  # the units were read under the pin (set by the I/O thread)
        self.source_released = source_done
        self.reclaimed = False  # the pin was taken back before the copy was known done


class StateOffloads:
    """Offloads of READY images, their shared-tier writes and demotions."""

    def __init__(self, stack: TierStack, *, coordinator, index, mover, keys, placement, offload_timeout_s: float):
        self.stack = stack
        self.placement = placement
        self.coord = coordinator
        self.index = index
        self.mover = mover
        self.keys = keys
        self.offload_timeout_s = offload_timeout_s
        self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="statecache-tiers")
        self.jobs: list[_Job] = []
        # Orders a copy's end against a reclaim of its pin (see note_reclaims).
        self._pins = threading.Lock()

    def offload(self, op, units) -> None:
        stack, host = self.stack, self.stack.host
        h = op.prefix_hash
        key = self.keys.filed_key("state", h)  # the image's own prefix
        rows = None
        if key is not None and not host.arena.contains(key):
            rows = host.reserve(key, len(units) * stack.unit_bytes, self.placement.position("state", h), STATE)
        if rows is None:
            self.coord.release_offload_store_source(op)
            self.coord.settle_offload_store(op)
            if key is not None and host.arena.contains(key):
                self.index.note_stored(h)  # already below: nothing to write
                self.placement.state_stored(h)
            else:
                self.index.note_store_failed(h)
                stack.count("state_offload_failed")
            return
        self.index.note_store_started(h)
        if stack.staging_only:
            # Copy and write on the I/O thread: the units stay pinned until the
            # copy is known done, and a copy that overran its pin is reclaimed.
            job = _Job(op, h, key, pinned=False, source_done=False)
            job.future = self._io.submit(self._copy_and_write, job, list(units), rows)
            self.jobs.append(job)
            return
        self.mover.to_rows(units, rows)
        self.coord.release_offload_store_source(op)
        header = integrity.make_header(key, len(rows) * stack.unit_bytes, integrity.checksum(rows))
        host.seal(key, header)
        self.placement.state_stored(h)
        if stack.shared_writes == "through":
            host.arena.pin(key)
            job = _Job(op, h, key, pinned=True, source_done=True)
            job.future = self._io.submit(self._write_shared, key, rows, header)
            self.jobs.append(job)
            return
        self._settle(op, h, key, True)

    def _copy_and_write(self, job, units, rows) -> bool:
        self.mover.to_rows(units, rows)
        with self._pins:
            if job.reclaimed:
                # The pin was taken back before this copy ended: the units may
                # hold another value now, so these bytes are never written.
                return False
            job.source_done = True
        header = integrity.make_header(job.key, len(rows) * self.stack.unit_bytes, integrity.checksum(rows))
        return self._write_shared(job.key, rows, header)

    def _write_shared(self, key, rows, header) -> bool:
        """On the I/O thread: one value to every shared tier."""
        return self.stack.put_one(key, [self.stack.header_buffer(0, header), *rows])

    def _settle(self, op, h: int, key: str, ok: bool) -> None:
        stack = self.stack
        self.coord.settle_offload_store(op)
        if self.coord.was_reclaimed(op):
            # The units were taken back before the copy was known done: the
            # bytes written may be anything, so nothing is indexed.
            self.index.note_store_failed(h, untrusted=True)
            stack.host.abort(key)
            self.remove_shared(key)
            stack.count("state_offload_failed")
        elif ok:
            self.index.note_stored(h)
            stack.count("state_offloaded")
        else:
            self.index.note_store_failed(h)
            stack.count("state_offload_failed")

    def remove_shared(self, key: str) -> None:
        """Best effort: ``key`` removed from every shared tier."""
        for t in self.stack.shared:
            try:
                t.remove_many([key])
            except TIER_ERRORS as e:
                self.stack.failed(None, "remove", t, e)

    def note_reclaims(self) -> None:
        """Right after ``reclaim_stale_offload_pins``, before anything can
        reuse the units: every job whose copy had not ended loses its pin for
        good. A copy that ends later writes nothing; one that ended before
        read the image while it was pinned (and is settled as untrusted)."""
        with self._pins:
            for job in self.jobs:
                if not job.source_done and not job.reclaimed and self.coord.was_reclaimed(job.op):
                    job.reclaimed = True

    def retire(self) -> None:
        """Releases the sources the I/O thread finished reading and settles
        the jobs whose writes completed."""
        stack = self.stack
        keep = []
        for job in self.jobs:
            if job.source_done and not job.source_released:
                self.coord.release_offload_store_source(job.op)
                job.source_released = True
            if not job.future.done():
                keep.append(job)
                continue
            try:
                ok = bool(job.future.result())
            except Exception as e:  # the I/O thread's failure fails this offload only
                stack.count("tier_errors")
                logger.log(logging.ERROR, "tiers: offload of %s failed on the I/O thread", job.key, exc_info=e)
                ok = False
            if not ok:
                stack.count("shared_writes_failed")
            if job.pinned:
                stack.host.arena.unpin(job.key)
            if stack.staging_only:
                stack.host.abort(job.key)
            self._settle(job.op, job.h, job.key, ok or not stack.staging_only)
        self.jobs = keep

    def demote(self, batch) -> None:
        """Host eviction hook: the evicted values go to the shared tiers."""
        stack = self.stack
        for key, rows, _nbytes, meta in batch:
            if not meta:
                continue
            for t in stack.shared:
                try:
                    if t.put_many([key], [[stack.header_buffer(1, meta), *rows]])[0]:
                        stack.count("demoted")
                        continue
                except TIER_ERRORS as e:
                    stack.failed(None, "demote", t, e)
                stack.count("shared_writes_failed")

    def flush(self) -> None:
        """Writes every host value to the shared tiers (a graceful shutdown,
        so another engine can resume from them)."""
        stack = self.stack
        self.wait_writes()
        if not stack.shared or stack.staging_only:
            return
        for k in stack.host.arena.keys():
            key = k.decode()
            got = stack.host.read(key)
            if got is None:
                continue
            rows, _nbytes, meta = got
            try:
                for t in stack.shared:
                    try:
                        t.put_many([key], [[stack.header_buffer(1, meta), *rows]])
                    except TIER_ERRORS as e:
                        stack.failed("shared_writes_failed", "flush", t, e)
                        break
            finally:
                stack.host.unpin(key)

    def wait_writes(self, timeout_s: float | None = None) -> None:
        """Waits for the shared-tier writes in flight, then retires them."""
        cf.wait([j.future for j in self.jobs], timeout=timeout_s or self.offload_timeout_s)
        self.retire()

    def pinned_keys(self) -> set[str]:
        """Host keys the jobs in flight hold pinned."""
        return {j.key for j in self.jobs if j.pinned}

    def close(self) -> None:
        self.wait_writes()
        # A write stuck on an unreachable server is left to its thread.
        self._io.shutdown(wait=not self.jobs)
