"""Issue 9, PAGE side: callbacks, owners, validation, bare instances, pickling,
live views, garbage collection and the invariant checkers.

Each crash class has a named regression test. Tests whose failure would be a
crash run their body in a subprocess (``isolated``), so a regression fails
one test instead of taking the runner down.
"""

import copy
import gc
import os
import pickle
import random
import subprocess
import sys
import textwrap
import weakref

import pytest

import statecache as sc
from paged_harness import FakeScratch, check_conservation

SPEC = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=400)
UNITS = SPEC.units_per_checkpoint  # 4

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "python")
SUPPORT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def isolated(body: str, malloc_debug: bool = False) -> str:
    """Runs ``body`` in a fresh interpreter; a crash fails the calling test.
    ``malloc_debug`` turns a read of freed memory into a crash."""
    src = "import statecache as sc\n" + textwrap.dedent(body)
    env = dict(os.environ)
    if malloc_debug:
        env["PYTHONMALLOC"] = "debug"
    # The caller's path first (a sanitizer build, say), then this checkout's.
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [os.path.abspath(PYTHON_DIR), SUPPORT_DIR])
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", src], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


@pytest.fixture
def unraisable(monkeypatch):
    """Exceptions reported through sys.unraisablehook, in order."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


def seq_in(slot, seq_id=0):
    s = sc.Sequence(seq_id=seq_id)
    s.state_slots = [slot]
    return s


def cached_kv(pool, hashes):
    """Blocks freed with their hashes: handing them out fires on_evict."""
    blocks = pool.allocate(len(hashes))
    for b, h in zip(blocks, hashes):
        assert pool.publish(b, h)
    pool.free(blocks)
    return blocks


def snapshot(pool, store=None):
    state = {
        "free": pool.num_free,
        "cached": pool.num_cached,
        "kv": pool.num_kv_blocks,
        "reserved": pool.num_reserved,
        "owners": [repr(pool.owner_of(u)) for u in range(pool.num_blocks)],
    }
    if store is not None:
        state["records"] = {cid: (r.prefix_hash, r.unit_ids, r.state, r.pin_count) for cid, r in store.records.items()}
        state["index"] = dict(store.hash_to_checkpoint.items())
        state["backlog"] = list(store.store_backlog)
        state["pins"] = store.has_offload_pins()
        state["generation"] = store.generation
    return state


def consistent(pool, store=None, coord=None):
    pool.check_consistency()
    check_conservation(pool)
    if store is not None:
        store.check_consistency()
    if coord is not None:
        coord.check_consistency()


# ------------------------------------------------------------------ callbacks --


def test_raising_on_evict_in_take_checkpoint_ops_delivers_every_store(unraisable):
    pool = sc.BlockPool(3 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    cached_kv(pool, list(range(100, 100 + 3 * UNITS)))  # every free block is a cached KV block

    def boom(h):
        raise RuntimeError(f"on_evict {h}")

    pool.on_evict = boom
    seqs = [seq_in(slot, seq_id=slot) for slot in range(3)]
    coord.complete_previous_batch()
    for i, s in enumerate(seqs):
        coord.checkpoint(s, 1, 7000 + i)
    stores, restores = coord.take_checkpoint_ops()
    # Every store begun was handed out: none can become READY unwritten.
    assert len(stores) == 3 and restores == ()
    assert len(unraisable) == 3 * UNITS and all(isinstance(e, RuntimeError) for e in unraisable)
    records = coord.store.records
    assert sorted(r.unit_ids for r in records.values()) == sorted(op.unit_ids for op in stores)
    # No unit is held by a checkpoint id without a record.
    owners = {pool.owner_of(u) for u in range(pool.num_blocks)}
    assert owners == {("state-checkpoint", cid) for cid in records}
    coord.complete_previous_batch()
    assert all(coord.contains(7000 + i) for i in range(3))
    consistent(pool, coord.store, coord)


@pytest.mark.parametrize("call", ["reserve_units", "allocate", "begin_store"])
def test_raising_on_evict_leaks_no_units_or_blocks(call, unraisable):
    pool = sc.BlockPool(UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    cached_kv(pool, [1, 2, 3, 4])
    pool.on_evict = lambda h: 1 / 0
    if call == "reserve_units":
        got = pool.reserve_units(UNITS, "me")
        assert sorted(got) == list(range(UNITS)) and all(pool.owner_of(u) == "me" for u in got)
        pool.release_units(got, "me")
    elif call == "allocate":
        got = pool.allocate(UNITS)
        assert sorted(got) == list(range(UNITS)) and pool.num_kv_blocks == UNITS
        pool.free(got)
    else:
        op = store.begin_store(55, 0)
        assert sorted(op.unit_ids) == list(range(UNITS))
        store.complete_inflight()
        assert store.lookup(55) == 0
    assert len(unraisable) == UNITS and all(isinstance(e, ZeroDivisionError) for e in unraisable)
    consistent(pool, store)


def test_on_evict_detaching_or_replacing_itself_mid_report(unraisable):
    pool = sc.BlockPool(3)
    calls = []

    def detach(h):
        calls.append(("detach", h))
        pool.on_evict = None

    cached_kv(pool, [1, 2, 3])
    pool.on_evict = detach
    assert len(pool.allocate(3)) == 3  # three evictions, the handler gone after the first
    assert calls == [("detach", 1)] and unraisable == []

    def second(h):
        calls.append(("second", h))

    def first(h):
        calls.append(("first", h))
        pool.on_evict = second

    pool2 = sc.BlockPool(2)
    cached_kv(pool2, [5, 6])
    pool = pool2
    pool2.on_evict = first
    pool2.allocate(2)
    assert calls[1:] == [("first", 5), ("second", 6)] and unraisable == []
    consistent(pool2)


def test_on_evict_reentering_pool_store_and_coordinator():
    pool = sc.BlockPool(6 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    store = coord.store
    seen = []

    def reenter(h):
        seen.append(h)
        coord.unindex(h)
        got = pool.reserve_units(1, ("guest", h))
        if got:
            pool.release_units(got, ("guest", h))
        store.has_available_units(UNITS)
        op = store.begin_store(900 + h, 7)  # a store begun from inside the report
        if op is not None:
            reentrant_ops.append(op)
        coord.checkpoint(seq_in(5, seq_id=50), 1, 800 + h)
        pool.check_consistency()

    reentrant_ops = []
    cached_kv(pool, list(range(1, 6 * UNITS + 1)))
    pool.on_evict = reenter
    coord.complete_previous_batch()
    coord.checkpoint(seq_in(0), 1, 4242)
    stores, _ = coord.take_checkpoint_ops()
    assert len(stores) == 1 and seen
    coord.complete_previous_batch()
    assert coord.contains(4242)
    consistent(pool, store, coord)


def test_clock_raising_or_not_a_number_leaks_no_offload_pin():
    pool = sc.BlockPool(4 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC, offload_sink=True)
    store.begin_store(11, 0)
    store.complete_inflight()
    before = snapshot(pool, store)
    for bad, exc in ((lambda: "soon", TypeError), (lambda: 1 / 0, ZeroDivisionError), (lambda: None, TypeError)):
        store.use_clock(bad)
        with pytest.raises(exc):
            store.take_offload_stores(4)
        with pytest.raises(exc):
            store.acquire_checkpoint_source(11)
        assert snapshot(pool, store) == before and store.records[0].pin_count == 0
    with pytest.raises(TypeError, match="clock"):
        store.use_clock(42)  # not callable
    store.use_clock(lambda: 5)
    [(op, units)] = store.take_offload_stores(4)
    assert store.records[0].pin_count == 1
    store.use_clock(lambda: 100.0)
    assert store.reclaim_stale_offload_pins(10) == 1 and store.records[0].pin_count == 0
    consistent(pool, store)


def test_clock_replacing_itself_while_read():
    pool = sc.BlockPool(2 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC, offload_sink=True)
    store.begin_store(11, 0)
    store.complete_inflight()

    def once():
        store.use_clock(None)
        return 1.0

    store.use_clock(once)
    assert len(store.take_offload_stores(2)) == 1
    consistent(pool, store)


def test_scratch_pool_pop_raising_gives_back_what_it_handed_out():
    pool = sc.BlockPool(4 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, readable_midstep=True)

    class Flaky(FakeScratch):
        pops = 0

        def pop(self):
            Flaky.pops += 1
            if Flaky.pops == 2:
                raise RuntimeError("scratch pop")
            return super().pop()

    scratch = Flaky(4)
    coord.attach_midstep_scratch(scratch, 4)
    with pytest.raises(RuntimeError, match="scratch pop"):
        coord.reserve_midstep(seq_in(0), [(16, 1), (32, 2)])
    assert sorted(scratch.free) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="reservations"):
        coord.publish_midstep([(0, 16, 1)])  # what was given back cannot be published
    consistent(pool, coord.store, coord)


# --------------------------------------------------------------------- owners --


class HashRaises:
    def __hash__(self):
        raise RuntimeError("owner hash")


def test_owner_hash_raising_is_a_clean_error():
    pool = sc.BlockPool(4)
    before = snapshot(pool)
    with pytest.raises(RuntimeError, match="owner hash"):
        pool.reserve_units(2, HashRaises())
    with pytest.raises(RuntimeError, match="owner hash"):
        pool.reserve_units(2, ("state-transfer", HashRaises()))
    with pytest.raises(TypeError):
        pool.reserve_units(2, ["unhashable"])
    assert snapshot(pool) == before
    consistent(pool)


def test_owner_eq_reentering_the_pool_is_refused_cleanly():
    out = isolated("""
        pool = sc.BlockPool(8)

        class Nosy:
            def __init__(self, tag):
                self.tag = tag
            def __hash__(self):
                return 1
            def __eq__(self, other):
                pool.reserve_units(1, "inner")  # re-enters the owner table
                return isinstance(other, Nosy) and other.tag == self.tag

        a = pool.reserve_units(2, Nosy("a"))
        try:
            pool.reserve_units(2, Nosy("b"))  # same hash: __eq__ runs and re-enters
        except RuntimeError as e:
            print("refused", "owner table" in str(e))
        else:
            print("accepted")
        for u in range(8):
            pool.owner_of(u)
        pool.check_consistency()
        assert pool.num_reserved == 2 and pool.num_free == 6
        pool.release_units(a, [o for o in [pool.owner_of(a[0])]][0])
        pool.check_consistency()
        print("ok")
    """)
    assert out.split() == ["refused", "True", "ok"]


def test_owner_sweep_survives_a_key_whose_hash_starts_raising(unraisable):
    pool = sc.BlockPool(4)

    class Fickle:
        broken = False

        def __hash__(self):
            if Fickle.broken:
                raise RuntimeError("hash now broken")
            return 7

    pool.reserve_units(0, Fickle())  # interned, holds nothing: swept later
    Fickle.broken = True
    for i in range(600):  # enough interned owners to trigger sweeps
        got = pool.reserve_units(1, ("o", i))
        pool.release_units(got, ("o", i))
    assert any("hash now broken" in str(e) for e in unraisable)
    Fickle.broken = False
    got = pool.reserve_units(1, Fickle())
    assert isinstance(pool.owner_of(got[0]), Fickle)
    consistent(pool)


def test_owner_none_is_refused():
    pool = sc.BlockPool(4)
    got = pool.reserve_units(1, "a")
    for call in (
        lambda: pool.reserve_units(1, None),
        lambda: pool.release_units(got, None),
        lambda: pool.rekey_units(got, None, "b"),
        lambda: pool.rekey_units(got, "a", None),
    ):
        with pytest.raises(ValueError, match="owner"):
            call()
    assert pool.owner_of(got[0]) == "a" and pool.num_reserved == 1
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    with pytest.raises(ValueError, match="owner"):
        coord.reserve_transfer_units(None)
    consistent(pool)


def test_equal_owners_are_one_owner():
    pool = sc.BlockPool(16)
    u = pool.reserve_units(1, 1)
    pool.release_units(u, 1.0)  # 1 == 1.0: the same owner, as in a dict
    u = pool.reserve_units(1, True)
    pool.rekey_units(u, 1, ("a", 1))
    pool.release_units(u, ("a", 1.0))
    u = pool.reserve_units(2, ("state-checkpoint", 3))
    assert pool.owner_of(u[0]) == ("state-checkpoint", 3)
    pool.release_units(u, ("state-checkpoint", 3.0))
    u = pool.reserve_units(1, ("state-transfer", 2))
    pool.release_units(u, ("state-transfer", 2.0))
    np = pytest.importorskip("numpy")
    u = pool.reserve_units(1, ("state-checkpoint", np.int64(5)))
    pool.release_units(u, ("state-checkpoint", 5))
    assert pool.num_reserved == 0
    consistent(pool)


# ----------------------------------------------------------------- validation --


def ready(store, h, slot=0):
    op = store.begin_store(h, slot)
    store.complete_inflight()
    return op


def test_release_suspended_restore_twice_takes_no_other_pin():
    pool = sc.BlockPool(4 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    ready(store, 7)
    store.begin_restore(7, 1)
    s1 = store.suspend_queued_restore(1)
    store.begin_restore(7, 2)  # another restore of the same checkpoint
    assert store.records[0].pin_count == 2
    store.release_suspended_restore(s1)
    before = snapshot(pool, store)
    with pytest.raises(ValueError, match="restore"):
        store.release_suspended_restore(s1)
    with pytest.raises(ValueError, match="restore"):
        store.resume_suspended_restore(s1)
    forged = sc.SuspendedCheckpointRestore(0, s1.operation)  # equal by value, never handed out again
    with pytest.raises(ValueError, match="restore"):
        store.release_suspended_restore(forged)
    assert snapshot(pool, store) == before and store.records[0].pin_count == 1
    assert store.restore_queued_for(2)
    consistent(pool, store)


def test_adopt_units_checks_the_unit_count():
    pool = sc.BlockPool(4 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    for n in (UNITS - 1, UNITS + 1, 0):
        got = pool.reserve_units(n, "loader")
        before = snapshot(pool, store)
        with pytest.raises(ValueError, match="unit_ids"):
            store.adopt_units(tuple(got), "loader", 99)
        assert snapshot(pool, store) == before
        pool.release_units(got, "loader")
    got = pool.reserve_units(UNITS, "loader")
    assert store.adopt_units(tuple(got), "loader", 99) is True
    consistent(pool, store)


def test_minus_one_is_never_a_content_hash():
    pool = sc.BlockPool(8 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, readable_midstep=True)
    coord.attach_midstep_scratch(FakeScratch(4), 4)
    store = coord.store
    blocks = pool.allocate(1)
    before = snapshot(pool, store)
    got = pool.reserve_units(UNITS, "loader")
    owner = ("state-transfer", "x")
    assert coord.reserve_transfer_units("x") is not None
    mid = snapshot(pool, store)
    for call in (
        lambda: store.begin_store(-1, 0),
        lambda: store.adopt_units(tuple(got), "loader", -1),
        lambda: coord.checkpoint(seq_in(0), 1, -1),
        lambda: coord.adopt_transfer_units("x", -1),
        lambda: coord.reserve_midstep(seq_in(0), [(16, -1)]),
        lambda: pool.publish(blocks[0], -1),
    ):
        with pytest.raises(ValueError, match="-1"):
            call()
        assert snapshot(pool, store) == mid
    assert coord.take_checkpoint_ops() == ((), ())
    assert store.lookup(-1) == -1 and not store.contains(-1) and -1 not in store.hash_to_checkpoint
    assert pool.owner_of(coord.reserve_transfer_units("y")[0]) == ("state-transfer", "y")
    del before, owner
    consistent(pool, store, coord)


BIG = [2**63, -(2**63) - 1, 2**70, -(2**70)]


def test_int_arguments_are_range_checked_and_change_nothing():
    pool = sc.BlockPool(4 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    store = coord.store
    ready(store, 7)
    s = seq_in(0)
    before = snapshot(pool, store)
    for big in BIG:
        hbig = 2**64 if big == 2**63 else big  # a hash takes [-2**63, 2**64)
        with pytest.raises((ValueError, OverflowError), match="count"):
            pool.reserve_units(big, "o")
        with pytest.raises((ValueError, OverflowError), match="count"):
            pool.allocate(big)
        with pytest.raises((ValueError, OverflowError), match="prefix_hash"):
            store.begin_store(hbig, 0)
        with pytest.raises((ValueError, OverflowError), match="src_slot"):
            store.begin_store(5, big)
        with pytest.raises((ValueError, OverflowError), match="dst_slot"):
            store.begin_restore(7, big)
        with pytest.raises((ValueError, OverflowError), match="hit"):
            coord.resumable_hit(s, big, [7])
        with pytest.raises((ValueError, OverflowError), match="block_hashes"):
            coord.resumable_hit(s, 1, [hbig])
        with pytest.raises((ValueError, OverflowError), match="boundary_blocks"):
            coord.checkpoint(s, big, 5)
        with pytest.raises((ValueError, OverflowError), match="unit_ids"):
            pool.release_units([big], "o")
        with pytest.raises((ValueError, OverflowError), match="count"):
            store.has_available_units(big)
        with pytest.raises((ValueError, OverflowError), match="max_inflight"):
            store.take_offload_stores(big)
        with pytest.raises((ValueError, OverflowError), match="unit"):
            pool.owner_of(big)
        with pytest.raises((ValueError, OverflowError), match="generation"):
            store.changed_since(big)
    for neg, fn in (
        (-1, lambda v: pool.reserve_units(v, "o")),
        (-1, pool.allocate),
        (-2, lambda v: store.begin_store(5, v)),
        (-1, lambda v: coord.checkpoint(s, v, 5)),
        (-1, lambda v: coord.resumable_hit(s, v, [7])),
        (-1, store.ensure_free_units),
    ):
        with pytest.raises(ValueError):
            fn(neg)
    with pytest.raises(IndexError):
        pool.owner_of(4 * UNITS)
    assert snapshot(pool, store) == before
    consistent(pool, store, coord)


MUTATING_SETUP = """
    from paged_harness import FakeScratch
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=400)
    pool = sc.BlockPool(64)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, True, readable_midstep=True)
    coord.attach_midstep_scratch(FakeScratch(4), 4)
    store = coord.store
    seq = sc.Sequence(seq_id=1); seq.state_slots = [0]

    class Clearer:
        def __init__(self, target, value):
            self.target, self.value = target, value
        def __index__(self):
            self.target.clear()
            self.target.extend(object() for _ in range(3))
            return self.value
