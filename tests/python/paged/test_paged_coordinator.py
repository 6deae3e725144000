"""PagedStateCheckpointCoordinator: pass timing, supersede, midstep budget,
external transfers, the tier's vote and fates."""

import pytest

import statecache as sc
from paged_harness import FakeScratch, check_conservation

SPEC = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=400)  # 4 units


def make(num_blocks=32, enabled=True, offload=None, readable=False):
    pool = sc.BlockPool(num_blocks)
    return pool, sc.PagedStateCheckpointCoordinator(pool, SPEC, enabled, offload=offload, readable_midstep=readable)


def seq_in(slot, **kw):
    s = sc.Sequence(**kw)
    s.state_slots = [slot]
    return s


def test_attributes():
    pool, c = make()
    assert c.enabled is True and c.readable_midstep is False and c.offload is None
    assert c.successor_room == 0.0 and sc.PagedStateCheckpointCoordinator.successor_room == 0.0
    assert c.store.pool is pool and c.store.spec == SPEC
    assert c.checkpoint_fates() == {
        "checkpoints_kept": 0,
        "checkpoints_dropped": 0,
        "checkpoints_evicted": 0,
        "offload_pins_reclaimed": 0,
        "checkpoints_orphaned": 0,
    }


def test_store_recorded_in_pass_n_is_ready_at_the_top_of_pass_n_plus_2():
    pool, c = make()
    seq = seq_in(3)
    c.complete_previous_batch()  # pass N
    c.checkpoint(seq, 4, 99)  # postprocess of pass N
    assert not c.contains(99)
    c.complete_previous_batch()  # pass N+1 top
    stores, restores = c.take_checkpoint_ops()  # batch N+1 scatters it
    assert [s.src_slot for s in stores] == [3] and restores == ()
    assert not c.contains(99) and c.resumable_hit(seq, 5, [1, 2, 3, 99, 7]) == 0
    c.complete_previous_batch()  # pass N+2 top
    assert c.contains(99) and c.resumable_hit(seq, 5, [1, 2, 3, 99, 7]) == 4
    assert c.checkpoints_kept == 1


def test_supersede_keeps_the_newer_boundary_of_one_sequence():
    pool, c = make()
    a, b = seq_in(1), seq_in(2)
    c.checkpoint(a, 2, 10)
    c.checkpoint(b, 2, 10)  # another sequence at the same hash is separate
    c.checkpoint(a, 4, 20)  # a's slot moved on: 10 from a is dropped
    assert c.checkpoints_dropped == 1
    c.checkpoint(a, 4, 20)  # the same boundary again is also counted
    assert c.checkpoints_dropped == 2
    stores, _ = c.take_checkpoint_ops()
    assert [s.src_slot for s in stores] == [2, 1]  # filing order: b's 10, then a's 20
    assert c.checkpoints_kept == 2


def test_pending_keeps_the_sequence_alive():
    pool, c = make()
    c.checkpoint(seq_in(5), 1, 42)  # the only reference is the coordinator's
    stores, _ = c.take_checkpoint_ops()
    assert stores[0].src_slot == 5


def test_checkpoint_ignores_sequences_without_state_or_when_disabled():
    pool, c = make()
    c.checkpoint(sc.Sequence(), 1, 1)  # no slot
    c.checkpoint(seq_in(1, has_per_req_cache=False), 1, 2)
    assert c.take_checkpoint_ops() == ((), ())
    pool2, off = make(enabled=False)
    s = seq_in(1)
    off.checkpoint(s, 1, 1)
    assert off.take_checkpoint_ops() == ((), ()) and off.resumable_hit(s, 3, [1, 2, 3]) == 3


def test_forget_pending_drops_boundaries_and_queued_restore():
    pool, c = make()
    s = seq_in(2)
    c.checkpoint(s, 1, 1)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    c.checkpoint(s, 2, 2)
    assert c.begin_restore(1, 2) and c.restore_queued_for(2)
    c.forget_pending(s)
    assert not c.restore_queued_for(2) and c.store.records[0].pin_count == 0
    assert c.take_checkpoint_ops() == ((), ()) and c.checkpoints_dropped == 0


def test_unindex_orphans_pending_and_stored_and_returns_none():
    pool, c = make()
    a, b = seq_in(1), seq_in(2)
    c.checkpoint(a, 1, 5)
    c.checkpoint(b, 1, 5)
    assert c.unindex(5) is None and c.checkpoints_orphaned == 1
    assert c.take_checkpoint_ops() == ((), ())
    c.unindex(6)
    assert c.checkpoints_orphaned == 1


