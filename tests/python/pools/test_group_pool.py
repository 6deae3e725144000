"""StateGroupPool: fork and copy mechanisms, the none() fix (docs/contract.md, "Divergences"), bad input,
and differential random sequences against the reference."""

import gc
import zlib

import pytest

import statecache as sc
from pool_diff import GROUP_TRANSFERS, GroupDriver
from reference import load

REF = load("group_pool")
needs_ref = pytest.mark.skipif(REF is None, reason="behaviour reference not found beside the checkout")

IMPLS = ["ours"] + (["reference"] if REF is not None else [])


def make(impl, n, transfer=None, **kw):
    cls = sc.StateGroupPool if impl == "ours" else REF.StateGroupPool
    return cls(n, transfer or sc.StateTransfer.copy(), **kw)


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def owner(group, num_tokens=100):
    s = sc.Sequence(num_tokens=num_tokens, num_prompt_tokens=num_tokens)
    s.per_req_cache_group = group
    return s


def test_free_list_basics(impl):
    p = make(impl, 3)
    assert p.has_free() is True and [p.pop(), p.pop(), p.pop()] == [0, 1, 2]
    assert p.has_free() is False and p.num_free() == 0
    with pytest.raises(IndexError):
        p.pop()
    p.release(1)
    assert p.is_free(1) is True and p.holds_checkpoint(1) is False and p.pop() == 1


def test_copy_checkpoint_becomes_findable_only_at_take_copies(impl):
    p = make(impl, 4)
    s = owner(p.pop())
    p.checkpoint(s, 2, 55)
    assert s.pending_checkpoint == 55 and p.lookup(55) == -1 and p.checkpoints_kept == 0
    p.checkpoint(s, 3, 56)  # a later boundary supersedes the earlier one
    assert p.take_copies() == [(0, 1)]
    assert p.lookup(56) == 1 and p.lookup(55) == -1 and p.holds_checkpoint(1)
    assert s.pending_checkpoint == -1 and s.per_req_cache_group == 0 and p.checkpoints_kept == 1
    assert p.take_copies() == []
    # the destination went straight back to the free list: capacity-neutral
    assert p.num_free() == 3


def test_copy_pairs_keep_record_copy_order_and_skip_gone_owners(impl):
    p = make(impl, 6)
    a, b, c = owner(p.pop()), owner(p.pop()), owner(p.pop())
    p.record_copy(4, 5)
    p.checkpoint(a, 1, 1)
    p.checkpoint(b, 1, 2)
    p.checkpoint(c, 1, 3)
    p.forget_pending(b)  # its group is being released
    p.release(c.per_req_cache_group)
    c.per_req_cache_group = -1  # preempted before the batch was built
    pairs = p.take_copies()
    assert pairs == [(4, 5), (0, 2)] and type(pairs) is list and type(pairs[0]) is tuple
    assert p.lookup(2) == -1 and p.lookup(3) == -1 and p.lookup(1) == 2


def test_copy_dropped_without_free_group(impl):
    p = make(impl, 1)
    s = owner(p.pop())
    p.checkpoint(s, 1, 9)
    assert p.take_copies() == [] and p.checkpoints_dropped == 1 and s.pending_checkpoint == -1


def test_pending_sequence_kept_alive(impl):
    p = make(impl, 3)
    s = owner(p.pop())
    p.checkpoint(s, 1, 42)
    del s
    gc.collect()
    assert p.take_copies() == [(0, 1)] and p.lookup(42) == 1


def test_fork_checkpoint_pins_through_next_pass(impl):
    p = make(impl, 3, sc.StateTransfer.fork(2))
    s = owner(p.pop())
    p.checkpoint(s, 1, 7)
    assert (s.per_req_cache_group, s.state_fork_src) == (1, 0)
    assert p.lookup(7) == 0 and p.pin_count(0) == 1 and not p.is_free(0)
    p.release_pins()
    assert p.is_pinned(0)
    p.release_pins()
    assert p.holds_checkpoint(0) and p.take_copies() == []


def test_checkpoints_spent_lru_and_vacant_first(impl):
    p = make(impl, 4)
    owners = [owner(p.pop()), owner(p.pop())]
    for i, s in enumerate(owners):
        p.checkpoint(s, 1, 100 + i)
    assert p.take_copies() == [(0, 2), (1, 3)]
    # 2 and 3 hold checkpoints; nothing vacant: LRU order
    p.claim(2)
    p.release(2)  # resumed from: refreshed
    assert p.pop() == 3 and p.pop() == 2 and p.checkpoints_evicted == 2


