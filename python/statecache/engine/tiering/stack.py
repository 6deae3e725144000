"""The tiers under one engine and what the store, KV and load sides share:
the host tier (or a small staging arena when there are only shared tiers),
the shared tiers in lookup order, the registered header buffer, the
counters, and how a tier's failure is reported (counted, and logged at a
rate-limited WARNING: never dropped silently)."""

from __future__ import annotations

import numpy as np

from statecache.logs import warn_degraded
from statecache.tiers.base import TierError
from statecache.tiers.host import HostTier

#: what a tier call may raise for a failure of the tier (the interface's
#: TierError; a client's socket or timeout error): counted, logged, survived.
#: Anything else is a bug and propagates.
TIER_ERRORS = (TierError, OSError)

_HEADER_SLOT = 256  # bytes reserved per value header in the registered header buffer

COUNTERS = (
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
    "tier_errors",
    "loads_missing_rank",
)


class TierStack:
    """``tiers``: at most one ``HostTier`` (first) and any shared tiers."""

    def __init__(self, tiers, *, unit_bytes: int, units_per_checkpoint: int, max_inflight: int, shared_writes):
        tiers = list(tiers)
        if not tiers:
            raise ValueError("tiers must name at least one tier")
        hosts = [t for t in tiers if isinstance(t, HostTier)]
        if len(hosts) > 1 or (hosts and tiers[0] is not hosts[0]):
            raise ValueError("tiers: at most one HostTier, and it comes first")
        if shared_writes not in (None, "demote", "through"):
            raise ValueError(f"shared_writes={shared_writes!r} must be 'demote' or 'through'")
        self.unit_bytes = unit_bytes
        self.shared = [t for t in tiers if not isinstance(t, HostTier)]
        if hosts:
            self.host, self.staging_only = hosts[0], False
        else:
            # Shared tiers only: a small host arena stages values for the I/O.
            self.host = HostTier((max_inflight + 4) * units_per_checkpoint * unit_bytes, unit_bytes)
            self.staging_only = True
        if self.host.entry_bytes != unit_bytes:
            raise ValueError(f"HostTier entry_bytes={self.host.entry_bytes} must equal the page unit size {unit_bytes}")
        self.shared_writes = shared_writes or ("through" if self.staging_only else "demote")
        self.headers = np.zeros((4 * max_inflight + 64, _HEADER_SLOT), dtype=np.uint8)
        self.counters = dict.fromkeys(COUNTERS, 0)

    def register_buffers(self) -> None:
        """Registers the host rows and the header buffer with every shared
        tier that reads and writes registered memory directly."""
        for t in self.shared:
            if hasattr(t, "register"):
                t.register(self.host.rows)
                t.register(self.headers)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def failed(self, counter: str | None, what: str, tier, exc: BaseException, n: int = 1) -> None:
        """A tier call raised: counted under ``tier_errors`` (and ``counter``,
        ``n`` values, unless the caller counts the outcome itself) and logged,
        rate-limited per tier and call."""
        if counter is not None:
            self.count(counter, n)
        self.count("tier_errors")
        name = getattr(tier, "name", type(tier).__name__)
        warn_degraded(f"tiers.{name}.{what}", "tier %s: %s failed (%d values): %r", name, what, n, exc)

    def header_buffer(self, slot: int, header: bytes):
        """``header`` copied into registered slot ``slot`` (a NumPy view)."""
        buf = self.headers[slot, : len(header)]
        buf[:] = np.frombuffer(header, dtype=np.uint8)
        return buf

    def put_one(self, key: str, segments) -> bool:
        """One value to every shared tier; True when at least one stored it
        (the caller counts a False)."""
        ok = False
        for t in self.shared:
            try:
                ok = t.put_many([key], [segments])[0] or ok
            except TIER_ERRORS as e:
                self.failed(None, "put", t, e)
        return ok
