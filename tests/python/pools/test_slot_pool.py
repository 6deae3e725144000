"""StateSlotPool: the reference's documented behaviours (each checked on both
the reference class and ours), bad input, and differential random sequences."""

import gc
import zlib

import numpy as np
import pytest

import statecache as sc
from pool_diff import SLOT_TRANSFERS, SlotDriver
from reference import load

REF = load("slot_pool")
needs_ref = pytest.mark.skipif(REF is None, reason="behaviour reference not found beside the checkout")

IMPLS = ["ours"] + (["reference"] if REF is not None else [])


def make(impl, n, transfer=None, **kw):
    cls = sc.StateSlotPool if impl == "ours" else REF.StateSlotPool
    return cls(n, transfer or sc.StateTransfer.fork(2), **kw)


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def seq_with(slot, num_tokens=100, **fields):
    s = sc.Sequence(num_tokens=num_tokens, num_prompt_tokens=num_tokens)
    s.state_slots = [slot]
    for k, v in fields.items():
        setattr(s, k, v)
    return s


def checkpointed(pool, slot, h):
    """Make `slot` (owned) a free checkpoint filed under `h` via a midstep-free
    path that both classes share: fork checkpoint, then two passes."""
    s = seq_with(slot, checkpoint_end_pos=4)
    pool.checkpoint(s, 2, h)  # hbs 2 * 2 blocks == anchor: not speculative
    pool.release_pins()
    pool.release_pins()
    return s


# ------------------------------------------------------------ free list --


def test_vacant_lowest_index_first(impl):
    p = make(impl, 4)
    assert [p.pop(), p.pop(), p.pop()] == [0, 1, 2]
    p.release(2)
    p.release(0)
    assert p.pop() == 0 and p.pop() == 2
    assert p.num_free() == 1 and p.has_free() is True and p.has_free(2) is False
    assert p.has_free(0) is True


def test_vacant_drawn_before_checkpoints_and_eviction_counted(impl):
    p = make(impl, 4, hash_block_size=2)
    p.pop()  # slot 0 becomes a checkpoint below
    s = checkpointed(p, 0, 77)  # seq moved to slot 1; 0 holds 77
    assert p.holds_checkpoint(0) is True and p.lookup(77) == 0
    assert s.state_slot == 1
    # vacant 2, 3 come before the checkpoint on 0
    assert [p.pop(), p.pop()] == [2, 3]
    assert p.checkpoints_evicted == 0
    assert p.pop() == 0
    assert p.checkpoints_evicted == 1 and p.lookup(77) == -1 and dict(p.hash_to_slot) == {}
    with pytest.raises(IndexError):
        p.pop()


def test_checkpoints_spent_in_lru_order_and_claim_refreshes(impl):
    p = make(impl, 6, hash_block_size=2)
    owners = [p.pop() for _ in range(3)]  # 0, 1, 2
    for slot, h in zip(owners, (10, 11, 12)):
        checkpointed(p, slot, h)  # each seq moves to a fresh slot (3, 4, 5)
    assert p.num_free() == 3
    # resume from 10: claim then release puts it at the LRU tail
    p.claim(0)
    p.release(0)
    assert [p.pop(), p.pop(), p.pop()] == [1, 2, 0]
    assert p.checkpoints_evicted == 3


def test_speculative_spent_first_and_promote(impl):
    p = make(impl, 6, hash_block_size=2)
    a, b = p.pop(), p.pop()
    sa = seq_with(a, checkpoint_end_pos=4)
    sb = seq_with(b, checkpoint_end_pos=4)
    p.checkpoint(sa, 2, 20)  # anchor: kept at the tail
    p.checkpoint(sb, 3, 21)  # 3 * 2 != 4: a guess, marked speculative
    p.release_pins()
    p.release_pins()
    for _ in range(2):  # drain the vacant slots
        p.pop()
    assert p.pop() == b  # the guess goes first though it was filed last
    # promote moves a free speculative checkpoint to the tail
    p2 = make(impl, 6, hash_block_size=2)
    a, b = p2.pop(), p2.pop()
    p2.checkpoint(seq_with(a, checkpoint_end_pos=4), 2, 30)
    p2.checkpoint(seq_with(b), 2, 31)  # no anchor at all: everything is a guess
    p2.release_pins()
    p2.release_pins()
    p2.promote(b)
    p2.promote(b)  # second promote is a no-op
    for _ in range(2):
        p2.pop()
    assert [p2.pop(), p2.pop()] == [a, b]


