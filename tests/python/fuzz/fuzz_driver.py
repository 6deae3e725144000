"""Adversarial call fuzzer for statecache's public objects (issue: trust).

Run as ``python fuzz/fuzz_driver.py CASE SEED SECONDS``; exits 0 when every call
either returned with every invariant holding, or raised a clean exception
having changed nothing (or, where a callback or a re-entrant argument of the
fuzzer itself ran and raised, left every invariant holding). A crash of the
process is the other way this can fail: fuzz/test_fuzz.py runs each case in its
own subprocess for that reason.

Arguments are drawn from the object's current state (valid slots, units,
hashes, owners) most of the time and from a pool of hostile values otherwise:
wrong types, huge and negative ints, NumPy scalars and arrays, buffers of the
wrong item type, the library's own live list views, lists that an element's
``__index__`` clears, owners whose ``__hash__`` / ``__eq__`` raise or re-enter,
callbacks that raise, re-enter or detach themselves.
"""

from __future__ import annotations

import array
import copy
import gc
import pickle
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

import statecache as sc

CLEAN = (TypeError, ValueError, IndexError, OverflowError, KeyError, AssertionError)


class ArgBoom(Exception):
    """Raised by a hostile argument: the call must change nothing."""


class CallbackBoom(Exception):
    """Raised by a hostile callback: the call must stay consistent."""


class Failure(Exception):
    pass


# ------------------------------------------------------------ hostile values --


class RaisingIndex:
    def __index__(self):
        raise ArgBoom("__index__")


class HugeIndex:
    def __index__(self):
        return 2**80


class Clearing:
    """An element whose __index__ empties (and shrinks) the list it sits in."""

    def __init__(self, target: list) -> None:
        self.target = target

    def __index__(self):
        self.target.clear()
        gc.collect()
        return 7


class Growing:
    def __init__(self, target: list) -> None:
        self.target = target

    def __index__(self):
        self.target.extend(range(10**12, 10**12 + 5000))
        return 8


class RaisingHash:
    def __hash__(self):
        raise ArgBoom("__hash__")


class RaisingEq:
    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise ArgBoom("__eq__")


class Reentrant:
    """An owner / element that calls back into the library while being read."""

    effects = False

    def __init__(self, fn) -> None:
        self.fn = fn

    def __hash__(self):
        Reentrant.effects = True
        try:
            self.fn()
        except Exception:
            pass
        return 5

    def __eq__(self, other):
        return self is other

    def __index__(self):
        Reentrant.effects = True
        try:
            self.fn()
        except Exception:
            pass
        return 3


def hostile_scalars() -> list:
    return [
        -1,
        -2,
        0,
        2**31,
        2**62,
        2**63 - 1,
        2**63,
        -(2**63),
        -(2**63) - 1,
        2**70,
        -(2**70),
        np.int64(2),
        np.int32(1),
        np.uint64(2**63),
        np.float64(1.0),
        True,
        False,
        1.5,
        float("nan"),
        float("inf"),
        "1",
        b"1",
        None,
        object(),
        [],
        {},
        (1,),
        RaisingIndex(),
        HugeIndex(),
    ]


def hostile_lists(rng: random.Random, seq: sc.Sequence) -> list:
    big = [10**12 + i for i in range(64)]
    clearing: list = [10**12 + i for i in range(200)]
    clearing[rng.randrange(len(clearing))] = Clearing(clearing)
    growing: list = [10**12 + i for i in range(50)]
    growing[0] = Growing(growing)
    seq.block_hashes = big
    return [
        big,
        tuple(big),
        clearing,
        growing,
        [1, 2, 2.5],
        [1, None],
        [RaisingIndex()],
        [HugeIndex()],
        [2**64],
        np.array(big, dtype=np.int64),
        np.array(big, dtype=np.int32),
        np.array([1.0, 2.0]),
        np.zeros((2, 2), dtype=np.int64),
        array.array("q", big),
        array.array("d", [1.0, 2.0]),
        array.array("b", [1, 2]),
        seq.block_hashes,
        seq.state_slots,
        range(5),
        {1, 2},
        (x for x in [1, 2]),
        "123",
        b"12",
        None,
        7,
        [np.int64(3), np.int32(4)],
        list(range(100_000)),
    ]


# -------------------------------------------------------------- snapshots ----


def snap_free_list(p) -> tuple:
    out = [
        dict(p.hash_to_slot if hasattr(p, "hash_to_slot") else p.hash_to_group),
        list(p.slot_hash if hasattr(p, "slot_hash") else p.group_hash),
        p.num_free(),
        p.checkpoint_fates(),
        p._debug_state(),
    ]
    if hasattr(p, "occupancy"):
        out += [p.occupancy(), p._debug_relocations()]
    else:
        out += [p._debug_copies(), [id(s) for s in p._debug_pending()]]
    return tuple(repr(x) for x in out)


def snap_block_pool(p) -> tuple:
    units = tuple((repr(p.owner_of(u)), p.block_hash(u), p.ref_count(u)) for u in range(p.num_blocks))
    return (p.num_free, p.num_cached, p.num_kv_blocks, p.num_reserved, units)


def snap_store(s) -> tuple:
    recs = tuple((cid, r.prefix_hash, tuple(r.unit_ids), r.state, r.pin_count) for cid, r in s.records.items())
    return (
        recs,
        tuple(s.hash_to_checkpoint.items()),
        s.generation,
        s.evictions,
        tuple(s.store_backlog),
        s.offload_pins_reclaimed,
        snap_block_pool(s.pool),
    )


