"""The property everything else serves (docs/contract.md, "Invariants", last item): whatever valid
and invalid calls came before, a lookup / resumable_hit / READY record never
names bytes that are not the checkpoint of exactly that prefix.

Each driver below runs a pool the way a serving loop would (passes: top of
pass, admission, batch build + the runner's byte moves, forward, postprocess)
interleaved with random refused calls, and keeps a pure-Python model of what
each slot, group and page unit *holds*. The library never sees the model; the
test asserts after every step that everything the library would resume from
holds exactly the prefix it is filed under.
"""

from __future__ import annotations

import random

import pytest

import statecache as sc

REFUSED = (TypeError, ValueError, IndexError, OverflowError, KeyError, AssertionError)
BAD_INTS = [-1, -2, 2**31, 2**62, 2**63, -(2**63) - 1, 2**70, 1.5, "3", None, True]


def _hashes(rng: random.Random, n: int) -> list[int]:
    """Chained-looking prefix hashes drawn from a small tree, so prefixes repeat."""
    out, h = [], rng.randrange(3) + 1
    for _ in range(n):
        h = (h * 1_000_003 + rng.randrange(2)) % (2**61)
        out.append(h)
    return out


class Live:
    """What a live request's state is while it runs: unique per request."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id

    def __repr__(self) -> str:
        return f"Live({self.seq_id})"


# --------------------------------------------------------------- slot pool --


class SlotPoolModel:
    def __init__(self, seed: int, retire: bool) -> None:
        self.rng = random.Random(seed)
        self.retire = retire
        self.pool = sc.StateSlotPool(12, sc.StateTransfer.fork(4), hash_block_size=4)
        self.content: dict[int, object] = {}
        self.seqs: list[sc.Sequence] = []
        self.next_id = 0

    def check(self) -> None:
        p = self.pool
        for h, s in dict(p.hash_to_slot).items():
            assert h != -1, "-1 filed as a content hash"
            assert self.content.get(s) == h, f"hash {h} names slot {s}, which holds {self.content.get(s)!r}"
        p._check_invariants()

    def refused(self) -> None:
        """A call the library must refuse, changing nothing."""
        p, rng = self.pool, self.rng
        before = (dict(p.hash_to_slot), list(p.slot_hash), p.num_free(), p.occupancy())
        bad = rng.choice(BAD_INTS)
        call = rng.choice(
            [
                lambda: p.release(bad),
                lambda: p.claim(bad),
                lambda: p.pin(bad),
                lambda: p.pop_many(bad),
                lambda: p.release_many([0, 0]),
                lambda: p.release_many([bad]),
                lambda: p.lookup(bad),
                lambda: p.extend(bad),
                lambda: p.checkpoint(sc.Sequence(99, num_tokens=64), 1, -1),
                lambda: p.resumable_hit(sc.Sequence(98, num_tokens=64), bad, [1, 2, 3]),
            ]
        )
        try:
            call()
        except REFUSED:
            after = (dict(p.hash_to_slot), list(p.slot_hash), p.num_free(), p.occupancy())
            assert before == after, "a refused call changed the pool"

    def step(self) -> None:
        p, rng = self.pool, self.rng
        p.release_pins()
        # admission
        if rng.random() < 0.5 and p.has_free(1):
            seq = sc.Sequence(self.next_id, num_tokens=64, num_prompt_tokens=64)
            self.next_id += 1
            hashes = _hashes(rng, 16)
            seq.block_hashes = hashes
            hit = p.resumable_hit(seq, rng.randrange(17), hashes)
            if hit:
                src = p.lookup(hashes[hit - 1])
                assert src >= 0 and self.content.get(src) == hashes[hit - 1], (
                    f"resumable_hit {hit} names slot {src} holding {self.content.get(src)!r}"
                )
            seq.state_slots = p.pop_many(1)
            self.content[seq.state_slot] = Live(seq.seq_id)
            self.seqs.append(seq)
        # finish / preempt
        if self.seqs and rng.random() < 0.3:
            seq = self.seqs.pop(rng.randrange(len(self.seqs)))
            p.release_many(list(seq.state_slots))
        if self.retire and rng.random() < 0.15:
            r = p.retire_top()
            if r is not None and r.relocated_to >= 0:
                # the caller copies retired -> relocated_to before the next forward
                self.content[r.relocated_to] = self.content.get(r.retired)
                for s in self.seqs:  # the owner follows its state
                    if s.state_slot == r.retired and not r.held_checkpoint:
                        s.state_slot = r.relocated_to
        if self.retire and rng.random() < 0.15:
            p.extend(1)
        for src, dst in p.take_relocations():  # the runner moves bytes first
            self.content[dst] = self.content.get(src)
        # forward, then postprocess: some sequences keep a boundary
        for seq in self.seqs:
            self.content[seq.state_slot] = Live(seq.seq_id)
        for seq in list(self.seqs):
            if rng.random() < 0.4:
                k = rng.randrange(1, 16)
                h = list(seq.block_hashes)[k - 1]
                self.content[seq.state_slot] = h  # the forward stopped exactly there
                p.checkpoint(seq, k, h)
                self.content[seq.state_slot] = Live(seq.seq_id)
        for _ in range(2):
            self.refused()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("retire", [False, True])
def test_slot_pool_never_names_wrong_bytes(seed, retire):
    m = SlotPoolModel(seed, retire)
    for _ in range(150):
        m.step()
        m.check()


def test_retired_top_index_does_not_come_back_with_its_hash():
    """retire_top of a checkpointed top slot, extend, then pop: the old hash
    must not name the slot the new owner now writes."""
    p = sc.StateSlotPool(2, sc.StateTransfer.fork(1), hash_block_size=1)
    seq = sc.Sequence(1, num_tokens=10)
    seq.state_slots = [p.pop()]  # slot 0
    p.checkpoint(seq, 1, 777)  # slot 0 filed, seq moves to slot 1
    p.release_pins()
    p.release_pins()
    p.release_many(list(seq.state_slots))
    # make slot 1 (top) the checkpoint holder
    seq2 = sc.Sequence(2, num_tokens=10)
    p.claim(0)
    seq2.state_slots = [p.pop()]  # slot 1
    p.checkpoint(seq2, 1, 888)  # needs a free slot: none, dropped or moves
    p.release_many([0])
    p.release_pins()
    p.release_pins()
    p.release_many(list(seq2.state_slots))
    for _ in range(3):
        p.retire_top()
    p.extend(2)
    taken = [p.pop() for _ in range(p.num_free())]
    for h, s in dict(p.hash_to_slot).items():
        assert s not in taken, f"hash {h} still names slot {s}, handed out vacant"


# -------------------------------------------------------------- group pool --


class GroupPoolModel:
    def __init__(self, seed: int, transfer: sc.StateTransfer) -> None:
        self.rng = random.Random(seed)
        self.pool = sc.StateGroupPool(10, transfer, hash_block_size=4)
        self.copies = transfer.copies
        self.content: dict[int, object] = {}
        self.seqs: list[sc.Sequence] = []
        self.next_id = 0

    def check(self) -> None:
        for h, g in dict(self.pool.hash_to_group).items():
            assert h != -1
            assert self.content.get(g) == h, f"hash {h} names group {g}, which holds {self.content.get(g)!r}"
        self.pool._check_invariants()

    def step(self) -> None:
        p, rng = self.pool, self.rng
        p.release_pins()
        if rng.random() < 0.5 and p.has_free():
            seq = sc.Sequence(self.next_id, num_tokens=64, num_prompt_tokens=64)
            self.next_id += 1
            seq.block_hashes = _hashes(rng, 16)
            hit = p.resumable_hit(seq, rng.randrange(17), list(seq.block_hashes))
            if hit:
                g = p.lookup(list(seq.block_hashes)[hit - 1])
                assert g >= 0 and self.content.get(g) == list(seq.block_hashes)[hit - 1]
            seq.per_req_cache_group = p.pop()
            self.content[seq.per_req_cache_group] = Live(seq.seq_id)
            self.seqs.append(seq)
        if self.seqs and rng.random() < 0.3:
            seq = self.seqs.pop(rng.randrange(len(self.seqs)))
            if rng.random() < 0.5:  # a careless engine skips forget_pending
                p.forget_pending(seq)
            p.release(seq.per_req_cache_group)
        for src, dst in p.take_copies():  # the runner copies before the forward
            self.content[dst] = self.content.get(src)
        for seq in self.seqs:
            self.content[seq.per_req_cache_group] = Live(seq.seq_id)
        for seq in list(self.seqs):
            if rng.random() < 0.4:
                k = rng.randrange(1, 16)
                h = list(seq.block_hashes)[k - 1]
                self.content[seq.per_req_cache_group] = h
                p.checkpoint(seq, k, h)
                if not self.copies:  # fork: the sequence moved on
                    self.content[seq.per_req_cache_group] = Live(seq.seq_id)
        # a refused call changes nothing
        before = (dict(p.hash_to_group), list(p.group_hash), p.num_free())
        try:
            rng.choice(
                [
                    lambda: p.release(rng.choice(BAD_INTS)),
                    lambda: p.checkpoint(sc.Sequence(97), 1, -1),
                    lambda: p.record_copy(rng.choice(BAD_INTS), 0),
                    lambda: p.lookup(rng.choice(BAD_INTS)),
                ]
            )()
        except REFUSED:
            assert before == (dict(p.hash_to_group), list(p.group_hash), p.num_free())


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["fork", "copy"])
def test_group_pool_never_names_wrong_bytes(seed, kind):
    t = sc.StateTransfer.fork(4) if kind == "fork" else sc.StateTransfer.copy()
    m = GroupPoolModel(seed, t)
    for _ in range(150):
        m.step()
        m.check()


def test_copy_intent_dies_with_its_group():
    """A records a copy intent, releases its group without forget_pending, B
    pops the same group: take_copies must not file B's bytes under A's hash."""
    p = sc.StateGroupPool(4, sc.StateTransfer.copy(), hash_block_size=1)
    a = sc.Sequence(1, num_tokens=10)
    a.per_req_cache_group = p.pop()
    p.checkpoint(a, 1, 4242)
    p.release(a.per_req_cache_group)
    b = sc.Sequence(2, num_tokens=10)
    b.per_req_cache_group = p.pop()
    assert b.per_req_cache_group == a.per_req_cache_group
    for src, _dst in p.take_copies():
        assert src != b.per_req_cache_group, "B's group copied under A's hash"
    assert p.lookup(4242) == -1


# ------------------------------------------------------- PAGE coordinator --


class PagedModel:
    UNIT = 64

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        spec = sc.PagedStateCheckpointSpec(
            page_unit_bytes=self.UNIT, slot_bytes=4 * self.UNIT, layout_id="model", image_bytes=4 * self.UNIT
        )
        self.pool = sc.BlockPool(48)
        self.coord = sc.PagedStateCheckpointCoordinator(self.pool, spec, enabled=True)
        self.unit_content: dict[int, object] = {}
        self.slot_content: dict[int, object] = {}
        self.seqs: list[sc.Sequence] = []
        self.free_slots = list(range(16))
        self.kv: list[int] = []
        self.restoring: dict[int, int] = {}  # dst slot -> the hash its restore reads
        self.next_id = 0

    def check(self) -> None:
        store = self.coord.store
        for h, cid in dict(store.hash_to_checkpoint).items():
            assert h != -1
            rec = store.records[cid]
            for i, u in enumerate(rec.unit_ids):
                assert self.unit_content.get(u) == (h, i), (
                    f"READY checkpoint {cid} of {h} names unit {u} holding {self.unit_content.get(u)!r}"
                )
        store.check_consistency()
        self.pool.check_consistency()

    def step(self) -> None:
        rng, coord, pool = self.rng, self.coord, self.pool
        coord.complete_previous_batch()
        if rng.random() < 0.5 and self.free_slots:
            seq = sc.Sequence(self.next_id, num_tokens=64, num_prompt_tokens=64)
            self.next_id += 1
            seq.block_hashes = _hashes(rng, 16)
            seq.state_slots = [self.free_slots.pop()]
            self.slot_content[seq.state_slot] = Live(seq.seq_id)
            hit = coord.resumable_hit(seq, rng.randrange(17), list(seq.block_hashes))
            if hit and coord.begin_restore(list(seq.block_hashes)[hit - 1], seq.state_slot):
                self.restoring[seq.state_slot] = list(seq.block_hashes)[hit - 1]
            self.seqs.append(seq)
        if self.seqs and rng.random() < 0.25:
            seq = self.seqs.pop(rng.randrange(len(self.seqs)))
            coord.forget_pending(seq)
            if coord.restore_queued_for(seq.state_slot):
                coord.store.cancel_queued_restore(seq.state_slot)
                self.restoring.pop(seq.state_slot, None)
            self.free_slots.append(seq.state_slot)
            seq.state_slots = []
        # the KV side takes blocks too (it may spend READY checkpoints)
        if rng.random() < 0.3:
            got = pool.allocate(rng.randrange(1, 4))
            if got:
                for b in got:
                    self.unit_content[b] = ("kv", b)
                self.kv.extend(got)
        if self.kv and rng.random() < 0.3:
            pool.free([self.kv.pop()])
        stores, restores = coord.take_checkpoint_ops()
        for op in stores:  # the runner: stores, then restores
            for i, u in enumerate(op.unit_ids):
                self.unit_content[u] = (self.slot_content.get(op.src_slot), i)
        for op in restores:
            h = self.restoring.pop(op.dst_slot)
            want = [(h, i) for i in range(len(op.unit_ids))]
            got = [self.unit_content.get(u) for u in op.unit_ids]
            assert got == want, f"restore of {h} into slot {op.dst_slot} reads {got}"
            self.slot_content[op.dst_slot] = h
        for seq in self.seqs:
            self.slot_content[seq.state_slot] = Live(seq.seq_id)
        for seq in list(self.seqs):
            if rng.random() < 0.4:
                k = rng.randrange(1, 16)
                h = list(seq.block_hashes)[k - 1]
                self.slot_content[seq.state_slot] = h
                coord.checkpoint(seq, k, h)
        # the stores recorded above read the slot in the next batch; until
        # then a sequence's slot keeps that boundary's state
        try:
            rng.choice(
                [
                    lambda: coord.checkpoint(sc.Sequence(96), 1, -1),
                    lambda: coord.begin_restore(rng.choice(BAD_INTS), 0),
                    lambda: pool.release_units([rng.choice(BAD_INTS)], ("state-checkpoint", 0)),
                    lambda: coord.resumable_hit(sc.Sequence(95, num_tokens=9), rng.choice(BAD_INTS), [1]),
                ]
            )()
        except REFUSED:
            pass


@pytest.mark.parametrize("seed", range(12))
def test_paged_store_never_names_wrong_units(seed):
    m = PagedModel(seed)
    for _ in range(150):
        m.step()
        m.check()
