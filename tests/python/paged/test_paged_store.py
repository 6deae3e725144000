"""PageUnitCheckpointStore: the behaviours the reference documents, one by one."""

import collections.abc

import pytest

import statecache as sc
from paged_harness import FakeClock, check_conservation

SPEC = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=350)  # 4 units


def make(num_blocks=16, sink=False):
    pool = sc.BlockPool(num_blocks)
    return pool, sc.PageUnitCheckpointStore(pool, SPEC, offload_sink=sink)


def ready(store, h, slot=0):
    op = store.begin_store(h, slot)
    assert op is not None
    store.complete_inflight()
    return op


def test_attributes_and_views():
    pool, store = make()
    assert store.pool is pool and store.spec == SPEC and store.units_per_checkpoint == 4
    assert (store.generation, store.evictions, store.offload_pins_reclaimed, store.offload_nominations_dropped) == (
        0,
        0,
        0,
        0,
    )
    ready(store, 5)
    assert isinstance(store.records, collections.abc.Mapping)
    assert isinstance(store.hash_to_checkpoint, collections.abc.Mapping)
    assert dict(store.hash_to_checkpoint) == {5: 0} and 5 in store.hash_to_checkpoint
    assert store.records[0] == sc.CheckpointRecord(5, (0, 1, 2, 3), "READY", 0)
    assert list(store.records) == [0] and store.records.get(9) is None
    with pytest.raises(KeyError):
        store.records[9]


def test_copying_is_invisible_until_the_batch_completes():
    pool, store = make()
    op = store.begin_store(11, src_slot=3)
    assert op == sc.CheckpointStoreOp(3, (0, 1, 2, 3), 350, "L")
    assert store.lookup(11) == -1 and not store.contains(11) and store.contains_or_pending(11)
    assert store.records[0].state == sc.COPYING and 11 not in store.hash_to_checkpoint
    assert store.begin_store(11, src_slot=4) is None  # already on its way
    assert store.begin_restore(11, 1) is None  # nothing to read yet
    gen = store.generation
    store.complete_inflight()
    assert store.lookup(11) == 0 and store.records[0].state == sc.READY
    assert store.generation == gen + 1 and store.changed_since(gen) == {11}
    assert store.begin_store(11, 4) is None  # already held


def test_several_readers_pin_one_record_and_an_empty_pass_completes_nothing():
    pool, store = make()
    ready(store, 7)
    a, b = store.begin_restore(7, 1), store.begin_restore(7, 2)
    assert a.unit_ids == b.unit_ids and (a.dst_slot, b.dst_slot) == (1, 2)
    assert store.records[0].pin_count == 2 and store.restore_queued_for(2)
    # The restores were not taken into a batch: a completing pass leaves them.
    store.complete_inflight()
    assert store.records[0].pin_count == 2 and store.restore_queued_for(1)
    assert store.take_restore_ops() == (a, b) and not store.restore_queued_for(1)
    assert store.take_restore_ops() == ()
    store.complete_inflight()
    assert store.records[0].pin_count == 0


def test_cancel_releases_the_pin_and_suspend_keeps_it():
    pool, store = make()
    ready(store, 7)
    store.begin_restore(7, 1)
    store.cancel_queued_restore(1)
    assert store.records[0].pin_count == 0 and not store.restore_queued_for(1)
    op = store.begin_restore(7, 2)
    s = store.suspend_queued_restore(2)
    assert s == sc.SuspendedCheckpointRestore(0, op) and store.records[0].pin_count == 1
    assert store.suspend_queued_restore(2) is None
    store.resume_suspended_restore(s)
    assert store.restore_queued_for(2)
    store.begin_restore(7, 2)
    with pytest.raises(AssertionError):
        store.suspend_queued_restore(2)  # two queued restores for one slot: nothing changes
    assert store.records[0].pin_count == 2 and store.take_restore_ops() == (op, op)
    store.complete_inflight()
    # Divergence (README): a suspended restore is taken back once; using it
    # again raises ValueError and leaves every pin alone.
    with pytest.raises(ValueError, match="restore"):
        store.resume_suspended_restore(s)
    with pytest.raises(ValueError, match="restore"):
        store.release_suspended_restore(s)
    assert store.records[0].pin_count == 0 and not store.restore_queued_for(2)


