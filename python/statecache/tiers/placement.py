"""Where values rank within a tier below GPU memory: one implementation for
the engine's tiers (``engine.tiering``), the simulator's (``sim.tiers``) and
the vLLM connector.

A resume needs a prefix's whole KV chain and a state image at its end; a KV
block alone resumes nothing, and a state whose chain broke is dead weight.
So within a tier (one ``HostArena``):

* KV blocks and state images compete for **one byte budget** (caps per class
  are optional) in one ranking: recency plus the prefill FLOPs a hit saves
  per byte of the whole prefix it needs (state + KV,
  ``HostArena.set_kv_bytes_per_position``), with the GPU caches' cost model.
* A KV block ranks with the **deepest state image it leads to**
  (``PrefixChains.lead``), not with its own position: a chain's root is worth
  what its deepest resumable prefix is worth, so chains are spent from the
  tail, never cut at the root. A block that leads to no state ranks as the
  cheapest.
* A state stored, or a prefix resumed (from any tier, the GPU included),
  refreshes the chain it needs, tail first, so the chain's head is the
  newest (``TierPlacement.state_stored`` / ``used``).
* Loads go in chain order and stop at the deepest boundary a state can
  resume from (``blocks_to_load``): KV past it would be recomputed anyway.

Positions are in hash blocks (the PAGE store's position unit).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

_MAX_KNOWN = 1 << 21  # hashes remembered; past this the oldest half is forgotten

# one record per known hash: [position, parent hash or None, lead, payload]
_POS, _PARENT, _LEAD, _PAYLOAD = range(4)


class PrefixChains:
    """What is known of the prefixes the tiers hold pieces of: each block's
    position (in hash blocks, where its prefix ends), its parent block, an
    optional payload (the engine keeps the 128-bit prefix key there), and
    the deepest state image it leads to. Bounded: past ``max_known`` hashes
    the oldest half is forgotten (a forgotten block ranks as unknown)."""

    def __init__(self, max_known: int = _MAX_KNOWN) -> None:
        if not isinstance(max_known, int) or isinstance(max_known, bool) or max_known < 2:
            raise ValueError(f"max_known={max_known!r} must be an int >= 2")
        self.max_known = max_known
        self._known: dict[int, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, h: object) -> bool:
        return h in self._known

    def note(
        self,
        hashes: Sequence[int],
        first_block: int,
        parent: int | None = None,
        payloads: Sequence[Any] | None = None,
    ) -> None:
        """Learns blocks ``first_block, first_block + 1, ...`` of one prefix,
        filed under ``hashes``; ``parent`` is the hash of block
        ``first_block - 1`` (None at the start or when unknown); ``payloads``
        one value per hash, kept with it."""
        known = self._known
        prev = parent
        for i, h in enumerate(hashes):
            rec = known.get(h)
            payload = payloads[i] if payloads is not None else None
            if rec is None:
                known[h] = [first_block + i + 1, prev, 0, payload]
            else:  # seen before (another sequence with this prefix): keep its lead
                rec[_POS], rec[_PARENT] = first_block + i + 1, prev
                if payload is not None:
                    rec[_PAYLOAD] = payload
            prev = h
        if len(known) > self.max_known:
            for h in list(itertools.islice(known, len(known) // 2)):
                del known[h]

    def position(self, h: int) -> int:
        """Where ``h``'s prefix ends, in hash blocks; 0 if unknown."""
        rec = self._known.get(h)
        return rec[_POS] if rec is not None else 0

    def payload(self, h: int) -> Any:
        """What ``note`` kept with ``h``, or None."""
        rec = self._known.get(h)
        return rec[_PAYLOAD] if rec is not None else None

    def lead(self, h: int) -> int:
        """The position of the deepest state image the block ``h`` leads to
        (``h``'s own position when a state sits there); 0 when none is known."""
        rec = self._known.get(h)
        return rec[_LEAD] if rec is not None else 0

    def leads(self, hashes: Sequence[int]) -> list[int]:
        """``lead`` of each of ``hashes``."""
        known = self._known
        return [rec[_LEAD] if (rec := known.get(h)) is not None else 0 for h in hashes]

    def chain(self, h: int) -> list[int]:
        """``h`` and its known ancestors, tail first (stops at the first one
        not known)."""
        out, known = [], self._known
        rec = known.get(h)
        while rec is not None:
            out.append(h)
            parent = rec[_PARENT]
            up = known.get(parent) if parent is not None else None
            if up is None or up[_POS] >= rec[_POS]:  # positions fall toward the root
                break
            h, rec = parent, up
        return out

    def note_state(self, h: int) -> list[int]:
        """A state image exists at ``h``: every block of its chain now leads
        at least that far. Returns the chain, tail first."""
        pos = self.position(h)
        chain = self.chain(h)
        for a in chain:
            rec = self._known[a]
            if rec[_LEAD] < pos:
                rec[_LEAD] = pos
        return chain

    def walk(self, h: int, state: bool = False) -> tuple[list[Any], list[int]]:
        """The payloads and leads of ``h``'s chain, tail first, in one pass
        (``chain``, then ``payload`` and ``lead`` of each); ``state``: as
        ``note_state`` first."""
        payloads: list[Any] = []
        leads: list[int] = []
        known = self._known
        rec = known.get(h)
        if rec is None:
            return payloads, leads
        pos = rec[_POS] if state else 0
        while True:
            if rec[_LEAD] < pos:
                rec[_LEAD] = pos
            payloads.append(rec[_PAYLOAD])
            leads.append(rec[_LEAD])
            parent = rec[_PARENT]
            up = known.get(parent) if parent is not None else None
            if up is None or up[_POS] >= rec[_POS]:  # positions fall toward the root
                return payloads, leads
            rec = up


