"""The engine's default checkpoint policy: placement and eviction tuned online.

One object serves both seams (``PlacementPolicy`` and ``EvictionPolicy``).

Placement: the prompt-end anchor and the demand rung always (a known resume
point, and a boundary a KV hit was just cut short at), plus a ladder of rungs
every N tokens. With PAGE images (checkpoints in the KV pool) N is chosen
online from ``ladder_candidates`` (0: no ladder). With a fork slot pool (a
separate state budget) N stays ``initial_ladder`` and the rungs are
room-gated instead: placed only while vacant slots cover a pass of pops, so a
guess never displaces knowledge (the shadow's memory price is for PAGE images
only).

Room rungs (PAGE images): while more than ``room_share`` of the KV pool is
vacant (neither in use nor holding a cached block), memory is free, so an
admission also gets rungs every ``room_ladder`` tokens. They are guesses
that must yield: once the vacant share falls below ``room_floor``, the
unread ones are dropped, oldest first, before the KV cache has to give up a
cached block for them (an image otherwise lives as long as its KV block).

How N is chosen (shadow evaluation, continuously): every admission files its
anchor and demand rung into one shadow set (hashes only; every candidate
places those), and a deterministic sample of requests (1 / ``sample_every``,
by their last prompt block's hash salted with ``seed``) is evaluated: each
candidate earns the tokens it would have resumed there, the deepest of the
shadow checkpoints or of its own rungs (every multiple of its interval: a
block that was seen was computed once, and a rung placed then) inside the
KV prefix *its* pool would still hold. That prefix comes from an LRU model on a KV clock (blocks written
so far): a block is held if fewer than C blocks were written since a request
last used it, where C is the pool shrunk by the share of writes that are the
candidate's own images (PAGE images live in the KV pool and die with their KV
block), so a ladder pays for its memory in the hits it loses. Scores decay
with a horizon of ``horizon`` admissions; after ``warmup`` admissions (the
shadows start empty), every ``decide_every`` the setting moves one notch
(candidates ordered coarse to fine) towards the best candidate if that beats
it by ``margin`` (a quarter of it towards a coarser one: hysteresis that
leans against images, whose cost the LRU model undercounts). Cost per admission: a
dict update per prompt block (C speed) and O(1) arithmetic; a sampled one
adds one pass over its blocks and O(candidates x log blocks) (scores and
each candidate's image writes are estimated from the sample alone).
Nothing is random but the salt, so a run repeats exactly.

Eviction: the library's cost model (``set_eviction_policy("cost", ...)`` on
the slot pool or the PAGE store): recency + ``weight`` x prefill FLOPs a hit
saves per byte, ladder rungs (guesses) spent first, demand rungs filed as
knowledge. ``cost`` comes from the model geometry when the caller has it
(the simulator does); without it the value of a checkpoint is its length.

Every decision is counted in ``checkpoint_funnel()``: ``adaptive_decisions``,
``adaptive_switches``, ``adaptive_ladder_tokens`` (the setting in force),
``adaptive_sampled``, ``adaptive_rungs_gated``, ``adaptive_rungs_roomy``
(admissions given room rungs), ``adaptive_room_dropped`` (room rungs that
yielded unread); ``decisions`` keeps the last ones with their scores.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import repeat
from operator import neg

from .placement import (
    ANCHOR,
    DEMAND,
    LADDER,
    Boundary,
    EvictionPolicy,
    PlacementContext,
    PlacementPolicy,
    prompt_end_anchor,
)

LADDER_CANDIDATES = (0, 32768, 16384, 8192, 4096, 2048, 1024, 512)
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class CostModel:
    """What a checkpoint at position p is worth to the library's eviction
    order: ``p x flops_per_token + flops_per_context_token x p(p+1)/2`` FLOPs
    saved, over ``checkpoint_bytes``; ``weight`` against recency."""

    flops_per_token: float = 1.0
    flops_per_context_token: float = 0.0
    checkpoint_bytes: float = 1.0
    weight: float = 1.0

    @classmethod
    def from_geometry(cls, geometry, weight: float = 1.0) -> CostModel:
        """From a ``statecache.sim.geometry.ModelGeometry`` (or anything with
        its ``flops_per_token``, ``attention_flops_per_context_token`` and
        ``state_bytes``)."""
        return cls(
            float(geometry.flops_per_token),
            float(geometry.attention_flops_per_context_token),
            float(max(1, geometry.state_bytes)),
            float(weight),
        )

    def settings(self, hash_block_size: int) -> dict:
        """Keyword arguments of ``set_eviction_policy("cost", ...)``."""
        return dict(
            flops_per_token=self.flops_per_token,
            flops_per_context_token=self.flops_per_context_token,
            checkpoint_bytes=self.checkpoint_bytes,
            tokens_per_position=float(hash_block_size),
            weight=self.weight,
            guesses_first=True,
        )


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit value from any int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Shadow:
    """One candidate ladder: what it would have resumed and written."""

    __slots__ = ("interval", "step", "gain", "units")

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.step = 0  # the interval in hash blocks (0: no ladder), set at bind
        self.gain = 0.0  # decayed tokens it would have resumed
        self.units = 0.0  # decayed image units it writes per admission


class AdaptiveCheckpointPolicy(PlacementPolicy, EvictionPolicy):
    """statecache's default: anchor + demand rung + a ladder chosen online by
    shadow evaluation, with FLOP-aware eviction in the library (module doc)."""

    name = "adaptive"

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        seed: int = 0,
        sample_every: int = 4,
        ladder_candidates=LADDER_CANDIDATES,
        initial_ladder: int = 16384,
        horizon: int = 2048,
        decide_every: int = 32,
        warmup: int = 256,
        margin: float = 0.05,
        max_decisions: int = 256,
        room_ladder: int = 1024,
        room_share: float = 0.4,
        room_floor: float = 0.03,
    ) -> None:
        if cost is not None and not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a CostModel or None, got {type(cost).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        for name, v in (
            ("sample_every", sample_every),
            ("horizon", horizon),
            ("decide_every", decide_every),
            ("warmup", warmup),
            ("max_decisions", max_decisions),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        cands = tuple(ladder_candidates)
        if (
            not cands
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in cands)
            or len(set(cands)) != len(cands)
        ):
            raise ValueError(f"ladder_candidates must be distinct ints >= 0, got {ladder_candidates!r}")
        if initial_ladder not in cands:
            raise ValueError(f"initial_ladder must be one of ladder_candidates {cands}, got {initial_ladder!r}")
        if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 <= margin < 1):
            raise ValueError(f"margin must be a number in [0, 1), got {margin!r}")
        if isinstance(room_ladder, bool) or not isinstance(room_ladder, int) or room_ladder < 0:
            raise ValueError(f"room_ladder must be an int >= 0 (0: no room rungs), got {room_ladder!r}")
        for name, v in (("room_share", room_share), ("room_floor", room_floor)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
        if room_floor > room_share:
            raise ValueError(f"room_floor must be <= room_share, got {room_floor!r} > {room_share!r}")
        self.cost = cost or CostModel()
        self.seed = seed
        self.salt = _mix(seed)
        self.sample_every = sample_every
        self.decay = 1.0 - 1.0 / horizon
        self.decide_every = decide_every
        self.warmup = warmup
        self.margin = float(margin)
        order = sorted(cands, key=lambda n: -(n or math.inf))  # coarse to fine; 0: none
        self.shadows = [_Shadow(n) for n in order]
        self.current = order.index(initial_ladder)
        self.decisions: deque = deque(maxlen=max_decisions)
        self.room_ladder = room_ladder
        self.room_share = float(room_share)
        self.room_floor = float(room_floor)
        # Room rungs not read yet, oldest first (dict order), to yield.
        self.room_rungs: dict[int, None] = {}
        # Anchors and demand rungs every candidate would hold (hashes).
        self.held: dict[int, None] = {}
        # The KV clock: blocks written so far; a block's stamp is the clock
        # when a request last used it (LRU age in KV blocks written since).
        self.clock = 0
        self.stamp: dict[int, int] = {}
        self.kv_written = 0.0  # decayed KV blocks written per admission
        self._far = 1 << 62
        self._stamp_limit = 1 << 16
        self.pool_blocks = 0
        self.units_per_checkpoint = 1
        self.pages = False
        self.room_for_guesses = True
        self._count = None
        self._bound = None
        self._admissions = 0
        self._pending: dict[str, int] = {}
        self._pool = None
        self._batch_blocks = 0
        self._unsampled = 0  # admissions since the last sampled one

    # ------------------------------ setting ------------------------------- #

    @property
    def ladder_tokens(self) -> int:
        """The ladder interval in force (0: none)."""
        return self.shadows[self.current].interval

    def _note(self, key: str, n: int = 1) -> None:
        if self._count is not None:
            self._count(key, n)
        else:  # before the first pass: held until the engine is known
            self._pending[key] = self._pending.get(key, 0) + n

    def _bind(self, engine) -> None:
        bm, caches = engine.block_manager, engine.caches
        self._bound = engine
        self._count = bm.count
        for k, v in self._pending.items():
            bm.count(k, v)
        self._pending.clear()
        self.pages = caches.coordinator is not None
        self.pool_blocks = int(bm.pool.num_blocks)
        self._stamp_limit = max(1 << 16, 4 * self.pool_blocks)
        settings = self.cost.settings(caches.hash_block_size)
        self._pool = bm.pool
        self._batch_blocks = engine.config.max_num_batched_tokens // caches.hash_block_size
        for sh in self.shadows:
            sh.step = sh.interval // caches.hash_block_size if sh.interval > 0 else 0
        if self.pages:
            self.units_per_checkpoint = int(caches.coordinator.store.units_per_checkpoint)
            caches.coordinator.set_eviction_policy("cost", **settings)
        elif caches.forks and caches.slot_pool is not None:
            caches.slot_pool.set_eviction_policy("cost", **settings)
        bm.count("adaptive_ladder_tokens", self.ladder_tokens)

    # ----------------------------- placement ------------------------------ #

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        if ctx.interval_tokens == 0 or math.isinf(ctx.successor_room):
            return []
        hbs = ctx.hash_block_size
        anchor = prompt_end_anchor(ctx.num_prompt_tokens, ctx.successor_room, hbs)
        hashes = ctx.block_hashes
        if hashes and self.pages:
            # What cached prefixes (KV blocks and images) can hold: the pool
            # less what running requests hold now.
            pool = self._pool
            self.pool_blocks = pool.num_free + pool.num_reserved
            # The sample is of requests (their last prompt block), so one
            # system prompt shared by all still leaves a sample.
            last = (
                hashes[min(len(hashes), ctx.num_prompt_tokens // ctx.hash_block_size) - 1]
                if ctx.num_prompt_tokens >= ctx.hash_block_size
                else hashes[0]
            )
            self._shadow_admission(ctx, anchor, _mix(last ^ self.salt) % self.sample_every == 0)
        out = []
        # A positive checkpoint_interval_tokens in the engine config pins the
        # ladder, ungated, as the fixed placement places it.
        pinned = ctx.interval_tokens > 0
        n = ctx.interval_tokens if pinned else self.ladder_tokens
        if n > 0:
            if pinned or self.room_for_guesses:
                step = max(hbs, (n // hbs) * hbs)
                out += [Boundary(p, LADDER, True) for p in range(step, anchor, step)]
            else:
                self._note("adaptive_rungs_gated")
        if not pinned and self.pages and self.room_ladder and self._pool is not None:
            if self.room_rungs:
                # Checked per admission, not per pass: vacancy falls as
                # admissions take blocks, and a pass costs nothing extra.
                self._yield_room(self._bound)
            out += self._room_rungs(ctx, anchor, n)
        if ctx.kv_hit_position > ctx.resume_position:
            out.append(Boundary(ctx.kv_hit_position, DEMAND, True))
        if anchor > 0:
            out.append(Boundary(anchor, ANCHOR, False))
        return out

    def _room_rungs(self, ctx: PlacementContext, anchor: int, ladder: int) -> list[Boundary]:
        """Rungs every ``room_ladder`` tokens while the pool is mostly vacant
        (module doc), except where the ladder in force puts one anyway."""
        hbs = ctx.hash_block_size
        step = max(hbs, (self.room_ladder // hbs) * hbs)
        first = (ctx.resume_position // step + 1) * step
        if first >= anchor:
            return []
        pool = self._pool
        vacant = pool.num_free - pool.num_cached
        want = (anchor - first + step - 1) // step
        if vacant < want * self.units_per_checkpoint + self._batch_blocks + self.room_share * pool.num_blocks:
            return []
        lad = max(hbs, (ladder // hbs) * hbs) if ladder > 0 else 0
        out = [Boundary(p, LADDER, True) for p in range(first, anchor, step) if not lad or p % lad]
        hashes = ctx.block_hashes
        self.room_rungs.update((hashes[b.position // hbs - 1], None) for b in out)
        self._note("adaptive_rungs_roomy")
        return out

    def _shadow_admission(self, ctx: PlacementContext, anchor: int, sampled: bool) -> None:
        hbs = ctx.hash_block_size
        hashes = ctx.block_hashes
        kv = min(ctx.kv_hit_position // hbs, len(hashes))
        anchor_b = anchor // hbs
        prompt_blocks = min(len(hashes), ctx.num_prompt_tokens // hbs)
        d = self.decay
        held, upc = self.held, self.units_per_checkpoint
        written = self.kv_written * d + max(0, prompt_blocks - kv)
        self.kv_written = written
        if sampled:
            limit = min(len(hashes), (ctx.num_tokens - 1) // hbs)  # a hit leaves one token
            # When each block was last used on the KV clock. Stamps fall along
            # a prefix (whoever used a block used the ones before it), so the
            # prefix a pool of C blocks still holds ends where clock - stamp
            # reaches C: a bisection per candidate.
            stamps = list(map(self.stamp.get, hashes[:limit], repeat(-self._far)))
            found: list[int] = []  # shadow checkpoints, deepest first
            scanned = limit + 1
        if sampled:
            # Scores and image writes are kept from the sample alone (each
            # sampled admission stands for ``sample_every``), so the others
            # cost no per-candidate work: the decay they owe is applied here.
            decay = d ** (self._unsampled + 1)
            self._unsampled = 0
            weight = self.sample_every
            for sh in self.shadows:
                # This candidate's images take residency from KV in proportion
                # to what it writes, so its pool reaches back fewer KV blocks.
                capacity = (
                    self.pool_blocks * written / (written + sh.units) if written + sh.units > 0 else self.pool_blocks
                )
                reach = bisect_left(stamps, capacity - self.clock, key=neg)
                while scanned > 1 and (not found or found[-1] > reach):
                    scanned -= 1
                    if hashes[scanned - 1] in held:
                        found.append(scanned)
                res = next((j for j in found if j <= reach), 0)
                step = sh.step
                if step:
                    res = max(res, reach // step * step)
                # Units it writes: anchor, demand rung, rungs between res and anchor.
                placed = (anchor_b > res) + (reach > res and reach != anchor_b)
                if step and anchor_b > 1:
                    placed += max(0, (anchor_b - 1) // step - res // step)
                sh.gain = sh.gain * decay + res * hbs * weight
                sh.units = sh.units * decay + placed * upc * weight
        else:
            self._unsampled += 1
        # Afterwards every candidate holds one where this prefix ended and
        # where its KV hit did: resumed from it, or placed a demand rung there
        # (whatever the setting in force happened to place).
        if anchor_b > 0:
            held[hashes[anchor_b - 1]] = None
        if kv > 0:
            held[hashes[kv - 1]] = None
        # This request used its prompt blocks now, and wrote the ones it missed.
        self.clock += max(0, prompt_blocks - kv)
        self.stamp.update(zip(hashes[:prompt_blocks], repeat(self.clock)))
        if len(self.stamp) > self._stamp_limit:
            self._prune()
        self._admissions += 1
        if sampled:
            self._note("adaptive_sampled")
        # Decisions wait until the pool has turned over once: before that,
        # images cost nothing (room rungs use that) and every score favours
        # the finest ladder.
        if (
            self._admissions >= self.warmup
            and self._admissions % self.decide_every == 0
            and self.clock >= self.pool_blocks
        ):
            self._decide()

    def _prune(self) -> None:
        """Forget blocks no candidate's pool could still reach, and the
        shadow checkpoints filed under them."""
        oldest = self.clock - 2 * self.pool_blocks
        self.stamp = {h: t for h, t in self.stamp.items() if t >= oldest}
        self.held = {h: None for h in self.held if h in self.stamp}

    def scores(self) -> list[float]:
        """Each candidate's shadow score: the (decayed) tokens it would have
        resumed, its own images' memory already charged (module doc)."""
        owed = self.decay**self._unsampled
        return [sh.gain * owed for sh in self.shadows]

    def _decide(self) -> None:
        s = self.scores()
        cur = self.current
        best = max(range(len(s)), key=lambda i: (s[i], -i))
        self._note("adaptive_decisions")
        # A finer ladder must win by ``margin``, a coarser one by a quarter of
        # it: the shadow undercounts what images displace, so the risk is in
        # going finer.
        margin = self.margin if best > cur else self.margin / 4
        switch = best != cur and s[best] > s[cur] + margin * abs(s[cur])
        if switch:
            # One notch at a time towards the best (candidates run coarse to
            # fine): a noisy score moves the setting a step, not across the range.
            step = cur + (1 if best > cur else -1)
            self._note("adaptive_switches")
            self._note("adaptive_ladder_tokens", self.shadows[step].interval - self.ladder_tokens)
            self.current = step
        self.decisions.append((self._admissions, self.ladder_tokens, tuple(round(x) for x in s)))

    # ------------------------------ eviction ------------------------------ #

    def before_admission(self, engine) -> None:
        if self._bound is not engine:
            self._bind(engine)
        caches = engine.caches
        if not self.pages and caches.forks and caches.slot_pool is not None:
            # Rungs only into vacant room, so a guess never displaces knowledge.
            vacant = caches.slot_pool.occupancy()["slots_vacant"]
            self.room_for_guesses = vacant >= 2 * engine.config.max_num_seqs

    def _yield_room(self, engine) -> None:
        """Drops unread room rungs, oldest first, while the vacant share of
        the pool is under ``room_floor`` (they yield before cached KV)."""
        pool = self._pool
        floor = self.room_floor * pool.num_blocks
        if pool.num_free - pool.num_cached >= floor:
            return
        coord, rungs = engine.caches.coordinator, self.room_rungs
        while rungs and pool.num_free - pool.num_cached < floor:
            h = next(iter(rungs))
            del rungs[h]
            if coord.contains(h):
                engine.block_manager.drop_checkpoint(h)
                self._note("adaptive_room_dropped")

    def on_resume(self, caches, seq, prefix_hash: int) -> None:
        # Read: a resume point now, no longer a room rung that must yield.
        self.room_rungs.pop(prefix_hash, None)

    def on_checkpoint(self, caches, seq, boundary: Boundary) -> None:
        # A demand rung is a seen resume point: filed as knowledge, not a guess.
        if boundary.kind == DEMAND and caches.forks and caches.slot_pool is not None:
            h = seq.hashes[boundary.position // caches.hash_block_size - 1]
            slot = caches.slot_pool.lookup(h)
            if slot >= 0:
                caches.slot_pool.promote(slot)


__all__ = ["AdaptiveCheckpointPolicy", "CostModel", "LADDER_CANDIDATES"]
