"""Batched per-pass calls: `resumable_hits`, `checkpoint_many`, `release_many`
(both pools and the PAGE coordinator) do what the per-sequence calls do in
order, and refuse a bad batch as a whole, changing nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

import statecache as sc


def _slot_state(p):
    return (
        dict(p.hash_to_slot),
        list(p.slot_hash),
        p.num_free(),
        p.occupancy(),
        p._debug_state(),
        p.checkpoint_fates(),
    )


def _group_state(p):
    return (
        dict(p.hash_to_group),
        list(p.group_hash),
        p.num_free(),
        p._debug_state(),
        p._debug_copies(),
        p.checkpoint_fates(),
    )


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
        a.release_pins()
        b.release_pins()
        hits = [rng.randrange(41) for _ in sa]
        as_array = rng.random() < 0.5
        per_seq = [a.resumable_hit(s, h, list(s.block_hashes)) for s, h in zip(sa, hits)]
        hashes = [np.asarray(list(s.block_hashes), dtype=np.int64) if as_array else list(s.block_hashes) for s in sb]
        batched = b.resumable_hits(sb, np.asarray(hits) if as_array else hits, hashes)
        assert batched == per_seq
        assert b.resumable_hits(sb, hits) == per_seq  # None: each sequence's own block_hashes
        chosen = [i for i in range(len(sa)) if rng.random() < 0.5]
        bounds = [rng.randrange(1, 41) for _ in chosen]
        for i, k in zip(chosen, bounds):
            a.checkpoint(sa[i], k, list(sa[i].block_hashes)[k - 1])
        b.checkpoint_many(
            [sb[i] for i in chosen], bounds, [list(sb[i].block_hashes)[k - 1] for i, k in zip(chosen, bounds)]
        )
        if kind == "group-copy":
            assert a.take_copies() == b.take_copies()
        assert state(a) == state(b)
        assert [s.state_slots[:] if kind == "slot" else s.per_req_cache_group for s in sa] == [
            s.state_slots[:] if kind == "slot" else s.per_req_cache_group for s in sb
        ]


@pytest.mark.parametrize("kind", ["slot", "group-fork"])
def test_bad_batch_changes_nothing(kind):
    _, (p, _), (seqs, _) = _twins(kind, 0)
    state = _slot_state if kind == "slot" else _group_state
    before = state(p)
    good = [list(s.block_hashes)[3] for s in seqs[:3]]
    with pytest.raises(ValueError, match="-1"):
        p.checkpoint_many(seqs[:3], [4, 4, 4], good[:2] + [-1])
    with pytest.raises(ValueError):
        p.checkpoint_many(seqs[:3], [4, 4], good)  # lengths differ
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
    for _c in coords:
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
        a.complete_previous_batch()
        b.complete_previous_batch()
        hits = [rng.randrange(21) for _ in sa]
        assert b.resumable_hits(sb, hits) == [a.resumable_hit(s, h, list(s.block_hashes)) for s, h in zip(sa, hits)]
        chosen = [i for i in range(12) if rng.random() < 0.4]
        ks = [rng.randrange(1, 21) for _ in chosen]
        for i, k in zip(chosen, ks):
            a.checkpoint(sa[i], k, list(sa[i].block_hashes)[k - 1])
        b.checkpoint_many([sb[i] for i in chosen], ks, [list(sb[i].block_hashes)[k - 1] for i, k in zip(chosen, ks)])
        ops_a, ops_b = a.take_checkpoint_ops(), b.take_checkpoint_ops()
        assert [(o.src_slot, tuple(o.unit_ids)) for o in ops_a[0]] == [
            (o.src_slot, tuple(o.unit_ids)) for o in ops_b[0]
        ]
        assert a.checkpoint_fates() == b.checkpoint_fates()


# ---------------------------------------------------------------- extended --

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class OwnSeq:
    """An engine's own request object: the sequence attributes, no base class."""

    def __init__(self, i, num_tokens=200):
        self.seq_id = i
        self.num_tokens = num_tokens
        self.num_prompt_tokens = num_tokens
        self.has_per_req_cache = True
        self.state_slots = [-1]
        self.state_fork_src = -1
        self.per_req_cache_group = -1
        self.pending_checkpoint = -1
        self.checkpoint_end_pos = 0
        self.midstep_anchor_pos = 0
        self.block_hashes = []

    @property
    def state_slot(self):
        return self.state_slots[0] if self.state_slots else -1

    @state_slot.setter
    def state_slot(self, v):
        if self.state_slots:
            self.state_slots[0] = v
        else:
            self.state_slots = [v]