def test_mark_speculative_disabled_pool_is_noop(impl):
    p = make(impl, 3, enabled=False)
    assert p.enabled is False
    x = p.pop()
    p.mark_speculative(x)
    p.release(x)
    assert p.pop() == x and p.checkpoint_fates()["checkpoints_kept"] == 0


def test_pop_many_release_many_forms(impl):
    p = make(impl, 5)
    assert p.pop_many(0) == []
    got = p.pop_many(3)
    assert got == [0, 1, 2] and type(got) is list
    p.release_many([-1, got[1], -1])
    p.release_many(())
    p.release_many([])
    p.release_many((got[0], -1))
    assert p.num_free() == 4
    p.release_many(None)
    p.release_many(0)
    two = p.pop_many(2)
    p.release_many({two[0]})
    p.release_many(x for x in [two[1], -1])
    assert p.num_free() == 4
    p.extend(0)
    assert p.num_slots == 5


# ------------------------------------------------------------------ pins --


def test_checkpoint_pins_source_through_next_pass(impl):
    p = make(impl, 4, hash_block_size=2)
    s = seq_with(p.pop(), checkpoint_end_pos=4)
    p.checkpoint(s, 2, 5)
    assert (s.state_slot, s.state_fork_src) == (1, 0)
    assert p.is_pinned(0) is True and p.pin_count(0) == 1 and p.is_free(0) is False
    assert p.lookup(5) == 0  # filed, though not free
    p.release_pins()
    assert p.is_pinned(0) is True  # deferred: read by the batch this pass builds
    p.release_pins()
    assert p.is_pinned(0) is False and p.holds_checkpoint(0) is True
    assert p.checkpoints_kept == 1


def test_plain_pin_clears_after_one_pass_and_counts(impl):
    p = make(impl, 4)
    x = p.pop()
    p.pin(x)
    p.pin(x, reader_is_next_batch=False)
    assert p.pin_count(x) == 2
    p.release_pins()
    assert p.is_pinned(x) is False and p.is_free(x) is True  # goes back once
    assert p.num_free() == 4


def test_unpin_and_drop_reader(impl):
    p = make(impl, 4)
    x = p.pop()
    p.pin(x)
    p.pin(x)
    p.drop_reader(x)
    assert p.pin_count(x) == 1 and not p.is_free(x)
    p.drop_reader(x)
    assert not p.is_pinned(x) and p.is_free(x)
    p.drop_reader(-1)  # tolerated
    p.drop_reader(x)  # not pinned: nothing
    y = p.pop()
    p.pin(y, reader_is_next_batch=True)
    p.unpin(y)  # the caller took it over
    assert not p.is_pinned(y) and not p.is_free(y)
    p.unpin(y)  # unpinned: nothing
    p.release_pins()
    assert not p.is_free(y)


# ----------------------------------------------------------- retirement --


def test_retire_top_vacant(impl):
    p = make(impl, 3)
    r = p.retire_top()
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (2, -1, False)
    assert type(r).__name__ == "SlotRetirement" and p.num_slots == 2 and p.num_free() == 2
    assert len(p.slot_hash) == 3  # grown, never shrunk
    p.extend(2)
    assert p.num_slots == 4 and len(p.slot_hash) == 4 and p.num_free() == 4


