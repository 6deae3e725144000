"""The PAGE store and coordinator on pools that are not statecache.BlockPool
(docs/paged.md, "Pool protocol"): attributes read only when used, pools that
raise, return the wrong thing, call back into the store, or run while
another thread calls it. The random differential runs on such pools are in
test_paged_differential.py (POOL_RUNS)."""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref

import pytest

import statecache as sc
from paged_harness import ListPool, PoolThroughPython
from reference import load

ref = load("paged_checkpoint")

SPEC = dict(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=350)  # 4 units


def store_on(pool, sink=False):
    return sc.PageUnitCheckpointStore(pool, sc.PagedStateCheckpointSpec(**SPEC), offload_sink=sink)


def checkpoint_units(pool: ListPool) -> set:
    """Units the pool says a ("state-checkpoint", id) owner holds."""
    return {u for u, o in pool._owner.items() if isinstance(o, tuple) and o[:1] == ("state-checkpoint",)}


def record_units(store) -> set:
    return {u for rec in store.records.values() for u in rec.unit_ids}


def ready(store, h, slot=0):
    assert store.begin_store(h, slot) is not None
    store.complete_inflight()


# ------------------------------------------------ read when the reference reads --


def test_any_object_but_none_is_accepted_and_read_only_when_used():
    class Nothing:
        pass

    pool = Nothing()
    store = store_on(pool)
    assert store.pool is pool
    assert store.lookup(5) == -1 and not store.contains_or_pending(5) and store.take_restore_ops() == ()
    store.complete_inflight()
    before = store_state_nopool(store)
    with pytest.raises(AttributeError, match="num_free"):
        store.begin_store(5, 0)
    assert store_state_nopool(store) == before
    coord = sc.PagedStateCheckpointCoordinator(pool, sc.PagedStateCheckpointSpec(**SPEC), True)
    assert coord.store.pool is pool and coord.take_checkpoint_ops() == ((), ())
    with pytest.raises(TypeError, match="pool"):
        store_on(None)


def store_state_nopool(store):
    return {
        "generation": store.generation,
        "records": {k: (v.prefix_hash, tuple(v.unit_ids), v.state, v.pin_count) for k, v in store.records.items()},
        "index": dict(store.hash_to_checkpoint.items()),
        "evictions": store.evictions,
    }


class NoRekey:
    """A pool without rekey_units: everything but adoption works, as in the reference."""

    def __init__(self, n):
        self._p = ListPool(n)
        self.reads = []

    @property
    def num_free(self):
        self.reads.append("num_free")
        return self._p.num_free

    def reserve_units(self, count, owner):
        self.reads.append("reserve_units")
        return self._p.reserve_units(count, owner)

    def release_units(self, unit_ids, owner):
        self.reads.append("release_units")
        self._p.release_units(unit_ids, owner)


@pytest.mark.skipif(ref is None, reason="reference modules not found")
def test_a_pool_without_rekey_units_serves_everything_but_adoption_like_the_reference():
    ours_pool, ref_pool = NoRekey(12), NoRekey(12)
    ours = store_on(ours_pool)
    theirs = ref.PageUnitCheckpointStore(ref_pool, ref.PagedStateCheckpointSpec(**SPEC))
    for s in (ours, theirs):
        for h in (1, 2, 3, 4):  # the fourth evicts the first (3 images fit)
            s.begin_store(h, 0)
            s.complete_inflight()
        assert s.begin_restore(4, 1) is not None
        s.take_restore_ops()
        s.complete_inflight()
        s.unindex(3)
        assert s.has_available_units(2)
    assert store_state_nopool(ours) == store_state_nopool(theirs)
    # Asked only what the reference asks, in the same order.
    assert ours_pool.reads == ref_pool.reads
    for s, p in ((ours, ours_pool), (theirs, ref_pool)):
        units = p._p.reserve_units(4, "loader")
        with pytest.raises(AttributeError, match="rekey_units"):
            s.adopt_units(tuple(units), "loader", 9)
    assert store_state_nopool(ours) == store_state_nopool(theirs)