def test_resumable_hit_forms_and_bad_input():
    pool, c = make()
    s = seq_in(0)
    assert c.resumable_hit(s, 3, [1, 2, 3], True) == 3
    assert c.resumable_hit(s, 3, [1, 2, 3], assume_checkpointed=True) == 3
    assert c.resumable_hit(s, 0, []) == 0
    import numpy as np

    assert c.resumable_hit(s, 2, np.array([4, 5], dtype=np.int64)) == 0
    with pytest.raises(ValueError):
        c.resumable_hit(s, -1, [1])
    with pytest.raises(IndexError):
        c.resumable_hit(s, 3, [1, 2])
    assert c.resumable_hit(s, 3, [1, 2], True) == 3  # as the reference: no hash is read
    with pytest.raises(TypeError):
        c.resumable_hit("seq", 1, [1])


def test_tier_votes_through_could_serve():
    tier = sc.StateOffloadIndex()
    pool, c = make(offload=tier)
    s = seq_in(0)
    tier.note_stored(2)
    assert c.resumable_hit(s, 3, [1, 2, 3]) == 2
    store_only = sc.StateOffloadIndex(can_load=False)
    c.attach_offload(store_only)
    store_only.note_stored(2)
    assert c.offload is store_only and c.resumable_hit(s, 3, [1, 2, 3]) == 0

    class Double:  # a test double without stats
        hashes = {1}

        def could_serve(self, h):
            return h in self.hashes

    c.attach_offload(Double(), sink=False)
    assert c.resumable_hit(s, 3, [1, 2, 3]) == 1 and "state_offload_store_backlog" not in c.checkpoint_fates()
    c.attach_offload(None)
    assert c.offload is None and c.resumable_hit(s, 3, [1, 2, 3]) == 0


def test_fates_fold_the_tier_stats():
    tier = sc.StateOffloadIndex()
    pool, c = make(offload=tier)
    tier.note_stored(1)
    fates = c.checkpoint_fates()
    assert fates["state_offload_stores_completed"] == 1 and fates["state_offload_store_backlog"] == 0
    assert fates["state_offload_nominations_dropped"] == 0
    assert list(fates)[:5] == [
        "checkpoints_kept",
        "checkpoints_dropped",
        "checkpoints_evicted",
        "offload_pins_reclaimed",
        "checkpoints_orphaned",
    ]


def test_sink_false_nominates_nothing():
    tier = sc.StateOffloadIndex()
    pool, c = make()
    c.attach_offload(tier, sink=False)
    c.checkpoint(seq_in(0), 1, 1)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert c.contains(1) and len(c.store.store_backlog) == 0 and c.take_offload_stores(4) == []
    c.attach_offload(tier)
    c.checkpoint(seq_in(1), 1, 2)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert [op.prefix_hash for op, _ in c.take_offload_stores(4)] == [2]


def test_midstep_scratch_budget_and_release():
    pool, c = make(readable=True)
    scratch = FakeScratch(3)
    c.attach_midstep_scratch(scratch, max_ops_per_batch=2)
    s = seq_in(0)
    res = c.reserve_midstep(s, [(16, 1), (32, 2), (48, 3), (64, 4)])
    assert res == [(0, 16, 1), (1, 32, 2), (2, 48, 3)] and c.checkpoints_dropped == 1  # out of scratch
    c.publish_midstep(res, s)
    assert not c.contains(1)
    c.begin_restore  # noqa: B018 (no restores queued)
    stores, restores = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [0, 1]  # budget 2; hash 3 stays queued in its slot
    assert scratch.free == []
    c.complete_previous_batch()
    assert sorted(scratch.free) == [0, 1] and c.contains(1) and c.contains(2)
    stores, _ = c.take_checkpoint_ops()
    assert [op.src_slot for op in stores] == [2]
    c.complete_previous_batch()
    assert sorted(scratch.free) == [0, 1, 2]
    assert c.reserve_midstep(s, [(16, 1), (80, 3)]) == []  # both already stored