def test_retire_top_rehomes_checkpoint_keeping_lru_position(impl):
    # The top (4) becomes a checkpoint with vacant room below.
    p = make(impl, 5, hash_block_size=2)
    live = [p.pop() for _ in range(5)]
    s = seq_with(4, checkpoint_end_pos=4)
    p.release(live[0])  # 0 vacant: the fresh slot for the fork
    p.checkpoint(s, 2, 50)  # seq 4 -> 0, 4 filed under 50
    p.release_pins()
    p.release_pins()
    p.release(live[1])  # 1 vacant: where the top's checkpoint moves
    r = p.retire_top()
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (4, 1, True)
    assert p.lookup(50) == 1 and p.holds_checkpoint(1) and p.slot_hash[1] == 50 and p.slot_hash[4] == -1
    assert p.num_slots == 4


def test_retire_top_live_relocates_and_spends_lru_when_no_vacant(impl):
    p = make(impl, 4, hash_block_size=2)
    slots = p.pop_many(4)
    r = p.retire_top()
    assert r is None  # top live, nowhere to go
    s = seq_with(slots[0], checkpoint_end_pos=4)
    p.release(slots[1])
    p.checkpoint(s, 2, 60)  # seq 0 -> 1; 0 filed under 60
    p.release_pins()
    p.release_pins()
    # only free slot is the checkpoint on 0: the live top moves there, spending it
    r = p.retire_top()
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (3, 0, False)
    assert p.lookup(60) == -1 and p.checkpoints_evicted == 0 and p.num_free() == 0


def test_retire_top_only_checkpoint_left_is_spent(impl):
    p = make(impl, 2, hash_block_size=2)
    a, b = p.pop(), p.pop()
    p.release(a)
    s = seq_with(b, checkpoint_end_pos=4)
    p.checkpoint(s, 2, 70)  # seq 1 -> 0; 1 filed
    p.release_pins()
    p.release_pins()
    r = p.retire_top()
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (1, -1, True)
    assert p.lookup(70) == -1 and p.num_slots == 1


def test_retire_top_pinned_or_empty_is_none(impl):
    p = make(impl, 2)
    p.pop()  # slot 0 owned too: the top cannot move down
    b = p.pop()
    p.pin(b)
    assert p.retire_top() is None
    q = make(impl, 0)
    assert q.retire_top() is None and q.enabled is False


# --------------------------------------------------------------- lookup --


def test_resumable_hit_min_fork_tokens(impl):
    p = make(impl, 8, sc.StateTransfer.fork(3), hash_block_size=2)
    hashes = [100, 101, 102, 103, 104]
    for h in (102, 104):  # boundaries L=3 and L=5
        checkpointed(p, p.pop(), h)
    s = sc.Sequence(num_tokens=10)
    # L=5: 10-10 < 3; L=3: 10-6 >= 3
    assert p.resumable_hit(s, 5, hashes) == 3
    assert p.resumable_hit(s, 5, tuple(hashes)) == 3
    assert p.resumable_hit(s, 5, np.asarray(hashes, dtype=np.int64)) == 3
    assert p.resumable_hit(s, 2, hashes) == 0
    assert p.resumable_hit(s, 5, hashes, True) == 3  # 10 - 2*3 >= 3
    assert p.resumable_hit(s, 5, hashes, assume_checkpointed=True) == 3
    assert p.resumable_hit(s, 0, []) == 0
    s.has_per_req_cache = False
    assert p.resumable_hit(s, 5, hashes) == 5


def test_replay_returns_hit_and_keeps_nothing(impl):
    p = make(impl, 4, sc.StateTransfer.replay())
    s = seq_with(p.pop())
    assert p.resumable_hit(s, 3, [1, 2, 3]) == 3
    p.checkpoint(s, 2, 9)
    assert p.checkpoint_fates() == {
        "checkpoints_kept": 0,
        "checkpoints_dropped": 0,
        "checkpoints_evicted": 0,
        "checkpoints_orphaned": 0,
    }
    assert p.successor_room == float("inf") and p.min_fork_tokens == 0