def test_eviction_frees_one_whole_image_lru_first():
    pool, store = make(num_blocks=12)
    for h in (1, 2, 3):
        ready(store, h)
    assert pool.num_free == 0
    store.begin_restore(1, 0)  # touches 1: 2 is now least recently used
    store.cancel_queued_restore(0)
    op = store.begin_store(4, 0)
    assert op is not None and store.evictions == 1 and pool.num_free == 0
    assert not store.contains(2) and store.contains(1) and store.contains(3)
    assert sorted(op.unit_ids) == [4, 5, 6, 7]  # exactly the evicted image's units
    check_conservation(pool)


def test_unindex_during_a_copy_defers_the_release():
    pool, store = make()
    store.begin_store(9, 0)
    assert store.unindex(9) is True
    assert store.records[0].state == sc.EVICTING and pool.num_free == 12  # the writer is still queued
    assert not store.contains_or_pending(9)
    store.complete_inflight()
    assert store.records == {} and pool.num_free == 16 and not store.contains(9)


def test_unindex_while_read_waits_for_the_reader():
    pool, store = make()
    ready(store, 9)
    store.begin_restore(9, 0)
    assert store.unindex(9) is True and pool.num_free == 12
    store.take_restore_ops()
    store.complete_inflight()
    assert pool.num_free == 16 and store.records == {}


def test_unindex_of_an_unknown_hash_still_bumps_the_generation():
    pool, store = make()
    assert store.unindex(123) is False and store.generation == 1
    assert type(store.unindex(123)) is bool


def test_protected_hash_is_excluded_and_ensure_refuses_before_evicting():
    pool, store = make(num_blocks=8)
    ready(store, 1)
    ready(store, 2)
    assert store.has_available_units(8) and store.has_available_units(4, protected_hash=1)
    assert not store.has_available_units(8, protected_hash=1)
    assert store.has_available_units(8, 99)  # a hash nobody holds protects nothing
    assert not store.ensure_free_units(9) and store.evictions == 0 and len(store.records) == 2
    assert store.ensure_free_units(3) and store.evictions == 1


def test_the_eviction_policy_cannot_move_the_admission_gate():
    """Pinned checkpoints at the LRU head change which ones are spent, never the answer."""
    pool, store = make(num_blocks=16)
    for h in (1, 2, 3, 4):
        ready(store, h)
    store.begin_restore(1, 0)  # pin 1 and move it to the MRU end
    store.begin_restore(2, 1)
    answers = [store.has_available_units(n) for n in range(0, 18)]
    assert answers == [True] * 9 + [False] * 9  # 8 evictable units: 3 and 4
    assert store.ensure_free_units(8) and store.evictions == 2
    assert store.contains(1) and store.contains(2)


def test_a_dropped_store_evicts_nothing():
    pool, store = make(num_blocks=8)
    ready(store, 1)
    store.begin_restore(1, 0)  # pinned: not evictable
    pool.reserve_units(2, "kv")
    gen = store.generation
    assert store.begin_store(2, 1) is None
    assert store.evictions == 0 and store.generation == gen and list(store.records) == [0]


def test_clear_releases_what_nobody_uses_and_defers_the_rest():
    pool, store = make()
    ready(store, 1)
    ready(store, 2)
    store.begin_restore(2, 0)
    store.begin_store(3, 1)
    store.clear()
    assert store.hash_to_checkpoint == {} and store.changed_since(0) is None
    assert sorted(store.records) == [1, 2] and pool.num_free == 8
    store.take_restore_ops()
    store.complete_inflight()
    assert store.records == {} and pool.num_free == 16
    check_conservation(pool)


