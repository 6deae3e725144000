"""Side-by-side drivers: the reference pool and statecache's, one random
operation sequence, every result and all public (and mirrored private) state
compared after every step. Used by pools/test_slot_pool.py and pools/test_group_pool.py.

Arguments are drawn from the reference's state, so every call is one the
protocol allows. Where docs/contract.md deliberately differs from the reference the
driver models the difference explicitly (README, "Divergences"; docs/contract.md):
* group checkpoint under none()/replay() keeps nothing: checked against the contract;
* -1 as a content hash (checkpoint, reserve_midstep positions) raises
  ValueError on ours and changes nothing; the reference is not called;
* retire_top drops the retired index's index entry: the reference is given
  the same `invalidate` right after its retire_top.
"""

from __future__ import annotations

import random

import numpy as np

import statecache as sc
from reference import load

SLOT_TRANSFERS = {
    "none": lambda: sc.StateTransfer.none(),
    "fork": lambda: sc.StateTransfer.fork(3),
    "fork_mid": lambda: sc.StateTransfer.fork(2, readable_midstep=True),
    "replay": lambda: sc.StateTransfer.replay(),
}
GROUP_TRANSFERS = {
    "none": lambda: sc.StateTransfer.none(),
    "fork": lambda: sc.StateTransfer.fork(3),
    "copy": lambda: sc.StateTransfer.copy(),
    "replay": lambda: sc.StateTransfer.replay(),
}


def same(a, b, what):
    """Equal value and equal type, recursively (True is not 1, None is not -1)."""
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{what}: {type(a).__name__} vs {type(b).__name__} ({a!r} / {b!r})"
        assert len(a) == len(b), f"{what}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
        return
    if isinstance(a, dict):
        assert type(b) is dict and list(a.items()) == list(b.items()), f"{what}: {a!r} vs {b!r}"
        return
    if a is None or isinstance(a, (bool, int, float, str)):
        assert type(a) is type(b) and a == b, f"{what}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"
        return
    # Retirement records: same type name and fields.
    assert type(a).__name__ == type(b).__name__, f"{what}: {a!r} vs {b!r}"
    assert (a.retired, a.relocated_to, a.held_checkpoint) == (b.retired, b.relocated_to, b.held_checkpoint), (
        f"{what}: {a!r} vs {b!r}"
    )
    same(a.held_checkpoint, b.held_checkpoint, f"{what}.held_checkpoint")


def refused(ours, name, *args, **kwargs):
    """A call the contract refuses where the reference accepts it: ours raises
    ValueError (and changes nothing, which the next compare() checks against
    the reference, which is not called)."""
    o_args = [a.ours if isinstance(a, Both) else a for a in args]
    o_kw = {k: (v.ours if isinstance(v, Both) else v) for k, v in kwargs.items()}
    try:
        getattr(ours, name)(*o_args, **o_kw)
    except ValueError:
        return
    raise AssertionError(f"{name}{tuple(o_args)}: -1 as a content hash was accepted")


def call(ref, ours, name, *args, **kwargs):
    """Call `name` on both (args given as (ref_arg, our_arg) pairs where they
    differ, see `Both`), compare results or exception types."""
    r_args = [a.ref if isinstance(a, Both) else a for a in args]
    o_args = [a.ours if isinstance(a, Both) else a for a in args]
    r_kw = {k: (v.ref if isinstance(v, Both) else v) for k, v in kwargs.items()}
    o_kw = {k: (v.ours if isinstance(v, Both) else v) for k, v in kwargs.items()}
    r_exc = o_exc = None
    r_res = o_res = None
    try:
        r_res = getattr(ref, name)(*r_args, **r_kw)
    except Exception as e:  # noqa: BLE001 - the type is what we compare
        r_exc = e
    try:
        o_res = getattr(ours, name)(*o_args, **o_kw)
    except Exception as e:  # noqa: BLE001
        o_exc = e
    assert type(r_exc) is type(o_exc), f"{name}{tuple(r_args)}: reference raised {r_exc!r}, ours {o_exc!r}"
    if r_exc is None:
        same(r_res, o_res, f"{name}{tuple(r_args)}")
    return r_res