def test_midstep_cancel_and_no_scratch_does_not_crash():
    pool, c = make(readable=True)
    s = seq_in(0)
    assert c.reserve_midstep(s, [(16, 1)]) == []  # nothing attached: nothing reserved
    # Rows never reserved are refused (the reference crashes on the cancel,
    # and a published foreign row would free a live slot).
    with pytest.raises(ValueError, match="reservations"):
        c.cancel_midstep([(0, 16, 1)])
    with pytest.raises(ValueError, match="reservations"):
        c.publish_midstep([(0, 16, 1)])
    c.complete_previous_batch()
    assert c.take_checkpoint_ops() == ((), ())  # no budget without a scratch pool
    scratch = FakeScratch(2)
    c.attach_midstep_scratch(scratch, 4)
    res = c.reserve_midstep(s, [(16, 5)])
    c.cancel_midstep(res)
    assert sorted(scratch.free) == [0, 1]
    pool2, plain = make(readable=False)
    plain.attach_midstep_scratch(scratch, 4)
    assert plain.reserve_midstep(s, [(16, 6)]) == []


def test_transfer_units_reserve_adopt_release():
    pool, c = make(num_blocks=12)
    assert c.reserve_transfer_units(("load", 1)) == (0, 1, 2, 3)
    assert pool.owner_of(0) == ("state-transfer", ("load", 1))
    assert c.reserve_transfer_units(("load", 1)) is None  # duplicate active owner
    with pytest.raises(ValueError, match="owner"):
        c.reserve_transfer_units(None)
    assert c.adopt_transfer_units(("load", 1), 77) is True and c.contains(77)
    assert pool.owner_of(0) == ("state-checkpoint", 0)
    assert c.adopt_transfer_units(("load", 1), 77) is False  # nothing reserved any more
    units = c.reserve_transfer_units("x")
    assert c.adopt_transfer_units("x", 77) is False and pool.owner_of(units[0]) is None
    c.reserve_transfer_units("y")
    c.release_transfer_units("y")
    c.release_transfer_units("y")  # once only
    assert pool.num_free == 8
    check_conservation(pool)


def test_transfer_reservation_evicts_only_when_reachable():
    pool, c = make(num_blocks=8)
    for h, slot in ((1, 0), (2, 1)):
        c.checkpoint(seq_in(slot), 1, h)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert c.begin_restore(1, 5) and c.begin_restore(2, 6)
    assert c.reserve_transfer_units("t") is None and c.store.evictions == 0
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    assert c.reserve_transfer_units("t") is not None and c.store.evictions == 1


def test_clear_index_moves_no_fate():
    pool, c = make()
    c.checkpoint(seq_in(0), 1, 1)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    c.checkpoint(seq_in(1), 1, 2)
    fates = c.checkpoint_fates()
    c.clear_index()
    assert c.checkpoint_fates() == fates and not c.contains(1)
    assert c.take_checkpoint_ops() == ((), ()) and pool.num_free == 32


def test_store_side_protocol_with_a_tier():
    tier = sc.StateOffloadIndex()
    pool, c = make(offload=tier)
    c.checkpoint(seq_in(0), 1, 9)
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    ((op, units),) = c.take_offload_stores(2)
    tier.note_store_started(op.prefix_hash)
    c.release_offload_store_source(op)
    assert c.has_offload_pins()
    c.settle_offload_store(op)
    if not c.was_reclaimed(op):
        tier.note_stored(op.prefix_hash)
    assert not c.has_offload_pins() and 9 in tier.hashes
    assert c.checkpoint_fates()["state_offload_stores_attempted"] == 1
    # Load side: reserve, copy in, adopt, restore.
    c.unindex(9)
    assert c.resumable_hit(seq_in(0), 2, [9, 10]) == 1 and tier.request_load(9)
    assert c.reserve_transfer_units(("t", 1)) is not None
    assert c.adopt_transfer_units(("t", 1), 9)
    tier.complete_load(9)
    assert c.begin_restore(9, 3)
    check_conservation(pool)


@pytest.mark.skipif(not hasattr(sc, "StateSlotPool"), reason="StateSlotPool lands with the pools branch")
def test_midstep_with_a_state_slot_pool():
    pool, c = make(readable=True)
    slots = sc.StateSlotPool(4, sc.StateTransfer.fork(4), hash_block_size=16, enabled=True)
    c.attach_midstep_scratch(slots, 8)
    s = seq_in(0)
    before = slots.num_free()
    res = c.reserve_midstep(s, [(16, 1), (32, 2)])
    assert len(res) == 2 and slots.num_free() == before - 2
    c.publish_midstep(res)
    stores, _ = c.take_checkpoint_ops()
    assert sorted(op.src_slot for op in stores) == sorted(r[0] for r in res)
    c.complete_previous_batch()
    assert slots.num_free() == before and c.contains(1) and c.contains(2)
