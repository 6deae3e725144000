"""RedisTier: the same interface on a Redis server, for small deployments.

Values are written with ``SET NX`` (a key keeps its first value) and read in
one pipeline per batch; the client's socket timeout bounds every call.
Redis has no zero-copy path: a put joins the segments, a get copies into the
caller's buffers once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import FAILED, MISSING, TIMED_OUT, TRUNCATED, Segments, Tier, check_batch


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as e:
        raise ImportError("RedisTier needs the redis client: pip install 'statecache[redis]'") from e
    return redis


class RedisTier(Tier):
    """A client of one Redis server (``host``, ``port``, ``db``)."""

    name = "redis"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        db: int = 0,
        *,
        timeout_s: float = 5.0,
        password: str | None = None,
    ) -> None:
        super().__init__(timeout_s)
        redis = _import_redis()
        self._errors = redis.exceptions
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No client-side retries: one call is bounded by timeout_s, and the
        # engine recomputes what a failed call would have brought.
        self._r = redis.Redis(
            host=host,
            port=port,
            db=db,
            password=password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )

    def _run(self, build: Callable[[Any], object]) -> list[Any]:
        with self._lock:
            self._check_open()
            pipe = self._r.pipeline(transaction=False)
            build(pipe)
            res: list[Any] = pipe.execute(raise_on_error=False)
            return res

    def put_many(self, keys: Sequence[str], values: Sequence[Segments]) -> list[bool]:
        """As ``Tier.put_many`` (``SET NX``): returns, per key, whether it is
        stored. Raises TypeError/ValueError for a malformed batch, TierError
        when closed."""
        check_batch(keys, values)
        blobs = [
            b"".join(bytes(memoryview(s).cast("B")) if not isinstance(s, bytes) else s for s in segs) for segs in values
        ]
        try:
            res = self._run(lambda p: [p.set(k, b, nx=True) for k, b in zip(keys, blobs)])
        except self._errors.TimeoutError as e:
            self._count("timeouts")
            res = [e] * len(keys)
        except self._errors.RedisError as e:
            self._client_failed("put_many", e)
            res = [e] * len(keys)
        # SET NX answers None for a key already held: its value stays, so the
        # key is stored (reads check it like any other).
        out = []
        for k, b, r in zip(keys, blobs, res):
            ok = r is True or (r is None and self._exists(k))
            out.append(bool(ok))
            self._count("puts" if ok else "puts_failed")
            if ok:
                self._count("bytes_put", len(b))
        return out

    def _exists(self, key: str) -> bool:
        try:
            return bool(self._r.exists(key))
        except self._errors.RedisError as e:
            self._client_failed("exists", e)
            return False

    def get_many_into(self, keys: Sequence[str], dests: Sequence[Segments]) -> list[int]:
        """As ``Tier.get_many_into``: returns, per key, the bytes read or a
        negative outcome. Raises TypeError/ValueError for a malformed batch,
        TierError when closed."""
        check_batch(keys, dests, "dests")
        from .host import copy_stream

        try:
            res = self._run(lambda p: [p.get(k) for k in keys])
        except self._errors.TimeoutError:
            timed_out = [TIMED_OUT] * len(keys)
            self._count_gets(timed_out)
            return timed_out
        except self._errors.RedisError as e:
            self._client_failed("get_many_into", e)
            res = [FAILED] * len(keys)
        out: list[int] = []
        for v, d in zip(res, dests):
            if v is None:
                out.append(MISSING)
            elif not isinstance(v, bytes):
                out.append(FAILED)
            elif len(v) != sum(memoryview(s).nbytes for s in d):
                out.append(TRUNCATED)
            else:
                out.append(copy_stream([v], d))
        self._count_gets(out)
        return out

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether the server holds it (False when the call
        failed). Raises TypeError for malformed keys, TierError when closed."""
        check_batch(keys)
        try:
            return [r == 1 for r in self._run(lambda p: [p.exists(k) for k in keys])]
        except self._errors.RedisError as e:
            self._client_failed("contains_many", e)
            return [False] * len(keys)

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether it was deleted (False when the call
        failed). Raises TypeError for malformed keys, TierError when closed."""
        check_batch(keys)
        try:
            out = [r == 1 for r in self._run(lambda p: [p.delete(k) for k in keys])]
        except self._errors.RedisError as e:
            self._client_failed("remove_many", e)
            return [False] * len(keys)
        self._count("removes", sum(out))
        return out

    def close(self) -> None:
        """Closes the connection; returns None. Raises what the client raised."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._r.close()
