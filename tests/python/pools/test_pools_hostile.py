"""Issue 9 (trust) for the state pools, Sequence and argument conversion: one
named regression test per crash class, wrong-state fix and conversion rule.

Cases that used to crash run in a subprocess under PYTHONMALLOC=debug (a
crash there fails the test instead of taking the runner down); the rest run
in process.
"""

from __future__ import annotations

import array
import copy
import gc
import os
import pickle
import subprocess
import sys
import weakref

import numpy as np
import pytest

import statecache as sc

HERE = os.path.dirname(os.path.abspath(__file__))


def fork_pool(n=8, tokens=1, **kw):
    return sc.StateSlotPool(n, sc.StateTransfer.fork(tokens, **kw))


def state(pool):
    """Everything observable about a pool, for "a raised call changed nothing"."""
    unit = "slot" if isinstance(pool, sc.StateSlotPool) else "group"
    out = (
        pool.num_free(),
        list(getattr(pool, f"{unit}_hash")),
        sorted(getattr(pool, f"hash_to_{unit}").items()),
        pool.checkpoint_fates(),
        pool._debug_state(),
    )
    if unit == "group":
        out += (pool._debug_copies(), [id(s) for s in pool._debug_pending()])
    else:
        out += (pool.occupancy(), pool._debug_relocations())
    return out


class Mutator:
    """An int-like whose __index__ clears or grows the list it sits in."""

    def __init__(self, target, value, mode="clear"):
        self.target, self.value, self.mode = target, value, mode

    def __index__(self):
        if self.mode == "clear":
            self.target.clear()
        else:
            self.target.extend(range(10_000))
        gc.collect()
        return self.value


# ---- crash classes, each in a subprocess -------------------------------------


def _case_reentrant_int_lists():
    for pool, attach in (
        (fork_pool(), lambda p, s: setattr(s, "state_slots", [p.pop()])),
        (sc.StateGroupPool(8, sc.StateTransfer.fork(1)), lambda p, s: setattr(s, "per_req_cache_group", p.pop())),
    ):
        seq = sc.Sequence(seq_id=1, num_tokens=100)
        attach(pool, seq)
        pool.checkpoint(seq, 2, 7)
        for mode in ("clear", "grow"):
            hashes = [1, 2, 3, 4, 5]
            hashes[2] = Mutator(hashes, 7, mode)
            hashes[4] = Mutator(hashes, 9, mode)
            assert pool.resumable_hit(seq, 5, hashes) == 3
            t = [5, 6]
            t.append(Mutator(t, 7, mode))
            assert pool.resumable_hit(seq, 3, tuple(t)) == 3
        pool._check_invariants()
    mid = fork_pool(8, readable_midstep=True)
    s = sc.Sequence(seq_id=2, num_tokens=100)
    s.state_slots = [mid.pop()]
    rows = [(4, 11), (6, 12)]
    rows.append((8, Mutator(rows, 13)))
    res = mid.reserve_midstep(s, rows)
    assert [r[2] for r in res] == [11, 12, 13]
    row = [res[0][0], 4, 11]
    row[1] = Mutator(row, 4)
    mid.cancel_midstep([row, res[1]])
    mid.publish_midstep([res[2]], s)
    mid._check_invariants()
    # Sequence setters and IntListView methods.
    lst = [1, 2, 3]
    lst.append(Mutator(lst, 4))
    s.block_hashes = lst
    assert list(s.block_hashes) == [1, 2, 3, 4]
    grow = [5]
    grow.append(Mutator(grow, 6, "grow"))
    s.state_slots = grow
    assert list(s.state_slots)[:2] == [5, 6]
    view = s.block_hashes
    view.extend([7, Mutator([], 8)])
    view.append(Mutator(lst, 9))
    view[0] = Mutator(lst, 10)
    assert Mutator(lst, 10) not in view  # not an int: never equal
    assert list(view) == [10, 2, 3, 4, 7, 8, 9]
    rel = [mid.pop(), mid.pop()]
    rel.append(Mutator(rel, -1))
    mid.release_many(rel)
    mid._check_invariants()