def test_what_each_call_passes_the_pool():
    pool = PoolThroughPython(sc.BlockPool(16))
    seen = []
    inner_reserve, inner_release, inner_rekey = pool.reserve_units, pool.release_units, pool.rekey_units

    class Spy(PoolThroughPython):
        def reserve_units(self, count, owner):
            seen.append(("reserve", count, owner))
            return inner_reserve(count, owner)

        def release_units(self, unit_ids, owner):
            seen.append(("release", type(unit_ids).__name__, owner))
            inner_release(unit_ids, owner)

        def rekey_units(self, unit_ids, old_owner, new_owner):
            seen.append(("rekey", type(unit_ids).__name__, old_owner, new_owner))
            inner_rekey(unit_ids, old_owner, new_owner)

    spy = Spy(pool._inner)
    coord = sc.PagedStateCheckpointCoordinator(spy, sc.PagedStateCheckpointSpec(**SPEC), True)
    units = coord.reserve_transfer_units(("load", 1))
    assert len(units) == 4 and coord.adopt_transfer_units(("load", 1), 77)
    coord.unindex(77)
    assert seen == [
        ("reserve", 4, ("state-transfer", ("load", 1))),
        ("rekey", "tuple", ("state-transfer", ("load", 1)), ("state-checkpoint", 0)),
        ("release", "tuple", ("state-checkpoint", 0)),
    ]
    assert pool._inner.num_free == 16


# ------------------------------------------------------------ hostile pools --


class Boom(RuntimeError):
    pass


class Flaky(ListPool):
    """Raises Boom before changing anything, on each protocol call with
    probability `p`; remembers the units of releases it refused (the store
    has let go of them: they stay the pool's, as with the reference)."""

    def __init__(self, n, rng, p):
        super().__init__(n)
        self.rng, self.p, self.refused = rng, p, set()

    def _maybe(self):
        if self.rng.random() < self.p:
            raise Boom("pool failed")

    @property
    def num_free(self):
        self._maybe()
        return len(self._free)

    def reserve_units(self, count, owner):
        self._maybe()
        return super().reserve_units(count, owner)

    def release_units(self, unit_ids, owner):
        try:
            self._maybe()
        except Boom:
            if isinstance(owner, tuple) and owner[:1] == ("state-checkpoint",):
                self.refused |= set(unit_ids)
            raise
        super().release_units(unit_ids, owner)

    def rekey_units(self, unit_ids, old_owner, new_owner):
        self._maybe()
        super().rekey_units(unit_ids, old_owner, new_owner)


