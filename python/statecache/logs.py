"""statecache's logging: one logger, ``logging.getLogger("statecache")``.

The library logs its configuration once when an engine, executor or metrics
exporter is created (INFO) and every degradation (WARNING): offload
nominations dropped because the store's backlog overflowed, offload pins
reclaimed as stale, a maintenance batch the executor refused. Repeats of one
kind of message are rate-limited (``RateLimitedLog``): the first goes out,
the rest within ``interval_s`` are counted and reported with the next one.
``DegradationMonitor`` turns the C++ objects' counters into such messages;
the reference engine polls one every pass, another engine can do the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("statecache")


class RateLimitedLog:
    """At most one record per key every ``interval_s`` seconds; the ones held
    back are counted and named in the next record that goes out."""

    def __init__(
        self,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = logger,
    ) -> None:
        if not interval_s >= 0:
            raise ValueError(f"interval_s={interval_s!r} must be >= 0")
        self.interval_s = interval_s
        self.clock = clock
        self.log = log
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, level: int, msg: str, *args: object) -> bool:
        """Logs ``msg % args`` under ``key`` unless one went out less than
        ``interval_s`` ago. Returns whether it was logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        if held:
            msg += " (%d similar messages held back in the last %.0f s)"
            args = (*args, held, self.interval_s)
        self.log.log(level, msg, *args)
        return True


_default = RateLimitedLog()


def warn_degraded(key: str, msg: str, *args: object) -> bool:
    """A rate-limited WARNING on the ``statecache`` logger. Returns whether it
    went out."""
    return _default(key, logging.WARNING, msg, *args)


def log_config(what: str, fields: Mapping[str, Any]) -> None:
    """One INFO record with an object's configuration, at its creation."""
    logger.info("%s: %s", what, ", ".join(f"{k}={v!r}" for k, v in fields.items()))


# counter attribute -> what a rise of it means
_DEGRADATIONS = {
    "offload_nominations_dropped": (
        "offload backlog overflow: %d checkpoint nominations for the lower tier dropped "
        "(%d in total); the tier writes too slowly or take_offload_stores is called too rarely"
    ),
    "offload_pins_reclaimed": (
        "%d stale offload pins reclaimed (%d in total): an offload worker did not release its source in time"
    ),
}


class DegradationMonitor:
    """Watches the degradation counters of PAGE stores (or coordinators, read
    through their ``store``) and logs a rate-limited WARNING when one rises.

    ``poll()`` is cheap (two attribute reads per object); call it once a pass.
    """

    def __init__(self, *objects: Any, log: RateLimitedLog | None = None) -> None:
        self._log = log or _default
        self._seen: list[tuple[str, Any, dict[str, int]]] = []
        for obj in objects:
            self.watch(obj)

    def watch(self, obj: Any, name: str | None = None) -> None:
        """Adds a store or coordinator (anything with the counters)."""
        target = getattr(obj, "store", obj)
        counters = {k: int(getattr(target, k)) for k in _DEGRADATIONS if hasattr(target, k)}
        if not counters:
            raise TypeError(f"obj={type(obj).__name__}: has none of {sorted(_DEGRADATIONS)}")
        self._seen.append((name or type(obj).__name__, target, counters))

    def poll(self) -> int:
        """Logs every counter that rose since the last poll; returns how many rose."""
        rose = 0
        for name, target, last in self._seen:
            for key, before in last.items():
                now = int(getattr(target, key))
                if now > before:
                    rose += 1
                    self._log(
                        f"{name}.{key}",
                        logging.WARNING,
                        f"{name}: " + _DEGRADATIONS[key],
                        now - before,
                        now,
                    )
                last[key] = now
        return rose