def check_block_pool(p) -> None:
    p.check_consistency()
    if p.num_free + p.num_kv_blocks + p.num_reserved != p.num_blocks:
        raise Failure(
            f"units not conserved: {p.num_free} free + {p.num_kv_blocks} kv + "
            f"{p.num_reserved} reserved != {p.num_blocks}"
        )


# ------------------------------------------------------------------ cases ----


class Case:
    """One object graph and the calls the fuzzer makes on it.

    ``unsigned``: the hashes it files are written as an unsigned engine
    writes them (most at or above 2**63); every one must come back so."""

    unsigned = False

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seq = sc.Sequence(1, num_tokens=10**6, num_prompt_tokens=10**6)

    def H(self, x: int) -> int:
        """Hash `x` in this case's form: as is, or moved above 2**63."""
        return x if not self.unsigned or x == -1 else 2**64 - 1 - x

    saw_unsigned = False  # an unsigned case must file such hashes, not only be refused them

    def check_forms(self, hashes) -> None:
        for h in hashes:
            if h == -1:
                raise Failure("-1 filed as a hash")
            if self.unsigned and h < 0:
                raise Failure(f"{h} came back signed from an object given unsigned hashes")
            if h >= 2**63:
                self.saw_unsigned = True

    def snapshot(self):
        raise NotImplementedError

    def check(self) -> None:
        raise NotImplementedError

    def calls(self):
        """(name, callable) pairs of candidate calls for this step."""
        raise NotImplementedError

    def any_value(self, valid):
        r = self.rng.random()
        if r < 0.7:
            return valid()
        if r < 0.85:
            return self.rng.choice(hostile_scalars())
        return self.rng.choice(hostile_lists(self.rng, self.seq))

    def prime(self) -> None:
        """Gives each object one hash of the case's form first, so that a
        hostile hash of the other form is refused rather than deciding it."""
        self.seq.block_hashes = [self.H(1)]

    def run(self, deadline: float) -> int:
        n = 0
        self.prime()
        while time.monotonic() < deadline:
            name, fn = self.rng.choice(self.calls())
            before = self.snapshot()
            Reentrant.effects = False
            try:
                fn()
            except CallbackBoom:
                pass  # the callback's own error: the call must still be consistent
            except (ArgBoom, *CLEAN) as e:
                if not Reentrant.effects and self.snapshot() != before:
                    raise Failure(f"{name} raised {type(e).__name__}: {e} and changed state") from e
            except BaseException as e:  # SystemError, RuntimeError, …: never acceptable
                raise Failure(f"{name} raised {type(e).__name__}: {e}") from e
            self.check()
            n += 1
        if self.unsigned and not self.saw_unsigned:
            raise Failure(f"{n} calls and no hash at or above 2**63 was ever filed")
        return n


class SlotPoolCase(Case):
    def __init__(self, rng) -> None:
        super().__init__(rng)
        self.p = sc.StateSlotPool(16, sc.StateTransfer.fork(2, readable_midstep=True), hash_block_size=4)
        self.owned: list[int] = []
        self.res: list = []

    def snapshot(self):
        return snap_free_list(self.p)

    def check(self) -> None:
        self.p._check_invariants()
        self.check_forms(dict(self.p.hash_to_slot))
        self.check_forms(h for h in self.p.slot_hash if h != -1)

    def prime(self) -> None:
        super().prime()
        self.p.lookup(self.H(11))

    def slot(self):
        return self.rng.randrange(-1, self.p.num_slots + 1)

    def h(self):
        return self.H(self.rng.choice([11, 12, 13, -1, 10**15]))

    def calls(self):
        p, a, s = self.p, self.any_value, self.seq
        rng = self.rng

        def pop():
            if p.has_free():
                self.owned.append(p.pop())

        def release():
            if self.owned:
                p.release(self.owned.pop())

        def checkpoint():
            if self.owned:
                s.state_slots = [self.owned[-1]]
            p.checkpoint(s, a(lambda: rng.randrange(1, 5)), a(self.h))
            if s.state_slots:
                self.owned[-1:] = [s.state_slot]

        def reserve():
            self.res = p.reserve_midstep(s, a(lambda: [(4, self.h())]))

        def reentrant_list():
            lst = [self.H(10**12), Reentrant(lambda: p.pop()), self.H(10**12 + 1)]
            return p.resumable_hit(s, 3, lst)

        def checkpoint_many():
            if self.owned:
                s.state_slots = [self.owned[-1]]
            p.checkpoint_many(a(lambda: [s]), a(lambda: [rng.randrange(1, 5)]), a(lambda: [self.h()]))
            if s.state_slots:
                self.owned[-1:] = [s.state_slot]

        return [
            ("pop", pop),
            ("release", release),
            ("checkpoint", checkpoint),
            ("reserve", reserve),
            ("publish", lambda: p.publish_midstep(a(lambda: self.res), None)),
            ("cancel", lambda: p.cancel_midstep(a(lambda: self.res))),
            ("release_many", lambda: p.release_many(a(lambda: list(self.owned[-1:])))),
            ("pop_many", lambda: self.owned.extend(p.pop_many(a(lambda: rng.randrange(2))) or [])),
            (
                "resumable_hit",
                lambda: p.resumable_hit(s, a(lambda: rng.randrange(65)), a(lambda: list(s.block_hashes))),
            ),
            ("resumable_hit_views", lambda: p.resumable_hit(s, 64, s.block_hashes)),
            ("reentrant_list", reentrant_list),
            (
                "resumable_hits",
                lambda: p.resumable_hits(
                    a(lambda: [s, s]),
                    a(lambda: [rng.randrange(65), 3]),
                    a(lambda: [list(s.block_hashes), [self.H(10**12), self.H(5), 6]]),
                ),
            ),
            ("resumable_hits_own", lambda: p.resumable_hits(a(lambda: [s]), a(lambda: [3]))),
            ("checkpoint_many", checkpoint_many),
            ("lookup", lambda: p.lookup(a(self.h))),
            ("claim", lambda: p.claim(a(self.slot))),
            ("pin", lambda: p.pin(a(self.slot))),
            ("unpin", lambda: p.unpin(a(self.slot))),
            ("drop_reader", lambda: p.drop_reader(a(self.slot))),
            ("release_pins", p.release_pins),
            ("promote", lambda: p.promote(a(self.slot))),
            ("mark_speculative", lambda: p.mark_speculative(a(self.slot))),
            ("invalidate", lambda: p.invalidate(a(self.slot))),
            ("unindex", lambda: p.unindex(a(self.h))),
            ("extend", lambda: p.extend(a(lambda: rng.randrange(3)))),
            ("retire_top", p.retire_top),
            ("has_free", lambda: p.has_free(a(lambda: 1))),
            ("record_relocation", lambda: p.record_relocation(a(self.slot), a(self.slot))),
            ("take_relocations", p.take_relocations),
            ("set_hashes", lambda: setattr(s, "block_hashes", a(lambda: [1, self.H(2), self.H(3)]))),
            ("set_slots", lambda: setattr(s, "state_slots", a(lambda: [1]))),
        ]


