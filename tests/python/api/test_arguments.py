"""Arguments at the edges (issue 18, item 11): each test failed on main's build.

A bad argument raises a clear exception naming it, before anything changes; an
int at the end of its range neither overflows nor wraps; a Sequence subclass
that redefines a field is honoured by per-sequence and batched calls alike.
"""

from __future__ import annotations

import pytest

import statecache as sc
from statecache import _C

LONE = "ab\udc80"  # a str with no UTF-8 form


def _coordinator(enabled=True):
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="a", image_bytes=256)
    return sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, enabled=enabled)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_negative_hit_is_refused_by_the_coordinator_as_by_the_pools(enabled):
    c = _coordinator(enabled)
    pool = sc.StateSlotPool(4, sc.StateTransfer.fork(1), enabled=enabled)
    for seq in (sc.Sequence(1, has_per_req_cache=True), sc.Sequence(2, has_per_req_cache=False)):
        for cache in (c, pool):
            with pytest.raises(ValueError, match="hit=-1"):
                cache.resumable_hit(seq, -1, [])
            with pytest.raises(ValueError, match=r"hits\[0\]"):
                cache.resumable_hits([seq], [-1], [[]])


@pytest.mark.parametrize(
    "call",
    [
        lambda: sc.chain_block_keys([1, 2, 3, 4], 2, salt=LONE),
        lambda: _C.HostArena(64, 640, [640]).allocate(LONE, 0, 1, 0, 0),
        lambda: _C.HostArena(64, 640, [640]).contains(LONE),
        lambda: _C.HostArena(64, 640, [640], LONE),
        lambda: sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id=LONE, image_bytes=128),
        lambda: sc.CheckpointStoreOp(src_slot=0, unit_ids=(1,), total_bytes=64, layout_id=LONE),
        lambda: sc.CheckpointRecord(5, (1,), LONE),
        lambda: sc.StateTransfer(LONE),
        lambda: sc.StateTransfer.copy(LONE),
    ],
    ids=["salt", "arena-key", "arena-contains", "ranking", "spec-layout", "op-layout", "state", "kind", "paged-layout"],
)
def test_a_lone_surrogate_str_is_a_value_error_naming_the_argument(call):
    with pytest.raises(ValueError, match="surrogate") as e:
        call()
    assert not isinstance(e.value, RuntimeError)


def test_units_per_checkpoint_does_not_overflow():
    big = 2**63 - 1
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=2, slot_bytes=big, layout_id="x", image_bytes=big)
    assert spec.units_per_checkpoint == (big + 1) // 2
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=big, slot_bytes=big, layout_id="x", image_bytes=big)
    assert spec.units_per_checkpoint == 1


def test_checkpoint_copy_ops_per_batch_takes_an_int():
    assert sc.checkpoint_copy_ops_per_batch(12) == 24 and sc.checkpoint_copy_ops_per_batch(None) == 0
    for bad in ("12", 3.7, True, [1]):
        with pytest.raises(TypeError, match="max_num_seqs"):
            sc.checkpoint_copy_ops_per_batch(bad)
    with pytest.raises(OverflowError, match="max_num_seqs"):
        sc.checkpoint_copy_ops_per_batch(2**62)
    assert sc.checkpoint_copy_ops_per_batch(2**62 - 1) == 2**63 - 2


def test_host_arena_counts_at_the_end_of_the_range_neither_wrap_nor_fit():
    a = _C.HostArena(64, 64 * 16, [64 * 8, 64 * 8])
    assert a.allocate(b"first", 0, 1, 64, 0) is not None
    for count in (2**62, 2**63 - 1):
        assert a.victims(0, count) is None  # main: used + count wrapped to "fits"
        assert a.allocate(b"huge", 0, count, 0, 0) is None  # main: count * entry_bytes wrapped
    assert a.class_stats(0)["refused"] == 2
    with pytest.raises(ValueError, match="class_budget_bytes"):
        _C.HostArena(1, 2**31 - 1, [2**62, 2**62, 2**62])
    a.check_consistency()


class _Overrides(sc.Sequence):
    """An engine's subclass that computes two fields itself."""

    @property
    def has_per_req_cache(self):
        return self.__dict__.get("cache", True)

    @has_per_req_cache.setter
    def has_per_req_cache(self, v):
        self.__dict__["cache"] = bool(v)

    @property
    def num_tokens(self):
        return self.__dict__.get("tokens", 0)

    @num_tokens.setter
    def num_tokens(self, v):
        self.__dict__["tokens"] = v


def test_a_sequence_subclass_that_redefines_fields_is_honoured_everywhere():
    pools = [
        sc.StateSlotPool(8, sc.StateTransfer.fork(4), hash_block_size=4),
        sc.StateGroupPool(8, sc.StateTransfer.fork(4), hash_block_size=4),
        _coordinator(),
    ]
    for p in pools:
        own = sc.Sequence(0)
        own.state_slots = [1]
        own.per_req_cache_group = 1
        if not isinstance(p, sc.PagedStateCheckpointCoordinator):
            p.claim(1)
        p.checkpoint(own, 1, 11)
        if isinstance(p, sc.PagedStateCheckpointCoordinator):
            p.take_checkpoint_ops()
            p.complete_previous_batch()
            p.complete_previous_batch()
        else:
            p.release_pins()
            p.release_pins()
        s = _Overrides(1)
        s.num_tokens = 5  # the property: 5 tokens leave no room for a fork of 4 past block 1
        s.__dict__["cache"] = True
        per = p.resumable_hit(s, 1, [11])
        assert p.resumable_hits([s], [1], [[11]]) == [per]
        want = 1 if isinstance(p, sc.PagedStateCheckpointCoordinator) else 0
        assert per == want, type(p).__name__
        s.__dict__["cache"] = False  # has_per_req_cache False: nothing applies, the hit stands
        assert not p.applies(s)
        assert p.resumable_hit(s, 1, [99]) == 1 and p.resumable_hits([s], [1], [[99]]) == [1]
