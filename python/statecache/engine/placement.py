"""Where to keep checkpoints, and which ones to spend first: the two policy seams.

The engine asks a **placement policy** which token positions of a sequence to
checkpoint, and tells an **eviction policy** what it kept and what it resumed
from. It never looks at which policy it holds; a peer scheme (vLLM's
all / align, SGLang's every-N, Marconi) is one more pair of small objects.

Placement
---------
``PlacementPolicy.prompt_boundaries(ctx)`` is called once when a sequence is
admitted, after its prefix hit is known, and returns :class:`Boundary` values
(token position, a kind label, and whether the position is a *guess* rather
than a known resume point). ``decode_boundary(ctx, position)`` is called after
each decode step that completes a hash block; most policies return None.

The policy states intent; the engine enforces mechanics the same way for every
policy (``feasible_positions``): a position must be a multiple of the hash
block size, lie past where the state resumes, leave ``successor_room`` tokens
of the prompt for the forward after it (fork checkpoints), and be at least
``successor_room`` past the previous cut. Positions that fail are dropped and
counted in ``checkpoint_funnel()`` as ``boundaries_infeasible``.

Eviction
--------
The state caches own their eviction order (C++: LRU with guesses first, or the
cost model of ``set_eviction_policy``). An eviction policy shapes it through
the caches' public calls only, from the hooks the engine calls:
``on_checkpoint(caches, seq, boundary)`` after a boundary was handed to the
caches, ``on_resume(caches, seq, prefix_hash)`` after a hit was attached, and
``before_admission(engine)``, where a policy may drop checkpoints it judges
worthless through ``engine.block_manager.drop_checkpoint(h)``.
:class:`GuessFirstLRU` (the pre-adaptive default) relies on the pools' own
rule: a guess (ladder and demand rungs) is filed at the LRU head, known
anchors at the tail. The engine's default now is
``statecache.engine.adaptive.AdaptiveCheckpointPolicy`` (both seams).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ANCHOR = "anchor"
LADDER = "ladder"
DEMAND = "demand"


@dataclass(frozen=True)
class Boundary:
    """One position to checkpoint: token ``position`` (a multiple of the
    hash block size), the policy's ``kind`` label, and ``guess`` (True when
    the position is not known to be where reuse will resume)."""

    position: int
    kind: str
    guess: bool


@dataclass(frozen=True)
class PlacementContext:
    """What a placement policy may base its answer on, for one sequence.

    ``successor_room`` is the largest room any state cache that keeps
    checkpoints needs (``inf`` when none can keep anything, 0 for copies).
    ``kv_hit_position`` is how far the KV prefix cache matched before the
    state caches capped it to ``resume_position``.
    """

    hash_block_size: int
    successor_room: float
    num_prompt_tokens: int
    num_tokens: int
    resume_position: int
    kv_hit_position: int
    interval_tokens: int
    # The sequence's chained block hashes (read-only; for policies that keep
    # their own statistics, e.g. the adaptive default's shadow evaluation).
    block_hashes: Sequence[int] = ()


class PlacementPolicy:
    """Decides which boundaries of a sequence to checkpoint (see module doc)."""

    name = "none"

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        return []

    def decode_boundary(self, ctx: PlacementContext, position: int) -> Boundary | None:
        return None


def prompt_end_anchor(num_prompt_tokens: int, successor_room: float, hbs: int) -> int:
    """``((P - room) // hbs) * hbs``, kept below the prompt's last token so a
    resend of the same prompt can resume there; 0 when there is none."""
    if math.isinf(successor_room):
        return 0
    pos = int((num_prompt_tokens - successor_room) // hbs) * hbs
    pos = min(pos, ((num_prompt_tokens - 1) // hbs) * hbs)
    return max(pos, 0)


class AnchorLadderDemand(PlacementPolicy):
    """statecache's placement: prompt-end anchor, interval ladder, demand rung.

    ``interval_tokens`` (from the engine config): 0 keeps nothing, -1 keeps
    the anchor and the demand rung only, N > 0 adds a rung every N tokens.
    """

    name = "anchor-ladder-demand"

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        n = ctx.interval_tokens
        if n == 0 or math.isinf(ctx.successor_room):
            return []
        hbs = ctx.hash_block_size
        anchor = prompt_end_anchor(ctx.num_prompt_tokens, ctx.successor_room, hbs)
        out = []
        if n > 0:
            step = max(hbs, (n // hbs) * hbs)
            out += [Boundary(p, LADDER, True) for p in range(step, anchor, step)]
        if ctx.kv_hit_position > ctx.resume_position:
            # The KV cache held more than any state could serve: keep that
            # boundary this time so the next request with this prefix gets it.
            out.append(Boundary(ctx.kv_hit_position, DEMAND, True))
        if anchor > 0:
            out.append(Boundary(anchor, ANCHOR, False))
        return out


def feasible_positions(bounds: list[Boundary], ctx: PlacementContext) -> list[Boundary]:
    """The engine's mechanical filter, the same for every policy: sorted,
    deduplicated (a known position wins over a guess at the same place)."""
    hbs = ctx.hash_block_size
    room = 0 if math.isinf(ctx.successor_room) else int(math.ceil(ctx.successor_room))
    ceiling = ctx.num_prompt_tokens - room
    by_pos: dict[int, Boundary] = {}
    for b in bounds:
        if b.position % hbs or b.position > ceiling:
            continue
        prev = by_pos.get(b.position)
        if prev is None or (prev.guess and not b.guess):
            by_pos[b.position] = b
    # A resumed fork must commit its room before the next cut; a fresh start
    # has no predecessor to cover.
    out, last = [], (ctx.resume_position if ctx.resume_position > 0 else -math.inf)
    for pos in sorted(by_pos):
        if pos <= ctx.resume_position or pos - last < max(room, 1):
            continue
        out.append(by_pos[pos])
        last = pos
    return out


class EvictionPolicy:
    """Shapes what the state caches spend first (see module doc)."""

    name = "base"

    def on_checkpoint(self, caches, seq, boundary: Boundary) -> None:
        pass

    def on_resume(self, caches, seq, prefix_hash: int) -> None:
        pass

    def before_admission(self, engine) -> None:
        pass


class GuessFirstLRU(EvictionPolicy):
    """LRU, with guesses spent before known anchors (the pools' own rule:
    the engine sets ``checkpoint_end_pos`` to the anchor, and a slot pool
    files every other position at the LRU head)."""

    name = "guess-first-lru"


class PlainLRU(EvictionPolicy):
    """Pure recency: a guess that was kept is filed like an anchor."""

    name = "lru"

    def on_checkpoint(self, caches, seq, boundary: Boundary) -> None:
        if boundary.guess and caches.slot_pool is not None and caches.forks:
            h = seq.hashes[boundary.position // caches.hash_block_size - 1]
            slot = caches.slot_pool.lookup(h)
            if slot >= 0:
                caches.slot_pool.promote(slot)
