"""The threading promises of docs/contract.md, "Threading": one test each.

Each test makes a second thread run exactly while the first one is inside a
window where Python code runs in the middle of a call (a setter, an owner's
__hash__, a subclass's __new__, a metrics source), by blocking that code on an
event the other thread sets; ``time.sleep`` inside the window hands the GIL
over. Before the per-thread guards every one of them failed: the other thread's
call raised, or the first call did.
"""

from __future__ import annotations

import threading
import time

import pytest

import statecache as sc
from pool_diff import PlainSeq
from statecache.metrics import StateCacheMetrics

WINDOW_S = 0.2  # how long a window stays open; the other thread runs inside it


def _run(*fns):
    """Runs each fn on its own thread; returns the exceptions they raised."""
    errors: list = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(f,)) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
        assert not t.is_alive(), "a thread hung"
    return errors


class _OwnSeq(PlainSeq):
    """An engine's own request object (no statecache base class), admitted with one vacant slot."""

    def __init__(self, i: int) -> None:
        super().__init__(i, num_tokens=64, num_prompt_tokens=64)
        self.state_slots = [-1]


def test_calls_on_one_object_wait_for_another_threads_owner_hash():
    """Promise: calls on one object are serialised. An owner's __hash__ running
    on thread A (inside BlockPool's owner table) makes thread B's call on the
    pool wait, never fail; both owners end up holding their units."""
    pool = sc.BlockPool(16)
    inside, done = threading.Event(), threading.Event()

    class SlowOwner:
        armed = True

        def __hash__(self):
            if SlowOwner.armed:
                SlowOwner.armed = False
                inside.set()
                time.sleep(WINDOW_S)
            return 7

        def __eq__(self, other):
            return self is other

    slow = SlowOwner()
    got = {}

    def a():
        got["a"] = pool.reserve_units(2, slow)

    def b():
        inside.wait(10)
        got["b"] = pool.reserve_units(3, ("tenant", 2))
        pool.release_units(got["b"][:1], ("tenant", 2))
        done.set()

    assert _run(a, b) == []
    assert done.is_set() and len(got["a"]) == 2 and len(got["b"]) == 3
    assert all(pool.owner_of(u) is slow for u in got["a"])
    assert pool.owner_of(got["b"][0]) is None and pool.owner_of(got["b"][1]) == ("tenant", 2)
    assert pool.num_reserved == 4
    pool.check_consistency()


def test_a_batch_with_engine_objects_is_atomic_for_other_threads():
    """Promise: each public method is atomic with respect to other threads.
    ``checkpoint_many`` writes an engine object's fields back before filing;
    while its setter runs, another thread's calls on the pool (a pop, a read
    of the index) wait: the batch neither fails nor is seen half done, and the
    end state is the batch followed by the pop."""

    class SlowSetter(_OwnSeq):
        armed = False

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            if name == "state_fork_src" and type(self).armed:
                type(self).armed = False
                inside.set()
                time.sleep(WINDOW_S)

    def build():
        p = sc.StateSlotPool(16, sc.StateTransfer.fork(4), hash_block_size=4)
        seqs = [SlowSetter(0), _OwnSeq(1), _OwnSeq(2)]
        for s in seqs:
            s.state_slot = p.pop()
        return p, seqs

    inside = threading.Event()
    pool, seqs = build()
    seen = {}

    def a():
        SlowSetter.armed = True
        pool.checkpoint_many(seqs, [1, 1, 1], [11, 12, 13])

    def b():
        inside.wait(10)
        seen["index"] = dict(pool.hash_to_slot)  # waits: never the batch half done
        seen["popped"] = pool.pop()

    assert _run(a, b) == []
    twin, twin_seqs = build()
    twin.checkpoint_many(twin_seqs, [1, 1, 1], [11, 12, 13])
    assert seen["index"] == dict(twin.hash_to_slot)
    assert seen["popped"] == twin.pop()
    assert [s.state_slot for s in seqs] == [s.state_slot for s in twin_seqs]
    assert dict(pool.hash_to_slot) == dict(twin.hash_to_slot) and pool.num_free() == twin.num_free()
    pool._check_invariants()


def test_take_copies_is_not_failed_by_another_threads_call():
    """Promise: calls on one object are serialised. ``take_copies`` clears an
    engine object's ``pending_checkpoint`` before committing; another thread's
    ``checkpoint`` of another sequence in that window waits, and both land."""

    class SlowSetter(_OwnSeq):
        armed = False

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            if name == "pending_checkpoint" and value == -1 and type(self).armed:
                type(self).armed = False
                inside.set()
                time.sleep(WINDOW_S)

    inside = threading.Event()
    pool = sc.StateGroupPool(16, sc.StateTransfer.copy())
    slow, other = SlowSetter(0), sc.Sequence(1)
    slow.per_req_cache_group, other.per_req_cache_group = pool.pop(), pool.pop()
    pool.checkpoint(slow, 1, 21)
    got = {}

    def a():
        SlowSetter.armed = True
        got["copies"] = pool.take_copies()

    def b():
        inside.wait(10)
        pool.checkpoint(other, 1, 22)

    assert _run(a, b) == []
    assert [src for src, _ in got["copies"]] == [slow.per_req_cache_group]
    assert slow.pending_checkpoint == -1 and other.pending_checkpoint == 22
    assert [src for src, _ in pool.take_copies()] == [other.per_req_cache_group]
    assert sorted(dict(pool.hash_to_group)) == [21, 22]
    pool._check_invariants()