class GroupPoolCase(Case):
    def __init__(self, rng) -> None:
        super().__init__(rng)
        self.p = sc.StateGroupPool(12, sc.StateTransfer.copy(), hash_block_size=4)
        self.owned: list[int] = []

    def snapshot(self):
        return snap_free_list(self.p)

    def check(self) -> None:
        self.p._check_invariants()
        self.check_forms(dict(self.p.hash_to_group))
        if self.seq.pending_checkpoint != -1:
            self.check_forms([self.seq.pending_checkpoint])

    def prime(self) -> None:
        super().prime()
        self.p.lookup(self.H(21))

    def calls(self):
        p, a, s, rng = self.p, self.any_value, self.seq, self.rng
        H = self.H

        def pop():
            if p.has_free():
                self.owned.append(p.pop())
                s.per_req_cache_group = self.owned[-1]

        def release():
            if self.owned:
                p.release(self.owned.pop())

        return [
            ("pop", pop),
            ("release", release),
            ("checkpoint", lambda: p.checkpoint(s, 1, a(lambda: H(rng.choice([21, 22, -1]))))),
            ("take_copies", p.take_copies),
            ("forget_pending", lambda: p.forget_pending(s)),
            (
                "checkpoint_many",
                lambda: p.checkpoint_many(a(lambda: [s]), a(lambda: [1]), a(lambda: [H(rng.choice([21, 22, -1]))])),
            ),
            ("forget_pending_many", lambda: p.forget_pending_many(a(lambda: [s, s]))),
            ("release_many", lambda: p.release_many(a(lambda: list(self.owned[-1:])))),
            (
                "resumable_hits",
                lambda: p.resumable_hits(a(lambda: [s]), a(lambda: [3]), a(lambda: [[H(21), H(22), H(23)]])),
            ),
            ("record_copy", lambda: p.record_copy(a(lambda: rng.randrange(12)), a(lambda: rng.randrange(12)))),
            ("resumable_hit", lambda: p.resumable_hit(s, a(lambda: 3), a(lambda: [H(21), H(22), H(23)]))),
            ("lookup", lambda: p.lookup(a(lambda: H(21)))),
            ("release_pins", p.release_pins),
            ("retire_top", p.retire_top),
            ("extend", lambda: p.extend(a(lambda: 1))),
            ("unindex", lambda: p.unindex(a(lambda: H(21)))),
        ]