def _case_views_as_arguments():
    pool = fork_pool()
    a, b = sc.Sequence(seq_id=1, num_tokens=64), sc.Sequence(seq_id=2)
    a.state_slots = [pool.pop()]
    a.block_hashes = list(range(100, 140))
    pool.checkpoint(a, 5, 104)
    assert pool.resumable_hit(a, 30, a.block_hashes) == 5
    b.block_hashes = a.block_hashes
    assert list(b.block_hashes) == list(range(100, 140))
    b.block_hashes.extend(b.block_hashes)  # a view extended by itself: no hang
    assert len(b.block_hashes) == 80
    assert pool.resumable_hit(a, 8, pool.slot_hash) == pool.resumable_hit(a, 8, list(pool.slot_hash))
    for bad in (array.array("d", [1.0, 2.0]), np.zeros(4)):
        try:
            b.block_hashes = bad
        except TypeError as e:
            assert "block_hashes" in str(e)
        else:
            raise AssertionError("a float buffer was accepted")
        try:
            pool.resumable_hit(a, 1, bad)
        except TypeError as e:
            assert "block_hashes" in str(e)
        else:
            raise AssertionError("a float buffer was accepted")


def _case_uninitialized_instances():
    classes = [
        sc.StateSlotPool,
        sc.StateGroupPool,
        sc.Sequence,
        sc.StateTransfer,
        sc.SlotRetirement,
        sc.GroupRetirement,
        type(fork_pool().hash_to_slot),
        type(fork_pool().slot_hash),
        type(sc.Sequence().block_hashes),
        sc.PageUnitCheckpointStore,
        sc.PagedStateCheckpointCoordinator,
    ]
    for cls in classes:
        try:
            cls.__new__(cls)
        except TypeError:
            continue
        raise AssertionError(f"{cls.__name__}.__new__ alone made an instance")

    seen = []

    class Req(sc.Sequence):
        def __init__(self):
            for name in ("seq_id", "state_slot", "state_slots", "block_hashes", "num_tokens", "pending_checkpoint"):
                try:
                    getattr(self, name)
                except TypeError:
                    seen.append(name)
            try:
                repr(self)
            except TypeError:
                seen.append("repr")
            try:
                self.state_slot = 3
            except TypeError:
                seen.append("set")
            pool = fork_pool()
            for call in (
                lambda: pool.applies(self),
                lambda: pool.checkpoint(self, 1, 5),
                lambda: pool.resumable_hit(self, 0, []),
            ):
                try:
                    call()
                except TypeError:
                    seen.append("pool")
            super().__init__(seq_id=9)

    r = Req()
    assert r.seq_id == 9
    assert len(seen) == 11, seen


def _case_pickle_and_copy():
    pool = fork_pool()
    seq = sc.Sequence(seq_id=1)
    group = sc.StateGroupPool(4, sc.StateTransfer.copy())
    for obj in (pool, group, pool.hash_to_slot, pool.slot_hash, group.hash_to_group, seq, seq.state_slots):
        for f in (pickle.dumps, copy.copy, copy.deepcopy):
            try:
                f(obj)
            except TypeError:
                continue
            raise AssertionError(f"{f.__name__} of {type(obj).__name__} did not raise TypeError")
    for value in (
        sc.StateTransfer.fork(3, readable_midstep=True),
        sc.StateTransfer.copy("gdn"),
        sc.SlotRetirement(3, 1, False),
        sc.GroupRetirement(2, -1, True),
    ):
        for f in (lambda v: pickle.loads(pickle.dumps(v)), copy.copy, copy.deepcopy):
            got = f(value)
            assert got == value and type(got) is type(value)


