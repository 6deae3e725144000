"""HostTier: page-unit-sized entries in one (pinned, where a GPU exists) host
buffer, bookkept by the C++ ``HostArena`` (hash index + ranking with the GPU
caches' eviction cost model: recency and prefill FLOPs saved per byte). State
images and KV blocks (classes 0 and 1) share one byte budget and rank
together, unless a cap is given for either."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from statecache import _C

from .base import MISSING, TRUNCATED, Segment, Segments, Tier, check_batch

STATE, KV = 0, 1

Rows: TypeAlias = npt.NDArray[np.uint8]
#: what on_evict receives: (key, row views, nbytes, meta) per value about to go
Demoted: TypeAlias = list[tuple[str, list[Rows], int, bytes]]


def _bytes_view(seg: Segment) -> Rows:
    return np.frombuffer(seg, dtype=np.uint8) if not isinstance(seg, np.ndarray) else seg.reshape(-1).view(np.uint8)


def copy_stream(src_segments: Segments, dst_segments: Segments) -> int:
    """Copies the concatenation of ``src_segments`` onto that of
    ``dst_segments`` (equal total sizes); returns the bytes copied. Raises
    TypeError for a segment that is not a buffer."""
    srcs = [_bytes_view(s) for s in src_segments]
    dsts = [_bytes_view(d) for d in dst_segments]
    si = so = di = do = done = 0
    while si < len(srcs) and di < len(dsts):
        s, d = srcs[si], dsts[di]
        n = min(s.size - so, d.size - do)
        if n:
            d[do : do + n] = s[so : so + n]
        so += n
        do += n
        done += n
        if so == s.size:
            si, so = si + 1, 0
        if do == d.size:
            di, do = di + 1, 0
    return done


def _allocate_buffer(num_entries: int, entry_bytes: int, pin_memory: bool | None) -> tuple[Rows, Any]:
    """The arena's memory, and the object that owns it."""
    if pin_memory is None or pin_memory:
        try:
            import torch

            if pin_memory or torch.cuda.is_available():
                t = torch.empty((num_entries, entry_bytes), dtype=torch.uint8, pin_memory=True)
                rows: Rows = t.numpy()
                return rows, t
        except ImportError:
            if pin_memory:
                raise ImportError("pin_memory=True needs torch with a GPU runtime") from None
    arr = np.empty((num_entries, entry_bytes), dtype=np.uint8)
    return arr, arr