class PagedCase(Case):
    """BlockPool + store + coordinator, with hostile owners and callbacks."""

    def __init__(self, rng) -> None:
        super().__init__(rng)
        self.spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="f", image_bytes=256)
        self.pool = sc.BlockPool(40)
        self.coord = sc.PagedStateCheckpointCoordinator(self.pool, self.spec, enabled=True)
        self.pool.on_evict = self.coord.unindex
        self.seq.state_slots = [0]
        self.kv: list[int] = []
        self.units: dict = {}

    def snapshot(self):
        return (snap_store(self.coord.store), repr(self.coord.checkpoint_fates()))

    def check(self) -> None:
        check_block_pool(self.pool)
        self.coord.store.check_consistency()
        self.check_forms(dict(self.coord.store.hash_to_checkpoint))
        self.check_forms(r.prefix_hash for r in self.coord.store.records.values())

    def prime(self) -> None:
        super().prime()
        self.pool.lookup(self.H(1))
        self.coord.contains(self.H(1))

    def owner(self):
        p = self.pool
        return self.rng.choice(
            [
                ("mine", 1),
                1,
                1.0,
                None,
                [1],
                RaisingHash(),
                RaisingEq(),
                Reentrant(lambda: p.allocate(1)),
                ("state-transfer", RaisingHash()),
                ("state-checkpoint", 2**70),
                ("state-checkpoint", -3),
            ]
        )

    def on_evict(self):
        p, c = self.pool, self.coord

        def raising(h):
            raise CallbackBoom("on_evict")

        def detaching(h):
            p.on_evict = None
            c.unindex(h)

        def reentrant(h):
            c.unindex(h)
            p.allocate(1)

        return self.rng.choice([c.unindex, raising, detaching, reentrant, None, 5])

    def calls(self):
        p, c, a, s, rng = self.pool, self.coord, self.any_value, self.seq, self.rng
        st = c.store
        H = self.H

        def h60():
            return H(rng.randrange(1, 60))

        def reserve():
            o = a(self.owner)
            got = p.reserve_units(a(lambda: rng.randrange(4)), o)
            if got:
                self.units.setdefault(repr(o), (o, []))[1].extend(got)

        def release():
            if self.units:
                key = rng.choice(list(self.units))
                o, got = self.units[key]
                if got:
                    p.release_units([got.pop()], o)

        def alloc():
            got = p.allocate(a(lambda: rng.randrange(1, 4)))
            if got:
                self.kv.extend(got)
                for b in got:
                    p.publish(b, h60())

        def free():
            if self.kv:
                p.free([self.kv.pop()])

        def clock():
            st.use_clock(
                rng.choice(
                    [lambda: 1.0, lambda: "x", lambda: (_ for _ in ()).throw(CallbackBoom()), time.monotonic, None, 3]
                )
            )

        return [
            ("reserve_units", reserve),
            ("release_units", release),
            ("allocate", alloc),
            ("free", free),
            ("set_on_evict", lambda: setattr(p, "on_evict", self.on_evict())),
            ("checkpoint", lambda: c.checkpoint(s, a(lambda: 1), a(h60))),
            ("complete", c.complete_previous_batch),
            ("take_ops", c.take_checkpoint_ops),
            ("begin_restore", lambda: c.begin_restore(a(h60), a(lambda: 1))),
            ("resumable_hit", lambda: c.resumable_hit(s, a(lambda: 3), a(lambda: [H(1), H(2), H(3)]))),
            ("resumable_hit_view", lambda: c.resumable_hit(s, 3, s.block_hashes)),
            ("unindex", lambda: c.unindex(a(h60))),
            ("offload", lambda: c.attach_offload(rng.choice([sc.StateOffloadIndex(), None]))),
            ("take_offload", lambda: st.take_offload_stores(a(lambda: 2))),
            ("reclaim", lambda: st.reclaim_stale_offload_pins(a(lambda: 0.001))),
            ("use_clock", clock),
            ("reserve_transfer", lambda: c.reserve_transfer_units(a(self.owner))),
            ("adopt_transfer", lambda: c.adopt_transfer_units(a(self.owner), a(lambda: H(7)))),
            ("release_transfer", lambda: c.release_transfer_units(a(self.owner))),
            ("adopt_units", lambda: st.adopt_units(a(lambda: tuple(self.kv[:4])), a(self.owner), a(lambda: H(9)))),
            ("reset_prefix_cache", p.reset_prefix_cache),
            ("forget_pending", lambda: c.forget_pending(s)),
            (
                "checkpoint_many",
                lambda: c.checkpoint_many(a(lambda: [s]), a(lambda: [1]), a(lambda: [h60()])),
            ),
            (
                "resumable_hits",
                lambda: c.resumable_hits(a(lambda: [s]), a(lambda: [3]), a(lambda: [[H(1), H(2), H(3)]])),
            ),
            ("forget_pending_many", lambda: c.forget_pending_many(a(lambda: [s]))),
            ("owner_of", lambda: p.owner_of(a(lambda: rng.randrange(40)))),
            ("changed_since", lambda: st.changed_since(a(lambda: 0))),
            ("has_available_units", lambda: c.has_available_units(a(lambda: 4), a(lambda: None))),
        ]


def uninitialised(deadline: float) -> int:
    """Every public class created without __init__: each method and property
    raises TypeError (or works), never crashes."""
    n = 0
    from statecache import _C

    # The extension's classes: a plain Python class without __init__ is Python's business.
    classes = [getattr(_C, name) for name in dir(_C) if isinstance(getattr(_C, name), type)]
    for cls in classes:
        try:
            obj = cls.__new__(cls)
        except Exception:
            continue
        for attr in dir(cls):
            if attr.startswith("__") and attr not in (
                "__len__",
                "__iter__",
                "__repr__",
                "__eq__",
                "__hash__",
                "__getitem__",
                "__contains__",
            ):
                continue
            try:
                v = getattr(obj, attr)
                if callable(v):
                    for args in ((), (1,), (1, 2), ([1],)):
                        try:
                            v(*args)
                        except CLEAN:
                            pass
            except CLEAN:
                pass
            n += 1
    return n


def pickling(deadline: float) -> int:
    """pickle / copy / deepcopy of every kind of object: works or TypeError."""
    pool = sc.BlockPool(8)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=64, layout_id="p", image_bytes=64)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
    slot = sc.StateSlotPool(4, sc.StateTransfer.fork(1))
    seq = sc.Sequence(3, num_tokens=5)
    seq.block_hashes = [1, 2]
    objs = [
        pool,
        coord,
        coord.store,
        coord.store.records,
        coord.store.hash_to_checkpoint,
        slot,
        slot.hash_to_slot,
        slot.slot_hash,
        seq,
        seq.block_hashes,
        sc.StateTransfer.copy(),
        spec,
        sc.StateOffloadIndex(),
        sc.StateStoreOperationId(1, 2),
        sc.StateGroupPool(2, sc.StateTransfer.fork(1)),
    ]
    n = 0
    for o in objs:
        for f in (lambda x: pickle.loads(pickle.dumps(x)), copy.copy, copy.deepcopy):
            try:
                f(o)
            except (TypeError, pickle.PicklingError):
                pass
            n += 1
    return n