@pytest.mark.parametrize("seed", range(12))
def test_a_pool_that_raises_leaves_every_object_consistent(seed):
    """Random passes on a pool whose calls fail at random: each failure
    propagates as the pool raised it, and afterwards the store and
    coordinator are consistent, pins and pending boundaries intact, and every
    unit the pool holds for a checkpoint is a record's, or one whose release
    the pool refused."""
    rng = random.Random(seed)
    pool = Flaky(24, rng, 0.15)
    coord = sc.PagedStateCheckpointCoordinator(pool, sc.PagedStateCheckpointSpec(**SPEC), True)
    store = coord.store
    seqs = [sc.Sequence(seq_id=i) for i in range(4)]
    for i, s in enumerate(seqs):
        s.state_slots = [i]
    hashes = list(range(1, 12))
    failures = 0
    for step in range(600):
        h = rng.choice(hashes)
        op = rng.choice(["checkpoint", "take", "complete", "restore", "unindex", "clear", "reserve", "release",
                         "adopt", "avail", "ensure", "forget"])  # fmt: skip
        try:
            if op == "checkpoint":
                coord.checkpoint(rng.choice(seqs), 1, h)
            elif op == "take":
                stores, restores = coord.take_checkpoint_ops()
                assert len({u for s in stores for u in s.unit_ids}) == 4 * len(stores)
            elif op == "complete":
                coord.complete_previous_batch()
            elif op == "restore":
                coord.begin_restore(h, rng.randrange(4))
            elif op == "unindex":
                coord.unindex(h)
            elif op == "clear" and rng.random() < 0.1:
                coord.clear_index()
            elif op == "reserve":
                coord.reserve_transfer_units(("load", rng.randrange(3)))
            elif op == "release":
                coord.release_transfer_units(("load", rng.randrange(3)))
            elif op == "adopt":
                coord.adopt_transfer_units(("load", rng.randrange(3)), h)
            elif op == "avail":
                coord.has_available_units(rng.choice([1, 4, 9, 30]), protected_hash=h)
            elif op == "ensure":
                coord.ensure_free_units(rng.choice([1, 4, 9]))
            elif op == "forget":
                coord.forget_pending(rng.choice(seqs))
        except Boom:
            failures += 1
        coord.check_consistency()
        pool.check_consistency()
        for cid, rec in store.records.items():
            owners = {pool.owner_of(u) for u in rec.unit_ids}
            assert owners == {("state-checkpoint", cid)}, f"step {step} ({op}): record {cid}'s units: {owners}"
        held = checkpoint_units(pool)
        assert held <= record_units(store) | pool.refused, f"step {step}: units leaked"
    assert failures > 20


@pytest.mark.skipif(ref is None, reason="reference modules not found")
@pytest.mark.parametrize("method", ["num_free", "reserve_units", "release_units", "rekey_units"])
def test_one_failing_call_leaves_the_store_as_the_reference_leaves_it(method):
    """Single-call operations: the error propagates and the store is left as
    the reference leaves it (where the reference changes nothing, nothing)."""

    class FailOnce(ListPool):
        armed = False

        def __getattribute__(self, name):
            if name == method and object.__getattribute__(self, "armed"):
                self.armed = False
                raise Boom(name)
            return object.__getattribute__(self, name)

    results = []
    for make in (lambda p: store_on(p, sink=True),
                 lambda p: ref.PageUnitCheckpointStore(p, ref.PagedStateCheckpointSpec(**SPEC), offload_sink=True)):  # fmt: skip
        pool = FailOnce(16)
        s = make(pool)
        for h in (1, 2, 3):
            s.begin_store(h, 0)
            s.complete_inflight()
        loaded = tuple(pool.reserve_units(4, "x"))  # the pool is full now
        outcomes = []
        for method, args in (
            ("begin_store", (4, 0)),  # evicts 1: num_free, release_units, reserve_units
            ("has_available_units", (5,)),
            ("ensure_free_units", (8,)),
            ("unindex", (3,)),
            ("adopt_units", (loaded, "x", 9)),
        ):
            pool.armed = True
            try:
                outcomes.append(("ok", repr(getattr(s, method)(*args))))
            except Boom as e:
                outcomes.append(("raise", str(e)))
            outcomes.append(store_state_nopool(s))
            outcomes.append(sorted(pool._owner.items(), key=repr))
        results.append(outcomes)
    assert results[0] == results[1]


@pytest.mark.parametrize(
    "returned, exc",
    [
        (7, TypeError),
        (["a", "b", "c", "d"], TypeError),
        ([0, 1, 2], ValueError),  # three ids for a reservation of four
        ([0, 1, 1, 2], ValueError),
        ([0, 1, 2, -3], ValueError),
        ((u for u in (4, 5, 6, 7)), None),  # any iterable of distinct ids will do
    ],
)
def test_what_reserve_units_returns_is_checked_before_anything_is_filed(returned, exc):
    class Liar(ListPool):
        def reserve_units(self, count, owner):
            got = super().reserve_units(count, owner)
            self.gave = got
            return returned if not isinstance(returned, list) else list(returned)

    pool = Liar(12)
    store = store_on(pool)
    before = store_state_nopool(store)
    if exc is None:
        op = store.begin_store(5, 0)
        assert op.unit_ids == (4, 5, 6, 7)
        return
    with pytest.raises(exc, match="reserve_units"):
        store.begin_store(5, 0)
    assert store_state_nopool(store) == before
    assert not store.contains_or_pending(5)
    store.check_consistency()