"""


def test_resumable_hit_hash_list_mutated_by_index_is_safe():
    out = isolated(
        MUTATING_SETUP
        + """
    results = []
    for n in range(1, 6):
        for make in (list, tuple):
            hashes = [1, 2, 3, 4, 5]
            hashes[n - 1] = Clearer(hashes, 3)
            hashes = make(hashes) if make is tuple else hashes
            try:
                results.append(coord.resumable_hit(seq, 5, hashes))
            except (ValueError, TypeError) as e:
                results.append(type(e).__name__)
    coord.check_consistency()
    print("ok", len(results))
    """,
        malloc_debug=True,
    )
    assert out.split() == ["ok", "10"]


def test_unit_and_reservation_lists_mutated_by_index_are_safe():
    out = isolated(
        MUTATING_SETUP
        + """
    results = []
    got = pool.reserve_units(3, "me")
    ids = list(got)
    ids[1] = Clearer(ids, got[1])
    try:
        pool.release_units(ids, "me")
    except (ValueError, TypeError) as e:
        results.append(type(e).__name__)
    res = coord.reserve_midstep(seq, [(16, 11), (32, 12)])
    rows = [list(r) for r in res]
    rows[0][0] = Clearer(rows[0], res[0][0])
    try:
        coord.cancel_midstep(rows)
    except (ValueError, TypeError) as e:
        results.append(type(e).__name__)
    try:
        coord.cancel_midstep(res)
    except ValueError:
        pass  # the mutated call already cancelled them
    pool.check_consistency()
    coord.check_consistency()
    print("ok")
    """,
        malloc_debug=True,
    )
    assert out.split() == ["ok"]


def test_resumable_hit_with_a_tier_mutating_the_hash_list():
    pool = sc.BlockPool(4 * UNITS)
    hashes = [1, 2, 3, 4, 5, 6]

    class Tier:
        def could_serve(self, h):
            hashes.clear()  # shrinks the list resumable_hit is reading
            return False

    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, offload=Tier())
    # The scan reads a snapshot taken before the first vote: every hash is asked.
    asked = []
    Tier.could_serve = lambda self, h: asked.append(h) or hashes.clear() or False
    assert coord.resumable_hit(seq_in(0), 6, hashes) == 0
    assert asked == [6, 5, 4, 3, 2, 1] and hashes == []
    consistent(pool, coord.store, coord)


def test_publish_and_cancel_take_only_open_reservations():
    pool = sc.BlockPool(4 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, readable_midstep=True)
    scratch = FakeScratch(4)
    coord.attach_midstep_scratch(scratch, 4)
    s = seq_in(0)
    res = coord.reserve_midstep(s, [(16, 1), (32, 2)])
    free_before = sorted(scratch.free)
    for rows in ([(3, 16, 1)], [res[0], res[0]], [res[0], (res[1][0], 99, 2)], [(0, 16, -5)]):
        with pytest.raises(ValueError, match="reservations"):
            coord.cancel_midstep(rows)
        with pytest.raises(ValueError, match="reservations"):
            coord.publish_midstep(rows)
        assert sorted(scratch.free) == free_before
    coord.publish_midstep([tuple(res[0])])
    with pytest.raises(ValueError, match="reservations"):
        coord.cancel_midstep([res[0]])  # already published
    coord.cancel_midstep([res[1]])
    consistent(pool, coord.store, coord)


# ------------------------------------------------- bare instances and pickling --

PAGE_CLASSES = [
    "BlockPool",
    "PageUnitCheckpointStore",
    "PagedStateCheckpointCoordinator",
    "StateOffloadIndex",
    "PagedStateCheckpointSpec",
    "CheckpointStoreOp",
    "CheckpointRestoreOp",
    "CheckpointRecord",
    "SuspendedCheckpointRestore",
    "CheckpointRecordsView",
    "CheckpointHashIndexView",
    "OffloadBacklogView",
    "OffloadHashesView",
]


def test_bare_instances_of_every_page_class_are_refused():
    out = isolated(f"""
        import statecache._C as C
        for name in {PAGE_CLASSES!r}:
            cls = getattr(C, name)
            try:
                obj = cls.__new__(cls)
            except TypeError as e:
                # the op values build themselves in __new__: it needs their fields
                assert "__init__" in str(e) or "uninitialized" in str(e) or "missing required argument" in str(e), e
                print("refused", name)
            else:
                print("CREATED", name)
            try:
                cls.__mro__[1].__new__(cls)  # pybind11_object.__new__
            except TypeError:
                pass
            else:
                print("CREATED-BY-BASE", name)
    """)
    assert out.split() == [w for name in PAGE_CLASSES for w in ("refused", name)]


def test_python_subclasses_still_construct():
    class MyPool(sc.BlockPool):
        pass

    pool = MyPool(8)
    assert pool.num_free == 8 and isinstance(pool, sc.BlockPool)


def live_objects():
    pool = sc.BlockPool(4 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, offload=sc.StateOffloadIndex())
    store = coord.store
    ready(store, 7)
    index = coord.offload
    return [pool, store, coord, index, store.records, store.hash_to_checkpoint, store.store_backlog, index.hashes]


@pytest.mark.parametrize("i", range(8))
def test_live_objects_refuse_pickle_and_copy(i):
    obj = live_objects()[i]
    for fn in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="pickle or copy"):
            fn(obj)


def test_value_types_round_trip_through_pickle_and_copy():
    op = sc.CheckpointStoreOp(1, (2, 3), 400, "L")
    values = [
        SPEC,
        op,
        sc.CheckpointRestoreOp(1, (2, 3), 400, "L"),
        sc.StateStoreOperationId(5, 2),
        sc.SuspendedCheckpointRestore(3, sc.CheckpointRestoreOp(1, (2,), 400, "L")),
        sc.CheckpointRecord(5, (1, 2), "READY", 1),
    ]
    for v in values:
        for fn in (lambda x: pickle.loads(pickle.dumps(x)), copy.copy, copy.deepcopy):
            assert fn(v) == v


# ------------------------------------------------------------------ live views --


def test_views_keep_their_store_alive_and_follow_it():
    pool = sc.BlockPool(4 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC, offload_sink=True)
    ready(store, 7)
    records, index, backlog = store.records, store.hash_to_checkpoint, store.store_backlog
    rec = records[0]
    wstore = weakref.ref(store)
    del store
    gc.collect()
    assert wstore() is not None  # the views hold it
    assert len(records) == 1 and index[7] == 0 and list(backlog) == [0]
    wstore().clear()
    assert len(records) == 0 and 7 not in index and rec.state == "EVICTING"
    with pytest.raises(KeyError):
        records[0]
    with pytest.raises(IndexError):
        backlog[5]
    with pytest.raises(AttributeError):
        rec.pin_count = 3  # a store's record is read-only
    del records, index, backlog
    gc.collect()
    assert rec.prefix_hash == 7  # the record keeps the fields it was released with


def test_views_iterated_while_the_store_changes_do_not_hang():
    pool = sc.BlockPool(8 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    for h in range(8):
        ready(store, 100 + h)
    seen = 0
    for cid in store.records:
        store.unindex(100 + cid)  # removes entries while iterating
        ready(store, 200 + cid, slot=1)
        seen += 1
    assert seen == 8
    for _h in store.hash_to_checkpoint:
        store.clear()
    consistent(pool, store)


# ------------------------------------------------------------------------- GC --


def test_pool_coordinator_cycle_is_collected():
    def build():
        pool = sc.BlockPool(4 * UNITS)
        coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
        pool.on_evict = coord.unindex  # the README's own example: a cycle through C++
        coord.checkpoint(seq_in(0), 1, 5)  # pending state holds a sequence too
        return weakref.ref(pool), weakref.ref(coord), weakref.ref(coord.store)

    refs = [build() for _ in range(5)]
    gc.collect()
    assert all(r() is None for t in refs for r in t)


def test_store_clock_and_pool_cycles_are_collected():
    def build():
        pool = sc.BlockPool(4 * UNITS)
        store = sc.PageUnitCheckpointStore(pool, SPEC)
        pool.on_evict = store.unindex
        views = (store.records, store.hash_to_checkpoint, store.store_backlog)
        store.use_clock(lambda: float(len(views[0])))  # the clock refers back to the store
        pool.reserve_units(1, ("owner", pool))  # an owner that holds the pool
        return weakref.ref(pool), weakref.ref(store)

    refs = [build() for _ in range(5)]
    gc.collect()
    assert all(r() is None for t in refs for r in t)


def test_coordinator_tier_and_scratch_cycles_are_collected():
    class Tier:
        def could_serve(self, h):
            return False

    def build():
        pool = sc.BlockPool(4 * UNITS)
        coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True, readable_midstep=True)
        tier, scratch = Tier(), FakeScratch(2)
        tier.coord = coord
        scratch.coord = coord
        coord.attach_offload(tier)
        coord.attach_midstep_scratch(scratch, 2)
        return weakref.ref(pool), weakref.ref(coord), weakref.ref(tier), weakref.ref(scratch)

    refs = [build() for _ in range(5)]
    gc.collect()
    assert all(r() is None for t in refs for r in t)


def test_engines_built_and_dropped_leave_no_pools_alive():
    from engine_support import engine
    from statecache.engine import Request

    def pools_alive():
        return sum(1 for o in gc.get_objects() if type(o) is sc.BlockPool)

    gc.collect()
    baseline = pools_alive()
    refs = []
    for i in range(100):
        e = engine("page" if i % 2 else "fork")  # the block manager sets pool.on_evict
        e.add_request(Request(list(range(1, 26)), 3, scripted_output=[900, 901, 902]))
        e.run_until_done()
        coord = e.block_manager.caches.coordinator
        refs += [weakref.ref(e.block_manager.pool), weakref.ref(e)]
        if coord is not None:
            refs.append(weakref.ref(coord))
        del e, coord
    gc.collect()
    assert pools_alive() == baseline
    assert all(r() is None for r in refs)


def test_gc_clear_leaves_surviving_cpp_objects_usable():
    # A record handle keeps the C++ store alive after the collector cleared
    # the Python side of the cycle; reading it must still work.
    pool = sc.BlockPool(4 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    pool.on_evict = store.unindex
    ready(store, 7)
    rec = store.records[0]
    del pool, store
    gc.collect()
    assert rec.prefix_hash == 7 and len(rec.unit_ids) == UNITS


# --------------------------------------------------------- invariant checkers --


def test_checkers_hold_across_random_valid_and_invalid_calls():
    rng = random.Random(9)
    pool = sc.BlockPool(10 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(
        pool, SPEC, True, offload=sc.StateOffloadIndex(capacity=4), readable_midstep=True
    )
    store = coord.store
    coord.attach_midstep_scratch(FakeScratch(3), 3)
    pool.on_evict = coord.unindex
    seqs = [seq_in(i, seq_id=i) for i in range(4)]
    hashes = [-1, 0, 1, 2, 3, 2**63 - 1, -(2**63), 2**64, "x", None, 1.5]
    reservations, suspended, ops, kv = [], [], [], []
    for step in range(1500):
        h = rng.choice(hashes)
        n = rng.choice([-1, 0, 1, 4, 7, 2**70])
        s = rng.choice(seqs)
        calls = [
            lambda: coord.checkpoint(s, rng.choice([0, 1, -1]), h),
            lambda: coord.take_checkpoint_ops(),
            lambda: coord.complete_previous_batch(),
            lambda: coord.begin_restore(h, rng.choice([0, 1, -1, 2**70])),
            lambda: coord.resumable_hit(s, rng.choice([0, 1, 3, -1]), [rng.choice(hashes) for _ in range(3)]),
            lambda: reservations.append(coord.reserve_midstep(s, [(16, h)])),
            lambda: coord.publish_midstep(reservations.pop() if reservations else [(0, 1, 2)]),
            lambda: coord.cancel_midstep(reservations.pop() if reservations else [(0, 1, 2)]),
            lambda: suspended.append(coord.suspend_queued_restore(rng.choice([0, 1]))),
            lambda: coord.release_suspended_restore(rng.choice(suspended) if suspended else None),
            lambda: coord.resume_suspended_restore(rng.choice(suspended) if suspended else None),
            lambda: ops.extend(op for op, _ in coord.take_offload_stores(n)),
            lambda: coord.release_offload_store_source(rng.choice(ops) if ops else (1, 1)),
            lambda: coord.settle_offload_store(rng.choice(ops) if ops else (1, 1)),
            lambda: coord.reserve_transfer_units(rng.choice(["a", "b", None])),
            lambda: coord.adopt_transfer_units(rng.choice(["a", "b"]), h),
            lambda: coord.release_transfer_units(rng.choice(["a", "b"])),
            lambda: coord.unindex(h),
            lambda: coord.ensure_free_units(n),
            lambda: kv.append(pool.allocate(rng.choice([1, 2]))),
            lambda: pool.publish(rng.choice(kv)[0], h) if kv and kv[-1] else None,
            lambda: pool.free(kv.pop()) if kv and kv[-1] else None,
            lambda: pool.reserve_units(n, rng.choice([("state-checkpoint", 0), "u", None])),
            lambda: coord.clear_index() if rng.random() < 0.05 else None,
        ]
        call = rng.choice(calls)
        before = snapshot(pool, store)
        try:
            call()
        except (ValueError, TypeError, OverflowError, IndexError, AssertionError):
            after = snapshot(pool, store)
            assert after == before, f"step {step}: a refused call changed something"
        consistent(pool, store, coord)


def test_on_evict_cannot_complete_stores_that_are_not_written(unraisable):
    # From inside take_checkpoint_ops (or begin_store) a handler that
    # completes the batch would make unwritten stores READY: refused.
    pool = sc.BlockPool(2 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    store = coord.store
    cached_kv(pool, list(range(1, 2 * UNITS + 1)))
    pool.on_evict = lambda h: (coord.complete_previous_batch(), coord.take_checkpoint_ops())
    coord.checkpoint(seq_in(0), 1, 77)
    stores, _ = coord.take_checkpoint_ops()
    assert len(stores) == 1 and not coord.contains(77)
    assert unraisable and all(isinstance(e, RuntimeError) for e in unraisable)
    pool.on_evict = lambda h: store.complete_inflight()
    unraisable.clear()
    assert store.begin_store(78, 1) is not None and not store.contains(78)
    assert unraisable and all(isinstance(e, RuntimeError) for e in unraisable)
    coord.complete_previous_batch()
    assert coord.contains(77) and coord.contains(78)
    consistent(pool, store, coord)


# ------------------------------------------------- the wrong-state property --


class DeviceModel:
    """What each slot and page unit holds, as the runner would leave them.

    A slot holds the prefix hash its state belongs to; a unit holds
    ``(hash, position in the image)`` after a store scatters into it, and
    ``None`` once anything else (KV data, another owner) may have written it.
    """

    def __init__(self, num_slots, num_blocks):
        self.slot = [None] * num_slots
        self.unit = [None] * num_blocks

    def run(self, stores, restores):
        # Stores read slots before restores overwrite them (one batch).
        for op in stores:
            for i, u in enumerate(op.unit_ids):
                self.unit[u] = (self.slot[op.src_slot], i)
        for op in restores:
            images = {self.unit[u][0] if self.unit[u] else None for u in op.unit_ids}
            positions = [self.unit[u][1] if self.unit[u] else None for u in op.unit_ids]
            assert len(images) == 1 and positions == list(range(len(op.unit_ids))), (
                f"restore into slot {op.dst_slot} gathers units {op.unit_ids} holding {[self.unit[u] for u in op.unit_ids]}"
            )
            self.slot[op.dst_slot] = images.pop()

    def scribble(self, blocks):
        for b in blocks:
            self.unit[b] = None


@pytest.mark.parametrize("seed", range(6))
def test_a_hit_never_names_bytes_of_another_prefix(seed, unraisable):
    """docs/contract.md, "Invariants": whatever valid and invalid calls came before, a READY
    checkpoint found by ``lookup`` / ``resumable_hit`` restores exactly the
    state filed under its hash."""
    rng = random.Random(seed)
    num_slots, num_blocks = 6, rng.choice([3, 5, 8]) * UNITS
    pool = sc.BlockPool(num_blocks)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    store = coord.store
    dev = DeviceModel(num_slots, num_blocks)
    hashes = list(range(1, 13))
    pool.on_evict = coord.unindex
    if seed % 2:
        flaky_evictions = []

        def flaky(h):  # unindexes, then raises: reported, the call completes
            coord.unindex(h)
            flaky_evictions.append(h)
            raise RuntimeError("flaky on_evict")

        pool.on_evict = flaky
    seqs = []
    for i in range(num_slots):
        s = seq_in(i, seq_id=i)
        seqs.append(s)
    kv, suspended, pending_slots = [], [], set()
    restored = 0
    for step in range(1200):
        kind = rng.choice(
            [
                "advance",
                "advance",
                "checkpoint",
                "checkpoint",
                "drain",
                "hit",
                "hit",
                "kv",
                "kv_free",
                "unindex",
                "suspend",
                "owner",
                "bad",
                "clear",
            ]
        )
        s = rng.choice(seqs)
        slot = s.state_slots[0]
        # The pass protocol: a forward runs after the batch that carries the
        # slot's pending store or restore, never before it.
        if kind == "advance" and slot not in pending_slots and not coord.restore_queued_for(slot):
            dev.slot[slot] = rng.choice(hashes)
        elif kind == "checkpoint" and dev.slot[slot] is not None:
            coord.checkpoint(s, 1, dev.slot[slot])
            pending_slots.add(slot)
        elif kind == "drain":
            coord.complete_previous_batch()
            stores, restores = coord.take_checkpoint_ops()
            dev.run(stores, restores)
            restored += len(restores)
            pending_slots.clear()
        elif kind == "hit":
            chain = rng.sample(hashes, 4)
            hit = coord.resumable_hit(s, 4, chain)
            if hit and not coord.restore_queued_for(slot):
                coord.begin_restore(chain[hit - 1], slot)
        elif kind == "kv":
            got = pool.allocate(rng.choice([1, 2, 3]))
            if got:
                dev.scribble(got)
                for b in got:
                    if rng.random() < 0.5:
                        pool.publish(b, rng.choice(hashes))
                kv.append(got)
        elif kind == "kv_free" and kv:
            pool.free(kv.pop(rng.randrange(len(kv))))
        elif kind == "unindex":
            coord.unindex(rng.choice(hashes))
        elif kind == "suspend":
            r = coord.suspend_queued_restore(slot)
            if r is not None:
                suspended.append(r)
            if suspended and rng.random() < 0.5:
                r = suspended.pop()
                coord.release_suspended_restore(r)
                with pytest.raises(ValueError):
                    coord.release_suspended_restore(r)  # would take another restore's pin
        elif kind == "owner":
            got = pool.reserve_units(rng.choice([1, UNITS]), ("other", step))
            if got:
                dev.scribble(got)
                pool.release_units(got, ("other", step))
        elif kind == "bad":
            for call in (
                lambda: coord.checkpoint(s, 1, -1),
                lambda: store.begin_store(-1, slot),
                lambda: coord.publish_midstep([(slot, 1, 2)]),
            ):
                with pytest.raises(ValueError):
                    call()
        elif kind == "clear" and rng.random() < 0.2:
            coord.clear_index()
        for h in hashes:  # every findable image holds exactly that prefix, unit by unit
            cid = store.lookup(h)
            if cid >= 0:
                units = store.records[cid].unit_ids
                assert [dev.unit[u] for u in units] == [(h, i) for i in range(len(units))], (
                    f"step {step}: READY {h} names units holding {[dev.unit[u] for u in units]}"
                )
        consistent(pool, store, coord)
    assert restored > 10 and coord.checkpoints_kept > 30  # the property was exercised


def test_reclaim_timeout_accepts_any_real_number_and_refuses_the_rest():
    np = pytest.importorskip("numpy")
    pool = sc.BlockPool(2 * UNITS)
    store = sc.PageUnitCheckpointStore(pool, SPEC, offload_sink=True)
    store.use_clock(lambda: 0.0)
    ready(store, 1)
    store.take_offload_stores(1)
    for t in (10**400, -(10**400), np.int64(3), np.float32(0.5), 3, 2.5, float("nan"), float("inf")):
        assert store.reclaim_stale_offload_pins(t) == 0  # nothing is older than t (or t <= 0)
    for t in (True, "1", None, [1]):
        with pytest.raises(TypeError, match="timeout_s"):
            store.reclaim_stale_offload_pins(t)
    assert store.has_offload_pins()
    store.use_clock(lambda: 10.0)
    assert store.reclaim_stale_offload_pins(np.float32(5.0)) == 1
    consistent(pool, store)


def test_python_cannot_release_or_rekey_a_stores_image_units():
    # Releasing a READY image's units under the store's owner name would let
    # the pool hand them out while lookup still finds the image.
    pool = sc.BlockPool(4 * UNITS)
    coord = sc.PagedStateCheckpointCoordinator(pool, SPEC, True)
    for store in (coord.store, sc.PageUnitCheckpointStore(pool, SPEC)):
        ready(store, 7)
        cid = store.lookup(7)
        units = list(store.records[cid].unit_ids)
        before = snapshot(pool, store)
        with pytest.raises(ValueError, match="unit_ids"):
            pool.release_units(units[:1], ("state-checkpoint", cid))
        with pytest.raises(ValueError, match="unit_ids"):
            pool.rekey_units(units, ("state-checkpoint", cid), "thief")
        assert snapshot(pool, store) == before
        store.check_consistency()
    # Units a caller reserved under a checkpoint-style name are its own.
    mine = pool.reserve_units(2, ("state-checkpoint", 123))
    pool.release_units(mine, ("state-checkpoint", 123))
    consistent(pool)
