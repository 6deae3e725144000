"""Objects that hold Python callbacks take part in garbage collection: an
engine (block manager -> BlockPool.on_evict -> block manager, coordinator and
pools behind it) built and dropped many times leaves nothing alive."""

from __future__ import annotations

import gc
import weakref

import statecache
from engine_support import engine
from statecache.engine import Request


def _alive(refs) -> int:
    gc.collect()
    return sum(r() is not None for r in refs)


def test_engine_built_and_dropped_100_times_leaves_no_pools():
    refs = []
    for i in range(100):
        e = engine("page" if i % 2 else "fork")
        e.add_request(Request(list(range(1, 30)), 3, scripted_output=[5, 6, 7]))
        e.run_until_done(200)
        refs += [weakref.ref(e.block_manager.pool), weakref.ref(e.caches.slot_pool)]
        if e.caches.coordinator is not None:
            refs.append(weakref.ref(e.caches.coordinator))
        del e
    assert _alive(refs) == 0, f"{_alive(refs)} of {len(refs)} pools / coordinators still alive"


def test_pool_coordinator_cycle_is_collected():
    spec = statecache.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=128, layout_id="g", image_bytes=128)
    refs = []
    for _ in range(10):
        pool = statecache.BlockPool(16)
        coord = statecache.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
        pool.on_evict = coord.unindex  # the README's own wiring: a cycle through C++
        refs += [weakref.ref(pool), weakref.ref(coord)]
        del pool, coord
    assert _alive(refs) == 0


def test_cycle_through_a_group_pools_views_is_collected():
    # the pool keeps seq (a pending copy intent); seq refers back to the pool
    # through one of its views: the collector must see the view's reference
    for attr in ("hash_to_group", "group_hash"):
        refs = []
        for _ in range(5):
            pool = statecache.StateGroupPool(4, statecache.StateTransfer.copy("L"))
            seq = statecache.Sequence(seq_id=1, num_tokens=8, num_prompt_tokens=8)
            seq.per_req_cache_group = pool.pop()
            seq.view = getattr(pool, attr)
            pool.checkpoint(seq, 1, 77)
            assert pool._debug_pending() == [seq]
            refs += [weakref.ref(pool), weakref.ref(seq)]
            del pool, seq
        assert _alive(refs) == 0, attr


def test_a_view_keeps_its_pool_alive_and_reads_it():
    pool = statecache.StateSlotPool(4, statecache.StateTransfer.fork(2))
    index, hashes = pool.hash_to_slot, pool.slot_hash
    ref = weakref.ref(pool)
    del pool
    assert _alive([ref]) == 1  # the views hold the pool
    assert dict(index) == {} and list(hashes) == [-1] * 4
    del index, hashes
    assert _alive([ref]) == 0
