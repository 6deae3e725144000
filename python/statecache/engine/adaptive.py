"""The engine's default checkpoint policy: placement and eviction tuned online.

One object serves both seams (``PlacementPolicy`` and ``EvictionPolicy``).

Placement: the prompt-end anchor and the demand rung always (a known resume
point, and a boundary a KV hit was just cut short at), plus a ladder of rungs
every N tokens. With PAGE images (checkpoints in the KV pool) N is chosen
online from ``ladder_candidates``. With a fork slot pool (a separate state
budget) N stays ``initial_ladder`` and the rungs are room-gated instead:
placed only while vacant slots cover a pass of pops, so a guess never
displaces knowledge (the shadow's memory price is for PAGE images only).

How N is chosen (shadow evaluation, continuously): every admission files the
checkpoints each candidate ladder would have placed into that candidate's
shadow set (hashes only), and a deterministic sample of requests (1 /
``sample_every``, by their last prompt block's hash salted with ``seed``) is
also evaluated: each candidate earns the tokens it would have resumed there,
the deepest of its shadow checkpoints inside the KV prefix *its* pool would
still hold. That prefix comes from an LRU model on a KV clock (blocks written
so far): a block is held if fewer than C blocks were written since a request
last used it, where C is the pool shrunk by the share of writes that are the
candidate's own images (PAGE images live in the KV pool and die with their KV
block), so a ladder pays for its memory in the hits it loses. Scores decay
with a horizon of ``horizon`` admissions; after ``warmup`` admissions (the
shadows start empty), every ``decide_every`` the setting moves one notch
(candidates ordered coarse to fine) towards the best candidate if that beats
it by ``margin`` (hysteresis). Cost per admission: a
dict update per prompt block plus O(candidates x blocks / interval) to file;
O(candidates x blocks) more for a sampled one. Nothing is random but the
salt, so a run repeats exactly.

Eviction: the library's cost model (``set_eviction_policy("cost", ...)`` on
the slot pool or the PAGE store): recency + ``weight`` x prefill FLOPs a hit
saves per byte, ladder rungs (guesses) spent first, demand rungs filed as
knowledge. ``cost`` comes from the model geometry when the caller has it
(the simulator does); without it the value of a checkpoint is its length.

Every decision is counted in ``checkpoint_funnel()``: ``adaptive_decisions``,
``adaptive_switches``, ``adaptive_ladder_tokens`` (the setting in force),
``adaptive_sampled``, ``adaptive_rungs_gated``; ``decisions`` keeps the last
ones with their scores.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from itertools import repeat
from dataclasses import dataclass

from .placement import (ANCHOR, DEMAND, LADDER, Boundary, EvictionPolicy, PlacementContext,
                        PlacementPolicy, prompt_end_anchor)

LADDER_CANDIDATES = (32768, 16384, 8192, 4096, 2048, 1024, 512)
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
    def from_geometry(cls, geometry, weight: float = 1.0) -> "CostModel":
        """From a ``statecache.sim.geometry.ModelGeometry`` (or anything with
        its ``flops_per_token``, ``attention_flops_per_context_token`` and
        ``state_bytes``)."""
        return cls(float(geometry.flops_per_token), float(geometry.attention_flops_per_context_token),
                   float(max(1, geometry.state_bytes)), float(weight))

    def settings(self, hash_block_size: int) -> dict:
        """Keyword arguments of ``set_eviction_policy("cost", ...)``."""
        return dict(flops_per_token=self.flops_per_token,
                    flops_per_context_token=self.flops_per_context_token,
                    checkpoint_bytes=self.checkpoint_bytes, tokens_per_position=float(hash_block_size),
                    weight=self.weight, guesses_first=True)


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit value from any int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class _Shadow:
    """One candidate ladder's shadow checkpoints over the sampled families."""

    __slots__ = ("interval", "held", "gain", "units")

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.held: dict[int, None] = {}  # hashes it would hold a checkpoint under
        self.gain = 0.0   # decayed tokens it would have resumed
        self.units = 0.0  # decayed image units it writes per admission


