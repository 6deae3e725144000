"""The interface every tier below GPU memory implements (docs/contract.md, "Tiers").

Batch first: one call moves many values. A value is a list of *segments*
(buffer-protocol objects: NumPy arrays, memoryviews, bytes for puts), stored
as their concatenation; ``get_many_into`` fills caller-provided segments of
exactly the stored size, so a backend that can read into registered memory
copies nothing twice. Keys are ``str`` (see :mod:`statecache.tiers.keys`).

Backends move opaque bytes; integrity (checksum + full key with every value)
is checked by the caller, in one place (:mod:`statecache.tiers.integrity`).
Every call is bounded by the tier's ``timeout_s`` and reports failure per key
instead of raising; a call that raises ``TierError`` failed as a whole.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from ..logs import RateLimitedLog

if TYPE_CHECKING:
    from typing_extensions import Self

#: a buffer-protocol object (NumPy array, memoryview, bytes for puts)
Segment: TypeAlias = Any
#: one value: its segments, stored as their concatenation
Segments: TypeAlias = Sequence[Segment]

_warn = RateLimitedLog(interval_s=30.0)

# get_many_into per-key results (>= 0: bytes read)
MISSING = -1  # no such key
TRUNCATED = -2  # stored size differs from the destination's size
FAILED = -3  # the backend reported an error
TIMED_OUT = -4  # the call did not finish within timeout_s


class TierError(RuntimeError):
    """A tier call that failed as a whole (server gone, bad configuration)."""


def segment_nbytes(segments: Segments) -> int:
    """Returns the total size of ``segments`` in bytes. Raises TypeError for a non-buffer."""
    return sum(memoryview(s).nbytes for s in segments)


def check_batch(keys: Sequence[str], values: Sequence[Segments] | None = None, name: str = "values") -> None:
    """Validates a batch's shape before anything moves; returns None. Raises
    TypeError for keys that are not a list of non-empty str, ValueError for
    values that are not one non-empty segment list per key."""
    if not isinstance(keys, (list, tuple)):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    for i, k in enumerate(keys):
        if not isinstance(k, str) or not k:
            raise TypeError(f"keys[{i}]={k!r} must be a non-empty str")
    if values is not None:
        if not isinstance(values, (list, tuple)) or len(values) != len(keys):
            raise ValueError(f"{name} must be a list of {len(keys)} segment lists, one per key")
        for i, v in enumerate(values):
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{name}[{i}] must be a non-empty list of buffers")


class Tier(ABC):
    """One tier below GPU memory. Thread-safe: calls are serialized per tier."""

    name = "tier"

    def __init__(self, timeout_s: float = 5.0) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
        self.timeout_s = float(timeout_s)
        self._lock = threading.RLock()
        self._stats = {
            "puts": 0,
            "puts_failed": 0,
            "gets": 0,
            "gets_missing": 0,
            "gets_truncated": 0,
            "gets_failed": 0,
            "timeouts": 0,
            "bytes_put": 0,
            "bytes_got": 0,
            "removes": 0,
            "errors": 0,
        }
        self.closed = False
        self._last_error = ""

    def _count(self, key: str, n: int = 1) -> None:
        self._stats[key] = self._stats.get(key, 0) + n

    def _client_failed(self, what: str, exc: BaseException) -> None:
        """A backend client raised inside a call that reports per key: counted
        (``errors``), kept (``last_error``) and logged at WARNING, rate-limited."""
        with self._lock:
            self._count("errors")
            self._last_error = repr(exc)
        _warn(f"{self.name}:{what}", logging.WARNING, "tiers: %s %s failed: %r", self.name, what, exc)

    def _count_gets(self, results: Sequence[int]) -> None:
        for r in results:
            if r >= 0:
                self._count("gets")
                self._count("bytes_got", r)
            else:
                self._count(
                    {MISSING: "gets_missing", TRUNCATED: "gets_truncated", TIMED_OUT: "timeouts"}.get(r, "gets_failed")
                )

    def _check_open(self) -> None:
        if self.closed:
            raise TierError(f"{self.name} tier is closed")

    @abstractmethod
    def put_many(self, keys: Sequence[str], values: Sequence[Segments]) -> list[bool]:
        """Stores each value under its key (replacing nothing: a key already
        held keeps its value and reports True). Returns, per key, whether it is
        stored. Raises TypeError/ValueError for a malformed batch (nothing
        stored), TierError when the call failed as a whole."""

    @abstractmethod
    def get_many_into(self, keys: Sequence[str], dests: Sequence[Segments]) -> list[int]:
        """Reads each value into its destination segments. Returns, per key,
        the bytes read or ``MISSING`` / ``TRUNCATED`` / ``FAILED`` /
        ``TIMED_OUT``. Raises TypeError/ValueError for a malformed batch,
        TierError when the call failed as a whole."""

    @abstractmethod
    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether it is held now (a later get may still
        miss). Raises TypeError for malformed keys, TierError when the call
        failed as a whole."""

    @abstractmethod
    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Returns, per key, whether it was removed (False when absent or the
        backend refused). Raises TypeError for malformed keys, TierError when
        the call failed as a whole."""

    def stats(self) -> dict[str, int]:
        """Returns a new dict of the tier's counters (puts, gets by outcome,
        timeouts, bytes moved, removes, errors: calls in which the backend's
        client raised). Raises nothing."""
        with self._lock:
            return dict(self._stats)

    def failed_calls(self) -> int:
        """Returns how many calls failed as a whole so far (``errors`` +
        ``timeouts``): a caller that reads per-key misses tells a failed call
        from a true miss by this number rising. Raises nothing."""
        with self._lock:
            return self._stats["errors"] + self._stats["timeouts"]

    @property
    def last_error(self) -> str:
        """The ``repr`` of the last exception a backend client raised ("" if none)."""
        return self._last_error

    def close(self) -> None:
        """Closes the tier; later calls raise TierError. Returns None; raises
        nothing."""
        self.closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
