"""MooncakeTier: the shared tier on Mooncake Store (docs/contract.md, "Tiers").

Values are written and read zero-copy from registered host memory
(``register(buffer)``: the host tier's arena) with ``batch_put_from_multi_buffers``
/ ``batch_get_into_multi_buffers``; segments outside registered memory go
through a registered staging buffer of this client. Every call runs on the
tier's I/O thread and is bounded by ``timeout_s``: a call that overruns
reports ``TIMED_OUT`` and the tier refuses new calls until it returned, and
until ``idle()`` the caller must not reuse that call's buffers.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from .base import (
    FAILED,
    MISSING,
    TIMED_OUT,
    TRUNCATED,
    Segment,
    Segments,
    Tier,
    TierError,
    check_batch,
)

_R = TypeVar("_R")

# Mooncake Store error codes this tier tells apart (mooncake/types.h).
_OBJECT_NOT_FOUND = -704
_OBJECT_ALREADY_EXISTS = -705

# What Mooncake's transfer engine advertises to its peers; set from
# local_host for the setup call unless the deployment set it.
_ADVERTISED = "MC_TCP_BIND_ADDRESS"
_ENV_LOCK = threading.Lock()


def _import_store() -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ImportError(
            "MooncakeTier needs Mooncake Store: pip install 'statecache[mooncake]' "
            "(PyPI mooncake-transfer-engine; mooncake-transfer-engine-non-cuda on machines "
            "without CUDA; Debian libibverbs1 librdmacm1 libnuma1)"
        ) from e
    return MooncakeDistributedStore


def _address(seg: Segment) -> tuple[int, int]:
    a = seg if isinstance(seg, np.ndarray) else np.frombuffer(seg, dtype=np.uint8)
    if not a.flags.c_contiguous:
        raise ValueError("segments must be contiguous buffers")
    return a.ctypes.data, a.nbytes


class MooncakeTier(Tier):
    """A client of a Mooncake Store cluster.

    ``master_addr``: ``host:port`` of ``mooncake_master``; ``metadata_server``:
    its HTTP metadata URL (``http://host:port/metadata``) or ``"P2PHANDSHAKE"``.
    ``protocol``: ``"tcp"`` (loopback, laptops) or ``"rdma"`` (production, with
    ``device_names``). ``segment_bytes``: memory this client contributes to
    the store (0: it only reads and writes others'). ``staging_bytes``: the
    registered buffer for segments outside registered memory. ``local_host``:
    the address this client's transfer engine gives its peers (loopback by
    default; a node's internal address in production). Mooncake takes it
    from ``MC_TCP_BIND_ADDRESS`` under an HTTP metadata server and would
    otherwise pick the machine's first external interface; it binds its
    listeners to every interface either way (docs/tiers.md, "Network exposure").
    """

    name = "mooncake"

    def __init__(
        self,
        master_addr: str,
        metadata_server: str,
        *,
        local_host: str = "127.0.0.1",
        protocol: str = "tcp",
        device_names: str = "",
        segment_bytes: int = 0,
        staging_bytes: int = 64 << 20,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(timeout_s)
        Store = _import_store()
        for name, v in (("master_addr", master_addr), ("metadata_server", metadata_server)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name}={v!r} must be a non-empty str")
        self._io = cf.ThreadPoolExecutor(1, thread_name_prefix="mooncake-tier")
        self._busy: cf.Future[Any] | None = None  # a call that overran its timeout
        self._store = Store()

        def setup() -> Any:
            with _ENV_LOCK:  # the transfer engine reads its address from the environment
                before = os.environ.get(_ADVERTISED)
                os.environ[_ADVERTISED] = before or local_host
                try:
                    return self._store.setup(
                        local_host,
                        metadata_server,
                        int(segment_bytes),
                        int(staging_bytes) + (16 << 20),
                        protocol,
                        device_names,
                        master_addr,
                    )
                finally:
                    if before is None:
                        del os.environ[_ADVERTISED]

        rc = self._call(setup)
        if rc != 0:
            self._io.shutdown(wait=False)
            raise TierError(
                f"MooncakeDistributedStore.setup(master={master_addr!r}, metadata={metadata_server!r}) returned {rc}"
            )
        self._regions: list[tuple[int, int, object]] = []
        self._staging = np.empty(max(staging_bytes, 4096), dtype=np.uint8)
        self._staging_lock = threading.Lock()
        self.register(self._staging)

    # ------------------------------ plumbing ------------------------------- #

    def _call(self, fn: Callable[[], _R]) -> _R:
        """Runs ``fn`` on the I/O thread within ``timeout_s``; raises
        ``TimeoutError`` when it overran (and marks the tier busy)."""
        with self._lock:
            self._check_open()
            if self._busy is not None and not self._busy.done():
                self._count("timeouts")
                raise TimeoutError("an earlier call has not returned")
            self._busy = None
            fut = self._io.submit(fn)
        try:
            return fut.result(self.timeout_s)
        except cf.TimeoutError:
            with self._lock:
                self._busy = fut
                self._count("timeouts")
            raise TimeoutError(f"mooncake call exceeded {self.timeout_s} s") from None

    def idle(self) -> bool:
        """Returns whether no call of this tier is still running (buffers of a
        timed-out call may then be reused). Raises nothing."""
        return self._busy is None or self._busy.done()

    def register(self, buffer: Segment) -> None:
        """Registers host memory for zero-copy puts and gets (kept alive
        here); returns None. Raises ValueError for a non-contiguous buffer,
        TierError when the store refuses it, TimeoutError past ``timeout_s``."""
        ptr, n = _address(buffer)
        rc: int = self._call(lambda: self._store.register_buffer(ptr, n))
        if rc != 0:
            raise TierError(f"register_buffer({n} bytes) returned {rc}")
        self._regions.append((ptr, ptr + n, buffer))

    def _registered(self, ptr: int, n: int) -> bool:
        return any(lo <= ptr and ptr + n <= hi for lo, hi, _ in self._regions)

    def _plan(self, segments: Segments) -> tuple[list[int] | None, list[int] | None, list[tuple[int, int]] | None]:
        addrs = [_address(s) for s in segments]
        if all(self._registered(p, n) for p, n in addrs):
            return [p for p, _ in addrs], [n for _, n in addrs], None
        return None, None, addrs

    # ----------------------------- interface ------------------------------- #

    def put_many(self, keys: Sequence[str], values: Sequence[Segments]) -> list[bool]:
        """As ``Tier.put_many``, zero-copy from registered memory: returns, per
        key, whether it is stored. Raises TypeError/ValueError for a malformed
        batch, TierError when closed."""
        check_batch(keys, values)
        # Per position, not per key: a key may come twice.
        direct: list[int] = []
        direct_p: list[list[int]] = []
        direct_n: list[list[int]] = []
        staged: list[int] = []
        for i, segs in enumerate(values):
            p, n, _ = self._plan(segs)
            if p is None or n is None:
                staged.append(i)
            else:
                direct.append(i)
                direct_p.append(p)
                direct_n.append(n)
        out = [False] * len(keys)
        try:
            if direct:
                dk = [keys[i] for i in direct]
                codes = self._call(lambda: self._store.batch_put_from_multi_buffers(dk, direct_p, direct_n))
                for i, c in zip(direct, codes):
                    out[i] = c in (0, _OBJECT_ALREADY_EXISTS)
            for i in staged:
                out[i] = self._put_staged(keys[i], values[i])
        except TimeoutError:
            pass
        except Exception as e:  # the client raised: the whole call failed
            self._client_failed("put_many", e)
        with self._lock:
            for segs, good in zip(values, out):
                if good:
                    self._count("puts")
                    self._count("bytes_put", sum(memoryview(s).nbytes for s in segs))
                else:
                    self._count("puts_failed")
        return out

    def _put_staged(self, key: str, segs: Segments) -> bool:
        from .host import copy_stream

        n = sum(memoryview(s).nbytes for s in segs)
        if n > self._staging.nbytes:
            return False
        with self._staging_lock:
            copy_stream(segs, [self._staging[:n]])
            code = self._call(
                lambda: self._store.batch_put_from_multi_buffers([key], [[self._staging.ctypes.data]], [[n]])
            )[0]
        return bool(code in (0, _OBJECT_ALREADY_EXISTS))

    def get_many_into(self, keys: Sequence[str], dests: Sequence[Segments]) -> list[int]:
        """As ``Tier.get_many_into``, zero-copy into registered memory:
        returns, per key, the bytes read or a negative outcome. Raises
        TypeError/ValueError for a malformed batch, TierError when closed."""
        check_batch(keys, dests, "dests")
        # Per destination, not per key: a key may come twice, into a
        # registered destination and an unregistered one, or of another size.
        want = [sum(memoryview(s).nbytes for s in d) for d in dests]
        res: list[int | None] = [None] * len(keys)
        try:
            plans = [self._plan(d)[:2] for d in dests]
            direct = [i for i, (p, _) in enumerate(plans) if p is not None]
            if direct:
                codes = self._call(
                    lambda: self._store.batch_get_into_multi_buffers(
                        [keys[i] for i in direct], [plans[i][0] for i in direct], [plans[i][1] for i in direct]
                    )
                )
                for i, c in zip(direct, codes):
                    res[i] = c
            for i, d in enumerate(dests):
                if res[i] is None:
                    res[i] = self._get_staged(keys[i], d)
            # A read that filled fewer or more bytes than its destination holds
            # is no read of it.
            for i, r in enumerate(res):
                if r is not None and r >= 0 and r != want[i]:
                    res[i] = FAILED
            bad = [i for i, r in enumerate(res) if r is not None and r < 0 and r != _OBJECT_NOT_FOUND]
            if bad:  # tell a size mismatch from other errors
                sizes = self._call(lambda: [self._store.get_size(keys[i]) for i in bad])
                for i, size in zip(bad, sizes):
                    res[i] = (
                        TRUNCATED
                        if size >= 0 and size != want[i]
                        else (MISSING if size == _OBJECT_NOT_FOUND else FAILED)
                    )
            out = [
                MISSING if r == _OBJECT_NOT_FOUND else (r if r >= 0 or r in (TRUNCATED, FAILED, MISSING) else FAILED)
                for r in (x if x is not None else FAILED for x in res)
            ]
        except TimeoutError:
            out = [TIMED_OUT] * len(keys)
        except Exception as e:  # the client raised: every key failed
            self._client_failed("get_many_into", e)
            out = [FAILED] * len(keys)
        with self._lock:
            self._count_gets(out)
        return out

    def _get_staged(self, key: str, dest: Segments) -> int:
        from .host import copy_stream

        n = sum(memoryview(s).nbytes for s in dest)
        if n > self._staging.nbytes:
            return FAILED
        with self._staging_lock:
            got: int = self._call(
                lambda: self._store.batch_get_into_multi_buffers([key], [[self._staging.ctypes.data]], [[n]])
            )[0]
            if got == n:
                copy_stream([self._staging[:n]], dest)
        return got

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether the store holds it (False after a
        timeout). Raises TypeError for malformed keys, TierError when closed."""
        check_batch(keys)
        try:
            return [r == 1 for r in self._call(lambda: self._store.batch_is_exist(list(keys)))]
        except TimeoutError:
            return [False] * len(keys)

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether it was removed (False after a timeout).
        Raises TypeError for malformed keys, TierError when closed."""
        check_batch(keys)
        try:
            codes = self._call(lambda: self._store.batch_remove(list(keys), True))
        except TimeoutError:
            return [False] * len(keys)
        out = [c == 0 for c in codes]
        with self._lock:
            self._count("removes", sum(out))
        return out

    def stats(self) -> dict[str, int]:
        """Returns the tier's counters plus registered_bytes. Raises nothing."""
        d = super().stats()
        d["registered_bytes"] = sum(hi - lo for lo, hi, _ in self._regions)
        return d

    def close(self) -> None:
        """Closes the client once no call is running; returns None. Raises nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        if self.idle():
            try:
                self._io.submit(self._store.close).result(self.timeout_s)
            except Exception as e:  # closing is best effort; the process keeps serving
                self._client_failed("close", e)
        self._io.shutdown(wait=False)