@pytest.mark.parametrize("value, exc", [("3", TypeError), (None, TypeError), (3.0, TypeError), (2**80, OverflowError)])
def test_num_free_must_be_an_int(value, exc):
    class Odd(ListPool):
        num_free = value

    store = store_on(Odd(8))
    with pytest.raises(exc, match="num_free"):
        store.has_available_units(1)
    with pytest.raises(exc, match="num_free"):
        store.begin_store(1, 0)
    assert store_state_nopool(store)["records"] == {}


# ---------------------------------------------------------- calls back -----


def test_a_pool_that_files_the_same_hash_while_reserving_gives_the_units_back():
    class Nested(ListPool):
        store = None
        depth = 0

        def reserve_units(self, count, owner):
            if self.depth == 0:
                self.depth += 1
                assert self.store.begin_store(5, 1) is not None  # the same hash, from inside
                self.depth -= 1
            return super().reserve_units(count, owner)

    pool = Nested(16)
    store = pool.store = store_on(pool)
    assert store.begin_store(5, 0) is None  # filed meanwhile: refused, units back
    assert [r.prefix_hash for r in store.records.values()] == [5]
    store.check_consistency()
    assert checkpoint_units(pool) == record_units(store) and pool.num_free == 12


def test_a_release_that_files_a_store_keeps_the_new_record_whole():
    """The slot a released record leaves may be taken by a record the pool's
    release begins from inside: the new record keeps its units."""

    class Refiling(ListPool):
        store = None
        once = True

        def release_units(self, unit_ids, owner):
            super().release_units(unit_ids, owner)
            if self.once:
                self.once = False
                assert self.store.begin_store(50, 3) is not None

    pool = Refiling(16)
    store = pool.store = store_on(pool)
    ready(store, 1)
    assert store.unindex(1)
    recs = list(store.records.values())
    assert [r.prefix_hash for r in recs] == [50] and len(recs[0].unit_ids) == 4
    store.check_consistency()
    assert checkpoint_units(pool) == record_units(store)