def _case_views_after_owner_changed():
    pool = fork_pool(4)
    index, hashes = pool.hash_to_slot, pool.slot_hash
    seq = sc.Sequence(seq_id=1, num_tokens=50)
    seq.state_slots = [pool.pop()]
    slots = seq.state_slots
    pool.checkpoint(seq, 1, 77)
    assert dict(index.items()) == {77: 0}
    del pool, seq
    gc.collect()
    assert index[77] == 0 and list(hashes) == [77, -1, -1, -1] and list(slots) == [1]
    pool = fork_pool(4)
    hashes = pool.slot_hash
    it = iter(hashes)
    pool.retire_top()
    pool.retire_top()
    assert len(list(it)) == 4 and len(hashes) == 4  # a snapshot; the view stays valid
    pool.extend(3)
    assert len(hashes) == 5
    s = sc.Sequence()
    s.block_hashes = [1, 2, 3]
    view = s.block_hashes
    s.block_hashes = []
    assert list(view) == [] and len(view) == 0
    try:
        view[0]
    except IndexError:
        pass
    else:
        raise AssertionError("view of an emptied list indexed")


CASES = [name for name in list(globals()) if name.startswith("_case_")]


@pytest.mark.parametrize("case", CASES)
def test_crash_class_in_subprocess(case):
    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONFAULTHANDLER="1")
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), case], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"{case}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"


# ---- wrong state (deliberate divergences from the reference) -----------------


@pytest.mark.parametrize("kind", ["slot", "group"])
def test_retired_top_drops_its_index_entry(kind):
    pool = fork_pool(3) if kind == "slot" else sc.StateGroupPool(3, sc.StateTransfer.fork(1))
    # File a checkpoint on the top index, then let a resumer claim it.
    owner = sc.Sequence(seq_id=1, num_tokens=50)
    for _ in range(2):
        pool.pop()
    top = pool.pop()
    if kind == "slot":
        owner.state_slots = [top]
    else:
        owner.per_req_cache_group = top
    pool.release(0)
    pool.checkpoint(owner, 1, 55)  # top filed under 55, owner moved to 0
    pool.drop_reader(top)
    assert pool.lookup(55) == top and pool.holds_checkpoint(top)
    pool.claim(top)  # a resumer owns it, hash and all
    pool.release(owner.state_slot if kind == "slot" else owner.per_req_cache_group)
    r = pool.retire_top()
    assert r.retired == top and r.relocated_to >= 0 and not r.held_checkpoint
    assert pool.lookup(55) == -1 and 55 not in getattr(pool, f"hash_to_{kind}")
    pool.extend(1)
    assert pool.lookup(55) == -1  # the reference revives {55: top} here
    pool._check_invariants()
    assert pool._index_is_exact()


def test_group_copy_intent_dies_with_its_group():
    pool = sc.StateGroupPool(4, sc.StateTransfer.copy())
    a, b = sc.Sequence(seq_id=1), sc.Sequence(seq_id=2)
    a.per_req_cache_group = pool.pop()
    pool.checkpoint(a, 1, 1001)
    pool.release(a.per_req_cache_group)  # no forget_pending
    b.per_req_cache_group = pool.pop()
    assert b.per_req_cache_group == a.per_req_cache_group
    assert pool.take_copies() == []
    assert pool.lookup(1001) == -1 and a.pending_checkpoint == -1
    pool._check_invariants()
    # A live intent still works, and survives its owner being re-homed.
    pool.checkpoint(b, 1, 2002)
    assert pool.take_copies() == [(b.per_req_cache_group, pool.lookup(2002))]


def _midstep_pool():
    pool = fork_pool(8, readable_midstep=True)
    seq = sc.Sequence(seq_id=1, num_tokens=100)
    seq.state_slots = [pool.pop()]
    return pool, seq