def test_checkpoint_dropped_without_free_slot(impl):
    p = make(impl, 1)
    s = seq_with(p.pop())
    p.checkpoint(s, 1, 3)
    assert p.checkpoints_dropped == 1 and s.state_slot == 0 and p.lookup(3) == -1


# -------------------------------------------------------------- midstep --


def test_midstep_reserve_publish_cancel(impl):
    p = make(impl, 6, sc.StateTransfer.fork(2, readable_midstep=True), hash_block_size=2)
    assert p.readable_midstep is True
    s = seq_with(p.pop(), midstep_anchor_pos=8)
    res = p.reserve_midstep(s, [(4, 40), (8, 80)])
    assert res == [(1, 4, 40), (2, 8, 80)] and type(res) is list and type(res[0]) is tuple
    assert p.lookup(40) == -1  # nothing findable before the bytes exist
    p.publish_midstep(res, s)
    assert p.lookup(40) == 1 and p.lookup(80) == 2 and p.checkpoints_kept == 2
    assert p.holds_checkpoint(1) and p.holds_checkpoint(2)
    # 4 != anchor 8: speculative, so spent before 80 once vacant slots run out
    p.pop_many(3)
    assert p.pop() == 1 and p.pop() == 2
    # cancel returns slots vacant, unindexed
    q = make(impl, 3, sc.StateTransfer.fork(2, readable_midstep=True))
    s = seq_with(q.pop())
    res = q.reserve_midstep(s, [(2, 7), (4, 8), (6, 9)])
    assert len(res) == 2 and q.checkpoints_dropped == 1  # stops at the first shortage
    q.cancel_midstep([tuple(r) for r in res])
    assert q.num_free() == 2 and dict(q.hash_to_slot) == {}


def test_publish_midstep_seq_forms(impl):
    for form in ("none", "omitted", "seq"):
        p = make(impl, 6, sc.StateTransfer.fork(2, readable_midstep=True))
        s = seq_with(p.pop())  # no anchor
        res = p.reserve_midstep(s, [(2, 5)])
        if form == "none":
            p.publish_midstep(res, None)
        elif form == "omitted":
            p.publish_midstep(res)
        else:
            p.publish_midstep(res, s)
        p.pop_many(4)
        slot = res[0][0]
        other = p.pop()  # the published checkpoint is the only free slot left
        assert other == slot and p.checkpoints_evicted == 1


def test_reserve_midstep_needs_readable_backend(impl):
    p = make(impl, 4)
    s = seq_with(p.pop())
    assert p.reserve_midstep(s, [(2, 5)]) == []


# --------------------------------------------------------- index upkeep --


def test_unindex_orphans_and_returns_none(impl):
    p = make(impl, 4, hash_block_size=2)
    checkpointed(p, p.pop(), 90)
    assert p.unindex(90) is None
    assert p.checkpoints_orphaned == 1 and p.lookup(90) == -1 and not p.holds_checkpoint(0)
    assert p.unindex(90) is None and p.checkpoints_orphaned == 1
    checkpointed(p, p.pop(), 91)
    p.clear_index()
    assert dict(p.hash_to_slot) == {} and p.checkpoints_orphaned == 1


def test_fates_occupancy_relocations(impl):
    p = make(impl, 4, hash_block_size=2)
    checkpointed(p, p.pop(), 1)
    occ = p.occupancy()
    assert occ == {"slots_total": 4, "slots_used": 1, "slots_held": 1, "slots_vacant": 2}
    assert list(occ) == ["slots_total", "slots_used", "slots_held", "slots_vacant"]
    assert list(p.checkpoint_fates()) == [
        "checkpoints_kept",
        "checkpoints_dropped",
        "checkpoints_evicted",
        "checkpoints_orphaned",
    ]
    p.record_relocation(3, 1)
    p.record_relocation(2, 0)
    assert p.take_relocations() == ((3, 1), (2, 0))
    assert p.take_relocations() == ()