def test_resumable_hit_copy_and_fork(impl):
    p = make(impl, 6, hash_block_size=4)
    s = owner(p.pop(), num_tokens=13)
    p.checkpoint(s, 2, 20)
    p.take_copies()
    assert p.resumable_hit(s, 3, [10, 20, 30]) == 2  # min_fork_tokens 0 under copy
    assert p.resumable_hit(s, 3, [10, 20, 30], True) == 3
    f = make(impl, 6, sc.StateTransfer.fork(4), hash_block_size=4)
    s = owner(f.pop(), num_tokens=13)
    f.checkpoint(s, 3, 30)
    # L=3: 13 - 12 < 4, so the hit walks back and finds nothing
    assert f.resumable_hit(s, 3, [10, 20, 30]) == 0
    assert f.resumable_hit(s, 3, [10, 20, 30], assume_checkpointed=True) == 2
    # assumed checkpoints never read the hashes
    assert f.resumable_hit(s, 3, [], assume_checkpointed=True) == 2


def test_unindex_returns_group_and_counts_orphaned(impl):
    p = make(impl, 3)
    s = owner(p.pop())
    p.checkpoint(s, 1, 5)
    p.take_copies()
    assert p.unindex(5) == 1 and p.checkpoints_orphaned == 1
    assert p.unindex(5) == -1 and p.checkpoints_orphaned == 1 and not p.holds_checkpoint(1)


def test_retire_top_cases(impl):
    p = make(impl, 3)
    s = owner(p.pop())
    p.checkpoint(s, 1, 8)
    p.take_copies()  # group 1 holds 8; 2 vacant
    r = p.retire_top()
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (2, -1, False)
    assert type(r).__name__ == "GroupRetirement"
    r = p.retire_top()  # top (1) holds the checkpoint, nowhere else free
    assert (r.retired, r.relocated_to, r.held_checkpoint) == (1, -1, True) and p.lookup(8) == -1
    assert p.retire_top() is None  # 0 is live, nothing free
    p.extend(2)
    assert p.num_groups == 3 and list(p.group_hash) == [-1, -1, -1]


def test_drop_reader_and_pins(impl):
    p = make(impl, 3, sc.StateTransfer.fork(1))
    g = p.pop()
    p.pin(g)
    p.pin(g, reader_is_next_batch=True)
    p.drop_reader(g)
    assert p.pin_count(g) == 1
    p.release_pins()  # deferred survives one pass
    assert p.is_pinned(g)
    p.drop_reader(g)
    assert p.is_free(g) and not p.is_pinned(g)


# ------------------------- divergences (docs/contract.md, "Divergences") --


@pytest.mark.parametrize("transfer", [sc.StateTransfer.none(), sc.StateTransfer.replay()])
def test_checkpoint_keeps_nothing_under_none_and_replay(transfer):
    p = sc.StateGroupPool(2, transfer)
    s = owner(p.pop())
    p.checkpoint(s, 1, 3)
    assert (s.per_req_cache_group, s.state_fork_src, s.pending_checkpoint) == (0, -1, -1)
    assert p.checkpoint_fates() == {
        "checkpoints_kept": 0,
        "checkpoints_dropped": 0,
        "checkpoints_evicted": 0,
        "checkpoints_orphaned": 0,
    }
    assert dict(p.hash_to_group) == {} and p.num_free() == 1 and not p.is_pinned(0)
    # with nothing free, not even a dropped count (docs/contract.md, "API guarantees")
    p.pop()
    p.checkpoint(s, 1, 3)
    assert p.checkpoints_dropped == 0


def test_replay_resumable_hit_returns_hit():
    p = sc.StateGroupPool(2, sc.StateTransfer.replay())
    assert p.resumable_hit(owner(0), 4, [1, 2, 3, 4]) == 4


@needs_ref
def test_reference_forks_under_none_which_spec_fixes():
    # Documents the divergence: the reference keeps a fork checkpoint here.
    p = REF.StateGroupPool(2, sc.StateTransfer.none())
    s = owner(p.pop())
    p.checkpoint(s, 1, 3)
    assert p.checkpoints_kept == 1


# ------------------------------------------------------------ bad input --