def views_after_owner(deadline: float) -> int:
    n = 0
    while time.monotonic() < deadline:
        p = sc.StateSlotPool(4, sc.StateTransfer.fork(1))
        v1, v2 = p.hash_to_slot, p.slot_hash
        seq = sc.Sequence(1)
        seq.block_hashes = [5, 6, 7]
        lv = seq.block_hashes
        del p, seq
        gc.collect()
        for v in (v1, v2, lv):
            try:
                len(v), list(v), repr(v)
            except CLEAN:
                pass
        try:
            lv.append(3)
            lv.extend(lv)
            lv.clear()
        except CLEAN:
            pass
        n += 1
    return n


def run_threads(ts: list[threading.Thread], errors: list[str]) -> None:
    """Starts and joins ``ts``; raises Failure naming the first errors they recorded."""
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise Failure("thread errors: " + "; ".join(errors[:3]))


def threads(deadline: float) -> int:
    pool = sc.BlockPool(256)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=128, layout_id="t", image_bytes=128)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
    pool.on_evict = coord.unindex
    slots = sc.StateSlotPool(64, sc.StateTransfer.fork(1))
    errors: list = []
    count = [0]

    def worker(k: int) -> None:
        rng = random.Random(k)
        seq = sc.Sequence(k, num_tokens=100)
        seq.state_slots = [k]
        try:
            while time.monotonic() < deadline:
                got = pool.allocate(2)
                if got:
                    pool.publish(got[0], rng.randrange(1, 500))
                    pool.free(got)
                coord.checkpoint(seq, 1, rng.randrange(1, 500))
                if k == 0:
                    coord.complete_previous_batch()
                    coord.take_checkpoint_ops()
                if slots.has_free(1):
                    try:
                        s = slots.pop()
                        slots.release(s)
                    except CLEAN:
                        pass
                count[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    run_threads(ts, errors)
    check_block_pool(pool)
    coord.store.check_consistency()
    slots._check_invariants()
    return count[0]


def mutating_ops(deadline: float) -> int:
    """Copy batches whose ops replace or resize the layout tensors' storage
    while they convert (an element's __index__, a duck-typed op's property):
    every batch either runs on storage that is still the layout's or raises
    ValueError. Under ASan a write to freed memory aborts the process."""
    import torch

    rng = random.Random(int(deadline * 1000) % 2**32)
    n = 0
    while time.monotonic() < deadline:
        slots = torch.arange(8 * 64, dtype=torch.uint8).reshape(8, 64).clone()
        pages = torch.zeros(16, 64, dtype=torch.uint8)
        ex = sc.StateCopyExecutor(sc.StateLayout([slots]), sc.PageLayout([pages], unit_dim=0), max_num_seqs=4)
        lid, nb = ex.layout_id, ex.spec.image_bytes
        for _ in range(20):

            def mutate(slots=slots, pages=pages):
                target = rng.choice([slots, pages])
                kind = rng.randrange(4)
                if kind == 0:  # a new storage; the old one is freed
                    target.set_(torch.zeros(target.shape, dtype=torch.uint8).untyped_storage(), 0, target.shape)
                elif kind == 1:  # the storage itself reallocated
                    target.untyped_storage().resize_(target.untyped_storage().nbytes() * 2)
                elif kind == 2:
                    gc.collect()

            class Mutating:
                def __init__(self, v):
                    self.v = v

                def __index__(self):
                    mutate()
                    return self.v

            class Duck:
                src_slot = rng.randrange(8)
                total_bytes = nb
                layout_id = lid

                @property
                def unit_ids(self):
                    mutate()
                    return [rng.randrange(16)]

            if rng.random() < 0.5:
                batch = dict(stores=[Duck()])
            else:
                op = sc.CheckpointRestoreOp(
                    dst_slot=rng.randrange(8), unit_ids=(rng.randrange(16),), total_bytes=nb, layout_id=lid
                )
                batch = dict(restores=[op], relocations=[(Mutating(rng.randrange(8)), Mutating(rng.randrange(8)))])
            try:
                ex(**batch)
            except ValueError:
                pass
            n += 1
    return n


def mutated_arrays(deadline: float) -> int:
    """Batched calls whose NumPy arguments (hits, hashes, a 2-D hash array)
    are resized or rewritten by Python code that runs mid-call: a tier's vote,
    an engine object's getter or setter, an element's __index__. Nothing is
    read from freed memory (ASan aborts the process if it is) and every call
    returns or raises cleanly, leaving the objects consistent."""
    rng = random.Random(int(deadline * 1000) % 2**32)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=256, layout_id="m", image_bytes=256)
    junk: list = []
    arrays: list = []
    n = 0

    def disturb():
        if not arrays:
            return
        a = rng.choice(arrays)
        try:
            if rng.random() < 0.5:
                grown = a.size * rng.choice([0, 8, 64])
                a.resize(grown if 0 < grown <= 1 << 14 else 1, refcheck=False)
            else:
                a[...] = -7
        except (ValueError, TypeError):
            pass
        junk.extend(np.full(64, -7, dtype=np.int64) for _ in range(4))  # reuses what was freed
        if len(junk) > 512:
            junk.clear()

    class Tier:
        def could_serve(self, h):
            disturb()
            return rng.random() < 0.2

        def stats(self):
            return {}

    class Disturbing:
        def __index__(self):
            disturb()
            return 1

    class Own:
        def __init__(self, i):
            self.seq_id = i
            self.num_tokens = 400
            self.num_prompt_tokens = 400
            self.slots = [i]
            self.state_fork_src = -1
            self.per_req_cache_group = -1
            self.pending_checkpoint = -1
            self.checkpoint_end_pos = 0
            self.midstep_anchor_pos = 0
            self.block_hashes = np.arange(1, 41, dtype=np.int64)

        @property
        def has_per_req_cache(self):
            disturb()
            return True

        @property
        def state_slot(self):
            disturb()
            return self.slots[0]

        @state_slot.setter
        def state_slot(self, v):
            disturb()
            self.slots = [v]

    while time.monotonic() < deadline:
        coord = sc.PagedStateCheckpointCoordinator(sc.BlockPool(64), spec, True, offload=Tier())
        pool = sc.StateSlotPool(32, sc.StateTransfer.fork(1), hash_block_size=4)
        for _ in range(30):
            seqs = [Own(i) if rng.random() < 0.5 else sc.Sequence(i, num_tokens=400) for i in range(4)]
            for k, s in enumerate(seqs):
                if isinstance(s, sc.Sequence):
                    s.state_slots = [k]
                    s.block_hashes = list(range(1, 41))
            arrays[:] = [
                np.array([rng.randrange(0, 41) for _ in seqs], dtype=np.int64),
                np.arange(1, 41, dtype=np.int64),
                np.arange(1, 161, dtype=np.int64).reshape(4, 40),
                np.array([rng.randrange(1, 41) for _ in seqs], dtype=np.int64),
                np.array([1, 2, 3, 4], dtype=np.int64),
            ]
            hits, row, matrix, hashes, blocks = arrays
            if rng.random() < 0.3:
                blocks = [Disturbing(), 1, 1, 1]
            target = rng.choice([coord, pool])
            call = rng.randrange(5)
            try:
                if call == 0:
                    target.resumable_hits(seqs, hits, matrix)
                elif call == 1:
                    target.resumable_hits(seqs, hits, [row, row, row, row])
                elif call == 2:
                    target.resumable_hit(seqs[0], 10, row)
                elif call == 3 and target is coord:
                    coord.begin_restores(hashes, np.array([0, 1, 2, 3], dtype=np.int64))
                else:
                    if target is pool:
                        for s in seqs:
                            if pool.has_free() and (s.state_slot < 0 or pool.is_free(s.state_slot)):
                                s.state_slot = pool.pop()
                    target.checkpoint_many(seqs, blocks, hashes)
            except CLEAN:
                pass
            except RuntimeError as e:
                if "changed" not in str(e):
                    raise Failure(f"call {call} raised RuntimeError: {e}") from e
            coord.check_consistency()
            pool._check_invariants()
            if target is coord and rng.random() < 0.3:
                coord.take_checkpoint_ops()
                coord.complete_previous_batch()
            n += 1
    return n