def _fields(s):
    return (s.state_slot, s.state_fork_src, s.per_req_cache_group, s.pending_checkpoint)


def _make_pool(kind):
    if kind == "slot":
        return sc.StateSlotPool(48, sc.StateTransfer.fork(4), hash_block_size=4)
    if kind == "group-fork":
        return sc.StateGroupPool(48, sc.StateTransfer.fork(4), hash_block_size=4)
    return sc.StateGroupPool(48, sc.StateTransfer.copy(), hash_block_size=4)


def _admit(pool, kind, seqs):
    for s in seqs:
        if kind == "slot":
            s.state_slot = pool.pop()
        else:
            s.per_req_cache_group = pool.pop()


_ops = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 15), max_size=16), st.integers(0, 10**6)),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("kind", ["slot", "group-fork", "group-copy"])
@pytest.mark.parametrize("seq_kind", ["native", "own", "mixed"])
@settings(max_examples=25, deadline=None)
@given(ops=_ops)
def test_random_batches_equal_per_sequence_calls(kind, seq_kind, ops):
    """Random passes: every batched call against the per-sequence calls on a
    twin pool, native, own and mixed sequence objects, lists and NumPy."""
    a, b = _make_pool(kind), _make_pool(kind)
    state = _slot_state if kind == "slot" else _group_state

    def mk(i):
        own = seq_kind == "own" or (seq_kind == "mixed" and i % 2)
        s = OwnSeq(i) if own else sc.Sequence(i, num_tokens=200, num_prompt_tokens=200)
        s.block_hashes = [(i % 4) * 1000 + k for k in range(40)]
        return s

    sa, sb = [mk(i) for i in range(16)], [mk(i) for i in range(16)]
    _admit(a, kind, sa)
    _admit(b, kind, sb)
    for op, picks, salt in ops:
        rng = random.Random(salt)
        chosen = sorted(set(picks))
        if op == 0:
            a.release_pins()
            b.release_pins()
        elif op == 1:
            hits = [rng.randrange(41) for _ in chosen]
            want = [a.resumable_hit(sa[i], h, list(sa[i].block_hashes)) for i, h in zip(chosen, hits)]
            np_in = salt % 2 == 0
            got = b.resumable_hits(
                [sb[i] for i in chosen],
                np.asarray(hits, dtype=np.int64) if np_in else hits,
                [
                    np.asarray(list(sb[i].block_hashes), dtype=np.int64) if np_in else tuple(sb[i].block_hashes)
                    for i in chosen
                ],
                assume_checkpointed=salt % 5 == 0 and kind == "slot",
            )
            if not (salt % 5 == 0 and kind == "slot"):
                assert got == want
        elif op == 2:
            ks = [rng.randrange(1, 41) for _ in chosen]
            hs = [(i % 4) * 1000 + k - 1 for i, k in zip(chosen, ks)]
            for i, k, h in zip(chosen, ks, hs):
                a.checkpoint(sa[i], k, h)
            b.checkpoint_many([sb[i] for i in chosen], np.asarray(ks, dtype=np.int64) if salt % 2 else ks, hs)
        else:
            # requests finish and are replaced
            if kind == "slot":
                for i in chosen:
                    a.release(sa[i].state_slot)
                for i in chosen:
                    sa[i].state_slot = a.pop()
                b.release_many([sb[i].state_slot for i in chosen])
                for i, slot in zip(chosen, [b.pop() for _ in chosen]):
                    sb[i].state_slot = slot
            else:
                for i in chosen:
                    a.forget_pending(sa[i])
                for i in chosen:
                    a.release(sa[i].per_req_cache_group)
                for i in chosen:
                    sa[i].per_req_cache_group = a.pop()
                b.forget_pending_many([sb[i] for i in chosen])
                b.release_many([sb[i].per_req_cache_group for i in chosen])
                for i, g in zip(chosen, [b.pop() for _ in chosen]):
                    sb[i].per_req_cache_group = g
        if kind == "group-copy" and op == 0:
            assert a.take_copies() == b.take_copies()
        assert state(a) == state(b)
        assert [_fields(s) for s in sa] == [_fields(s) for s in sb]
        b._check_invariants()