def test_no_thread_obtains_an_uninitialised_instance():
    """Promise: an instance is never handed out uninitialised, on any thread,
    and a legitimate construction never fails because of another thread's.
    Thread A constructs a Sequence subclass whose Python ``__new__`` is slow;
    thread B's bare ``__new__`` meanwhile is refused, and A's construction
    completes."""
    inside = threading.Event()

    class SlowNew(sc.Sequence):
        def __new__(cls, *args, **kwargs):
            inside.set()
            time.sleep(WINDOW_S)
            return super().__new__(cls)

    made, refused = {}, []

    def a():
        made["seq"] = SlowNew(5, num_tokens=3)

    def b():
        inside.wait(10)
        try:
            made["bare"] = sc.Sequence.__new__(SlowNew)
        except TypeError:
            refused.append(True)

    assert _run(a, b) == []
    assert refused == [True] and "bare" not in made
    assert made["seq"].seq_id == 5 and made["seq"].num_tokens == 3


def test_metrics_collect_while_another_thread_registers():
    """Promise: metrics collection is safe from any thread. ``collect()`` runs
    while another thread registers sources (a source that is read slowly keeps
    the collection open); neither raises and the snapshot is consistent."""
    metrics = StateCacheMetrics()
    inside = threading.Event()

    class SlowCache:
        def checkpoint_fates(self):
            inside.set()
            time.sleep(WINDOW_S)
            return {"checkpoints_kept": 1}

    metrics.track_cache("slow", SlowCache())
    snaps = []

    def a():
        snaps.append(metrics.collect())

    def b():
        inside.wait(10)
        for i in range(50):
            metrics.track_cache(f"pool{i}", sc.StateSlotPool(2))
            metrics.track_tier(f"tier{i}", sc.StateOffloadIndex())

    assert _run(a, b) == []
    assert snaps[0]["checkpoints"]["slow"] == {"checkpoints_kept": 1}
    full = metrics.collect()
    assert len(full["checkpoints"]) == 51 and len(full["tiers"]) == 50


def test_a_batch_is_checked_after_its_ops_convert_even_across_threads():
    """Promise: a StateCopyExecutor may be shared between threads, and a
    layout tensor changed between batches raises ValueError. A batch converts
    its ops first and checks the tensors after: here thread B replaces a page
    tensor's storage while thread A's batch is still converting a duck-typed
    op (its unit ids convert slowly). A's batch raises ValueError and writes
    nothing, neither into the new storage nor into the old one, kept alive
    here only to look at it."""
    torch = pytest.importorskip("torch")
    slots = torch.arange(8 * 64, dtype=torch.uint8).reshape(8, 64).clone()
    pages = torch.zeros(32, 64, dtype=torch.uint8)
    ex = sc.StateCopyExecutor(sc.StateLayout([slots]), sc.PageLayout([pages], unit_dim=0), max_num_seqs=4)
    lid, n = ex.layout_id, ex.spec.image_bytes
    inside, replaced = threading.Event(), threading.Event()
    old_storage = []

    class SlowUnit:
        def __index__(self):
            inside.set()
            replaced.wait(10)  # B touches no executor, so A can wait for it (no timing window)
            return 3

    class DuckStore:  # an op of the engine's own type, read attribute by attribute
        src_slot = 1
        unit_ids = [SlowUnit()]
        total_bytes = n
        layout_id = lid

    raised = []

    def a():
        try:
            ex(stores=[DuckStore()])
        except ValueError as e:
            raised.append(str(e))

    def b():
        inside.wait(10)
        old_storage.append(torch.zeros(0, dtype=torch.uint8).set_(pages.untyped_storage()))
        pages.set_(torch.zeros(32, 64, dtype=torch.uint8).untyped_storage(), 0, (32, 64))
        replaced.set()

    assert _run(a, b) == []
    assert raised and "storage was replaced" in raised[0]
    kept = old_storage[0].untyped_storage()
    assert not any(kept.tolist()) and not pages.any()  # nothing was written anywhere
    assert ex.copy_stats["refused"] == 1 and ex.copy_stats["batches"] == 0


def test_the_extension_needs_the_gil():
    """Promise: the extension declares that it needs the GIL, so a
    free-threaded Python re-enables it on import. Meaningful only on a
    free-threaded interpreter (3.13t and later)."""
    import subprocess
    import sys

    if not hasattr(sys, "_is_gil_enabled"):
        pytest.skip("Python before 3.13 always has the GIL")
    out = subprocess.run(
        [sys.executable, "-c", "import sys, statecache._C; print(sys._is_gil_enabled())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"
