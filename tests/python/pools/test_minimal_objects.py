"""Engine-owned request objects that carry only what the reference reads
(docs/contract.md, "API guarantees"): each call reads an attribute only where
the reference reads it, so an object without the others works, and ends
with the same fields and the same pool state as the reference leaves."""

from __future__ import annotations

import pytest

import statecache as sc
from reference import load

ref_slot, ref_group, ref_paged = load("slot_pool"), load("group_pool"), load("paged_checkpoint")
if ref_slot is None:
    pytest.skip("reference modules not found", allow_module_level=True)

FIELDS = ("has_per_req_cache", "num_tokens", "state_slot", "state_fork_src", "per_req_cache_group",
          "pending_checkpoint", "midstep_anchor_pos", "checkpoint_end_pos")  # fmt: skip


class Req:
    """Only the attributes given; any attribute may be set later."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def fields(self):
        return {k: v for k, v in self.__dict__.items() if k in FIELDS}


def slot_pools(transfer, enabled=True):
    ours = sc.StateSlotPool(6, transfer(sc), hash_block_size=4, enabled=enabled)
    theirs = ref_slot.StateSlotPool(6, transfer(sc), hash_block_size=4, enabled=enabled)
    return ours, theirs


def group_pools(transfer, enabled=True):
    ours = sc.StateGroupPool(6, transfer(sc), hash_block_size=4, enabled=enabled)
    theirs = ref_group.StateGroupPool(6, transfer(sc), hash_block_size=4, enabled=enabled)
    return ours, theirs


def both(pools, call, make):
    """Runs call(pool, obj) on each side with its own object from make();
    returns the results and the objects' fields, which must agree."""
    out = []
    for pool in pools:
        obj = make()
        out.append((call(pool, obj), obj.fields()))
    assert out[0] == out[1], f"ours={out[0]} reference={out[1]}"
    return out[0]


FORK = lambda sc: sc.StateTransfer.fork(2)  # noqa: E731
COPY = lambda sc: sc.StateTransfer.copy()  # noqa: E731
NONE = lambda sc: sc.StateTransfer.none()  # noqa: E731
REPLAY = lambda sc: sc.StateTransfer.replay()  # noqa: E731


def test_group_fork_checkpoint_needs_no_pending_checkpoint_nor_fork_src():
    pools = group_pools(FORK)
    for p in pools:
        p.pop()  # group 0 is the sequence's
    r, fields = both(
        pools, lambda p, o: p.checkpoint(o, 3, 77), lambda: Req(has_per_req_cache=True, per_req_cache_group=0)
    )
    assert fields == {"has_per_req_cache": True, "per_req_cache_group": 1, "state_fork_src": 0}
    assert pools[0].lookup(77) == pools[1].lookup(77) == 0


def test_group_copy_checkpoint_reads_pending_checkpoint():
    pools = group_pools(COPY)
    for p in pools:
        p.pop()
    make = lambda: Req(has_per_req_cache=True, per_req_cache_group=0, pending_checkpoint=-1)  # noqa: E731
    both(pools, lambda p, o: p.checkpoint(o, 3, 77), make)
    with pytest.raises(TypeError, match="pending_checkpoint"):  # the reference reads it here too
        pools[0].checkpoint(Req(has_per_req_cache=True, per_req_cache_group=0), 3, 78)


@pytest.mark.parametrize("pools", [lambda: group_pools(FORK), lambda: group_pools(COPY), lambda: group_pools(NONE)])
def test_group_calls_on_a_sequence_without_a_cache_read_nothing_else(pools):
    ps = pools()
    make = lambda: Req(has_per_req_cache=False)  # noqa: E731
    both(ps, lambda p, o: p.checkpoint(o, 3, 77), make)
    both(ps, lambda p, o: p.applies(o), make)
    both(ps, lambda p, o: p.resumable_hit(o, 2, [1, 2]), make)


@pytest.mark.parametrize("kind", ["slot", "group"])
def test_a_disabled_pool_reads_nothing(kind):
    ps = slot_pools(FORK, enabled=False) if kind == "slot" else group_pools(FORK, enabled=False)
    both(ps, lambda p, o: p.checkpoint(o, 3, 77), Req)
    both(ps, lambda p, o: p.applies(o), Req)
    both(ps, lambda p, o: p.resumable_hit(o, 2, [1, 2]), Req)


def test_slot_calls_read_only_what_the_reference_reads():
    # Without a cache: nothing past has_per_req_cache.
    ps = slot_pools(FORK)
    make = lambda: Req(has_per_req_cache=False)  # noqa: E731
    both(ps, lambda p, o: p.checkpoint(o, 3, 77), make)
    both(ps, lambda p, o: p.resumable_hit(o, 2, [1, 2]), make)
    both(ps, lambda p, o: p.reserve_midstep(o, [(4, 9)]), make)
    # Under replay nothing is kept and no slot is read.
    ps = slot_pools(REPLAY)
    both(ps, lambda p, o: p.checkpoint(o, 3, 77), lambda: Req(has_per_req_cache=True))
    both(ps, lambda p, o: p.resumable_hit(o, 2, [1, 2]), lambda: Req(has_per_req_cache=True))
    # A fork: state_slot read, state_fork_src written, anchors optional.
    ps = slot_pools(FORK)
    for p in ps:
        p.pop()
    _, fields = both(ps, lambda p, o: p.checkpoint(o, 3, 77), lambda: Req(has_per_req_cache=True, state_slot=0))
    assert fields == {"has_per_req_cache": True, "state_slot": 1, "state_fork_src": 0}
    # Nothing free: the slot is read, nothing written.
    ps = slot_pools(FORK)
    for p in ps:
        for _ in range(6):
            p.pop()
    both(ps, lambda p, o: p.checkpoint(o, 3, 78), lambda: Req(has_per_req_cache=True, state_slot=0))


@pytest.mark.skipif(ref_paged is None, reason="reference modules not found")
def test_coordinator_calls_read_only_what_the_reference_reads():
    spec = dict(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=350)
    for enabled, readable in ((True, False), (False, True), (True, True)):
        ps = (
            sc.PagedStateCheckpointCoordinator(sc.BlockPool(16), sc.PagedStateCheckpointSpec(**spec), enabled,
                                               readable_midstep=readable),
            ref_paged.PagedStateCheckpointCoordinator(sc.BlockPool(16), ref_paged.PagedStateCheckpointSpec(**spec),
                                                      enabled, readable_midstep=readable),
        )  # fmt: skip
        make = (lambda: Req(has_per_req_cache=False)) if enabled else Req
        both(ps, lambda p, o: p.checkpoint(o, 3, 77), make)
        both(ps, lambda p, o: p.resumable_hit(o, 2, [1, 2]), make)
        both(ps, lambda p, o: p.applies(o), make)
        if not readable:
            both(ps, lambda p, o: p.reserve_midstep(o, [(4, 9)]), Req)
    # A sequence with a cache: its slot, nothing else.
    ps = (
        sc.PagedStateCheckpointCoordinator(sc.BlockPool(16), sc.PagedStateCheckpointSpec(**spec), True),
        ref_paged.PagedStateCheckpointCoordinator(sc.BlockPool(16), ref_paged.PagedStateCheckpointSpec(**spec), True),
    )
    objs = []
    for p in ps:
        o = Req(has_per_req_cache=True, state_slot=2)
        objs.append(o)
        p.checkpoint(o, 3, 77)
    stores = [p.take_checkpoint_ops()[0] for p in ps]
    assert [s.src_slot for s in stores[0]] == [s.src_slot for s in stores[1]] == [2]
