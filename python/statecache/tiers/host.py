"""HostTier: page-unit-sized entries in one (pinned, where a GPU exists) host
buffer, bookkept by the C++ ``HostArena`` (hash index + ranking with the GPU
caches' eviction cost model: recency and prefill FLOPs saved per byte). State
images and KV blocks have separate byte budgets (classes 0 and 1)."""

from __future__ import annotations

import numpy as np

from statecache import _C

from .base import MISSING, TRUNCATED, Tier, check_batch

STATE, KV = 0, 1


def _bytes_view(seg) -> np.ndarray:
    return np.frombuffer(seg, dtype=np.uint8) if not isinstance(seg, np.ndarray) else seg.reshape(-1).view(np.uint8)


def copy_stream(src_segments, dst_segments) -> int:
    """Copies the concatenation of ``src_segments`` onto that of
    ``dst_segments`` (equal total sizes); returns the bytes copied."""
    srcs = [_bytes_view(s) for s in src_segments]
    dsts = [_bytes_view(d) for d in dst_segments]
    si = so = di = do = done = 0
    while si < len(srcs) and di < len(dsts):
        s, d = srcs[si], dsts[di]
        n = min(s.size - so, d.size - do)
        if n:
            d[do:do + n] = s[so:so + n]
        so += n
        do += n
        done += n
        if so == s.size:
            si, so = si + 1, 0
        if do == d.size:
            di, do = di + 1, 0
    return done


def _allocate_buffer(num_entries: int, entry_bytes: int, pin_memory):
    """The arena's memory, and the object that owns it."""
    if pin_memory is None or pin_memory:
        try:
            import torch
            if pin_memory or torch.cuda.is_available():
                t = torch.empty((num_entries, entry_bytes), dtype=torch.uint8, pin_memory=True)
                return t.numpy(), t
        except ImportError:
            if pin_memory:
                raise ImportError("pin_memory=True needs torch with a GPU runtime") from None
    arr = np.empty((num_entries, entry_bytes), dtype=np.uint8)
    return arr, arr


class HostTier(Tier):
    """A host-memory tier of ``capacity_bytes`` in entries of ``entry_bytes``
    (the page unit size). ``state_bytes`` / ``kv_bytes``: the two classes'
    budgets (default: all of it for state images, none for KV blocks).
    ``ranking``: ``"cost"`` (recency + value of the position) or ``"lru"``;
    ``arena.set_eviction_policy`` installs the GPU caches' model (``Tiering``
    copies the PAGE store's).
    """

    name = "host"

    def __init__(self, capacity_bytes: int, entry_bytes: int, *, state_bytes: int | None = None,
                 kv_bytes: int = 0, ranking: str = "cost", pin_memory=None, timeout_s: float = 5.0):
        super().__init__(timeout_s)
        for name, v in (("capacity_bytes", capacity_bytes), ("entry_bytes", entry_bytes),
                        ("kv_bytes", kv_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0")
        if entry_bytes <= 0:
            raise ValueError(f"entry_bytes={entry_bytes} must be > 0")
        if state_bytes is None:
            state_bytes = capacity_bytes - kv_bytes
        if not isinstance(state_bytes, int) or isinstance(state_bytes, bool) or state_bytes < 0:
            raise ValueError(f"state_bytes={state_bytes!r} must be an int >= 0")
        if state_bytes + kv_bytes > capacity_bytes:
            raise ValueError(f"state_bytes={state_bytes} + kv_bytes={kv_bytes} exceed "
                             f"capacity_bytes={capacity_bytes}")
        self.arena = _C.HostArena(entry_bytes, capacity_bytes, [state_bytes, kv_bytes], ranking)
        self.entry_bytes = entry_bytes
        self.capacity_bytes = capacity_bytes
        self.rows, self._owner = _allocate_buffer(max(self.arena.num_entries, 1), entry_bytes,
                                                  pin_memory)
        self.pinned = self._owner is not self.rows
        # Called with [(key, row views, nbytes, meta)] before those values are
        # evicted, so a lower tier can take them (demotion).
        self.on_evict = None

    @staticmethod
    def klass_of(key: str) -> int:
        return KV if "/kv/" in key else STATE

    # ------------------------------ entries -------------------------------- #

    def reserve(self, key: str, nbytes: int, position: int = 0, klass: int | None = None):
        """Entries for a value of ``nbytes`` whose prefix ends at ``position``
        (row views, in order), evicting (and first demoting) by the ranking;
        None when the class cannot hold it now. The value is invisible until
        ``seal``."""
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

    def _demote(self, keys) -> None:
        batch = []
        for k in keys:
            k = k.decode()
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

    def views(self, entries, nbytes: int):
        """Row views covering ``nbytes`` of ``entries`` (the last one cut)."""
        out, left = [], nbytes
        for e in entries:
            n = min(left, self.entry_bytes)
            out.append(self.rows[e, :n])
            left -= n
        return out

    def seal(self, key: str, meta: bytes = b"") -> None:
        with self._lock:
            self.arena.seal(key, meta)
            self._count("puts")

    def abort(self, key: str) -> None:
        with self._lock:
            self.arena.remove(key)

    def read(self, key: str):
        """``(row views, nbytes, meta)`` of a sealed value, pinned until
        ``unpin(key)``; None when absent."""
        with self._lock:
            self._check_open()
            v = self.arena.lookup(key)
            if v is None:
                return None
            self.arena.pin(key)
            return self.views(v[0], v[1]), v[1], v[2]

    def unpin(self, key: str) -> None:
        with self._lock:
            self.arena.unpin(key)

    # ----------------------------- interface ------------------------------- #

    def put_many(self, keys, values) -> list[bool]:
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

    def get_many_into(self, keys, dests) -> list[int]:
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

    def contains_many(self, keys) -> list[bool]:
        check_batch(keys)
        with self._lock:
            return [self.arena.contains(k) for k in keys]

    def remove_many(self, keys) -> list[bool]:
        check_batch(keys)
        with self._lock:
            out = [self.arena.remove(k) for k in keys]
            self._count("removes", sum(out))
            return out

    def stats(self) -> dict:
        with self._lock:
            d = dict(self._stats)
            for name, k in (("state", STATE), ("kv", KV)):
                for f, v in self.arena.class_stats(k).items():
                    d[f"{name}_{f}"] = v
            d["entry_bytes"] = self.entry_bytes
            d["num_free"] = self.arena.num_free
            return d

    def close(self) -> None:
        with self._lock:
            self.closed = True