def test_block_hashes_none_reads_each_sequences_own_list():
    p = _make_pool("slot")
    seqs = [sc.Sequence(0, num_tokens=200), OwnSeq(1)]
    _admit(p, "slot", seqs)
    for s in seqs:
        s.block_hashes = [7, 8, 9, 10]
    p.checkpoint_many(seqs, [3, 2], [9, 8])
    p.release_pins()
    assert p.resumable_hits(seqs, [4, 4]) == [3, 3]
    assert p.resumable_hits(seqs, np.array([2, 1])) == [2, 0]
    assert p.resumable_hits(seqs, [4, 4], np.array([[7, 8, 9, 10], [1, 2, 3, 4]])) == [3, 0]  # 2-D array
    with pytest.raises(ValueError, match=r"hits\[1\]"):
        p.resumable_hits(seqs, [4, 5])  # past seqs[1]'s own list
    assert p.resumable_hits([], []) == []
    p.checkpoint_many([], [], [])


def test_bad_inputs_name_the_argument_and_change_nothing():
    p = _make_pool("slot")
    seqs = [sc.Sequence(i, num_tokens=200) for i in range(3)]
    _admit(p, "slot", seqs)
    before = _slot_state(p)
    with pytest.raises(ValueError, match=r"hashes\[1\]"):
        p.checkpoint_many(seqs, [1, 2, 3], [5, -1, 6])
    with pytest.raises(ValueError, match=r"seqs\[2\] is seqs\[0\]"):
        p.checkpoint_many([seqs[0], seqs[1], seqs[0]], [1, 2, 3], [5, 6, 7])
    with pytest.raises(TypeError, match=r"seqs\[1\]"):
        p.checkpoint_many([seqs[0], 5], [1, 2], [5, 6])
    with pytest.raises(TypeError, match=r"seqs\[1\]"):
        p.resumable_hits([seqs[0], object()], [1, 1], [[1], [2]])
    with pytest.raises((OverflowError, ValueError), match="hashes"):
        p.checkpoint_many(seqs[:1], [1], [2**70])
    with pytest.raises((OverflowError, ValueError), match="hits"):
        p.resumable_hits(seqs[:1], [2**64], [[1]])
    with pytest.raises(TypeError, match="boundary_blocks"):
        p.checkpoint_many(seqs[:1], [1.5], [5])
    with pytest.raises(TypeError, match="hits"):
        p.resumable_hits(seqs[:1], np.array([1.0]), [[1]])
    with pytest.raises(TypeError, match="seqs"):
        p.checkpoint_many("abc", [1, 2, 3], [5, 6, 7])
    with pytest.raises(ValueError, match="block_hashes has 1 entries"):
        p.resumable_hits(seqs[:2], [1, 1], [[1]])
    seqs[2].state_slots = [p.peek_pop() if hasattr(p, "peek_pop") else 47]
    with pytest.raises((ValueError, IndexError), match=r"seqs\[2\]"):
        p.checkpoint_many(seqs, [1, 2, 3], [5, 6, 7])  # a slot the sequence does not own
    assert _slot_state(p) == before