@pytest.mark.parametrize(
    "nested",
    [
        lambda s, c: s.clear(),
        lambda s, c: s.complete_inflight(),
        lambda s, c: c.take_checkpoint_ops(),
        lambda s, c: c.complete_previous_batch(),
        lambda s, c: s.unindex(2),
        lambda s, c: c.reserve_transfer_units("t"),
        lambda s, c: s.reclaim_stale_offload_pins(1e-9),
        lambda s, c: [s.settle_offload_store(op) for op, _ in s.take_offload_stores(4)],
        lambda s, c: c.begin_restore(2, 6),
        lambda s, c: s.cancel_queued_restore(6),
    ],
)
@pytest.mark.parametrize("where", ["num_free", "reserve_units", "release_units"])
def test_any_call_back_from_any_pool_call_leaves_everything_consistent(nested, where):
    """Whatever the pool calls back (it may be refused with RuntimeError), the
    outer call completes or raises, and nothing is left inconsistent or
    leaked."""

    class CallsBack(ListPool):
        coord = None
        busy = False
        errors: list = []

        def _back(self, name):
            if name == where and not self.busy and self.coord is not None:
                self.busy = True
                try:
                    nested(self.coord.store, self.coord)
                except RuntimeError as e:  # refused from inside a drain or a filing
                    self.errors.append(str(e))
                finally:
                    self.busy = False

        @property
        def num_free(self):
            self._back("num_free")
            return len(self._free)

        def reserve_units(self, count, owner):
            self._back("reserve_units")
            return super().reserve_units(count, owner)

        def release_units(self, unit_ids, owner):
            super().release_units(unit_ids, owner)
            self._back("release_units")

    pool = CallsBack(20)
    coord = sc.PagedStateCheckpointCoordinator(
        pool, sc.PagedStateCheckpointSpec(**SPEC), True, offload=sc.StateOffloadIndex()
    )
    store = coord.store
    seqs = [sc.Sequence(seq_id=i) for i in range(3)]
    for i, s in enumerate(seqs):
        s.state_slots = [i]
    pool.coord = coord
    rng = random.Random(7)
    for _ in range(120):
        h = rng.randrange(1, 9)
        which = rng.randrange(8)
        if which == 0:
            coord.checkpoint(rng.choice(seqs), 1, h)
        elif which == 1:
            coord.take_checkpoint_ops()
        elif which == 2:
            coord.complete_previous_batch()
        elif which == 3:
            coord.unindex(h)
        elif which == 4:
            coord.begin_restore(h, 6)
            coord.take_checkpoint_ops()
        elif which == 5:
            for op, _units in store.take_offload_stores(2):
                store.release_offload_store_source(op)
        elif which == 6:
            coord.has_available_units(rng.choice([4, 12, 20]))
        else:
            store.reclaim_stale_offload_pins(1e-9)
        coord.check_consistency()
        pool.check_consistency()
        transfer = {u for u, o in pool._owner.items() if o == ("state-transfer", "t")}
        assert checkpoint_units(pool) == record_units(store)
        assert len(pool._owner) == len(record_units(store)) + len(transfer)


# ---------------------------------------------------------------- threads ----


def test_another_threads_call_waits_while_the_pool_runs():
    """A pool's Python code lets other threads run; their calls on the store
    wait until it returns, so no two store calls interleave."""
    log = []

    class Slow(ListPool):
        def reserve_units(self, count, owner):
            log.append(("start", owner))
            time.sleep(0.05)  # releases the GIL
            log.append(("end", owner))
            return super().reserve_units(count, owner)

    pool = Slow(16)
    coord = sc.PagedStateCheckpointCoordinator(pool, sc.PagedStateCheckpointSpec(**SPEC), True)
    store = coord.store
    started = threading.Event()

    errors = []

    def other():
        started.wait()
        time.sleep(0.01)  # inside the first reservation by now
        try:
            # Refused from inside a filing on this thread; from another it waits its turn.
            store.complete_inflight()
            coord.complete_previous_batch()
            store.begin_store(2, 1)
            coord.reserve_transfer_units("t")
        except Exception as e:  # noqa: BLE001 - any failure here is the finding
            errors.append(repr(e))

    t = threading.Thread(target=other)
    t.start()
    started.set()
    store.begin_store(1, 0)
    t.join()
    assert errors == []
    assert [e for e, _ in log] == ["start", "end"] * 3
    assert log[1] == ("end", ("state-checkpoint", 0))
    coord.check_consistency()


# -------------------------------------------------------------------- gc ----


def test_a_pool_store_cycle_is_collectable():
    class Holder(ListPool):
        pass

    for make in (
        lambda p: store_on(p),
        lambda p: sc.PagedStateCheckpointCoordinator(p, sc.PagedStateCheckpointSpec(**SPEC), True),
    ):
        pool = Holder(12)
        obj = make(pool)
        pool.back = obj  # pool -> store or coordinator -> pool
        store = obj if isinstance(obj, sc.PageUnitCheckpointStore) else obj.store
        ready(store, 3)
        if not isinstance(obj, sc.PageUnitCheckpointStore):
            obj.reserve_transfer_units(pool)  # an owner naming the pool, held in the owner table
        wr = weakref.ref(pool)
        del pool, obj, store
        gc.collect()
        assert wr() is None