class HostTier(Tier):
    """A host-memory tier of ``capacity_bytes`` in entries of ``entry_bytes``
    (the page unit size). ``state_bytes`` / ``kv_bytes``: optional caps of the
    two classes. Neither (the default): state images and KV blocks share the
    whole tier, ranked together. One: that class is capped and the other has
    the rest (a fixed split). Both: both capped (together within the tier).
    ``ranking``: ``"cost"`` (recency + value of the position) or ``"lru"``;
    ``arena.set_eviction_policy`` installs the GPU caches' model (``Tiering``
    copies the PAGE store's).
    """

    name = "host"

    def __init__(
        self,
        capacity_bytes: int,
        entry_bytes: int,
        *,
        state_bytes: int | None = None,
        kv_bytes: int | None = None,
        ranking: Literal["lru", "cost"] = "cost",
        pin_memory: bool | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(timeout_s)
        for name, v in (("capacity_bytes", capacity_bytes), ("entry_bytes", entry_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0")
        for name, cap in (("state_bytes", state_bytes), ("kv_bytes", kv_bytes)):
            if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
                raise ValueError(f"{name}={cap!r} must be an int >= 0 or None")
        if entry_bytes <= 0:
            raise ValueError(f"entry_bytes={entry_bytes} must be > 0")
        if (state_bytes is None) != (kv_bytes is None):  # one cap given: the other class has the rest
            if kv_bytes is not None:
                state_bytes = max(0, capacity_bytes - kv_bytes)
            elif state_bytes is not None:
                kv_bytes = max(0, capacity_bytes - state_bytes)
        if state_bytes is not None and kv_bytes is not None and state_bytes + kv_bytes > capacity_bytes:
            raise ValueError(f"state_bytes={state_bytes} + kv_bytes={kv_bytes} exceed capacity_bytes={capacity_bytes}")
        self.arena = _C.HostArena(entry_bytes, capacity_bytes, [state_bytes, kv_bytes], ranking)
        self.entry_bytes = entry_bytes
        self.capacity_bytes = capacity_bytes
        self.rows, self._owner = _allocate_buffer(max(self.arena.num_entries, 1), entry_bytes, pin_memory)
        self.pinned = self._owner is not self.rows
        # Called with [(key, row views, nbytes, meta)] before those values are
        # evicted, so a lower tier can take them (demotion).
        self.on_evict: Callable[[Demoted], object] | None = None

    @staticmethod
    def klass_of(key: str) -> int:
        """Returns the budget class of ``key`` (KV blocks or state images). Raises nothing."""
        return KV if "/kv/" in key else STATE

    # ------------------------------ entries -------------------------------- #

    def reserve(self, key: str, nbytes: int, position: int = 0, klass: int | None = None) -> list[Rows] | None:
        """Returns the entries for a value of ``nbytes`` whose prefix ends at
        ``position`` (row views, in order), evicting (and first demoting) by
        the ranking; None when the class cannot hold it now or ``key`` is
        held. The value is invisible until ``seal``. Raises TierError when
        closed, ValueError for a bad size or position, what ``on_evict``
        raised."""
        with self._lock:
            self._check_open()
            klass = self.klass_of(key) if klass is None else klass
            count = max(1, -(-nbytes // self.entry_bytes))
            plan = self.arena.victims(klass, count)
            if plan is None:
                return None
            if plan and self.on_evict is not None:
                self._demote(plan)
            try:
                got = self.arena.allocate(key, klass, count, nbytes, position)
            except ValueError as e:
                if "already in the arena" in str(e):
                    return None  # held, or still being written or read into
                raise
            if got is None:
                return None
            entries, _evicted = got
            self._count("evictions", len(_evicted))
            return self.views(entries, nbytes)

    def _demote(self, keys: list[bytes]) -> None:
        assert self.on_evict is not None
        batch: Demoted = []
        for raw in keys:
            k = raw.decode()
            v = self.arena.lookup(k, False)
            if v is None:
                continue
            self.arena.pin(k)
            batch.append((k, self.views(v[0], v[1]), v[1], v[2]))
        try:
            self.on_evict(batch)
        finally:
            for k, *_ in batch:
                self.arena.unpin(k)

    def views(self, entries: Sequence[int], nbytes: int) -> list[Rows]:
        """Returns row views covering ``nbytes`` of ``entries`` (the last one
        cut). Raises IndexError for an entry out of range."""
        out, left = [], nbytes
        for e in entries:
            n = min(left, self.entry_bytes)
            out.append(self.rows[e, :n])
            left -= n
        return out

    def seal(self, key: str, meta: bytes = b"") -> None:
        """Makes the reserved value under ``key`` findable; returns None.
        Raises ValueError for a key not reserved or already sealed."""
        with self._lock:
            self.arena.seal(key, meta)
            self._count("puts")

    def abort(self, key: str) -> None:
        """Drops a reserved (or sealed) value; returns None. Raises nothing."""
        with self._lock:
            self.arena.remove(key)

    def read(self, key: str) -> tuple[list[Rows], int, bytes] | None:
        """Returns ``(row views, nbytes, meta)`` of a sealed value, pinned
        until ``unpin(key)``; None when absent. Raises TierError when closed."""
        with self._lock:
            self._check_open()
            v = self.arena.lookup(key)
            if v is None:
                return None
            self.arena.pin(key)
            return self.views(v[0], v[1]), v[1], v[2]

    def unpin(self, key: str) -> None:
        """Drops the pin ``read`` took; returns None. Raises ValueError for a
        key that is not pinned."""
        with self._lock:
            self.arena.unpin(key)

    # ----------------------------- interface ------------------------------- #

    def put_many(self, keys: Sequence[str], values: Sequence[Segments]) -> list[bool]:
        """As ``Tier.put_many``: returns, per key, whether it is stored. Raises
        TypeError/ValueError for a malformed batch, TierError when closed."""
        check_batch(keys, values)
        out = []
        with self._lock:
            self._check_open()
            for key, segs in zip(keys, values):
                if self.arena.contains(key):
                    out.append(True)
                    continue
                nbytes = sum(memoryview(s).nbytes for s in segs)
                rows = self.reserve(key, nbytes)
                if rows is None:
                    self._count("puts_failed")
                    out.append(False)
                    continue
                copy_stream(segs, rows)
                self.seal(key)
                self._count("bytes_put", nbytes)
                out.append(True)
        return out

    def get_many_into(self, keys: Sequence[str], dests: Sequence[Segments]) -> list[int]:
        """As ``Tier.get_many_into``: returns, per key, the bytes read or a
        negative outcome. Raises TypeError/ValueError for a malformed batch,
        TierError when closed."""
        check_batch(keys, dests, "dests")
        out = []
        with self._lock:
            self._check_open()
            for key, segs in zip(keys, dests):
                v = self.arena.lookup(key)
                if v is None:
                    out.append(MISSING)
                    continue
                want = sum(memoryview(s).nbytes for s in segs)
                if want != v[1]:
                    out.append(TRUNCATED)
                    continue
                out.append(copy_stream(self.views(v[0], v[1]), segs))
        self._count_gets(out)
        return out

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether a sealed value is held. Raises TypeError
        for malformed keys."""
        check_batch(keys)
        with self._lock:
            return [self.arena.contains(k) for k in keys]

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether a value was removed. Raises TypeError for
        malformed keys."""
        check_batch(keys)
        with self._lock:
            out = [self.arena.remove(k) for k in keys]
            self._count("removes", sum(out))
            return out

    def stats(self) -> dict[str, int]:
        """Returns a new dict of the tier's counters plus each class's arena
        stats, entry_bytes and num_free. Raises nothing."""
        with self._lock:
            d = dict(self._stats)
            for name, k in (("state", STATE), ("kv", KV)):
                for f, v in self.arena.class_stats(k).items():
                    d[f"{name}_{f}"] = v
            d["entry_bytes"] = self.entry_bytes
            d["num_free"] = self.arena.num_free
            return d

    def close(self) -> None:
        """Closes the tier (its memory goes with the object); returns None.
        Raises nothing."""
        with self._lock:
            self.closed = True
