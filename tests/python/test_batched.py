"""Batched per-pass calls: `resumable_hits`, `checkpoint_many`, `release_many`
(both pools and the PAGE coordinator) do what the per-sequence calls do in
order, and refuse a bad batch as a whole, changing nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

import statecache as sc


def _slot_state(p):
    return (dict(p.hash_to_slot), list(p.slot_hash), p.num_free(), p.occupancy(), p._debug_state(),
            p.checkpoint_fates())


def _group_state(p):
    return (dict(p.hash_to_group), list(p.group_hash), p.num_free(), p._debug_state(),
            p._debug_copies(), p.checkpoint_fates())


def _twins(kind, seed):
    rng = random.Random(seed)
    if kind == "slot":
        mk = lambda: sc.StateSlotPool(64, sc.StateTransfer.fork(4), hash_block_size=4)  # noqa: E731
    elif kind == "group-fork":
        mk = lambda: sc.StateGroupPool(64, sc.StateTransfer.fork(4), hash_block_size=4)  # noqa: E731
    else:
        mk = lambda: sc.StateGroupPool(64, sc.StateTransfer.copy(), hash_block_size=4)  # noqa: E731
    pools, seqsets = [mk(), mk()], []
    for p in pools:
        seqs = []
        for i in range(20):
            s = sc.Sequence(i, num_tokens=200, num_prompt_tokens=200)
            s.block_hashes = [(i % 5) * 1000 + b for b in range(40)]
            if kind == "slot":
                s.state_slots = [p.pop()]
            else:
                s.per_req_cache_group = p.pop()
            seqs.append(s)
        seqsets.append(seqs)
    return rng, pools, seqsets


@pytest.mark.parametrize("kind", ["slot", "group-fork", "group-copy"])
@pytest.mark.parametrize("seed", range(6))
def test_batched_equals_per_sequence_calls(kind, seed):
    rng, (a, b), (sa, sb) = _twins(kind, seed)
    state = _slot_state if kind == "slot" else _group_state
    for _ in range(30):
        a.release_pins(); b.release_pins()
        hits = [rng.randrange(41) for _ in sa]
        as_array = rng.random() < 0.5
        per_seq = [a.resumable_hit(s, h, list(s.block_hashes)) for s, h in zip(sa, hits)]
        hashes = [np.asarray(list(s.block_hashes), dtype=np.int64) if as_array else list(s.block_hashes)
                  for s in sb]
        batched = b.resumable_hits(sb, np.asarray(hits) if as_array else hits, hashes)
        assert batched == per_seq
        assert b.resumable_hits(sb, hits) == per_seq  # None: each sequence's own block_hashes
        chosen = [i for i in range(len(sa)) if rng.random() < 0.5]
        bounds = [rng.randrange(1, 41) for _ in chosen]
        for i, k in zip(chosen, bounds):
            a.checkpoint(sa[i], k, list(sa[i].block_hashes)[k - 1])
        b.checkpoint_many([sb[i] for i in chosen], bounds,
                          [list(sb[i].block_hashes)[k - 1] for i, k in zip(chosen, bounds)])
        if kind == "group-copy":
            assert a.take_copies() == b.take_copies()
        assert state(a) == state(b)
        assert [s.state_slots[:] if kind == "slot" else s.per_req_cache_group for s in sa] == \
               [s.state_slots[:] if kind == "slot" else s.per_req_cache_group for s in sb]


@pytest.mark.parametrize("kind", ["slot", "group-fork"])
def test_bad_batch_changes_nothing(kind):
    _, (p, _), (seqs, _) = _twins(kind, 0)
    state = _slot_state if kind == "slot" else _group_state
    before = state(p)
    good = [list(s.block_hashes)[3] for s in seqs[:3]]
    with pytest.raises(ValueError, match="-1"):
        p.checkpoint_many(seqs[:3], [4, 4, 4], good[:2] + [-1])
    with pytest.raises(ValueError):
        p.checkpoint_many(seqs[:3], [4, 4], good)            # lengths differ
    with pytest.raises(ValueError):
        p.checkpoint_many([seqs[0], seqs[0]], [4, 4], good[:2])  # one sequence twice
    with pytest.raises(TypeError):
        p.checkpoint_many(seqs[:2] + [object()], [4, 4, 4], good)
    with pytest.raises(ValueError):
        p.resumable_hits(seqs[:2], [1, -1])
    assert state(p) == before


def test_coordinator_batched():
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="b", image_bytes=256)
    coords = [sc.PagedStateCheckpointCoordinator(sc.BlockPool(256), spec, enabled=True) for _ in range(2)]
    seqsets = []
    for c in coords:
        seqs = []
        for i in range(12):
            s = sc.Sequence(i, num_tokens=100)
            s.state_slots = [i]
            s.block_hashes = [(i % 4) * 100 + b for b in range(20)]
            seqs.append(s)
        seqsets.append(seqs)
    (a, b), (sa, sb) = coords, seqsets
    rng = random.Random(3)
    for _ in range(20):
        a.complete_previous_batch(); b.complete_previous_batch()
        hits = [rng.randrange(21) for _ in sa]
        assert b.resumable_hits(sb, hits) == [a.resumable_hit(s, h, list(s.block_hashes)) for s, h in zip(sa, hits)]
        chosen = [i for i in range(12) if rng.random() < 0.4]
        ks = [rng.randrange(1, 21) for _ in chosen]
        for i, k in zip(chosen, ks):
            a.checkpoint(sa[i], k, list(sa[i].block_hashes)[k - 1])
        b.checkpoint_many([sb[i] for i in chosen], ks, [list(sb[i].block_hashes)[k - 1] for i, k in zip(chosen, ks)])
        ops_a, ops_b = a.take_checkpoint_ops(), b.take_checkpoint_ops()
        assert [(o.src_slot, tuple(o.unit_ids)) for o in ops_a[0]] == [(o.src_slot, tuple(o.unit_ids)) for o in ops_b[0]]
        assert a.checkpoint_fates() == b.checkpoint_fates()