@pytest.mark.parametrize(
    "call",
    [
        lambda p, s, g, gs: p.checkpoint(s, 1, -1),
        lambda p, s, g, gs: p.reserve_midstep(s, [(2, 5), (4, -1)]),
        lambda p, s, g, gs: p.publish_midstep([(p.reserve_midstep(s, [(2, 9)])[0][0], 2, -1)], s),
        lambda p, s, g, gs: g.checkpoint(gs, 1, -1),
    ],
    ids=["slot-checkpoint", "reserve_midstep", "publish_midstep", "group-checkpoint"],
)
def test_minus_one_is_never_a_content_hash(call):
    pool, seq = _midstep_pool()
    group = sc.StateGroupPool(4, sc.StateTransfer.copy())
    gseq = sc.Sequence(seq_id=2)
    gseq.per_req_cache_group = group.pop()
    with pytest.raises(ValueError, match="-1"):
        call(pool, seq, group, gseq)
    assert -1 not in pool.hash_to_slot and -1 not in group.hash_to_group
    assert gseq.pending_checkpoint == -1 and group._debug_pending() == []
    pool._check_invariants()
    group._check_invariants()


def test_publish_midstep_takes_live_reservations_only():
    pool, seq = _midstep_pool()
    res = pool.reserve_midstep(seq, [(2, 21), (4, 22)])
    before = state(pool)
    with pytest.raises(ValueError, match="reservation"):
        pool.publish_midstep([(seq.state_slot, 2, 23)], seq)  # a live request's slot
    assert state(pool) == before and pool.lookup(23) == -1
    pool.publish_midstep(res[:1], seq)
    with pytest.raises(ValueError, match="reservation"):
        pool.publish_midstep(res[:1], seq)  # published already
    pool.release(res[1][0])  # released by hand, then handed to someone else
    assert pool.pop() == res[1][0]
    with pytest.raises(ValueError, match="reservation"):
        pool.cancel_midstep(res[1:])
    pool._check_invariants()


def test_cancel_midstep_is_atomic():
    pool, seq = _midstep_pool()
    res = pool.reserve_midstep(seq, [(2, 31), (4, 32)])
    before = state(pool)
    with pytest.raises(ValueError):
        pool.cancel_midstep([res[0], (seq.state_slot, 0, 33)])
    assert state(pool) == before
    with pytest.raises(ValueError, match=r"reservations\[1\]"):  # the reference's unpacking error
        pool.cancel_midstep([res[0], (1, 2)])
    assert state(pool) == before
    with pytest.raises(TypeError, match=r"reservations\[1\]"):
        pool.cancel_midstep([res[0], (1, 2, "h")])
    assert state(pool) == before
    pool.cancel_midstep(res)
    assert pool.num_free() == 7


# ---- conversions and ranges ------------------------------------------------


def test_as_bool_accepts_any_int():
    assert sc.StateTransfer.fork(3, readable_midstep=2**70).readable_midstep is True
    assert sc.StateSlotPool(2, enabled=-(2**80)).enabled is True
    pool = fork_pool(2)
    s = sc.Sequence()
    s.state_slots = [pool.pop()]
    pool.pin(s.state_slot, reader_is_next_batch=2**100)
    assert pool._debug_state()["deferred"] == [s.state_slot]
    with pytest.raises(TypeError, match="reader_is_next_batch"):
        pool.pin(s.state_slot, reader_is_next_batch="yes")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda p: p.extend(2**62), "count"),
        (lambda p: p.extend(2**63 - 1), "count"),
        (lambda p: p.extend(2**64), "count"),
        (lambda p: p.has_free(2**70), "count"),
        (lambda p: p.pop_many(2**62), "count"),
        (lambda p: p.release(2**63), "slot"),
        (lambda p: p.lookup(-(2**63) - 1), "h"),
        (lambda p: p.resumable_hit(sc.Sequence(), 2**64, []), "hit"),
        (lambda p: sc.StateSlotPool(2**62), "num_slots"),
        (lambda p: sc.StateSlotPool(4, hash_block_size=2**64), "hash_block_size"),
        (lambda p: p.checkpoint(sc.Sequence(), 2**64, 1), "boundary_blocks"),
        (lambda p: p.record_relocation(0, 2**62), "dst"),
    ],
)
def test_integer_arguments_are_range_checked(call, name):
    pool = fork_pool(4)
    before = state(pool)
    with pytest.raises((ValueError, OverflowError, IndexError), match=name):
        call(pool)
    assert state(pool) == before