def test_reentrant_index_in_a_batch_is_harmless():
    """Elements whose __index__ changes the pool and a list being read while
    the batch converts them: the batch uses what it read, and the result is
    what the per-sequence calls give on the values read."""
    p = _make_pool("slot")
    seqs = [sc.Sequence(i, num_tokens=200) for i in range(4)]
    _admit(p, "slot", seqs)
    hashes = [[i * 100 + k for k in range(10)] for i in range(4)]
    p.checkpoint_many(seqs, [5] * 4, [h[4] for h in hashes])
    p.release_pins()
    rows = [list(h) for h in hashes]
    calls = []

    class Evil:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            calls.append(self.v)
            rows[0].clear()  # a list the first scan read in place
            p.pop()  # the pool changes (a vacant slot: no checkpoint lost)
            return self.v

    rows[1][9], rows[2][9] = Evil(109), Evil(209)
    free = p.num_free()
    assert p.resumable_hits(seqs, [10, 10, 10, 10], rows) == [5, 5, 5, 5]
    assert calls == [109, 209] and rows[0] == [] and p.num_free() == free - 2
    p._check_invariants()

    # In checkpoint_many's arguments: converted (and the pool changed) before
    # the batch is checked and applied.
    olds = [s.state_slot for s in seqs[1:]]
    p.checkpoint_many(seqs[1:], [6, 6, Evil(6)], [Evil(105), 205, 305])
    assert calls[2:] == [6, 105]
    assert [p.lookup(h) for h in (105, 205, 305)] == olds
    assert [s.state_fork_src for s in seqs[1:]] == olds
    p._check_invariants()


class _SetterFails(OwnSeq):
    """Raises from the setter of `fail_on` while armed."""

    armed = False
    fail_on = "state_fork_src"

    def __setattr__(self, name, value):
        if name == type(self).fail_on and type(self).armed:
            raise RuntimeError("setter refused")
        object.__setattr__(self, name, value)


@pytest.mark.parametrize("kind", ["slot", "group-fork", "group-copy"])
def test_a_failing_setter_stops_the_batch_at_its_entry(kind):
    # The batch stands for the per-sequence calls in order: the entries before
    # the failing one are filed as their own calls would file them, the failing
    # entry's fields get their values back, and nothing after it changes. The
    # twin runs those per-sequence calls; no copy of the pool is made.
    p, twin = _make_pool(kind), _make_pool(kind)
    good = [OwnSeq(i) for i in range(3)]
    bad = _SetterFails(9)
    seqs = good[:2] + [bad] + good[2:]
    twin_seqs = [OwnSeq(i) for i in (0, 1, 9, 2)]
    _admit(p, kind, seqs)
    _admit(twin, kind, twin_seqs)
    # what checkpoint writes last on an object: fork_src (fork), pending (copy)
    _SetterFails.fail_on = "pending_checkpoint" if kind == "group-copy" else "state_fork_src"
    state = _slot_state if kind == "slot" else _group_state
    fields = [_fields(s) for s in seqs]
    for s, b, h in zip(twin_seqs[:2], [1, 2], [11, 12]):
        twin.checkpoint(s, b, h)
    _SetterFails.armed = True
    try:
        with pytest.raises(RuntimeError, match="setter refused"):
            p.checkpoint_many(seqs, [1, 2, 3, 4], [11, 12, 13, 14])
    finally:
        _SetterFails.armed = False
    assert state(p) == state(twin)
    assert [_fields(s) for s in seqs[:2]] == [_fields(s) for s in twin_seqs[:2]]
    assert [_fields(s) for s in seqs[2:]] == fields[2:]  # the failing entry restored, the last untouched
    p._check_invariants()
    p.checkpoint_many(seqs[2:], [3, 4], [13, 14])  # disarmed: the rest goes through
    assert [_fields(s) for s in seqs[2:]] != fields[2:]
    p._check_invariants()


def test_a_setter_that_reenters_the_pool_is_caught():
    p = _make_pool("slot")

    class Reenter(OwnSeq):
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            if name == "state_fork_src" and getattr(type(self), "armed", False):
                type(self).armed = False
                p.pop()  # changes what the rest of the batch would get

    seqs = [Reenter(0), OwnSeq(1)]
    _admit(p, "slot", seqs)
    before, fields = _slot_state(p), [_fields(s) for s in seqs]
    Reenter.armed = True
    with pytest.raises(RuntimeError, match="changed while"):
        p.checkpoint_many(seqs, [1, 2], [11, 12])
    after = _slot_state(p)
    assert after[2] == before[2] - 1  # only the setter's own pop happened
    assert [_fields(s) for s in seqs] == fields
    p._check_invariants()


