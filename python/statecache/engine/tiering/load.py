"""The load side: values read back from the tiers, checked, and adopted.

``read`` finds the cheapest tier holding a trusted copy (host first, then the
shared tiers in order): a value is adopted only when its header's full key
and XXH3-128 checksum match, otherwise it is removed where it was found and
the prefix is recomputed. ``load_state`` brings an image into the PAGE store
by the transfer protocol (``reserve_transfer_units`` -> copy the image in ->
``adopt_transfer_units`` -> READY); the engine then restores it as usual.
"""

from __future__ import annotations

import itertools

from statecache.tiers import integrity
from statecache.tiers.base import FAILED, MISSING, TIMED_OUT, TRUNCATED
from statecache.tiers.host import STATE

from .stack import TIER_ERRORS, TierStack


class Loads:
    """Reads from the tiers; state images into the PAGE store."""

    def __init__(self, stack: TierStack, *, coordinator, index, mover, keys, before_unit_write, all_ranks=None):
        self.stack = stack
        # With tensor parallelism: ``all_ranks(kind, prefix_keys)`` says per prefix key
        # whether every rank's shard is held (statecache.tiers.ranks).
        self.all_ranks = all_ranks
        self.coord = coordinator
        self.index = index
        self.mover = mover
        self.keys = keys
        # Called before a load writes units: KV blocks queued to go down may
        # sit in units a reservation just evicted.
        self.before_unit_write = before_unit_write
        self.quarantine: list[tuple[object, str]] = []  # (tier, host key) of timed-out reads
        self._owner_ids = itertools.count()
        self._loaded_from: dict[int, str] = {}

    def read(self, key: str, nbytes: int, klass: int):
        """The payload rows of ``key`` from the cheapest tier that holds a
        trusted copy, pinned in the host arena (``unpin`` when done), or None.
        Untrusted copies are removed where they were found."""
        stack, host = self.stack, self.stack.host
        got = host.read(key)
        if got is not None:
            rows, n, meta = got
            if n == nbytes and integrity.check(meta, key, rows, nbytes) == integrity.OK:
                return rows, "host"
            host.unpin(key)
            host.abort(key)
            stack.count("loads_untrusted")
        for t in stack.shared:
            rows = host.reserve(key, nbytes, 0, klass if not stack.staging_only else STATE)
            if rows is None:
                return None
            hlen = integrity.header_nbytes(key)
            hb = stack.headers[3, :hlen]
            try:
                r = t.get_many_into([key], [[hb, *rows]])[0]
            except TIER_ERRORS as e:
                stack.failed(None, "get", t, e)
                r = FAILED
            if r == TIMED_OUT:
                self.quarantine.append((t, key))  # the read may still land there
                stack.count("loads_failed")
                continue
            if r < 0:
                host.abort(key)
                stack.count("loads_missing" if r == MISSING else "loads_failed")
                if r == TRUNCATED:  # the stored value has another size: never adoptable
                    stack.count("loads_untrusted")
                    self._remove(t, key)
                continue
            verdict = integrity.check(hb, key, rows, nbytes)
            if verdict != integrity.OK:
                host.abort(key)
                stack.count("loads_untrusted")
                self._remove(t, key)
                continue
            # Keep the verified copy on the host (unless it only stages).
            host.seal(key, bytes(hb))
            if stack.staging_only:
                host.arena.pin(key)
                host.abort(key)  # freed at unpin
                return rows, t.name
            host.arena.pin(key)
            return rows, t.name
        return None

    def _remove(self, tier, key: str) -> None:
        try:
            tier.remove_many([key])
        except TIER_ERRORS as e:
            self.stack.failed(None, "remove", tier, e)

    def release_quarantine(self) -> None:
        """Frees the host rows of timed-out reads once their tier is idle."""
        keep = []
        for tier, key in self.quarantine:
            if getattr(tier, "idle", lambda: True)():
                self.stack.host.abort(key)
            else:
                keep.append((tier, key))
        self.quarantine = keep

    def discover(self, seq, upto: int) -> None:
        """Asks the shared tiers which of ``seq``'s first ``upto`` boundaries
        they hold that this engine does not know of (one batch call)."""
        stack = self.stack
        if not stack.shared or upto <= getattr(seq, "_tier_probed", 0):
            return
        lo = getattr(seq, "_tier_probed", 0)
        seq._tier_probed = upto
        triples = [
            (h, self.keys.key("state", k), k)
            for h, k in zip(seq.hashes[lo:upto], seq.prefix_keys[lo:upto])
            if not self.index.could_serve(h) and not self.coord.contains(h)
        ]
        if not triples:
            return
        pairs = [(h, key) for h, key, _ in triples]
        stack.count("probes")
        if self.all_ranks is not None:  # resumable only with every rank's shard
            for (h, _), f in zip(pairs, self.all_ranks("state", [k for _, _, k in triples])):
                if f:
                    self.index.note_stored(h)
            return
        for t in stack.shared:
            try:
                found = t.contains_many([k for _, k in pairs])
            except TIER_ERRORS as e:
                stack.failed(None, "contains", t, e, len(pairs))
                continue
            for (h, _), f in zip(pairs, found):
                if f:
                    self.index.note_stored(h)

    def load_state(self, h: int, prefix_key: bytes) -> bool:
        """Brings the image of prefix ``prefix_key`` from a tier into the PAGE
        store under ``h`` (READY); False when no tier has a trusted copy or no
        units are free. The caller holds ``h``'s KV block, filed under that key."""
        stack = self.stack
        if self.coord.contains(h):
            return True
        key = self.keys.key("state", prefix_key)
        if key is None:
            return False
        if self.all_ranks is not None and not self.all_ranks("state", [prefix_key])[0]:
            self.index.forget(h)  # some rank lacks its shard: every rank recomputes
            stack.count("loads_missing_rank")
            return False
        if not self.index.request_load(h):
            return False
        nbytes = self.coord.store.units_per_checkpoint * stack.unit_bytes
        untrusted = stack.counters["loads_untrusted"]
        got = self.read(key, nbytes, STATE)
        if got is None:
            # Every copy was missing or failed its check (and was removed).
            self.index.fail_load(h, missing=True, untrusted=stack.counters["loads_untrusted"] > untrusted)
            return False
        rows, where = got
        owner = ("statecache-tier-load", next(self._owner_ids))
        try:
            units = self.coord.reserve_transfer_units(owner)
            if units is None:
                self.index.abandon_load(h)
                return False
            try:
                self.before_unit_write()
                self.mover.from_rows(rows, units)
            except BaseException:
                self.coord.release_transfer_units(owner)
                raise
        finally:
            stack.host.unpin(key)
        if not self.coord.adopt_transfer_units(owner, h):
            self.index.abandon_load(h)
            return self.coord.contains(h)
        self.index.complete_load(h)
        stack.count("state_loaded_host" if where == "host" else "state_loaded_shared")
        self._loaded_from[h] = where
        return True

    def source_of(self, h: int) -> str:
        """Where the image a resume starts from came from: "gpu", "host" or
        the shared tier's name (forgotten once asked)."""
        return self._loaded_from.pop(h, "gpu")