def thread_promises(deadline: float) -> int:
    """docs/contract.md, "Threading", under load: threads share a slot pool
    whose engine objects' setters hand the GIL over mid-call, a block pool
    whose owners' __hash__ does, a metrics registry one thread registers into
    while another collects, and a Sequence subclass one thread constructs
    while another calls its bare __new__. No legitimate call fails, no bare
    __new__ gets through, and every object stays consistent."""
    from statecache.metrics import StateCacheMetrics

    slots = sc.StateSlotPool(64, sc.StateTransfer.fork(1))
    blocks = sc.BlockPool(256)
    metrics = StateCacheMetrics()
    errors: list = []
    count = [0]

    class Yielding:
        """An engine object whose setters hand the GIL to another thread."""

        def __init__(self):
            self.num_tokens, self.has_per_req_cache = 100, True
            self.state_slot, self.state_fork_src = -1, -1
            self.checkpoint_end_pos = self.midstep_anchor_pos = 0

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)
            time.sleep(0)

    class SlowOwner:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            time.sleep(0)
            return self.k

        def __eq__(self, other):
            return isinstance(other, SlowOwner) and other.k == self.k

    class SlowNew(sc.Sequence):
        def __new__(cls, *a, **kw):
            time.sleep(0)
            return super().__new__(cls)

    def batches(k):
        rng = random.Random(k)
        own = [Yielding() for _ in range(3)]
        while time.monotonic() < deadline:
            for s in own:
                if s.state_slot < 0 and slots.has_free():
                    s.state_slot = slots.pop()
            live = [s for s in own if s.state_slot >= 0]
            slots.checkpoint_many(live, [1] * len(live), [rng.randrange(1, 10**6) for _ in live])
            slots.release_pins()
            for s in own:
                if s.state_slot >= 0 and rng.random() < 0.3:
                    slots.release(s.state_slot)
                    s.state_slot = -1
            count[0] += 1

    def pool_user(k):
        rng = random.Random(100 + k)
        mine: list = []
        while time.monotonic() < deadline:
            if slots.has_free() and rng.random() < 0.5:
                mine.append(slots.pop())
            elif mine:
                slots.release(mine.pop())
            dict(slots.hash_to_slot)
            o = SlowOwner(rng.randrange(8))
            got = blocks.reserve_units(1, o)
            if got:
                blocks.release_units(got, o)
            count[0] += 1

    def metrics_user(k):
        i = 0
        while time.monotonic() < deadline:
            if k == 0:
                metrics.track_cache(f"c{i % 50}", slots)
                i += 1
            else:
                metrics.collect()
            count[0] += 1

    def constructor(k):
        while time.monotonic() < deadline:
            if k == 0:
                s = SlowNew(1, num_tokens=2)
                if s.num_tokens != 2:
                    raise Failure("a construction lost its arguments")
            else:
                try:
                    sc.Sequence.__new__(SlowNew)
                except TypeError:
                    pass
                else:
                    raise Failure("another thread's bare __new__ got an uninitialised instance")
            count[0] += 1

    def guard(fn, k):
        try:
            fn(k)
        except BaseException as e:  # noqa: BLE001
            errors.append(f"{fn.__name__}[{k}]: {e!r}")

    ts = [
        threading.Thread(target=guard, args=(fn, k))
        for fn in (batches, pool_user, metrics_user, constructor)
        for k in (0, 1)
    ]
    run_threads(ts, errors)
    slots._check_invariants()
    check_block_pool(blocks)
    return count[0]