class Both:
    """An argument that differs between the two sides (their own Sequence)."""

    def __init__(self, ref, ours):
        self.ref, self.ours = ref, ours


class PlainSeq:
    """An engine's own request class: the sequence attributes, no statecache
    base class (docs/contract.md, "API guarantees": the pools take it through their generic path)."""

    def __init__(self, seq_id=None, num_tokens=0, num_prompt_tokens=0, has_per_req_cache=True):
        self.seq_id, self.num_tokens, self.num_prompt_tokens = seq_id, num_tokens, num_prompt_tokens
        self.has_per_req_cache = has_per_req_cache
        self.state_slots = []
        self.state_fork_src = self.per_req_cache_group = self.pending_checkpoint = -1
        self.checkpoint_end_pos = self.midstep_anchor_pos = 0
        self.block_hashes = []

    @property
    def state_slot(self):
        return self.state_slots[0] if self.state_slots else -1

    @state_slot.setter
    def state_slot(self, slot):
        self.state_slots = [slot] + list(self.state_slots[1:])


class SeqPair:
    _next = 0

    def __init__(self, num_tokens, has_cache=True, ours_cls=sc.Sequence):
        SeqPair._next += 1
        self.id = SeqPair._next
        self.ref = sc.Sequence(
            seq_id=self.id, num_tokens=num_tokens, num_prompt_tokens=num_tokens, has_per_req_cache=has_cache
        )
        self.ours = ours_cls(
            seq_id=self.id, num_tokens=num_tokens, num_prompt_tokens=num_tokens, has_per_req_cache=has_cache
        )

    @property
    def both(self):
        return Both(self.ref, self.ours)

    def set(self, name, value):
        setattr(self.ref, name, value)
        setattr(self.ours, name, value)

    def check(self):
        for f in (
            "state_slots",
            "state_fork_src",
            "per_req_cache_group",
            "pending_checkpoint",
            "num_tokens",
            "checkpoint_end_pos",
            "midstep_anchor_pos",
            "has_per_req_cache",
        ):
            a, b = getattr(self.ref, f), getattr(self.ours, f)
            if f == "state_slots":
                a, b = list(a), list(b)
            same(a, b, f"seq {self.id}.{f}")