def test_huge_boundary_does_not_overflow():
    pool = sc.StateSlotPool(4, sc.StateTransfer.fork(1), hash_block_size=16)
    s = sc.Sequence(num_tokens=10)
    s.state_slots = [pool.pop()]
    s.checkpoint_end_pos = 32
    pool.checkpoint(s, 2**62, 5)  # boundary * hbs overflows int64: a guess, not UB
    assert pool._debug_state()["speculative"] == [0]


@pytest.mark.parametrize(
    "make",
    [
        lambda xs: np.asarray(xs, dtype=np.int64),
        lambda xs: np.asarray(xs, dtype=np.int32),
        lambda xs: np.asarray(xs, dtype=np.uint16),
        lambda xs: np.asarray(xs, dtype=">i8"),
        lambda xs: np.repeat(np.asarray(xs, dtype=np.int64), 2)[::2],
        lambda xs: array.array("q", xs),
        lambda xs: array.array("i", xs),
        lambda xs: memoryview(array.array("l", xs)),
    ],
    ids=["int64", "int32", "uint16", "big-endian", "strided", "array-q", "array-i", "memoryview"],
)
def test_integer_buffers_are_accepted(make):
    xs = [3, 4, 5, 6]
    pool = fork_pool(4)
    s = sc.Sequence(num_tokens=40)
    s.state_slots = [pool.pop()]
    pool.checkpoint(s, 2, 5)
    assert pool.resumable_hit(s, 4, make(xs)) == pool.resumable_hit(s, 4, xs) == 3
    s.block_hashes = make(xs)
    assert list(s.block_hashes) == xs


@pytest.mark.parametrize(
    "bad, exc",
    [
        (array.array("d", [1.0]), TypeError),
        (np.zeros(2, dtype=np.float32), TypeError),
        (np.zeros(2, dtype=bool), TypeError),
        (np.zeros((2, 2), dtype=np.int64), ValueError),
        (np.asarray([2**64 - 1], dtype=np.uint64), ValueError),  # the unsigned spelling of -1
        ([2**64], OverflowError),  # past the unsigned range
        ("1234", TypeError),
        (b"1234", TypeError),
        ({1: 2}, TypeError),
        ([1, 2.0], TypeError),
        ([True], TypeError),
    ],
)
def test_bad_int_lists_name_the_argument(bad, exc):
    pool = fork_pool(4)
    s = sc.Sequence(num_tokens=40)
    s.state_slots = [pool.pop()]
    pool.checkpoint(s, 1, 123)  # something to scan for
    with pytest.raises(exc, match="block_hashes"):
        pool.resumable_hit(s, len(bad), bad)
    with pytest.raises(exc, match="block_hashes"):
        s.block_hashes = bad
    assert list(s.block_hashes) == []


# ---- any object as seq (docs/contract.md, "API guarantees") -------------


class Request:
    """An engine's own request class: the sequence attributes, no subclassing."""

    def __init__(self, num_tokens=100):
        self.num_tokens = num_tokens
        self.has_per_req_cache = True
        self.state_slot = -1
        self.state_fork_src = -1
        self.per_req_cache_group = -1
        self.pending_checkpoint = -1
        self.checkpoint_end_pos = 0


def test_engine_request_class_works_like_sequence():
    ours, native = fork_pool(4), fork_pool(4)
    r, s = Request(), sc.Sequence(num_tokens=100)
    r.state_slot = ours.pop()
    s.state_slots = [native.pop()]
    for pool, seq in ((ours, r), (native, s)):
        assert pool.applies(seq)
        pool.checkpoint(seq, 2, 42)
        assert pool.resumable_hit(seq, 3, [1, 42, 3]) == 2
    assert (r.state_slot, r.state_fork_src) == (s.state_slot, s.state_fork_src) == (1, 0)
    assert state(ours) == state(native)

    groups = sc.StateGroupPool(4, sc.StateTransfer.copy())
    g = Request()
    g.per_req_cache_group = groups.pop()
    groups.checkpoint(g, 1, 77)
    assert g.pending_checkpoint == 77 and groups._debug_pending() == [g]
    assert groups.take_copies() == [(0, 1)] and g.pending_checkpoint == -1
    groups.checkpoint(g, 1, 78)
    groups.forget_pending(g)
    assert g.pending_checkpoint == -1 and groups.take_copies() == []