class AdaptiveCheckpointPolicy(PlacementPolicy, EvictionPolicy):
    """statecache's default: anchor + demand rung + a ladder chosen online by
    shadow evaluation, with FLOP-aware eviction in the library (module doc)."""

    name = "adaptive"

    def __init__(self, cost: CostModel | None = None, *, seed: int = 0, sample_every: int = 4,
                 ladder_candidates=LADDER_CANDIDATES, initial_ladder: int = 16384,
                 horizon: int = 2048, decide_every: int = 32, warmup: int = 1024, margin: float = 0.015,
                 max_decisions: int = 256) -> None:
        if cost is not None and not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a CostModel or None, got {type(cost).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        for name, v in (("sample_every", sample_every), ("horizon", horizon),
                        ("decide_every", decide_every), ("warmup", warmup),
                        ("max_decisions", max_decisions)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        cands = tuple(ladder_candidates)
        if not cands or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in cands) \
                or len(set(cands)) != len(cands):
            raise ValueError(f"ladder_candidates must be distinct ints >= 0, got {ladder_candidates!r}")
        if initial_ladder not in cands:
            raise ValueError(f"initial_ladder must be one of ladder_candidates {cands}, got "
                             f"{initial_ladder!r}")
        if not (isinstance(margin, (int, float)) and not isinstance(margin, bool)
                and 0 <= margin < 1):
            raise ValueError(f"margin must be a number in [0, 1), got {margin!r}")
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
            # The sample is of requests (their last prompt block), so one
            # system prompt shared by all still leaves a sample.
            last = hashes[min(len(hashes), ctx.num_prompt_tokens // ctx.hash_block_size) - 1] \
                if ctx.num_prompt_tokens >= ctx.hash_block_size else hashes[0]
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
        if ctx.kv_hit_position > ctx.resume_position:
            out.append(Boundary(ctx.kv_hit_position, DEMAND, True))
        if anchor > 0:
            out.append(Boundary(anchor, ANCHOR, False))
        return out

    def _shadow_admission(self, ctx: PlacementContext, anchor: int, sampled: bool) -> None:
        hbs = ctx.hash_block_size
        hashes = ctx.block_hashes
        kv = min(ctx.kv_hit_position // hbs, len(hashes))
        actual = ctx.resume_position // hbs
        anchor_b = anchor // hbs
        prompt_blocks = min(len(hashes), ctx.num_prompt_tokens // hbs)
        limit = min(len(hashes), (ctx.num_tokens - 1) // hbs)  # a hit leaves one token
        d = self.decay
        stamp, clock = self.stamp, self.clock
        written = self.kv_written * d + max(0, prompt_blocks - kv)
        self.kv_written = written
        if sampled:
            # How far back, in KV blocks written since, each block was last used.
            far = -self._far
            ages = [clock - stamp.get(hashes[j], far) for j in range(limit)]
        for sh in self.shadows:
            held = sh.held
            res, reach = actual, kv
            if sampled:
                # This candidate's images take residency from KV in proportion
                # to what it writes, so its pool reaches back fewer KV blocks.
                capacity = (self.pool_blocks * written / (written + sh.units)
                            if written + sh.units > 0 else self.pool_blocks)
                # Ages grow along a prefix (whoever used a block used the ones
                # before it), so the held prefix ends where they pass capacity.
                reach = bisect_left(ages, capacity)
                res = 0
                for j in range(reach, 0, -1):
                    if hashes[j - 1] in held:
                        res = j
                        break
                sh.gain = sh.gain * d + res * hbs * self.sample_every
            else:
                sh.gain *= d
            # Block indices (boundary - 1) of what it would file: anchor,
            # demand rung, ladder rungs.
            placed = []
            if anchor_b > res:
                placed.append(anchor_b - 1)
            if reach > res:
                placed.append(reach - 1)
            n = sh.interval
            if n > 0:
                step = max(1, n // hbs)
                placed += range(step * (res // step + 1) - 1, anchor_b - 1, step)
            held.update(zip(map(hashes.__getitem__, placed), repeat(None)))
            sh.units = sh.units * d + len(placed) * self.units_per_checkpoint
        # This request used its prompt blocks now, and wrote the ones it missed.
        self.clock = clock + max(0, prompt_blocks - kv)
        stamp.update(zip(hashes[:prompt_blocks], repeat(self.clock)))
        if len(stamp) > self._stamp_limit:
            self._prune()
        self._admissions += 1
        if sampled:
            self._note("adaptive_sampled")
        if self._admissions >= self.warmup and self._admissions % self.decide_every == 0:
            self._decide()

    def _prune(self) -> None:
        """Forget blocks no candidate's pool could still reach, and the
        shadow checkpoints filed under them."""
        oldest = self.clock - 2 * self.pool_blocks
        self.stamp = {h: t for h, t in self.stamp.items() if t >= oldest}
        for sh in self.shadows:
            sh.held = {h: None for h in sh.held if h in self.stamp}

    def scores(self) -> list[float]:
        """Each candidate's shadow score: the (decayed) tokens it would have
        resumed, its own images' memory already charged (module doc)."""
        return [sh.gain for sh in self.shadows]

    def _decide(self) -> None:
        s = self.scores()
        cur = self.current
        best = max(range(len(s)), key=lambda i: (s[i], -i))
        self._note("adaptive_decisions")
        switch = best != cur and s[best] > s[cur] + self.margin * abs(s[cur])
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

    def on_checkpoint(self, caches, seq, boundary: Boundary) -> None:
        # A demand rung is a seen resume point: filed as knowledge, not a guess.
        if boundary.kind == DEMAND and caches.forks and caches.slot_pool is not None:
            h = seq.hashes[boundary.position // caches.hash_block_size - 1]
            slot = caches.slot_pool.lookup(h)
            if slot >= 0:
                caches.slot_pool.promote(slot)


__all__ = ["AdaptiveCheckpointPolicy", "CostModel", "LADDER_CANDIDATES"]
