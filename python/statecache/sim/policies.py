"""The placement and eviction policies the simulator compares.

Each policy is a pair of small objects behind the reference engine's two
seams (``statecache.engine.placement``): a ``PlacementPolicy`` that names the
token positions to checkpoint, and an ``EvictionPolicy`` that shapes which
checkpoint the state cache spends first. The engine enforces the mechanics
the same way for every policy (positions on the hash-block grid, successor
room, one checkpoint per position), so the figures differ only by policy.

Peers are re-created from their public descriptions, not from their code;
each docstring says what is modelled and what is simplified. One mapping
applies to all of them: a trace names prompt blocks only (generated tokens
have no ids, so a follow-up turn shares the previous *prompt's* full blocks
and no more), which makes "the end of the request" resumable only at the
prompt's last full block. A policy that checkpoints "at finish" or "at the
last decoded token" is therefore given that position, the one its real
counterpart's checkpoint would serve in this trace. Decode-time positions
(vLLM ``all``, SGLang) are named through ``decode_boundary``: with PAGE
images (a shared ``memory`` budget) they are kept and cost memory, never
read, as generated text is not shared in a trace; a fork cannot be taken
at decode, so under separate budgets the engine skips them.

Peers mark every position but the prompt end as a guess and pair it with
``PlainLRU``, which files guesses like anything else: pure recency, as
their systems do. ``statecache`` is the library's default
(``statecache.engine.AdaptiveCheckpointPolicy``, given the geometry's cost
model); ``statecache-lru`` the fixed default before it (the engine's
``AnchorLadderDemand`` + ``GuessFirstLRU``); ``statecache-flop`` a fixed
setting the simulator measured well on chat traces (see
``FlopAwareEviction`` and ``WithLadder``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from statecache.engine.adaptive import AdaptiveCheckpointPolicy, CostModel
from statecache.engine.placement import (
    ANCHOR,
    LADDER,
    AnchorLadderDemand,
    Boundary,
    EvictionPolicy,
    GuessFirstLRU,
    PlacementContext,
    PlacementPolicy,
    PlainLRU,
    prompt_end_anchor,
)

BLOCK = "block"
CHUNK = "chunk"
INTERVAL = "interval"
BRANCH = "branch"


def _anchor(ctx: PlacementContext) -> int:
    return prompt_end_anchor(ctx.num_prompt_tokens, ctx.successor_room, ctx.hash_block_size)


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _rungs_then_anchor(ctx: PlacementContext, first: int, step: int, kind: str) -> list[Boundary]:
    """Guesses at ``first, first + step, ...`` below the prompt-end position, then it."""
    if math.isinf(ctx.successor_room):
        return []
    end = _anchor(ctx)
    out = [Boundary(p, kind, True) for p in range(first, end, step)]
    if end > 0:
        out.append(Boundary(end, ANCHOR, False))
    return out


def _grid(step: int, hbs: int) -> int:
    """``step`` rounded down to the hash-block grid, at least one block."""
    return max(hbs, (step // hbs) * hbs)


class EveryBlock(PlacementPolicy):
    """vLLM ``all`` (mamba prefix caching, every block): a state snapshot at
    every full block boundary of the prompt and of the generated text.

    Models: one checkpoint per ``hash_block_size`` tokens, prefill and decode,
    none preferred over another. Simplifies: vLLM's block is its own KV
    block size (aligned up to the mamba page); here it is the simulator's
    hash block.
    """

    name = "every-block"

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        if math.isinf(ctx.successor_room):
            return []
        hbs = ctx.hash_block_size
        first = (ctx.resume_position // hbs + 1) * hbs
        return [Boundary(p, BLOCK, True) for p in range(first, _anchor(ctx) + 1, hbs)]

    def decode_boundary(self, ctx: PlacementContext, position: int) -> Boundary | None:
        return Boundary(position, BLOCK, True)


class ChunkEnds(PlacementPolicy):
    """vLLM ``align``: a snapshot where each scheduled prefill chunk ends,
    chunks cut on the block grid, the last one at the prompt's last full
    block.

    Models: checkpoints every ``chunk_tokens`` (the engine's per-pass token
    budget, rounded down to the grid) from where the request resumed, plus
    the prompt-end position. Simplifies: a real chunk's length depends on
    what else shares the pass; here every chunk gets the whole budget.
    """

    name = "chunk-ends"

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = _positive("chunk_tokens", chunk_tokens)

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        step = _grid(self.chunk_tokens, ctx.hash_block_size)
        return _rungs_then_anchor(ctx, ctx.resume_position + step, step, CHUNK)


class EveryNTokens(PlacementPolicy):
    """SGLang (Mamba radix cache): a state tracked every ``interval_tokens``
    tokens of the sequence, and one at finish.

    Models: positions that are multiples of the interval, counted from the
    start of the sequence, in the prompt and while decoding; "at finish" is
    the prompt-end position (see the module note). Simplifies: SGLang's tree
    is token-granular; here positions sit on the hash-block grid.
    """

    name = "every-n"

    def __init__(self, interval_tokens: int) -> None:
        self.interval_tokens = _positive("interval_tokens", interval_tokens)

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        step = _grid(self.interval_tokens, ctx.hash_block_size)
        return _rungs_then_anchor(ctx, step, step, INTERVAL)

    def decode_boundary(self, ctx: PlacementContext, position: int) -> Boundary | None:
        step = _grid(self.interval_tokens, ctx.hash_block_size)
        return Boundary(position, INTERVAL, True) if position % step == 0 else None


class BranchPointsAndEnd(PlacementPolicy):
    """Marconi's admission: checkpoint only where reuse has been seen or is
    certain: the branch point where this prompt leaves a prefix already in
    the cache, and the end of the sequence (the conversation's resume point).

    Models: the branch point is where the KV prefix match ends when the
    state could not serve all of it (the match proves a shared prefix up
    to there); the end is the prompt-end position (module note). Nothing
    else, so a prefix is first kept the second time it is seen. Simplifies:
    Marconi's radix tree detects a branch inside any cached edge at token
    granularity; here branches are found on the hash-block grid.
    """

    name = "branch-and-end"

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        if math.isinf(ctx.successor_room):
            return []
        out = []
        if ctx.kv_hit_position > ctx.resume_position:
            out.append(Boundary(ctx.kv_hit_position, BRANCH, True))
        end = _anchor(ctx)
        if end > 0:
            out.append(Boundary(end, ANCHOR, False))
        return out


class WithLadder(AnchorLadderDemand):
    """statecache's placement with its own ladder interval, whatever the
    engine's ``checkpoint_interval_tokens`` says. With a ``gate`` (an object
    with a ``room_for_guesses`` flag), rungs are placed only while the state
    cache has room to spend on guesses; anchors and demand rungs always."""

    name = "anchor-ladder-demand"

    def __init__(self, interval_tokens: int, gate=None) -> None:
        if isinstance(interval_tokens, bool) or not isinstance(interval_tokens, int) or interval_tokens < -1:
            raise ValueError(f"interval_tokens must be an int >= -1, got {interval_tokens!r}")
        self.interval_tokens = interval_tokens
        self.gate = gate

    def prompt_boundaries(self, ctx: PlacementContext) -> list[Boundary]:
        if ctx.interval_tokens == 0:  # prefix caching off
            return []
        n = self.interval_tokens
        if self.gate is not None and not self.gate.room_for_guesses:
            n = -1
        return super().prompt_boundaries(replace(ctx, interval_tokens=n))


class FlopAwareEviction(PlainLRU):
    """Marconi's eviction: spend the checkpoint with the lowest
    ``recency + alpha * flop_efficiency``, both min-max normalised over the
    checkpoints held; FLOP efficiency is the prefill FLOPs a hit there saves
    per byte that evicting it frees.

    How it drives the real pool: before each admission, when a shortage is
    near (fewer vacant slots than ``2 * max_num_seqs``, the most one pass
    can pop), it files the held checkpoints in utility order through the
    slot pool's public calls (``mark_speculative`` then ``promote`` moves a
    free checkpoint to the LRU tail), so the pool's own eviction spends the
    lowest utility first. Simplifies: ``alpha`` is fixed (Marconi tunes it
    online on a bootstrap window); the bytes freed are the state image only,
    because KV blocks are budgeted and evicted separately here. Needs a
    fork-mode slot pool (separate state budget); with PAGE images it keeps
    the store's LRU.

    ``demote``: boundary kinds spent before every other checkpoint until one
    is read (statecache files its ladder rungs so; Marconi demotes nothing).
    """

    name = "flop-aware"

    def __init__(self, geometry, alpha: float = 1.0, demote: frozenset = frozenset()) -> None:
        self.geometry = geometry
        self.alpha = float(alpha)
        self.demote = frozenset(demote)
        self.demoted: set[int] = set()
        self.clock = 0
        self.last_use: dict[int, int] = {}  # prefix hash -> clock of last write or read
        self.efficiency: dict[int, float] = {}  # prefix hash -> FLOPs saved per byte
        self.reorders = 0
        self._filed = -1  # len(held) at the last reorder; -1: something changed since
        # Whether a guess written now would only displace other guesses or
        # vacant slots: vacant + demoted-held covers one pass of pops.
        self.room_for_guesses = True

    def _note(self, h: int, position: int | None) -> None:
        self._filed = -1
        self.last_use[h] = self.clock
        if position is not None and h not in self.efficiency:
            saved = self.geometry.prefill_flops(0, position)
            self.efficiency[h] = saved / max(1, self.geometry.state_bytes)

    def on_checkpoint(self, caches, seq, boundary: Boundary) -> None:
        super().on_checkpoint(caches, seq, boundary)
        h = seq.block_hashes[boundary.position // caches.hash_block_size - 1]
        self._note(h, boundary.position)
        if boundary.kind in self.demote:
            self.demoted.add(h)
        else:
            self.demoted.discard(h)

    def on_resume(self, caches, seq, prefix_hash: int) -> None:
        self._note(prefix_hash, seq.num_computed_tokens)
        self.demoted.discard(prefix_hash)

    def before_admission(self, engine) -> None:
        self.clock += 1
        caches = engine.caches
        pool = caches.slot_pool
        if not caches.forks or pool is None:
            return
        held = pool.hash_to_slot
        # forget what the pool no longer holds (evicted, orphaned)
        if len(self.last_use) > 2 * len(held) + 64:
            for h in [h for h in self.last_use if h not in held]:
                del self.last_use[h]
                self.efficiency.pop(h, None)
                self.demoted.discard(h)
        vacant = pool.occupancy()["slots_vacant"]
        self.demoted = {h for h in self.demoted if h in held}
        self.room_for_guesses = vacant + len(self.demoted) >= 2 * engine.config.max_num_seqs
        # The order only changes when a checkpoint was written, read or lost.
        if self._filed == len(held) or not held:
            return
        if vacant >= 2 * engine.config.max_num_seqs:
            return
        items = [(h, s) for h, s in held.items()]
        rec = [self.last_use.get(h, 0) for h, _ in items]
        eff = [self.efficiency.get(h, 0.0) for h, _ in items]
        r_lo, r_hi = min(rec), max(rec)
        e_lo, e_hi = min(eff), max(eff)
        r_span, e_span = (r_hi - r_lo) or 1, (e_hi - e_lo) or 1.0
        score = [
            (h not in self.demoted, ((r - r_lo) / r_span) + self.alpha * ((e - e_lo) / e_span))
            for (h, _), r, e in zip(items, rec, eff)
        ]
        for k in sorted(range(len(items)), key=score.__getitem__):
            slot = items[k][1]
            pool.mark_speculative(slot)
            pool.promote(slot)
        self.reorders += 1
        self._filed = len(held)


@dataclass(frozen=True)
class PolicySpec:
    """A named policy: what it models, and how to build its two objects."""

    name: str
    description: str
    build: Callable[[PolicyContext], tuple[PlacementPolicy, EvictionPolicy]]


@dataclass(frozen=True)
class PolicyContext:
    """What building a policy may depend on."""

    geometry: object
    hash_block_size: int
    chunk_tokens: int
    interval_tokens: int
    ladder_tokens: int = 16384
    seed: int = 0


def _statecache_flop(c: PolicyContext) -> tuple[PlacementPolicy, EvictionPolicy]:
    eviction = FlopAwareEviction(c.geometry, demote={LADDER})
    return WithLadder(c.ladder_tokens, gate=eviction), eviction


def _statecache_adaptive(c: PolicyContext) -> tuple[PlacementPolicy, EvictionPolicy]:
    p = AdaptiveCheckpointPolicy(CostModel.from_geometry(c.geometry), seed=c.seed)
    return p, p


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec(
            "statecache",
            "the library default (adaptive): anchor + demand rung + a ladder chosen online "
            "by shadow evaluation; recency + FLOPs saved per byte in the library",
            _statecache_adaptive,
        ),
        PolicySpec(
            "statecache-lru",
            "the fixed pre-adaptive default: prompt-end anchor + demand rung; guesses spent first, LRU",
            lambda c: (AnchorLadderDemand(), GuessFirstLRU()),
        ),
        PolicySpec(
            "vllm-all", "vLLM all: every block boundary, prefill and decode; LRU", lambda c: (EveryBlock(), PlainLRU())
        ),
        PolicySpec(
            "vllm-align",
            "vLLM align: ends of grid-aligned prefill chunks; LRU",
            lambda c: (ChunkEnds(c.chunk_tokens), PlainLRU()),
        ),
        PolicySpec(
            "sglang",
            "SGLang: every N tokens and at finish; LRU",
            lambda c: (EveryNTokens(c.interval_tokens), PlainLRU()),
        ),
        PolicySpec(
            "marconi",
            "Marconi: branch points and the end; recency + FLOPs saved per byte",
            lambda c: (BranchPointsAndEnd(), FlopAwareEviction(c.geometry)),
        ),
        PolicySpec(
            "statecache-flop",
            "statecache placement with a ladder; ladder rungs spent first, then recency + FLOPs saved per byte",
            _statecache_flop,
        ),
    )
}


def policy(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {name!r}") from None


__all__ = [
    "POLICIES",
    "PolicyContext",
    "PolicySpec",
    "policy",
    "EveryBlock",
    "ChunkEnds",
    "EveryNTokens",
    "BranchPointsAndEnd",
    "FlopAwareEviction",
    "WithLadder",
    "AnchorLadderDemand",
    "GuessFirstLRU",
    "PlainLRU",
]