def test_generic_seq_missing_attribute_is_a_type_error_naming_it():
    pool = fork_pool(4)
    r = Request()
    del r.num_tokens
    before = state(pool)
    with pytest.raises(TypeError, match="num_tokens"):
        pool.resumable_hit(r, 0, [])
    with pytest.raises(TypeError, match="seq"):
        pool.applies(None)
    r.state_slot = "x"
    with pytest.raises(TypeError, match="seq.state_slot"):
        pool.checkpoint(r, 1, 5)
    assert state(pool) == before


class FailingSetter(Request):
    def __setattr__(self, name, value):
        if name == "state_fork_src" and getattr(self, "armed", False):
            raise RuntimeError("no")
        super().__setattr__(name, value)


def test_generic_seq_failed_write_back_changes_nothing():
    pool = fork_pool(4)
    r = FailingSetter()
    r.state_slot = pool.pop()
    r.armed = True
    before = state(pool)
    with pytest.raises(RuntimeError, match="no"):
        pool.checkpoint(r, 1, 5)
    assert state(pool) == before
    assert (r.state_slot, r.state_fork_src) == (0, -1)  # state_slot written, then restored
    r.armed = False
    pool.checkpoint(r, 1, 5)
    assert (r.state_slot, r.state_fork_src, pool.lookup(5)) == (1, 0, 0)


def test_generic_seq_reentrant_setter_is_refused_consistently():
    pool = fork_pool(4)

    class Sneaky(Request):
        def __setattr__(self, name, value):
            if name == "state_slot" and getattr(self, "armed", False):
                self.__dict__["armed"] = False
                pool.pop()  # takes the slot the plan chose
            super().__setattr__(name, value)

    r = Sneaky()
    r.state_slot = pool.pop()
    r.armed = True
    with pytest.raises(RuntimeError, match="changed"):
        pool.checkpoint(r, 1, 5)
    assert r.state_slot == 0 and pool.lookup(5) == -1
    pool._check_invariants()


# ---- garbage collection ----------------------------------------------------


def test_cycle_through_group_pool_intents_is_collected():
    class Req(sc.Sequence):
        pass

    pool = sc.StateGroupPool(4, sc.StateTransfer.copy())
    seq = Req(seq_id=1)
    seq.per_req_cache_group = pool.pop()
    seq.pool = pool  # dynamic attribute: seq -> pool
    pool.checkpoint(seq, 1, 5)  # pool -> seq (pending intent)
    plain = Request()
    plain.per_req_cache_group = pool.pop()
    plain.pool = pool
    pool.checkpoint(plain, 1, 6)
    refs = [weakref.ref(pool), weakref.ref(seq), weakref.ref(plain)]
    del pool, seq, plain
    gc.collect()
    assert all(r() is None for r in refs)


def test_sequence_subclass_self_cycle_is_collected():
    # CPython 3.11 and 3.12 differ in who visits a subclass instance's dict
    class Req(sc.Sequence):
        pass

    class Deeper(Req):
        __slots__ = ()

    refs = []
    for cls in (sc.Sequence, Req, Deeper):
        s = cls(seq_id=1)
        s.me = s
        refs.append(weakref.ref(s))
        del s
    gc.collect()
    assert all(r() is None for r in refs)


def test_engine_pools_do_not_accumulate():
    refs = []
    for _ in range(100):
        pool = sc.StateGroupPool(4, sc.StateTransfer.copy())
        s = sc.Sequence()
        s.per_req_cache_group = pool.pop()
        s.owner = pool
        pool.checkpoint(s, 1, 9)
        refs.append(weakref.ref(pool))
        del pool, s
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


if __name__ == "__main__":
    globals()[sys.argv[1]]()