def test_coordinator_takes_any_object_with_the_sequence_attributes():
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="g", image_bytes=256)
    c = sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, enabled=True)
    own, native = OwnSeq(1), sc.Sequence(2)
    own.state_slot, native.state_slots = 3, [4]
    c.checkpoint(own, 2, 500)  # per-sequence, own object
    c.checkpoint_many([native], [2], [600])
    own.state_slot = 7  # the drain reads the slot then, as the reference does
    stores, _ = c.take_checkpoint_ops()
    assert sorted(op.src_slot for op in stores) == [4, 7]
    c.complete_previous_batch()
    assert c.resumable_hits([own, native], [1, 1], [[500], [600]]) == [1, 1]
    assert c.resumable_hit(own, 1, [500]) == 1
    assert c.applies(own)
    # a finished own request: its pending boundary and queued restore go
    c.checkpoint_many([own, native], [3, 3], [501, 601])
    assert c.begin_restore(500, 7)
    c.forget_pending_many([own, native])
    stores, restores = c.take_checkpoint_ops()
    assert stores == () and restores == ()
    import gc
    import weakref

    r = weakref.ref(own)
    c.checkpoint(own, 4, 502)
    del own
    gc.collect()
    assert r() is not None  # kept alive while its boundary is pending
    c.take_checkpoint_ops()
    gc.collect()
    assert r() is None  # and let go once drained
    c.check_consistency()


def test_coordinator_refused_batch_files_nothing():
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="g", image_bytes=256)
    c = sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, enabled=True)
    seqs = [OwnSeq(i) for i in range(3)]
    for i, s in enumerate(seqs):
        s.state_slot = i
    with pytest.raises(ValueError, match=r"hashes\[2\]"):
        c.checkpoint_many(seqs, [1, 1, 1], [5, 6, -1])
    with pytest.raises(ValueError, match="boundary_blocks"):
        c.checkpoint_many(seqs, [1, -1, 1], [5, 6, 7])
    with pytest.raises(ValueError, match="once per batch"):
        c.checkpoint_many([seqs[0], seqs[0]], [1, 1], [5, 6])
    with pytest.raises(TypeError, match=r"seqs\[1\]"):
        c.checkpoint_many([seqs[0], None], [1, 1], [5, 6])
    assert c.take_checkpoint_ops() == ((), ())
    assert c.checkpoint_fates()["checkpoints_dropped"] == 0
    c.check_consistency()


def test_group_release_many():
    p = _make_pool("group-fork")
    gs = [p.pop() for _ in range(3)]
    before = _group_state(p)
    with pytest.raises(ValueError, match="listed twice"):
        p.release_many([gs[0], gs[0]])
    with pytest.raises(ValueError, match="already free"):
        p.release_many([gs[0], 40])
    with pytest.raises(IndexError):
        p.release_many([gs[0], 4000])
    assert _group_state(p) == before
    p.release_many(None)
    p.release_many([])
    p.release_many(np.array([-1, gs[1], gs[2]]))
    p.release_many((gs[0],))
    assert p.num_free() == 48


def test_coordinator_batch_with_a_tier_mutating_the_hash_lists():
    """A tier's vote runs Python code between reads: every hash list (the
    caller's, a statecache.Sequence's own) was snapshotted before the scan, so
    what the vote does to them changes neither the answer nor the
    coordinator."""
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="t", image_bytes=256)
    hashes = [1, 2, 3, 4, 5, 6]
    seqs = [sc.Sequence(0), sc.Sequence(1)]
    for i, s in enumerate(seqs):
        s.state_slots = [i]
        s.block_hashes = [7, 8, 9]

    class Tier:
        def could_serve(self, h):
            hashes.clear()
            seqs[1].block_hashes = [1]  # the C++ vector behind seqs[1] is replaced
            return h == 1

    c = sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, True, offload=Tier())
    assert c.resumable_hits(seqs[:1], [6], [hashes]) == [1] and hashes == []
    assert c.resumable_hit(seqs[0], 3, [1, 2, 3]) == 1
    seqs[1].block_hashes = [7, 8, 9]
    assert c.resumable_hits(seqs, [3, 3]) == [0, 0]  # seqs[1]'s own list replaced mid-batch
    assert list(seqs[1].block_hashes) == [1]
    seqs[1].block_hashes = [7, 8, 9]
    assert c.resumable_hits(seqs, [3, 1], [(5, 6, 7), [1]]) == [0, 1]
    c.check_consistency()