def test_change_log_answers_4000_bumps():
    pool, store = make()
    start = store.generation
    for h in range(4000):
        store.unindex(h)
    assert store.changed_since(start) == set(range(4000))
    assert store.changed_since(start + 3990) == set(range(3990, 4000))
    for h in range(200):
        store.unindex(h)
    assert store.changed_since(start) is None  # too old to tell
    assert store.changed_since(store.generation) == set() and store.changed_since(store.generation + 5) == set()


def test_adopt_units_publishes_without_a_copy_or_releases():
    pool, store = make()
    units = pool.reserve_units(4, ("state-transfer", "t1"))
    assert store.adopt_units(tuple(units), ("state-transfer", "t1"), 77) is True
    assert store.contains(77) and pool.owner_of(units[0]) == ("state-checkpoint", 0)
    assert list(store.store_backlog) == []  # adopted images are not nominated back
    more = pool.reserve_units(4, "t2")
    assert store.adopt_units(tuple(more), "t2", 77) is False and pool.num_free == 12
    with pytest.raises(ValueError):
        store.adopt_units((5,), "not-the-owner", 78)


def test_nominations_are_deferred_not_dropped_and_requeued_at_the_front():
    pool, store = make(num_blocks=32, sink=True)
    ready(store, 1)
    ((op1, units1),) = store.take_offload_stores(4)
    assert op1 == (1, 1) and op1.prefix_hash == 1 and units1 == store.records[0].unit_ids
    assert store.records[0].pin_count == 1 and store.has_offload_pins()
    store.unindex(1)  # spent while the store is out; the copy goes on
    assert store.records[0].state == sc.EVICTING
    ready(store, 1)  # the same prefix again, while attempt 1 is in flight
    ready(store, 2)
    assert list(store.store_backlog) == [1, 2]
    out = store.take_offload_stores(4)
    assert [op for op, _ in out] == [(2, 2)] and list(store.store_backlog) == [1]  # 1 deferred, not dropped
    store.release_offload_store_source(op1)
    assert 0 not in store.records  # released once the gather drained
    assert store.has_offload_pins()  # still dispatched-but-unreported
    assert store.take_offload_stores(4) == []  # hash 1 still in flight until settled
    store.settle_offload_store(op1)
    ((op3, _),) = store.take_offload_stores(4)
    assert op3 == (1, 3) and not store.was_reclaimed(op3)


def test_in_flight_cap_counts_released_but_unsettled_operations():
    pool, store = make(num_blocks=32, sink=True)
    for h in (1, 2, 3):
        ready(store, h)
    ((a, _),) = store.take_offload_stores(1)
    store.release_offload_store_source(a)
    assert store.take_offload_stores(1) == [] and len(store.store_backlog) == 2
    assert store.acquire_checkpoint_source(3, max_inflight=1) is None
    store.settle_offload_store(a)
    assert len(store.take_offload_stores(2)) == 2


def test_a_reclaimed_store_is_never_indexed():
    clock = FakeClock()
    pool, store = make(num_blocks=16, sink=True)
    store.use_clock(clock)
    tier = sc.StateOffloadIndex()
    ready(store, 1)
    ready(store, 2)
    (a, _), (b, _) = store.take_offload_stores(4)
    store.release_offload_store_source(b)  # b's gather drained; only its report is late
    clock.now += 10
    assert store.reclaim_stale_offload_pins(0) == 0 and store.reclaim_stale_offload_pins(-1) == 0
    assert store.reclaim_stale_offload_pins(3600) == 0
    assert store.reclaim_stale_offload_pins(5.0) == 2 and store.offload_pins_reclaimed == 2
    assert store.was_reclaimed(a) and not store.was_reclaimed(b) and not store.has_offload_pins()
    for op in (a, b):  # the worker's late reports
        store.settle_offload_store(op)
        if not store.was_reclaimed(op):
            tier.note_stored(op.prefix_hash)
    assert 1 not in tier.hashes and 2 in tier.hashes
    assert all(r.pin_count == 0 for r in store.records.values())
    check_conservation(pool)