class _Driver:
    unit = "slot"

    # Weight multipliers: "shrink" retires and re-grows the pool often while
    # checkpoints sit free, which is what exercises retire_top's re-homing.
    PROFILES = {
        "mixed": {},
        "idle": {
            "admit": 1.5,
            "finish": 4,
            "checkpoint": 2,
            "release_pins": 3,
            "retire_top": 2,
            "extend": 2,
            "pop": 0.3,
            "pop_many": 0.3,
            "resume": 2,
            "claim": 0.5,
        },
        "shrink": {"retire_top": 3, "extend": 3, "checkpoint": 2, "release_pins": 2, "admit": 1.5, "finish": 1.5},
    }

    def __init__(
        self, seed, transfer_name, enabled=True, size=8, hbs=2, profile="mixed", plain_seqs=False, unsigned_hashes=False
    ):
        self.rng = random.Random(seed)
        self.ours_seq_cls = PlainSeq if plain_seqs else sc.Sequence
        self.profile = self.PROFILES[profile]
        t = self.transfers[transfer_name]()
        ref_cls = getattr(load(self.ref_module), self.class_name)
        self.ref = ref_cls(size, t, hash_block_size=hbs, enabled=enabled)
        self.ours = getattr(sc, self.class_name)(size, t, hash_block_size=hbs, enabled=enabled)
        self.transfer_name = transfer_name
        self.hbs = hbs
        self.seqs: list[SeqPair] = []
        self.passes = 0  # release_pins calls so far
        self.pin_stamp: dict[int, int] = {}  # unit -> pass of its latest pin
        self.last_pins: dict[int, int] = {}
        self.hash_space = list(range(1, 4 * size + 4))
        # An engine that hashes unsigned (xxh64): most hashes have the top bit
        # set, so ours must give every one back as the int it was given.
        self.unsigned = unsigned_hashes
        if unsigned_hashes:
            self.hash_space = [h if h % 3 == 0 else 2**64 - 1 - h for h in self.hash_space]

    # -- helpers -------------------------------------------------------------
    @property
    def n(self):
        return getattr(self.ref, f"num_{self.unit}s")

    def units(self):
        return list(range(max(self.n, 0)))

    def held_by_seqs(self):
        raise NotImplementedError

    def loose(self):
        """Owned by the test: not free, not pinned, not held by a sequence."""
        held = self.held_by_seqs()
        return [u for u in self.units() if not self.ref.is_free(u) and not self.ref.is_pinned(u) and u not in held]

    def new_seq(self, num_tokens, has_cache=True):
        return SeqPair(num_tokens, has_cache, self.ours_seq_cls)

    def pick(self, xs):
        return self.rng.choice(xs) if xs else None

    def some_hash(self):
        r = self.rng.random()
        if r < 0.02:
            return -1
        if r < 0.6 and self.ref_index():
            return self.rng.choice(list(self.ref_index()))
        return self.rng.choice(self.hash_space)

    def hash_list(self, length):
        return [self.some_hash() for _ in range(length)]

    def hashes_arg(self, hs):
        r = self.rng.random()
        if r < 0.2:
            return tuple(hs)
        if r < 0.4:
            if self.unsigned:  # a uint64 array holds no -1
                return hs if -1 in hs else np.asarray(hs, dtype=np.uint64)
            return np.asarray(hs, dtype=np.int64)
        return hs

    # -- state comparison ----------------------------------------------------
    def compare(self):
        ref, ours, u = self.ref, self.ours, self.unit
        for attr in (
            f"num_{u}s",
            "enabled",
            "min_fork_tokens",
            "successor_room",
            "hash_block_size",
            "checkpoints_kept",
            "checkpoints_dropped",
            "checkpoints_evicted",
            "checkpoints_orphaned",
        ):
            same(getattr(ref, attr), getattr(ours, attr), attr)
        assert ref.transfer == ours.transfer
        same(getattr(ref, f"{u}_hash"), list(getattr(ours, f"{u}_hash")), f"{u}_hash")
        assert getattr(ours, f"{u}_hash") == getattr(ref, f"{u}_hash")
        ref_idx, our_idx = getattr(ref, f"hash_to_{u}"), getattr(ours, f"hash_to_{u}")
        assert list(ref_idx.items()) == list(our_idx.items()), f"hash_to_{u}: {ref_idx} vs {our_idx}"
        assert our_idx == ref_idx and len(our_idx) == len(ref_idx)
        same(ref.num_free(), ours.num_free(), "num_free")
        same(ref.checkpoint_fates(), ours.checkpoint_fates(), "checkpoint_fates")
        cap = len(getattr(ref, f"{u}_hash"))
        for x in range(-1, cap + 1):
            same(ref.is_free(x), ours.is_free(x), f"is_free({x})")
            same(ref.holds_checkpoint(x), ours.holds_checkpoint(x), f"holds_checkpoint({x})")
            same(ref.is_pinned(x), ours.is_pinned(x), f"is_pinned({x})")
            same(ref.pin_count(x), ours.pin_count(x), f"pin_count({x})")
        dbg = ours._debug_state()
        assert dbg["checkpointed"] == list(ref._checkpointed), (dbg["checkpointed"], list(ref._checkpointed))
        assert dbg["pinned"] == dict(ref._pinned)
        assert dbg["deferred"] == sorted(ref._deferred)
        for s in self.seqs:
            s.check()
        # docs/contract.md, "Invariants" on ours; where the reference's own index stays exact, ours must too.
        ours._check_invariants()
        assert ours._index_is_exact()
        assert ours.num_free() == sum(1 for x in range(cap) if ours.is_free(x))
        assert set(ref._free) == {x for x in range(cap) if ours.is_free(x)}
        self.check_spec()

    def check_spec(self):
        """docs/contract.md, "Invariants" on ours, beyond what _check_invariants covers."""
        ours, u = self.ours, self.unit
        cap = len(getattr(ours, f"{u}_hash"))
        pins = {x: ours.pin_count(x) for x in range(cap) if ours.is_pinned(x)}
        for x, c in pins.items():
            assert c > 0 and not ours.is_free(x), f"pinned {u} {x} is free"
            if c > self.last_pins.get(x, 0):
                self.pin_stamp[x] = self.passes
        self.last_pins = pins
        for x in self.held_by_seqs():
            assert not ours.is_free(x), f"{u} {x} is both free and owned"
        held = sum(1 for x in range(cap) if ours.holds_checkpoint(x))
        vacant = sum(1 for x in range(cap) if ours.is_free(x) and not ours.holds_checkpoint(x))
        assert ours.num_free() == held + vacant
        assert ours.has_free() == (ours.num_free() > 0)

    def after_release_pins(self):
        self.passes += 1
        self.check_spec()
        for x in self.last_pins:
            assert self.pin_stamp[x] >= self.passes - 1, f"pin on {x} outlived two passes"

    def ref_index(self):
        return getattr(self.ref, f"hash_to_{self.unit}")

    def retire_top(self):
        """retire_top on both; then the divergence: an index entry naming the
        retired index is dropped on ours, so the reference gets the same
        `invalidate` (it would otherwise revive on extend)."""
        res = call(self.ref, self.ours, "retire_top")
        if res is not None:
            for _h, x in list(self.ref_index().items()):
                if x == res.retired:
                    self.ref.invalidate(x)
        return res

    def run(self, steps):
        ops = self.ops()
        names = [o[0] for o in ops]
        weights = [o[1] * self.profile.get(o[0], 1) for o in ops]
        self.compare()
        for step in range(steps):
            name = self.rng.choices(names, weights)[0]
            try:
                getattr(self, "op_" + name)()
                self.compare()
            except AssertionError as e:
                raise AssertionError(f"step {step} op {name}: {e}") from e