# ---- docs/contract.md, "Invariants", last item: the index never names
# bytes of another prefix ----


class ContentModel:
    """What each slot / group holds, driven pass by pass in protocol order
    (release_pins; admissions, finishes, resizes; take_copies; forward;
    checkpoints), with protocol slips mixed in: a group released without
    forget_pending, -1 as a hash, retire_top with claimed checkpoints on top.
    After every call: every hash the index names sits on a unit whose bytes are
    the state of exactly that prefix."""

    def __init__(self, seed, kind):
        import random

        self.rng = random.Random(seed)
        self.kind = kind
        if kind == "slot":
            self.pool = sc.StateSlotPool(6, sc.StateTransfer.fork(1))
        else:
            self.pool = sc.StateGroupPool(6, sc.StateTransfer.copy())
        self.content = {}  # unit -> ("h", prefix hash) | ("junk", n)
        self.seqs = []  # [Sequence, last prefix hash or None]
        self.serial = 0

    def unit_of(self, s):
        return s.state_slot if self.kind == "slot" else s.per_req_cache_group

    def set_unit(self, s, u):
        if self.kind == "slot":
            s.state_slots = [u]
        else:
            s.per_req_cache_group = u

    def junk(self):
        self.serial += 1
        return ("junk", self.serial)

    def check(self):
        index = self.pool.hash_to_slot if self.kind == "slot" else self.pool.hash_to_group
        for h, u in index.items():
            assert h != -1
            assert self.content.get(u) == ("h", h), f"index names {u} for {h}, it holds {self.content.get(u)}"
        self.pool._check_invariants()

    def step(self):
        p, rng = self.pool, self.rng
        p.release_pins()
        self.check()
        for _ in range(rng.randint(0, 3)):
            r = rng.random()
            if r < 0.4 and p.num_free():
                s = sc.Sequence(seq_id=self.serial, num_tokens=1000)
                u = p.pop()
                self.content[u] = self.junk()  # a new owner's bytes, soon overwritten
                self.set_unit(s, u)
                self.seqs.append([s, None])
            elif r < 0.7 and self.seqs:
                s, _ = self.seqs.pop(rng.randrange(len(self.seqs)))
                if self.kind == "group" and rng.random() < 0.5:
                    p.forget_pending(s)  # sometimes forgotten: the intent must die anyway
                p.release(self.unit_of(s))
                p.drop_reader(s.state_fork_src)
            elif r < 0.8:
                top = self.pool.num_slots - 1 if self.kind == "slot" else self.pool.num_groups - 1
                if top >= 0 and p.holds_checkpoint(top) and rng.random() < 0.5:
                    p.claim(top)  # a resumer holds the checkpoint: owned, still hashed
                    held = top
                else:
                    held = None
                res = p.retire_top()
                if res is not None and res.relocated_to >= 0:
                    self.content[res.relocated_to] = self.content.get(res.retired)
                    for entry in self.seqs:
                        if self.unit_of(entry[0]) == res.retired:
                            self.set_unit(entry[0], res.relocated_to)
                if res is not None and held == res.retired and res.relocated_to >= 0:
                    p.release(res.relocated_to)  # the resumer is gone
                elif held is not None and res is None:
                    p.release(held)
            elif r < 0.9:
                p.extend(rng.randint(0, 2))
            else:
                with pytest.raises(ValueError):
                    if self.seqs:
                        p.checkpoint(self.seqs[0][0], 1, -1)
                    else:
                        raise ValueError
            self.check()
        if self.kind == "group":
            for src, dst in p.take_copies():
                self.content[dst] = self.content.get(src)
            self.check()
        for entry in self.seqs:  # the forward: each sequence reaches a new boundary
            self.serial += 1
            entry[1] = 10_000 + self.serial
            self.content[self.unit_of(entry[0])] = ("h", entry[1])
        self.check()
        for entry in self.seqs:  # postprocess: keep some boundaries
            if rng.random() < 0.6:
                s, h = entry
                before = self.unit_of(s)
                p.checkpoint(s, 1, h)
                after = self.unit_of(s)
                if after != before:
                    self.content[after] = self.junk()  # fork: the next forward writes it
                self.check()