def test_invalidate_when_disabled_is_noop(impl):
    p = make(impl, 2, enabled=False)
    p.invalidate(1)
    assert p.lookup(5) == -1 and p.unindex(5) is None and p.checkpoints_orphaned == 0


# ------------------------------------------------------- ours: the views --


def test_views_are_live_mapping_and_sequence():
    from collections.abc import Mapping
    from collections.abc import Sequence as Seq

    p = make("ours", 4, hash_block_size=2)
    idx, hashes = p.hash_to_slot, p.slot_hash
    assert isinstance(idx, Mapping) and isinstance(hashes, Seq)
    checkpointed(p, p.pop(), 123)
    assert 123 in idx and idx[123] == 0 and idx.get(123) == 0 and idx.get(5) is None and len(idx) == 1
    assert list(idx.keys()) == [123] and list(idx.values()) == [0] and list(idx.items()) == [(123, 0)]
    assert idx == {123: 0} and {123: 0} == idx and idx != {1: 2}
    assert list(idx) == [123]
    with pytest.raises(KeyError):
        idx[5]
    assert hashes == [123, -1, -1, -1] and hashes[0] == 123 and hashes[-1] == -1 and len(hashes) == 4
    assert hashes[1:3] == [-1, -1] and 123 in hashes and hashes.count(-1) == 3
    with pytest.raises(IndexError):
        hashes[4]
    del p
    gc.collect()
    assert idx[123] == 0  # the view keeps its pool alive


def test_retirement_is_a_frozen_value():
    a = sc.SlotRetirement(3, -1, False)
    assert a == sc.SlotRetirement(retired=3, relocated_to=-1, held_checkpoint=False)
    assert a != sc.SlotRetirement(3, 1, False) and hash(a) == hash(sc.SlotRetirement(3, -1, False))
    assert repr(a) == "SlotRetirement(retired=3, relocated_to=-1, held_checkpoint=False)"
    assert a != sc.GroupRetirement(3, -1, False)
    with pytest.raises(AttributeError):
        a.retired = 4
    assert type(a.held_checkpoint) is bool


def test_scratch_slot_source_shares_the_pool():
    # The PAGE coordinator borrows scratch through ScratchSlotSource; from
    # Python all that shows is that the pool is the same object.
    p = sc.StateSlotPool(2, sc.StateTransfer.fork(1))
    assert p.has_free(2) and p.pop() == 0


# ------------------------------------------------------------ bad input --