# ------------------------------------------------------------ begin_restores --


def _restore_twins(seed):
    """Two coordinators with the same READY images (and a COPYING one)."""
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="r", image_bytes=256)
    out = []
    for _ in range(2):
        c = sc.PagedStateCheckpointCoordinator(sc.BlockPool(128), spec, enabled=True)
        seqs = []
        for i in range(8):
            s = sc.Sequence(i, num_tokens=100)
            s.state_slots = [i]
            seqs.append(s)
        c.checkpoint_many(seqs, [1] * 8, [100 + i for i in range(8)])
        c.take_checkpoint_ops()
        c.complete_previous_batch()
        c.complete_previous_batch()  # READY: 100..107
        c.checkpoint(seqs[0], 2, 200)
        c.take_checkpoint_ops()  # 200 is COPYING
        out.append(c)
    return out


def _store_state(c):
    recs = sorted((r.prefix_hash, r.state, r.pin_count, tuple(r.unit_ids)) for r in c.store.records.values())
    return recs


@pytest.mark.parametrize("seed", range(6))
def test_begin_restores_equals_begin_restore_calls(seed):
    rng = random.Random(seed)
    a, b = _restore_twins(seed)
    pool_hashes = [100 + i for i in range(8)] + [200, 999, -1]
    for _ in range(6):
        n = rng.randrange(0, 12)
        hs = [rng.choice(pool_hashes) for _ in range(n)]
        slots = [rng.randrange(4) for _ in range(n)]  # slots repeat on purpose
        want = [a.begin_restore(h, s) for h, s in zip(hs, slots)]
        args = (np.array(hs, dtype=np.int64), np.array(slots, dtype=np.int64)) if rng.random() < 0.5 else (hs, slots)
        assert b.begin_restores(*args) == want
        assert _store_state(a) == _store_state(b)
        ops_a, ops_b = a.take_checkpoint_ops(), b.take_checkpoint_ops()
        assert ops_a == ops_b
        assert [(o.dst_slot, o.unit_ids) for o in ops_a[1]] == [(o.dst_slot, o.unit_ids) for o in ops_b[1]]
        if rng.random() < 0.5:
            a.complete_previous_batch()
            b.complete_previous_batch()
        # LRU order: evicting one image at a time takes the same ones.
        assert a.store.has_available_units(104) == b.store.has_available_units(104)
        assert _store_state(a) == _store_state(b)
        a.check_consistency()
        b.check_consistency()


def test_begin_restores_refused_batch_queues_nothing():
    (c, _) = _restore_twins(0)
    before = _store_state(c)
    with pytest.raises(ValueError, match=r"dst_slots\[2\]"):
        c.begin_restores([100, 101, 102], [0, 1, -1])
    with pytest.raises(ValueError, match="dst_slots"):
        c.begin_restores([100, 101], [0])
    with pytest.raises(TypeError, match=r"hashes\[1\]"):
        c.begin_restores([100, "x"], [0, 1])
    with pytest.raises(TypeError, match=r"dst_slots\[0\]"):
        c.begin_restores([100], [None])
    with pytest.raises(TypeError, match="hashes"):
        c.begin_restores(None, [0])
    with pytest.raises(OverflowError):
        c.begin_restores([2**70], [0])
    with pytest.raises(TypeError):
        c.begin_restores([100])
    assert _store_state(c) == before
    assert c.take_checkpoint_ops()[1] == ()
    assert c.begin_restores([], []) == []
    assert c.begin_restores(hashes=[100], dst_slots=[3]) == [True]
    c.check_consistency()