def snapshot(p):
    return (
        p.num_groups,
        list(p.group_hash),
        list(p.hash_to_group.items()),
        p.checkpoint_fates(),
        p.num_free(),
        p._debug_state(),
        p._debug_copies(),
        len(p._debug_pending()),
    )


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda p: p.release(9), IndexError, "group=9"),
        (lambda p: p.release(3), ValueError, "group=3: is already free"),
        (lambda p: p.release(1), ValueError, "group=1: is pinned"),
        (lambda p: p.claim(0), ValueError, "group=0: is not free"),
        (lambda p: p.pin(3), ValueError, "group=3: is free"),
        (lambda p: p.extend(-1), ValueError, "count=-1"),
        (lambda p: p.has_free(1), TypeError, "positional argument"),
        (lambda p: p.checkpoint("seq", 1, 2), TypeError, "seq"),
        (lambda p: p.forget_pending(3), TypeError, "seq"),
        (lambda p: p.checkpoint(owner(7), 1, 2), IndexError, "seq.per_req_cache_group=7"),
        (lambda p: p.record_copy(-1, 0), IndexError, "src=-1"),
        (lambda p: p.resumable_hit(owner(0), 2, [5]), IndexError, "hit=2"),
        (lambda p: p.unindex("h"), TypeError, "h"),
        (lambda p: p.invalidate(4), IndexError, "group=4"),
    ],
)
def test_bad_input_raises_before_anything_changes(call, exc, match):
    p = sc.StateGroupPool(4, sc.StateTransfer.copy())
    p.pop(), p.pop(), p.pop()
    p.pin(1)
    before = snapshot(p)
    with pytest.raises(exc, match=match):
        call(p)
    assert snapshot(p) == before
    p._check_invariants()


def test_group_hash_view_and_mapping():
    p = sc.StateGroupPool(2, sc.StateTransfer.copy())
    s = owner(p.pop())
    p.checkpoint(s, 1, 77)
    p.take_copies()
    assert p.hash_to_group == {77: 1} and p.group_hash == [-1, 77]
    assert p.readable_midstep is False and p.successor_room == 0.0


# ---------------------------------------------------------- differential --


@needs_ref
@pytest.mark.parametrize("profile", ["mixed", "idle", "shrink"])
@pytest.mark.parametrize("transfer", sorted(GROUP_TRANSFERS))
@pytest.mark.parametrize("seed", range(4))
def test_differential_random_sequences(seed, transfer, profile):
    size = (4, 6, 9, 12)[seed]
    GroupDriver(
        seed * 7919 + zlib.crc32(f"{transfer}/{profile}".encode()) % 1000,
        transfer,
        size=size,
        hbs=1 + seed % 3,
        profile=profile,
    ).run(500)


@needs_ref
@pytest.mark.parametrize("transfer", sorted(GROUP_TRANSFERS))
@pytest.mark.parametrize("seed", range(2))
def test_differential_disabled(seed, transfer):
    GroupDriver(1000 + seed, transfer, enabled=False, size=5).run(300)
    GroupDriver(2000 + seed, transfer, enabled=True, size=0).run(100)


def test_assumed_hit_is_constant_time_and_overflow_safe():
    p = sc.StateGroupPool(2, sc.StateTransfer.fork(4), hash_block_size=4)
    s = owner(0, num_tokens=4 * 10 + 4)
    assert p.resumable_hit(s, 2**62, [], assume_checkpointed=True) == 10
    s.num_tokens = -(2**63)
    assert p.resumable_hit(s, 2**62, [], assume_checkpointed=True) == 0
    s.num_tokens = 2**63 - 1
    assert p.resumable_hit(s, 3, [1, 2, 3], True) == 3


@needs_ref
@pytest.mark.parametrize("transfer", sorted(GROUP_TRANSFERS))
@pytest.mark.parametrize("seed", range(3))
def test_differential_engine_request_class(seed, transfer):
    """Ours driven with a plain request class (no statecache base), the
    reference with statecache.Sequence: same results and fields (docs/contract.md, "API guarantees")."""
    GroupDriver(
        3000 + seed,
        transfer,
        size=(5, 8, 11)[seed],
        hbs=1 + seed % 2,
        profile=("mixed", "idle", "shrink")[seed],
        plain_seqs=True,
    ).run(400)


@needs_ref
@pytest.mark.parametrize("transfer", sorted(GROUP_TRANSFERS))
@pytest.mark.parametrize("seed", range(3))
def test_differential_unsigned_hashes(seed, transfer):
    """An engine that hashes unsigned (the reference project's xxh64): hashes
    at and above 2**63 mean what the reference makes them mean, and every one
    comes back as the int given (index keys, per-index hashes, pending
    checkpoints), compared with the reference after every step."""
    GroupDriver(5000 + seed, transfer, size=(4, 6, 9)[seed], hbs=1 + seed % 2, unsigned_hashes=True).run(500)