@pytest.mark.parametrize("kind", ["slot", "group"])
@pytest.mark.parametrize("seed", range(6))
def test_index_never_names_another_prefix(kind, seed):
    m = ContentModel(seed, kind)
    for _ in range(150):
        m.step()


def test_take_copies_that_raises_leaves_every_pending_checkpoint():
    """A setter that changes the pool while take_copies clears the pending
    fields (it files another intent) makes take_copies raise, committing
    nothing: every pending_checkpoint already cleared gets its value back, so
    the next take_copies files them (before, they stayed -1 and were lost)."""
    pool = sc.StateGroupPool(8, sc.StateTransfer.copy())
    late = sc.Sequence(9)
    late.per_req_cache_group = pool.pop()

    class Reenters(Request):
        armed = False

        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name == "pending_checkpoint" and value == -1 and type(self).armed:
                type(self).armed = False
                pool.checkpoint(late, 1, 99)  # the pending list grows under take_copies

    first, second = Request(), Reenters()
    for r in (first, second):
        r.per_req_cache_group = pool.pop()
    pool.checkpoint(first, 1, 11)
    pool.checkpoint(second, 1, 12)
    Reenters.armed = True
    with pytest.raises(RuntimeError, match="changed"):
        pool.take_copies()
    assert (first.pending_checkpoint, second.pending_checkpoint) == (11, 12)
    assert pool.lookup(11) == pool.lookup(12) == -1
    pairs = pool.take_copies()
    assert sorted(src for src, _ in pairs) == sorted(
        [first.per_req_cache_group, second.per_req_cache_group, late.per_req_cache_group]
    )
    assert all(pool.lookup(h) >= 0 for h in (11, 12, 99))
    pool._check_invariants()


def test_forget_pending_writes_the_field_without_reading_it():
    """As the reference: pending_checkpoint is set to -1, never read, so an
    engine object need not carry it; one that cannot take it raises the
    setter's AttributeError, and a batch restores what it wrote."""
    pool = sc.StateGroupPool(4, sc.StateTransfer.copy())

    class Bare:
        pass

    a, b = Bare(), Bare()
    pool.forget_pending(a)
    assert a.pending_checkpoint == -1
    with pytest.raises(AttributeError, match="pending_checkpoint"):
        pool.forget_pending(object())
    with pytest.raises(AttributeError, match="pending_checkpoint"):
        pool.forget_pending_many([b, object()])
    assert not hasattr(b, "pending_checkpoint")  # written, then deleted again


def _heap_in_use() -> int:
    """Bytes malloc has handed out and not got back (glibc), mmapped chunks included."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks")] + [
            (n, ctypes.c_size_t) for n in ("fsmblks", "uordblks", "fordblks", "keepcost")
        ]

    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc's mallinfo2")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return m.hblkhd + m.uordblks


@pytest.mark.parametrize("kind", ["slot", "group"])
def test_checkpoint_many_with_engine_objects_keeps_no_copy_of_the_pool(kind):
    """checkpoint_many with an engine-owned object once dry-ran the batch on a
    function-static copy of the pool, which outlived the pool (about 24 bytes
    a slot, 0.8 GB after an 8M-slot pool). Now nothing of a dropped pool stays."""
    n = 2_000_000
    gc.collect()
    before = _heap_in_use()
    if kind == "slot":
        pool = sc.StateSlotPool(n, sc.StateTransfer.fork(1))
        r = Request()
        r.state_slot = pool.pop()
    else:
        pool = sc.StateGroupPool(n, sc.StateTransfer.fork(1))
        r = Request()
        r.per_req_cache_group = pool.pop()
    pool.checkpoint_many([r], [1], [5])
    assert pool.lookup(5) == 0
    del pool
    gc.collect()
    assert _heap_in_use() - before < 8 * n  # the pool alone is 24 bytes a slot