def snapshot(p):
    return (
        p.num_slots,
        list(p.slot_hash),
        list(p.hash_to_slot.items()),
        p.checkpoint_fates(),
        p.num_free(),
        p._debug_state(),
        p._debug_relocations(),
    )


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda p: p.release(99), IndexError, "slot=99"),
        (lambda p: p.release(-2), IndexError, "slot=-2"),
        (lambda p: p.release(3), ValueError, "slot=3: is already free"),
        (lambda p: p.release(1), ValueError, "slot=1: is pinned"),
        (lambda p: p.release_many([0, 0]), ValueError, "slot=0"),
        (lambda p: p.release_many([0, 3]), ValueError, "slot=3"),
        (lambda p: p.release_many([0, "x"]), TypeError, "slots"),
        (lambda p: p.claim(0), ValueError, "slot=0: is not free"),
        (lambda p: p.claim(12), IndexError, "slot=12"),
        (lambda p: p.pin(3), ValueError, "slot=3: is free"),
        (lambda p: p.pin(7), IndexError, "slot=7"),
        (lambda p: p.mark_speculative(9), IndexError, "slot=9"),
        (lambda p: p.invalidate(9), IndexError, "slot=9"),
        (lambda p: p.has_free(-1), ValueError, "count=-1"),
        (lambda p: p.pop_many(-1), ValueError, "count=-1"),
        (lambda p: p.pop_many(3), IndexError, "count=3"),
        (lambda p: p.extend(-2), ValueError, "count=-2"),
        (lambda p: p.release("1"), TypeError, "slot"),
        (lambda p: p.release(1.0), TypeError, "slot"),
        (lambda p: p.checkpoint(object(), 1, 2), TypeError, "seq"),
        (lambda p: p.checkpoint(seq_with(3), 1, 2), ValueError, "seq.state_slot=3"),
        (lambda p: p.checkpoint(seq_with(8), 1, 2), IndexError, "seq.state_slot=8"),
        (lambda p: p.resumable_hit(None, 1, [1]), TypeError, "seq"),
        (lambda p: p.resumable_hit(sc.Sequence(num_tokens=9), -1, [1]), ValueError, "hit=-1"),
        (lambda p: p.resumable_hit(sc.Sequence(num_tokens=9), 3, [1]), IndexError, "hit=3"),
        (lambda p: p.resumable_hit(sc.Sequence(num_tokens=9), 2, np.array([1.0, 2.0])), TypeError, "block_hashes"),
        (lambda p: p.resumable_hit(sc.Sequence(num_tokens=9), 2, "ab"), TypeError, "block_hashes"),
        (lambda p: p.resumable_hit(sc.Sequence(num_tokens=9), 1, [1], "yes"), TypeError, "assume_checkpointed"),
        (lambda p: p.publish_midstep([(3, 2, 5)]), ValueError, "slot=3"),
        (lambda p: p.publish_midstep([(0, 2)]), ValueError, r"reservations\[0\] must be a \(slot, position, hash\)"),
        (lambda p: p.publish_midstep([(0, 2, 5), (0, 4, 6)]), ValueError, "slot=0"),
        (lambda p: p.cancel_midstep([(9, 2, 5)]), IndexError, "slot=9"),
        (
            lambda p: p.reserve_midstep(sc.Sequence(), [(1,)]),
            ValueError,
            r"positions\[0\] must be a \(position, hash\)",
        ),
        (lambda p: p.publish_midstep([5]), TypeError, r"reservations\[0\]"),
        (lambda p: p.record_relocation(0, 77), IndexError, "dst=77"),
        (lambda p: p.pin(0, True), TypeError, "positional argument"),
    ],
)
def test_bad_input_raises_before_anything_changes(call, exc, match):
    p = sc.StateSlotPool(4, sc.StateTransfer.fork(2, readable_midstep=True), hash_block_size=2)
    p.pop_many(3)  # 0, 1, 2 owned; 3 free
    p.pin(1)
    before = snapshot(p)
    with pytest.raises(exc, match=match):
        call(p)
    assert snapshot(p) == before
    p._check_invariants()


def test_non_int_hash_raises_type_error():
    p = sc.StateSlotPool(4, sc.StateTransfer.fork(1))
    checkpointed(p, p.pop(), 5)
    with pytest.raises(TypeError, match=r"block_hashes\[1\]"):
        p.resumable_hit(sc.Sequence(num_tokens=99), 2, [1, "a"])
    assert p.resumable_hit(sc.Sequence(num_tokens=99), 2, [5, 6]) == 1


def test_pop_on_empty_changes_nothing():
    p = sc.StateSlotPool(1)
    p.pop()
    before = snapshot(p)
    with pytest.raises(IndexError):
        p.pop()
    assert snapshot(p) == before


@pytest.mark.parametrize(
    "args, kwargs, exc",
    [
        ((4, sc.StateTransfer.copy()), {}, ValueError),
        ((-1,), {}, ValueError),
        ((4,), {"hash_block_size": 0}, ValueError),
        ((4, "fork"), {}, TypeError),
        (("4",), {}, TypeError),
    ],
)
def test_bad_construction(args, kwargs, exc):
    with pytest.raises(exc):
        sc.StateSlotPool(*args, **kwargs)