# ------------------------------------------------------------------ tiers --


def tier_batches(deadline: float) -> int:
    """Batches with duplicate keys (and sizes that differ) on the host tier,
    against a dict: every destination gets its own answer, and one reported
    read holds the value."""
    from statecache.tiers import MISSING, TRUNCATED, HostTier

    t0 = time.monotonic()
    rng = random.Random(random.randrange(2**32))
    t = HostTier(64 * 256, 256, pin_memory=False)
    deadline += time.monotonic() - t0  # the budget is for calls, not imports
    model: dict[str, bytes] = {}
    n = 0
    while time.monotonic() < deadline:
        keys = [f"k{rng.randrange(8)}" for _ in range(rng.randrange(1, 6))]
        op = rng.randrange(4)
        if op == 0:
            vals = [bytes(rng.randrange(256) for _ in range(rng.choice((1, 100, 256, 600)))) for _ in keys]
            got = t.put_many(keys, [[v] for v in vals])
            for k, v, ok in zip(keys, vals, got):
                if ok and k not in model:
                    model[k] = v
                if ok != (k in model):
                    raise Failure(f"put {k}: {ok}, held {k in model}")
            # the arena may have evicted others for room
            for k in list(model):
                if not t.contains_many([k])[0]:
                    del model[k]
        elif op == 1:
            dests = [np.full(rng.choice((1, 100, 256, 600, len(model.get(k, b"")) or 5)), 7, np.uint8) for k in keys]
            got = t.get_many_into(keys, [[d] for d in dests])
            for k, d, r in zip(keys, dests, got):
                want = model.get(k)
                expect = MISSING if want is None else (len(want) if len(want) == d.size else TRUNCATED)
                if r != expect or (r >= 0 and d.tobytes() != want):
                    raise Failure(f"get {k} into {d.size} bytes: {r}, expected {expect}")
        elif op == 2:
            if t.contains_many(keys) != [k in model for k in keys]:
                raise Failure("contains_many disagrees per position")
        else:
            got = t.remove_many(keys)
            seen = set()
            for k, r in zip(keys, got):
                if r != (k in model and k not in seen):
                    raise Failure(f"remove {k}: {r}")
                seen.add(k)
            for k in keys:
                model.pop(k, None)
        t.arena.check_consistency()
        n += 1
    return n


class _FlakyTier:
    """A shared tier in a dict that is slow, fails and refuses at random,
    and whose removals do not happen (best effort)."""

    name = "flaky"

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.values, self.lock = rng, {}, threading.Lock()

    def put_many(self, keys, values):
        from statecache.tiers import TierError

        r = self.rng.random()
        if r < 0.3:
            time.sleep(self.rng.random() * 0.02)
        if r > 0.9:
            raise TierError("flaky: down")
        out = []
        for k, segs in zip(keys, values):
            ok = self.rng.random() > 0.1
            if ok:
                with self.lock:
                    self.values.setdefault(k, b"".join(bytes(memoryview(x).cast("B")) for x in segs))
            out.append(ok)
        return out

    def get_many_into(self, keys, dests):
        return [-1] * len(keys)

    def contains_many(self, keys):
        return [k in self.values for k in keys]

    def remove_many(self, keys):
        return [False] * len(keys)

    def stats(self):
        return {}


class _ArrayMover:
    """The unit mover over a NumPy array of units, slow at random (so that
    copies on the I/O thread overrun their pins)."""

    def __init__(self, mem, rng: random.Random) -> None:
        self.mem, self.rng, self.unit_bytes = mem, rng, mem.shape[1]

    def to_rows(self, units, rows) -> None:
        if self.rng.random() < 0.3:
            time.sleep(self.rng.random() * 0.01)
        for u, row in zip(units, rows):
            row[:] = self.mem[u]