def _resize_away(arr, junk):
    """Frees `arr`'s memory (NumPy lets a resize go ahead without a refcheck,
    buffer exports or not) and hands memory of that size to junk arrays."""
    n = arr.size
    arr.resize(n * 64, refcheck=False)
    junk.extend(np.full(n, -7, dtype=np.int64) for _ in range(8))


def test_hash_arrays_are_not_read_in_place_across_a_tier_vote():
    """A tier's vote (Python) resizes the int64 hash array being scanned, and
    the hits array: the scan answers from copies taken before the first vote
    (it read freed memory before)."""
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="t", image_bytes=256)
    junk = []
    hashes = np.arange(100, 164, dtype=np.int64)
    hits = np.array([64], dtype=np.int64)
    asked = []

    class Tier:
        def could_serve(self, h):
            asked.append(h)
            if len(asked) == 1:
                _resize_away(hashes, junk)
                _resize_away(hits, junk)
            return h == 110

    c = sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, True, offload=Tier())
    s = sc.Sequence(0)
    s.state_slots = [0]
    assert c.resumable_hits([s], hits, hashes[None, :].copy()) == [11]
    asked.clear()
    hashes = np.arange(100, 164, dtype=np.int64)
    hits = np.array([64], dtype=np.int64)
    assert c.resumable_hits([s], hits, [hashes]) == [11]
    assert asked == list(range(163, 109, -1))
    asked.clear()
    hashes = np.arange(100, 164, dtype=np.int64)
    assert c.resumable_hit(s, 64, hashes) == 11
    c.check_consistency()


def test_arrays_are_not_read_in_place_across_an_engine_objects_getter():
    """An engine object's attribute getter (Python) runs after the batch's
    array arguments were taken; one that resizes them changes nothing the
    batch reads."""
    junk = []
    p = sc.StateSlotPool(16, sc.StateTransfer.fork(1))
    blocks = np.array([1, 1], dtype=np.int64)
    hashes = np.array([501, 502], dtype=np.int64)
    hits = np.array([2, 2], dtype=np.int64)

    class Resizing(OwnSeq):
        @property
        def has_per_req_cache(self):
            for a in (blocks, hashes, hits):
                if a.size == 2:
                    _resize_away(a, junk)
            return True

        @has_per_req_cache.setter
        def has_per_req_cache(self, v):
            pass

    seqs = [Resizing(0), OwnSeq(1)]
    for s in seqs:
        s.state_slot = p.pop()
    olds = [s.state_slot for s in seqs]
    p.checkpoint_many(seqs, blocks, hashes)
    assert [p.lookup(h) for h in (501, 502)] == olds
    blocks, hashes, hits = (np.array(v, dtype=np.int64) for v in ([1, 1], [501, 502], [2, 2]))
    assert p.resumable_hits(seqs, hits, [np.array([7, 501]), np.array([7, 502])]) == [2, 2]
    p._check_invariants()


def test_a_hash_array_read_in_place_is_copied_before_an_elements_index_runs():
    """Without Python code in the scan an int64 row is read in place; when
    another row holds an element with ``__index__`` (which runs Python code
    and here frees that array), the batch copies the array before converting
    the element, and answers from the copy."""
    junk = []
    p = sc.StateSlotPool(16, sc.StateTransfer.fork(1))
    seqs = [sc.Sequence(i, num_tokens=200) for i in range(2)]
    for s in seqs:
        s.state_slots = [p.pop()]
    p.checkpoint_many(seqs, [2, 2], [702, 802])
    p.release_pins()
    row = np.array([701, 702, 703], dtype=np.int64)

    class Frees:
        def __index__(self):
            _resize_away(row, junk)
            return 801

    assert p.resumable_hits(seqs, [3, 3], [row, [Frees(), 802, 803]]) == [2, 2]
    matrix = np.array([[701, 702, 703], [801, 802, 803]], dtype=np.int64)
    assert p.resumable_hits(seqs, [3, 3], matrix) == [2, 2]
    p._check_invariants()