class TierPlacement:
    """How one tier's ``HostArena`` ranks the values of ``chains``' prefixes.

    ``key_of(kind, h)``: the arena key of ``h``'s ``"kv"`` block or
    ``"state"`` image, or None when ``h`` cannot be named. The caller
    allocates with ``position(kind, h)`` and reports stores and uses; this
    object refiles what those change.
    """

    def __init__(
        self, arena: Any, chains: PrefixChains, key_of: Callable[[str, int], Any], kv_payload: bool = False
    ) -> None:
        self.arena = arena
        self.chains = chains
        self.key_of = key_of
        # the chains' payload of a block is its "kv" key (None: unnamed): a
        # chain's keys are read in its one walk, not by a key_of call per block
        self.kv_payload = kv_payload
        self._model: dict[str, Any] | None = None

    def use_model(self, model: dict[str, Any], kv_bytes_per_position: float, gpu_bytes: int) -> None:
        """Ranks with the GPU caches' cost model ``model`` (an
        ``eviction_policy`` dict), per byte of the whole prefix: a prefix
        holds ``kv_bytes_per_position`` KV bytes per position besides its
        state (the model's ``checkpoint_bytes``). Cheap when unchanged.

        The model's ``weight`` trades value against the recency span of the
        GPU cache (``gpu_bytes``); a tier N times larger spans about N times
        the time (what enters it is what the GPU evicts), so it takes
        ``weight / N`` to buy a valuable prefix the same extra lifetime."""
        model = dict(model)
        tier_bytes = self.arena.num_entries * self.arena.entry_bytes
        if tier_bytes > gpu_bytes > 0:
            model["weight"] = model["weight"] * gpu_bytes / tier_bytes
        if model != self._model:
            self.arena.set_eviction_policy(**model)
            self._model = dict(model)
        if self.arena.kv_bytes_per_position != kv_bytes_per_position:
            self.arena.set_kv_bytes_per_position(kv_bytes_per_position)

    def position(self, kind: str, h: int) -> int:
        """The position to file ``h``'s value with: a state where its prefix
        ends, a KV block where the deepest state it leads to ends."""
        return self.chains.position(h) if kind == "state" else self.chains.lead(h)

    def state_stored(self, h: int) -> None:
        """A state image at ``h`` entered this tier: its chain's KV blocks
        here now lead to it (refiled, tail first)."""
        if self.kv_payload:
            self._refile_walk(*self.chains.walk(h, state=True))
        else:
            self._refile_chain(self.chains.note_state(h))

    def used(self, h: int) -> None:
        """A prefix ending at ``h`` was resumed (from any tier, the GPU
        included): its state and its chain here are refreshed, tail first."""
        key = self.key_of("state", h)
        if key is not None:
            self.arena.refile(key, self.chains.position(h))
        if self.kv_payload:
            self._refile_walk(*self.chains.walk(h))
        else:
            self._refile_chain(self.chains.chain(h))

    def _refile_walk(self, keys: list[Any], leads: list[int]) -> None:
        if None in keys:
            leads = [p for k, p in zip(keys, leads) if k is not None]
            keys = [k for k in keys if k is not None]
        if keys:
            self.arena.refile_many(keys, leads)

    def _refile_chain(self, chain: list[int]) -> None:
        # one arena call for the whole chain: a long prefix refiles dozens of blocks
        keys = [self.key_of("kv", a) for a in chain]
        leads = self.chains.leads(chain)
        if None in keys:
            leads = [p for k, p in zip(keys, leads) if k is not None]
            keys = [k for k in keys if k is not None]
        if keys:
            self.arena.refile_many(keys, leads)


def blocks_to_load(gpu_hit: int, present: Sequence[bool], resumable: Callable[[int], int]) -> int:
    """How many blocks past a GPU KV hit of ``gpu_hit`` blocks to load from
    the tiers: the leading run of ``present`` (block ``gpu_hit + i`` is held
    by the GPU or a tier), cut at the deepest boundary ``resumable(n)`` finds
    a state for within the first ``n`` blocks. KV past that boundary would be
    recomputed by the forward, so it is never loaded."""
    n = 0
    while n < len(present) and present[n]:
        n += 1
    if n == 0:
        return 0
    return max(0, resumable(gpu_hit + n) - gpu_hit)