def test_defaults_match_reference():
    p = sc.StateSlotPool(3)
    assert p.transfer == sc.StateTransfer.none() and p.hash_block_size == 1 and p.enabled is True
    assert p.min_fork_tokens == 0 and p.readable_midstep is False and p.successor_room == float("inf")
    assert p.unindex(4) is None and p.release_pins() is None and p.extend(0) is None


# ---------------------------------------------------------- differential --


@needs_ref
@pytest.mark.parametrize("profile", ["mixed", "idle", "shrink"])
@pytest.mark.parametrize("transfer", sorted(SLOT_TRANSFERS))
@pytest.mark.parametrize("seed", range(4))
def test_differential_random_sequences(seed, transfer, profile):
    size = (4, 6, 9, 12)[seed]
    SlotDriver(
        seed * 7919 + zlib.crc32(f"{transfer}/{profile}".encode()) % 1000,
        transfer,
        size=size,
        hbs=1 + seed % 3,
        profile=profile,
    ).run(500)


@needs_ref
@pytest.mark.parametrize("transfer", sorted(SLOT_TRANSFERS))
@pytest.mark.parametrize("seed", range(2))
def test_differential_disabled(seed, transfer):
    SlotDriver(1000 + seed, transfer, enabled=False, size=5).run(300)
    SlotDriver(2000 + seed, transfer, enabled=True, size=0).run(100)


@needs_ref
@pytest.mark.parametrize("module, cls_name", [("slot_pool", "StateSlotPool"), ("group_pool", "StateGroupPool")])
def test_public_api_matches_reference(module, cls_name):
    import inspect

    ref_cls = getattr(load(module), cls_name)
    ours_cls = getattr(sc, cls_name)
    ref_obj = ref_cls(2, sc.StateTransfer.fork(1))
    ours_obj = ours_cls(2, sc.StateTransfer.fork(1))
    public = {n for n in dir(ref_cls) if not n.startswith("_")} | {n for n in vars(ref_obj) if not n.startswith("_")}
    compared = 0
    for name in sorted(public):
        assert hasattr(ours_obj, name), f"{cls_name}.{name} is missing"
        ref_attr = getattr(ref_obj, name)
        if not callable(ref_attr):
            continue
        try:
            ours_sig = inspect.signature(getattr(ours_obj, name))
        except (TypeError, ValueError):
            continue  # bound through pybind11 without a text signature
        ref_params = [(p.name, p.kind, p.default) for p in inspect.signature(ref_attr).parameters.values()]
        ours_params = [(p.name, p.kind, p.default) for p in ours_sig.parameters.values()]
        assert ours_params == ref_params, f"{cls_name}.{name}: {ours_params} != {ref_params}"
        compared += 1
    assert compared >= 15


@needs_ref
@pytest.mark.parametrize("transfer", sorted(SLOT_TRANSFERS))
@pytest.mark.parametrize("seed", range(3))
def test_differential_engine_request_class(seed, transfer):
    """Ours driven with a plain request class (no statecache base), the
    reference with statecache.Sequence: same results and fields (docs/contract.md, "API guarantees")."""
    SlotDriver(
        3000 + seed,
        transfer,
        size=(5, 8, 11)[seed],
        hbs=1 + seed % 2,
        profile=("mixed", "idle", "shrink")[seed],
        plain_seqs=True,
    ).run(400)


@needs_ref
@pytest.mark.parametrize("transfer", sorted(SLOT_TRANSFERS))
@pytest.mark.parametrize("seed", range(3))
def test_differential_unsigned_hashes(seed, transfer):
    """An engine that hashes unsigned (the reference project's xxh64): hashes
    at and above 2**63 mean what the reference makes them mean, and every one
    comes back as the int given (index keys, per-index hashes, pending
    checkpoints), compared with the reference after every step."""
    SlotDriver(5000 + seed, transfer, size=(4, 6, 9)[seed], hbs=1 + seed % 2, unsigned_hashes=True).run(500)
