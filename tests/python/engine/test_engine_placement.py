"""Placement rules on known prompts (docs/contract.md, "Reference engine")."""

import math

import pytest

from statecache.engine import (
    ANCHOR,
    DEMAND,
    LADDER,
    AnchorLadderDemand,
    Boundary,
    PlacementContext,
    feasible_positions,
    prompt_end_anchor,
)


def ctx(P, room, interval=-1, resume=0, kv=0, hbs=16):
    return PlacementContext(
        hash_block_size=hbs,
        successor_room=room,
        num_prompt_tokens=P,
        num_tokens=P,
        resume_position=resume,
        kv_hit_position=kv,
        interval_tokens=interval,
    )


def plan(c):
    return [(b.position, b.kind, b.guess) for b in feasible_positions(AnchorLadderDemand().prompt_boundaries(c), c)]


@pytest.mark.parametrize(
    "P,room,want",
    [
        (100, 0.0, 96),  # PAGE: last full block
        (96, 0.0, 80),  # exactly full: stays below the last full block
        (100, 4.0, 96),  # fork(4): 96 leaves 4 tokens
        (100, 5.0, 80),  # fork(5): 96 would leave only 4
        (15, 0.0, 0),  # no full block below the end
        (100, math.inf, 0),
    ],
)
def test_anchor(P, room, want):
    assert prompt_end_anchor(P, room, 16) == want


def test_interval_modes():
    assert plan(ctx(100, 0.0, interval=0)) == []
    assert plan(ctx(100, 0.0, interval=-1)) == [(96, ANCHOR, False)]
    assert plan(ctx(100, 0.0, interval=32)) == [(32, LADDER, True), (64, LADDER, True), (96, ANCHOR, False)]
    # an interval that is not a block multiple rounds down to one
    assert plan(ctx(100, 0.0, interval=40)) == [(32, LADDER, True), (64, LADDER, True), (96, ANCHOR, False)]


def test_demand_rung_where_hit_fell_short():
    assert plan(ctx(200, 0.0, resume=64, kv=160)) == [(160, DEMAND, True), (192, ANCHOR, False)]
    # nothing at or below where the state resumes
    assert plan(ctx(200, 0.0, interval=32, resume=64)) == [
        (96, LADDER, True),
        (128, LADDER, True),
        (160, LADDER, True),
        (192, ANCHOR, False),
    ]


def test_fork_room_spacing_and_ceiling():
    # fork(20): cuts at least 20 apart, none later than P - 20
    c = ctx(100, 20.0, interval=16, resume=0)
    got = plan(c)
    pos = [p for p, _, _ in got]
    assert pos == [16, 48, 80] and got[-1][1] == ANCHOR
    assert all(b - a >= 20 for a, b in zip(pos, pos[1:]))


def test_known_beats_guess_at_same_position():
    c = ctx(100, 0.0)
    bs = [Boundary(96, DEMAND, True), Boundary(96, ANCHOR, False), Boundary(50, LADDER, True)]
    assert [(b.position, b.kind) for b in feasible_positions(bs, c)] == [(96, ANCHOR)]