def test_explicit_leases_are_never_reclaimed_by_time():
    clock = FakeClock()
    pool, store = make()
    store.use_clock(clock)
    ready(store, 1)
    op, units = store.acquire_checkpoint_source(1)
    assert units == store.records[0].unit_ids and store.acquire_checkpoint_source(1) is None
    clock.now += 1e6
    assert store.reclaim_stale_offload_pins(1.0) == 0 and store.records[0].pin_count == 1
    store.settle_offload_store(op)  # terminal: releases the source too
    assert store.records[0].pin_count == 0


def test_real_monotonic_clock_measures_seconds():
    import time

    pool, store = make(sink=True)
    ready(store, 1)
    store.take_offload_stores(1)
    time.sleep(0.003)
    assert store.reclaim_stale_offload_pins(3600) == 0
    assert store.reclaim_stale_offload_pins(0.001) == 1


def test_backlog_cap_drops_oldest_nominations():
    pool = sc.BlockPool(8300)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=1, slot_bytes=1, layout_id="L", image_bytes=1)
    store = sc.PageUnitCheckpointStore(pool, spec, offload_sink=True)
    for h in range(8200):
        store.begin_store(h, 0)
    store.complete_inflight()
    assert len(store.store_backlog) == 8192 and store.offload_nominations_dropped == 8
    assert store.store_backlog[0] == 8 and list(store.store_backlog)[-1] == 8199


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda s: s.begin_store(1, -1), ValueError),
        (lambda s: s.begin_restore(1, -2), ValueError),
        (lambda s: s.has_available_units(-1), ValueError),
        (lambda s: s.ensure_free_units(-3), ValueError),
        (lambda s: s.begin_store("h", 0), TypeError),
        (lambda s: s.lookup(2**70), ValueError),
        (lambda s: s.reclaim_stale_offload_pins("soon"), TypeError),
        (lambda s: s.was_reclaimed([1, 2]), TypeError),
        (lambda s: sc.PageUnitCheckpointStore(s.pool, "spec"), TypeError),
        (lambda s: sc.PageUnitCheckpointStore(None, SPEC), TypeError),  # any other pool is read lazily
    ],
)
def test_bad_input_raises_before_anything_changes(call, exc):
    pool, store = make()
    ready(store, 1)
    before = (store.generation, dict(store.records), pool.num_free)
    with pytest.raises(exc):
        call(store)
    assert (store.generation, dict(store.records), pool.num_free) == before


def test_records_are_live_and_keep_their_release_state():
    """As the reference's record objects: a held record follows the store."""
    pool, store = make()
    ready(store, 3)
    rec = store.records[0]
    store.begin_restore(3, 1)
    assert rec.pin_count == 1 and rec.state == sc.READY
    store.unindex(3)
    assert rec.state == sc.EVICTING and rec.pin_count == 1
    store.take_restore_ops()
    store.complete_inflight()  # the reader is done: released
    assert 0 not in store.records
    assert (rec.state, rec.pin_count, rec.unit_ids) == (sc.EVICTING, 0, (0, 1, 2, 3))
    with pytest.raises(AttributeError):
        rec.pin_count = 5  # a store's record is read-only
    twin = store.begin_store(4, 0)
    dup = store.records[1]
    store.unindex(4)
    store.complete_inflight()
    assert twin is not None and dup.state == sc.EVICTING
    copy = sc.CheckpointRecord(dup.prefix_hash, dup.unit_ids, dup.state, dup.pin_count)
    assert copy == dup
    copy.pin_count = 2  # a constructed record is a plain value
    assert copy != dup