def _image(h: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(h).integers(0, 256, nbytes, dtype=np.uint8)


def tier_reclaim(deadline: float) -> int:
    """Slow and failing shared tiers racing reclaim: offloads whose copies
    wait behind slow writes lose their pins and their units are reused
    (overwritten at once); no value the tier holds under a valid checksum
    may be anything but its prefix's image."""
    from statecache.engine.tiering.stack import TierStack
    from statecache.engine.tiering.store import StateOffloads
    from statecache.tiers import integrity

    t0 = time.monotonic()
    UB, UPC = 64, 2
    rng = random.Random(random.randrange(2**32))
    pool = sc.BlockPool(48)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=UB, slot_bytes=UB * UPC, layout_id="f", image_bytes=UB * UPC)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
    pool.on_evict = coord.unindex
    mem = np.zeros((48, UB), np.uint8)
    tier = _FlakyTier(random.Random(rng.randrange(2**32)))
    stack = TierStack([tier], unit_bytes=UB, units_per_checkpoint=UPC, max_inflight=4, shared_writes=None)
    index = sc.StateOffloadIndex()
    coord.attach_offload(index)

    class Keys:
        filed_key = staticmethod(lambda kind, h: f"f/{kind}/{h}")
        position = staticmethod(lambda h: 1)

    class Placement:
        position = staticmethod(lambda kind, h: 1)
        state_stored = staticmethod(lambda h: None)

    stores = StateOffloads(
        stack,
        coordinator=coord,
        index=index,
        mover=_ArrayMover(mem, rng),
        keys=Keys,
        placement=Placement,
        offload_timeout_s=0.004,
    )
    seq = sc.Sequence(1, num_tokens=1000)
    seq.state_slots = [0]
    taken: list = []
    deadline += time.monotonic() - t0  # the budget is for passes, not imports
    n = 0

    def check() -> None:
        with tier.lock:
            items = list(tier.values.items())
        for k, v in items:
            hl = integrity.header_nbytes(k)
            payload = np.frombuffer(v[hl:], np.uint8)
            if integrity.check(v[:hl], k, [payload], payload.size) != integrity.OK:
                continue
            if not np.array_equal(payload, _image(int(k.rsplit("/", 1)[1]), UB * UPC)):
                raise Failure(f"{k}: a valid checksum over bytes that are not its image")

    try:
        while time.monotonic() < deadline:
            # top of pass, as Tiering.top_of_pass orders it
            coord.complete_previous_batch()
            stores.retire()
            coord.reclaim_stale_offload_pins(stores.offload_timeout_s)
            stores.note_reclaims()
            for op, units in taken:
                if coord.was_reclaimed(op):
                    mem[list(units)] = 0xAB  # reused at once
            taken = [(op, u) for op, u in taken if not coord.was_reclaimed(op)]
            for op, units in coord.take_offload_stores(4):
                taken.append((op, list(units)))
                stores.offload(op, units)
            # the pass: one new checkpoint, its image written into its units
            h = rng.randrange(1, 10**9)
            coord.checkpoint(seq, 1, h)
            ops, _ = coord.take_checkpoint_ops()
            for op in ops:
                mem[list(op.unit_ids)] = _image(h, UB * UPC).reshape(UPC, UB)
            if rng.random() < 0.1:
                check()
            n += 1
        stores.wait_writes(5)
        check()
        coord.store.check_consistency()
        stack.host.arena.check_consistency()
    finally:
        stores.close()
    return n


# Two 16-token blocks with one scheduler hash under seed 0 (issue 18): the
# engine must resume neither's KV or state for the other.
COLLIDING_A = [14, 24, 35, 54, 70, 82, 111, 116, 134, 159, 171, 191, 197, 208, 235, 250]
COLLIDING_B = [13, 24, 33, 50, 70, 83, 104, 114, 128, 158, 169, 186, 192, 215, 225, 244]


def collision_pair(deadline: float) -> int:
    """The reference engine under seed 0 (configured, so the pair collides)
    serving prompts that start with either block of the pair, under random
    shapes (PAGE or fork, midstep or chunked, small pools that evict and
    preempt, ladders) with checkpoints dropped and the prefix cache reset at
    random. A content model of every slot, unit and KV block (engine_support's
    ContentRunner) checks every forward reads only its own prefix."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine_support import ContentRunner, engine
    from statecache.engine import Request

    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    tails = [[rng.randrange(1, 9) for _ in range(48)] for _ in range(3)]
    n = 0
    while time.monotonic() < deadline:
        mech = rng.choice(["page", "fork"])
        runner = ContentRunner(16)
        eng = engine(
            mech,
            hbs=16,
            num_blocks=rng.choice([10, 16, 64]),
            num_slots=rng.choice([4, 8]),
            budget=rng.choice([16, 40, 64]),
            interval=rng.choice([-1, 16, 32]),
            runner=runner,
            hash_seed=0,
            readable_midstep=rng.random() < 0.4,
        )
        bm, seen = eng.block_manager, []
        for _ in range(rng.randrange(4, 16)):
            for _ in range(rng.randrange(1, 4)):
                head = COLLIDING_A if rng.random() < 0.5 else COLLIDING_B
                tail = rng.choice(tails)[: rng.randrange(1, 40)]
                out = [rng.randrange(1, 9) for _ in range(rng.randrange(1, 5))]
                req = Request(head + tail, len(out), scripted_output=out)
                eng.add_request(req)
                seen.append(req)
            for _ in range(rng.randrange(1, 6)):
                eng.step()
                n += 1
                r = rng.random()
                hashes = rng.choice(seen).hashes
                if r < 0.1 and hashes:
                    bm.drop_checkpoint(rng.choice(hashes))  # as an eviction policy does
                elif r < 0.13:
                    bm.pool.reset_prefix_cache()
            if rng.random() < 0.5:
                eng.run_until_done()
        eng.run_until_done()
        bm.pool.check_consistency()
    return n


CASES = {
    "slot_pool": SlotPoolCase,
    "group_pool": GroupPoolCase,
    "paged": PagedCase,
    "uninitialised": uninitialised,
    "pickling": pickling,
    "views": views_after_owner,
    "threads": threads,
    "slot_pool_u64": type("SlotPoolU64Case", (SlotPoolCase,), {"unsigned": True}),
    "group_pool_u64": type("GroupPoolU64Case", (GroupPoolCase,), {"unsigned": True}),
    "paged_u64": type("PagedU64Case", (PagedCase,), {"unsigned": True}),
    "mutating_ops": mutating_ops,
    "mutated_arrays": mutated_arrays,
    "thread_promises": thread_promises,
    "tier_batches": tier_batches,
    "tier_reclaim": tier_reclaim,
    "collision_pair": collision_pair,
}


def main() -> int:
    case, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    deadline = time.monotonic() + seconds
    target = CASES[case]
    random.seed(seed)  # the functions' draws; the classes take their own Random
    if isinstance(target, type):
        n = target(random.Random(seed)).run(deadline)
    else:
        n = target(deadline)
    print(f"{case}: {n} calls, ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
