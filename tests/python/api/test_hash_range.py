"""The full hash range (docs/contract.md, "Words", "Divergences"): every hash
argument takes [-2**63, 2**64); each object gives a hash back as the int it was
given (an engine that hashes unsigned gets unsigned ints back); -1 stays "no
hash", 2**64 - 1 is refused naming the argument, and one object given both
forms refuses the second. Every test here but the range test (which held
before) failed on main's build, which refused every hash at or above 2**63
(the pools' twins against the reference: pools/test_slot_pool.py,
pools/test_group_pool.py, test_differential_unsigned_hashes).
"""

from __future__ import annotations

import numpy as np
import pytest

import statecache as sc

U = 2**64 - 5  # the unsigned spelling of -5
V = 2**63  # the smallest unsigned hash with the top bit set
SPEC = sc.PagedStateCheckpointSpec(page_unit_bytes=64, slot_bytes=64, layout_id="u", image_bytes=64)


def _ready_coordinator(hashes, offload=None, sink=True):
    pool = sc.BlockPool(32)
    c = sc.PagedStateCheckpointCoordinator(pool, SPEC, enabled=True)
    if offload is not None:
        c.attach_offload(offload, sink=sink)
    seqs = []
    for i in range(len(hashes)):
        s = sc.Sequence(i)
        s.state_slots = [i]
        seqs.append(s)
    c.checkpoint_many(seqs, [1] * len(hashes), list(hashes))
    c.take_checkpoint_ops()
    c.complete_previous_batch()
    c.complete_previous_batch()
    return pool, c, seqs


def test_slot_pool_gives_unsigned_hashes_back():
    p = sc.StateSlotPool(8, sc.StateTransfer.fork(1, readable_midstep=True))
    s = sc.Sequence(0, num_tokens=10)
    s.state_slots = [p.pop()]
    p.checkpoint(s, 1, U)
    assert p.lookup(U) == 0 and dict(p.hash_to_slot) == {U: 0} and p.slot_hash[0] == U
    assert U in p.hash_to_slot and -5 not in p.hash_to_slot and p.hash_to_slot[U] == 0
    assert p.slot_hash.index(U) == 0 and list(p.slot_hash)[0] == U
    p.release_pins()
    assert p.resumable_hit(s, 1, [U]) == 1 and p.resumable_hits([s], [1], [np.array([U], dtype=np.uint64)]) == [1]
    (res,) = p.reserve_midstep(s, [(1, V)])
    assert res[2] == V
    p.publish_midstep([res], s)
    assert p.lookup(V) == res[0] and p.hash_to_slot[V] == res[0]
    p.unindex(U)
    assert p.lookup(U) == -1
    p._check_invariants()


def test_group_pool_copy_intents_keep_the_form():
    p = sc.StateGroupPool(8, sc.StateTransfer.copy())
    native, own = sc.Sequence(0), type("Own", (), {})()
    own.has_per_req_cache, own.pending_checkpoint, own.state_fork_src = True, -1, -1
    native.per_req_cache_group, own.per_req_cache_group = p.pop(), p.pop()
    p.checkpoint_many([native, own], [1, 1], [U, V])
    assert native.pending_checkpoint == U and own.pending_checkpoint == V
    pairs = p.take_copies()
    assert native.pending_checkpoint == own.pending_checkpoint == -1
    assert {h: p.lookup(h) for h in (U, V)} == {U: pairs[0][1], V: pairs[1][1]}
    assert sorted(p.hash_to_group) == sorted([U, V]) and p.group_hash[pairs[0][1]] == U


def test_coordinator_store_and_tier_give_unsigned_hashes_back():
    index = sc.StateOffloadIndex()
    pool, c, seqs = _ready_coordinator([U, V], offload=index)
    store = c.store
    assert sorted(store.hash_to_checkpoint) == sorted([U, V])
    assert sorted(r.prefix_hash for r in store.records.values()) == sorted([U, V])
    assert c.contains(U) and store.lookup(V) >= 0 and c.resumable_hit(seqs[0], 1, [U]) == 1
    assert c.resumable_hits(seqs, [1, 1], [[U], [V]]) == [1, 1]
    sources = c.take_offload_stores(4)
    ops = sorted(op for op, _ in sources)
    assert [op.prefix_hash for op in ops] == sorted([U, V]) and all(
        isinstance(op, sc.StateStoreOperationId) for op in ops
    )
    for op, _units in sources:
        c.release_offload_store_source(op)  # main refused the unsigned op as no operation at all
        c.settle_offload_store(op)
        assert not c.was_reclaimed(op)
        index.note_stored(op.prefix_hash)
    assert not c.has_offload_pins()
    assert sorted(index.hashes) == sorted([U, V]) and U in index.hashes and index.could_serve(V)
    gen = store.generation
    assert c.begin_restores([U], [7]) == [True]
    c.unindex(V)
    assert store.changed_since(gen) == {V}
    assert c.acquire_checkpoint_source(V) is None and c.acquire_checkpoint_source(U)[0].prefix_hash == U
    c.check_consistency()