class SlotDriver(_Driver):
    unit = "slot"
    ref_module, class_name, transfers = "slot_pool", "StateSlotPool", SLOT_TRANSFERS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reservations = []  # (ref_list, our_list, SeqPair)

    def held_by_seqs(self):
        held = set()
        for s in self.seqs:
            held.update(x for x in s.ref.state_slots if x >= 0)
        for r, _o, _s in self.reservations:
            held.update(x[0] for x in r)
        return held

    def ops(self):
        return [
            ("pop", 4),
            ("pop_many", 2),
            ("release", 4),
            ("release_many", 2),
            ("claim", 3),
            ("mark_speculative", 1),
            ("promote", 2),
            ("pin", 3),
            ("unpin", 1),
            ("drop_reader", 2),
            ("release_pins", 4),
            ("admit", 4),
            ("finish", 3),
            ("resume", 3),
            ("checkpoint", 6),
            ("resumable_hit", 4),
            ("lookup", 1),
            ("reserve", 3),
            ("publish", 3),
            ("cancel", 1),
            ("extend", 1),
            ("retire_top", 2),
            ("unindex", 2),
            ("clear_index", 0.2),
            ("invalidate", 1),
            ("relocation", 1),
            ("queries", 2),
            ("seq_fields", 2),
        ]

    def op_pop(self):
        if self.ref.num_free() == 0 and self.rng.random() < 0.5:
            call(self.ref, self.ours, "pop")  # IndexError on both, nothing changes
            return
        if self.ref.num_free():
            call(self.ref, self.ours, "pop")

    def op_pop_many(self):
        k = self.rng.randint(0, min(3, self.ref.num_free()))
        call(self.ref, self.ours, "pop_many", k)

    def op_release(self):
        x = self.pick(self.loose())
        if x is not None:
            if self.rng.random() < 0.3:
                call(self.ref, self.ours, "release", **{self.unit: x})
            else:
                call(self.ref, self.ours, "release", x)

    def op_release_many(self):
        xs = self.loose()
        self.rng.shuffle(xs)
        xs = xs[: self.rng.randint(0, 3)]
        if self.rng.random() < 0.5:
            xs.insert(self.rng.randint(0, len(xs)), -1)
        arg = tuple(xs) if self.rng.random() < 0.3 else xs
        call(self.ref, self.ours, "release_many", arg)

    def op_claim(self):
        free = [x for x in self.units() if self.ref.is_free(x)]
        held = [x for x in free if self.ref.holds_checkpoint(x)]
        x = self.pick(held if held and self.rng.random() < 0.7 else free)
        if x is not None:
            call(self.ref, self.ours, "claim", x)

    def op_mark_speculative(self):
        x = self.pick(self.units())
        if x is not None:
            call(self.ref, self.ours, "mark_speculative", x)

    def op_promote(self):
        cands = sorted(self.ref._speculative) or self.units()
        x = self.pick(cands)
        if x is not None and x < len(self.ref.slot_hash):
            call(self.ref, self.ours, "promote", x)

    def op_pin(self):
        cands = self.loose() + [x for x in self.units() if self.ref.is_pinned(x)]
        x = self.pick(cands)
        if x is None:
            return
        r = self.rng.random()
        if r < 0.3:
            call(self.ref, self.ours, "pin", x)
        else:
            call(self.ref, self.ours, "pin", x, reader_is_next_batch=r < 0.65)

    def op_unpin(self):
        pinned = [x for x in self.units() if self.ref.is_pinned(x)]
        x = self.pick(pinned) if pinned and self.rng.random() < 0.8 else self.pick(self.units())
        if x is not None:
            call(self.ref, self.ours, "unpin", x)

    def op_drop_reader(self):
        pinned = [x for x in self.units() if self.ref.is_pinned(x)]
        x = self.pick(pinned) if pinned and self.rng.random() < 0.8 else self.rng.choice([-1, -1, 0])
        held = self.held_by_seqs()
        if x >= 0 and not self.ref.is_pinned(x) and not self.ref.is_free(x) and x in held:
            return  # unpinned and owned by a sequence: drop_reader is a no-op anyway, skip
        call(self.ref, self.ours, "drop_reader", x)

    def op_release_pins(self):
        call(self.ref, self.ours, "release_pins")
        self.after_release_pins()

    def op_admit(self):
        width = self.rng.choice([1, 1, 2, 3])
        if not self.ref.has_free(width):
            same(self.ref.has_free(width), self.ours.has_free(width), "has_free")
            return
        s = self.new_seq(self.rng.randint(1, 40), has_cache=self.rng.random() < 0.9)
        got = call(self.ref, self.ours, "pop_many", width)
        s.set("state_slots", list(got))
        self.seqs.append(s)

    def op_finish(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        call(self.ref, self.ours, "release_many", list(s.ref.state_slots))
        call(self.ref, self.ours, "drop_reader", s.ref.state_fork_src)
        for r, o, owner in list(self.reservations):
            if owner is s:
                self.reservations.remove((r, o, owner))
                call(self.ref, self.ours, "cancel_midstep", Both(r, o))
        self.seqs.remove(s)

    def op_resume(self):
        """Resume from a checkpoint: find it, promote and claim it (or read a
        pinned one alongside), take a new slot, pin the source."""
        if not self.ref_index():
            return
        h = self.rng.choice(list(self.ref_index()))
        src = call(self.ref, self.ours, "lookup", h)
        if src < 0 or src >= self.n:
            return
        if self.ref.holds_checkpoint(src):
            call(self.ref, self.ours, "promote", src)
            call(self.ref, self.ours, "claim", src)
        elif not self.ref.is_pinned(src):
            return
        if not self.ref.has_free(1):
            if not self.ref.is_pinned(src):
                call(self.ref, self.ours, "release", src)
            return
        s = self.new_seq(self.rng.randint(1, 40))
        slot = call(self.ref, self.ours, "pop")
        s.set("state_slots", [slot])
        s.set("state_fork_src", src)
        call(self.ref, self.ours, "pin", src)
        self.seqs.append(s)

    def op_checkpoint(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        bb = self.rng.randint(0, 12)
        if self.rng.random() < 0.3:
            s.set("checkpoint_end_pos", bb * self.hbs)
        h = self.some_hash()
        if h == -1:
            refused(self.ours, "checkpoint", s.both, bb, h)
        elif self.rng.random() < 0.3:
            call(self.ref, self.ours, "checkpoint", seq=s.both, boundary_blocks=bb, h=h)
        else:
            call(self.ref, self.ours, "checkpoint", s.both, bb, h)

    def op_resumable_hit(self):
        s = self.pick(self.seqs) or self.new_seq(self.rng.randint(0, 40))
        length = self.rng.randint(0, 10)
        hs = self.hash_list(length)
        hit = self.rng.randint(0, length)
        arg = self.hashes_arg(hs)
        form = self.rng.random()
        if form < 0.5:
            got = call(self.ref, self.ours, "resumable_hit", s.both, hit, arg)
            assert 0 <= got <= hit
        elif form < 0.75:
            call(self.ref, self.ours, "resumable_hit", s.both, hit, arg, self.rng.random() < 0.5)
        else:
            call(self.ref, self.ours, "resumable_hit", s.both, hit, arg, assume_checkpointed=self.rng.random() < 0.5)

    def op_lookup(self):
        call(self.ref, self.ours, "lookup", self.some_hash())

    def op_reserve(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        positions = [(self.rng.randint(1, 12) * self.hbs, self.some_hash()) for _ in range(self.rng.randint(0, 3))]
        if any(h == -1 for _p, h in positions):
            refused(self.ours, "reserve_midstep", s.both, positions)
            return
        r = self.ref.reserve_midstep(s.ref, positions)
        o = self.ours.reserve_midstep(s.ours, positions)
        same(r, o, "reserve_midstep")
        if r:
            self.reservations.append((r, o, s))

    def op_publish(self):
        if not self.reservations:
            return
        r, o, s = self.reservations.pop(self.rng.randrange(len(self.reservations)))
        if self.rng.random() < 0.3:
            o = [tuple(x) for x in r]  # plain (slot, position, hash) tuples
        form = self.rng.random()
        if form < 0.3:
            call(self.ref, self.ours, "publish_midstep", Both(r, o))
        elif form < 0.5:
            call(self.ref, self.ours, "publish_midstep", Both(r, o), None)
        else:
            if self.rng.random() < 0.5:
                s.set("midstep_anchor_pos", self.rng.choice([0, r[0][1]]))
            call(self.ref, self.ours, "publish_midstep", Both(r, o), s.both)

    def op_cancel(self):
        if not self.reservations:
            return
        r, o, _s = self.reservations.pop(self.rng.randrange(len(self.reservations)))
        call(self.ref, self.ours, "cancel_midstep", Both(r, o))

    def op_extend(self):
        call(self.ref, self.ours, "extend", self.rng.randint(0, 3))

    def op_retire_top(self):
        top = self.n - 1
        owner = None
        for s in self.seqs:
            if top in s.ref.state_slots:
                owner = ("seq", s)
        for i, (r, _o, _s) in enumerate(self.reservations):
            if any(x[0] == top for x in r):
                owner = ("res", i)
        res = self.retire_top()
        if res is None or res.relocated_to < 0 or res.held_checkpoint or owner is None:
            return
        # The caller re-points the owner of a live top slot.
        dst = res.relocated_to
        if owner[0] == "seq":
            s = owner[1]
            s.set("state_slots", [dst if x == top else x for x in s.ref.state_slots])
        else:
            r, o, s = self.reservations[owner[1]]
            r = [(dst if x[0] == top else x[0], x[1], x[2]) for x in r]
            self.reservations[owner[1]] = (r, list(r), s)

    def op_unindex(self):
        call(self.ref, self.ours, "unindex", self.some_hash())

    def op_clear_index(self):
        call(self.ref, self.ours, "clear_index")

    def op_invalidate(self):
        x = self.pick(self.units())
        if x is not None:
            call(self.ref, self.ours, "invalidate", x)

    def op_relocation(self):
        if self.rng.random() < 0.6 and self.n > 0:
            call(self.ref, self.ours, "record_relocation", self.rng.randrange(self.n), self.rng.randrange(self.n))
        else:
            call(self.ref, self.ours, "take_relocations")

    def op_queries(self):
        call(self.ref, self.ours, "has_free", self.rng.randint(0, self.n + 1))
        call(self.ref, self.ours, "has_free")
        call(self.ref, self.ours, "occupancy")
        call(self.ref, self.ours, "checkpoint_fates")
        if self.seqs:
            call(self.ref, self.ours, "applies", self.rng.choice(self.seqs).both)

    def op_seq_fields(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        f = self.rng.choice(["num_tokens", "checkpoint_end_pos", "midstep_anchor_pos", "has_per_req_cache"])
        if f == "has_per_req_cache":
            s.set(f, self.rng.random() < 0.8)
        else:
            s.set(f, self.rng.randint(0, 12) * self.hbs + self.rng.choice([0, 0, 1]))

    def compare(self):
        super().compare()
        same(self.ref.occupancy(), self.ours.occupancy(), "occupancy")
        same(self.ref.readable_midstep, self.ours.readable_midstep, "readable_midstep")
        assert self.ours._debug_state()["speculative"] == sorted(self.ref._speculative)
        assert self.ours._debug_relocations() == list(self.ref._relocations)


class GroupDriver(_Driver):
    unit = "group"
    ref_module, class_name, transfers = "group_pool", "StateGroupPool", GROUP_TRANSFERS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # docs/contract.md, "Divergences": under none() / replay() checkpoint keeps nothing; the
        # reference's group pool still forks there, so those calls are checked
        # against docs/contract.md rather than the reference.
        self.keeps_nothing = self.transfer_name in ("none", "replay")

    def held_by_seqs(self):
        return {s.ref.per_req_cache_group for s in self.seqs if s.ref.per_req_cache_group >= 0}

    def ops(self):
        return [
            ("pop", 4),
            ("release", 4),
            ("claim", 3),
            ("pin", 3),
            ("unpin", 1),
            ("drop_reader", 2),
            ("release_pins", 4),
            ("admit", 4),
            ("finish", 3),
            ("resume", 3),
            ("checkpoint", 6),
            ("take_copies", 4),
            ("record_copy", 1),
            ("forget_pending", 1),
            ("resumable_hit", 4),
            ("lookup", 1),
            ("extend", 1),
            ("retire_top", 2),
            ("unindex", 2),
            ("invalidate", 1),
            ("queries", 2),
            ("seq_fields", 2),
        ]

    op_pop = SlotDriver.op_pop
    op_release = SlotDriver.op_release
    op_claim = SlotDriver.op_claim
    op_pin = SlotDriver.op_pin
    op_unpin = SlotDriver.op_unpin
    op_drop_reader = SlotDriver.op_drop_reader
    op_release_pins = SlotDriver.op_release_pins
    op_lookup = SlotDriver.op_lookup
    op_extend = SlotDriver.op_extend
    op_unindex = SlotDriver.op_unindex
    op_invalidate = SlotDriver.op_invalidate
    op_seq_fields = SlotDriver.op_seq_fields

    def op_admit(self):
        if not self.ref.has_free():
            same(self.ref.has_free(), self.ours.has_free(), "has_free")
            return
        s = self.new_seq(self.rng.randint(1, 40), has_cache=self.rng.random() < 0.9)
        g = call(self.ref, self.ours, "pop")
        s.set("per_req_cache_group", g)
        self.seqs.append(s)

    def op_finish(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        call(self.ref, self.ours, "forget_pending", s.both)
        if s.ref.per_req_cache_group >= 0:
            call(self.ref, self.ours, "release", s.ref.per_req_cache_group)
        call(self.ref, self.ours, "drop_reader", s.ref.state_fork_src)
        s.set("per_req_cache_group", -1)
        self.seqs.remove(s)

    def op_resume(self):
        if not self.ref_index():
            return
        h = self.rng.choice(list(self.ref_index()))
        src = call(self.ref, self.ours, "lookup", h)
        if src < 0 or src >= self.n:
            return
        if self.ref.holds_checkpoint(src):
            call(self.ref, self.ours, "claim", src)
        elif not self.ref.is_pinned(src):
            return
        if not self.ref.has_free():
            if not self.ref.is_pinned(src):
                call(self.ref, self.ours, "release", src)
            return
        s = self.new_seq(self.rng.randint(1, 40))
        g = call(self.ref, self.ours, "pop")
        s.set("per_req_cache_group", g)
        if self.transfer_name == "copy":
            call(self.ref, self.ours, "record_copy", src, g)
            call(self.ref, self.ours, "release", src) if not self.ref.is_pinned(src) else None
        else:
            s.set("state_fork_src", src)
            call(self.ref, self.ours, "pin", src)
        self.seqs.append(s)

    def op_checkpoint(self):
        s = self.pick(self.seqs)
        if s is None:
            return
        bb, h = self.rng.randint(0, 12), self.some_hash()
        if h == -1:
            refused(self.ours, "checkpoint", s.both, bb, h)
            return
        if self.keeps_nothing:
            before = self.snapshot_ours(s)
            self.ours.checkpoint(s.ours, bb, h)
            assert self.snapshot_ours(s) == before, "checkpoint under none()/replay() changed something"
            return
        if self.rng.random() < 0.3:
            call(self.ref, self.ours, "checkpoint", seq=s.both, boundary_blocks=bb, h=h)
        else:
            call(self.ref, self.ours, "checkpoint", s.both, bb, h)

    def snapshot_ours(self, s):
        o = self.ours
        return (
            list(o.group_hash),
            list(o.hash_to_group.items()),
            o.checkpoint_fates(),
            o.num_free(),
            o._debug_state(),
            o._debug_copies(),
            len(o._debug_pending()),
            s.ours.per_req_cache_group,
            s.ours.state_fork_src,
            s.ours.pending_checkpoint,
        )

    def op_take_copies(self):
        call(self.ref, self.ours, "take_copies")

    def op_record_copy(self):
        if self.n > 0:
            call(self.ref, self.ours, "record_copy", self.rng.randrange(self.n), self.rng.randrange(self.n))

    def op_forget_pending(self):
        s = self.pick(self.seqs)
        if s is not None:
            call(self.ref, self.ours, "forget_pending", s.both)

    def op_resumable_hit(self):
        s = self.pick(self.seqs) or self.new_seq(self.rng.randint(0, 40))
        length = self.rng.randint(0, 10)
        hs = self.hash_list(length)
        hit = self.rng.randint(0, length)
        arg = self.hashes_arg(hs)
        assume = self.rng.random() < 0.3
        if self.transfer_name == "replay":
            got = self.ours.resumable_hit(s.ours, hit, arg, assume)
            same(got, hit if self.ours.applies(s.ours) else hit, "resumable_hit under replay")
            return
        got = call(self.ref, self.ours, "resumable_hit", s.both, hit, arg, assume_checkpointed=assume)
        assert 0 <= got <= hit

    def op_retire_top(self):
        top = self.n - 1
        owner = next((s for s in self.seqs if s.ref.per_req_cache_group == top), None)
        res = self.retire_top()
        if res is None or res.relocated_to < 0 or res.held_checkpoint or owner is None:
            return
        owner.set("per_req_cache_group", res.relocated_to)

    def op_queries(self):
        call(self.ref, self.ours, "has_free")
        call(self.ref, self.ours, "checkpoint_fates")
        if self.seqs:
            call(self.ref, self.ours, "applies", self.rng.choice(self.seqs).both)

    def compare(self):
        super().compare()
        assert self.ours._debug_copies() == list(self.ref._copies)
        ref_pending = [s.seq_id for s in self.ref._checkpoint_pending]
        our_pending = [s.seq_id for s in self.ours._debug_pending()]
        assert ref_pending == our_pending, (ref_pending, our_pending)
