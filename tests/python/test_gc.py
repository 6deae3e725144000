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
    spec = statecache.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=128, layout_id="g",
                                               image_bytes=128)
    refs = []
    for _ in range(10):
        pool = statecache.BlockPool(16)
        coord = statecache.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
        pool.on_evict = coord.unindex       # the README's own wiring: a cycle through C++
        refs += [weakref.ref(pool), weakref.ref(coord)]
        del pool, coord
    assert _alive(refs) == 0