def test_a_python_tier_is_asked_in_the_coordinators_form():
    asked = []

    class Tier:
        def could_serve(self, h):
            asked.append(h)
            return False

        def stats(self):
            return {}

    pool, c, seqs = _ready_coordinator([U], offload=Tier())
    assert c.resumable_hit(seqs[0], 2, [V, V + 1]) == 0
    assert asked == [V + 1, V]


def test_block_pool_and_on_evict_give_unsigned_hashes_back():
    evicted = []
    pool = sc.BlockPool(2, on_evict=evicted.append)
    (b,) = pool.allocate(1)
    assert pool.publish(b, U) and pool.lookup(U) == b and pool.block_hash(b) == U
    pool.free([b])
    assert pool.reset_prefix_cache() == 1 and evicted == [U]


def test_sequence_fields_keep_the_form():
    s = sc.Sequence(0)
    s.block_hashes = [1, U, V]
    assert list(s.block_hashes) == [1, U, V] and s.block_hashes[1] == U and U in s.block_hashes
    s.block_hashes.append(V + 1)
    s.block_hashes[0] = 2**64 - 7
    assert s.block_hashes.copy() == [2**64 - 7, U, V, V + 1] and s.block_hashes.pop() == V + 1
    s.block_hashes = np.array([U, 3], dtype=np.uint64)
    assert list(s.block_hashes) == [U, 3]
    s.pending_checkpoint = V
    assert s.pending_checkpoint == V
    t = sc.Sequence(1)
    t.block_hashes = s.block_hashes  # another Sequence's view: hashes and form
    assert list(t.block_hashes) == [U, 3]
    r = sc.CheckpointRecord(U, (1,), "READY")
    assert r.prefix_hash == U and r == sc.CheckpointRecord(U, (1,), "READY")


def test_chain_block_hashes_keeps_the_parents_form():
    signed = sc.chain_block_hashes([1, 2, 3, 4], 2, parent_hash=-5)
    unsigned = sc.chain_block_hashes([1, 2, 3, 4], 2, parent_hash=U)
    assert [h % 2**64 for h in signed] == unsigned and all(h >= 0 for h in unsigned)
    arr = sc.chain_block_hashes([1, 2, 3, 4], 2, parent_hash=U, as_numpy=True)
    assert arr.dtype == np.uint64 and arr.tolist() == unsigned


def _filed_pool():
    """A slot pool holding a checkpoint, so that a scan reads its hashes."""
    p = sc.StateSlotPool(4, sc.StateTransfer.fork(1))
    s = sc.Sequence(0, num_tokens=9)
    s.state_slots = [p.pop()]
    p.checkpoint(s, 1, 3)
    return p


@pytest.mark.parametrize(
    "call",
    [
        lambda: sc.StateSlotPool(4).lookup(2**64 - 1),
        lambda: _filed_pool().resumable_hit(sc.Sequence(0, num_tokens=9), 1, [2**64 - 1]),
        lambda: sc.BlockPool(4).lookup(2**64 - 1),
        lambda: sc.StateOffloadIndex().note_stored(2**64 - 1),
        lambda: sc.PagedStateCheckpointCoordinator(sc.BlockPool(4), SPEC, True).unindex(2**64 - 1),
        lambda: setattr(sc.Sequence(0), "block_hashes", [1, 2**64 - 1]),
        lambda: sc.chain_block_hashes([1, 2], 2, parent_hash=2**64 - 1),
    ],
)
def test_the_unsigned_spelling_of_minus_one_is_refused(call):
    with pytest.raises(ValueError, match="2\\*\\*64 - 1"):
        call()


def test_outside_the_range_is_an_overflow_error_and_minus_one_stays_none():
    p = sc.StateSlotPool(4, sc.StateTransfer.fork(1))
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(OverflowError, match="h="):
            p.lookup(bad)
    s = sc.Sequence(0, num_tokens=9)
    s.state_slots = [p.pop()]
    with pytest.raises(ValueError, match="no hash"):
        p.checkpoint(s, 1, -1)
    assert p.lookup(-1) == -1


def test_one_object_refuses_the_other_form_naming_the_argument():
    p = sc.StateSlotPool(8, sc.StateTransfer.fork(1))
    s = sc.Sequence(0, num_tokens=9)
    s.state_slots = [p.pop()]
    p.checkpoint(s, 1, U)
    before = dict(p.hash_to_slot)
    with pytest.raises(ValueError, match=r"h=-7 is a negative hash.*unsigned"):
        p.checkpoint(s, 1, -7)
    with pytest.raises(ValueError, match=r"block_hashes\[0\]=-5"):
        p.resumable_hit(s, 1, [-5])
    assert dict(p.hash_to_slot) == before and p.lookup(5) == -1  # small hashes take either form
    q = sc.StateSlotPool(8, sc.StateTransfer.fork(1))
    q.lookup(-5)
    with pytest.raises(ValueError, match=r"h=18446744073709551611 is an unsigned hash.*signed"):
        q.lookup(U)
    seq = sc.Sequence(1)
    seq.block_hashes = [-9]
    with pytest.raises(ValueError, match="block_hashes"):
        seq.block_hashes = [U]
    assert list(seq.block_hashes) == [-9]
