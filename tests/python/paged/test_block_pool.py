"""BlockPool: page units, the KV prefix cache, on_evict re-entrancy, bad input."""

import random
import sys

import pytest

import statecache as sc
from paged_harness import check_conservation

SPEC = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=400)


def test_units_reserve_release_rekey_and_owner_of():
    pool = sc.BlockPool(8)
    a = pool.reserve_units(3, ("state-checkpoint", 7))
    assert a == [0, 1, 2] and pool.num_free == 5 and pool.num_reserved == 3
    assert pool.owner_of(0) == ("state-checkpoint", 7)
    b = pool.reserve_units(2, {"not": "hashable"}.__class__.__name__)  # any hashable owner
    assert pool.owner_of(b[0]) == "dict"
    assert pool.reserve_units(4, "x") is None and pool.num_free == 3  # short: nothing taken
    pool.rekey_units(a, ("state-checkpoint", 7), ("state-transfer", ("load", 1)))
    assert pool.owner_of(1) == ("state-transfer", ("load", 1))
    pool.release_units(tuple(a), ("state-transfer", ("load", 1)))
    assert pool.owner_of(1) is None and pool.num_free == 6
    assert pool.reserve_units(0, "y") == []
    check_conservation(pool)


def test_owners_compare_by_equality_not_identity():
    pool = sc.BlockPool(4)
    units = pool.reserve_units(2, ("req", [1, 2].__len__()))
    pool.release_units(units, ("req", 2))  # an equal, distinct tuple
    assert pool.num_free == 4


@pytest.mark.parametrize(
    "units, owner, exc",
    [
        ([0, 1], "other", ValueError),  # not the owner
        ([0, 0], "me", ValueError),  # listed twice
        ([0, 5], "me", ValueError),  # 5 is free
        ([0, 99], "me", IndexError),  # out of range
        ([-1], "me", IndexError),
        ("01", "me", TypeError),
        ([0], [1], TypeError),  # unhashable owner
    ],
)
def test_release_by_non_owner_changes_nothing(units, owner, exc):
    pool = sc.BlockPool(8)
    pool.reserve_units(3, "me")
    before = [pool.owner_of(u) for u in range(8)], pool.num_free
    with pytest.raises(exc):
        pool.release_units(units, owner)
    with pytest.raises(exc):
        pool.rekey_units(units, owner, "new")
    assert ([pool.owner_of(u) for u in range(8)], pool.num_free) == before
    check_conservation(pool)


def test_bad_counts_and_indices():
    pool = sc.BlockPool(4)
    for call in (lambda: pool.reserve_units(-1, "o"), lambda: pool.allocate(-2), lambda: sc.BlockPool(-1)):
        with pytest.raises(ValueError, match="-"):
            call()
    with pytest.raises(TypeError):
        pool.reserve_units(1.5, "o")
    with pytest.raises(IndexError, match="unit=4"):
        pool.owner_of(4)
    with pytest.raises(ValueError):
        pool.publish(0, 5)  # block 0 is not held by the KV cache
    with pytest.raises(TypeError):
        sc.BlockPool(4, on_evict=3)


def test_kv_refcounts_and_lazy_lru_eviction():
    evicted = []
    pool = sc.BlockPool(4, on_evict=evicted.append)
    a = pool.allocate(2)
    assert a == [0, 1] and pool.num_kv_blocks == 2 and pool.ref_count(0) == 1
    assert pool.publish(0, 100) and pool.publish(1, 101)
    assert not pool.publish(pool.allocate(1)[0], 100)  # hash already held by block 0
    assert pool.lookup(100) == 0 and pool.block_hash(1) == 101
    pool.incref([0])  # a second sequence shares the prefix
    pool.free([1, 0])
    assert pool.ref_count(0) == 1 and pool.lookup(101) == 1  # freed, still findable
    assert pool.num_cached == 1 and pool.num_free == 2
    pool.free([0])
    assert pool.num_cached == 2 and pool.lookup(100) == 0
    # A hit on a cached block revives it without evicting anything.
    pool.incref([pool.lookup(100)])
    assert pool.ref_count(0) == 1 and pool.num_cached == 1
    # Never-hashed blocks go first, then cached ones least recently freed first.
    assert pool.allocate(1) == [3] and evicted == []
    assert pool.allocate(1) == [1] and evicted == [101] and pool.lookup(101) == -1
    assert pool.allocate(1) is None
    check_conservation(pool)


def test_free_more_than_referenced_changes_nothing():
    pool = sc.BlockPool(3)
    blocks = pool.allocate(2)
    with pytest.raises(ValueError):
        pool.free([blocks[0], blocks[0]])
    with pytest.raises(ValueError):
        pool.free([2])  # never allocated
    assert pool.ref_count(blocks[0]) == 1 and pool.num_kv_blocks == 2
    with pytest.raises(ValueError):
        pool.incref([2])  # free and unhashed: nothing to share


def test_units_and_kv_share_one_free_list():
    evicted = []
    pool = sc.BlockPool(4, on_evict=evicted.append)
    blocks = pool.allocate(4)
    for i, b in enumerate(blocks):
        pool.publish(b, 10 + i)
    pool.free(blocks)
    units = pool.reserve_units(2, ("state-checkpoint", 0))
    assert units == [0, 1] and evicted == [10, 11]
    assert pool.lookup(10) == -1 and pool.lookup(12) == 2
    check_conservation(pool)


def test_on_evict_may_unindex_a_store_on_the_same_pool():
    """The callback releases units into the pool that is handing out a block."""
    pool = sc.BlockPool(6)
    store = sc.PageUnitCheckpointStore(pool, SPEC)
    calls = []

    def on_evict(h):
        calls.append((h, pool.num_free))
        store.unindex(h)

    pool.on_evict = on_evict
    kv = pool.allocate(2)
    pool.publish(kv[0], 42)
    assert store.begin_store(42, src_slot=0) is not None  # 4 units: the pool is full
    store.complete_inflight()
    assert store.contains(42) and pool.num_free == 0
    pool.free(kv)  # block 0 cached under 42, block 1 fresh
    assert pool.allocate(1) == [kv[1]] and calls == []
    # Handing out the cached block fires on_evict once the pool is consistent;
    # unindex then returns the checkpoint's 4 units to the same pool.
    assert pool.allocate(1) == [kv[0]]
    assert calls == [(42, 0)]
    assert not store.contains(42) and pool.num_free == 4
    check_conservation(pool)
    store.check_consistency()


def test_on_evict_error_is_reported_and_the_allocation_delivered(monkeypatch):
    # README guarantees: a notification callback's exception goes to
    # sys.unraisablehook; the call completes and hands out its result.
    seen, reported = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def boom(h):
        seen.append(h)
        raise RuntimeError(f"handler {h}")

    pool = sc.BlockPool(2, on_evict=boom)
    blocks = pool.allocate(2)
    pool.publish(blocks[0], 1)
    pool.publish(blocks[1], 2)
    pool.free(blocks)
    assert sorted(pool.allocate(2)) == sorted(blocks)
    assert seen == [1, 2] and [str(e) for e in reported] == ["handler 1", "handler 2"]
    assert pool.num_kv_blocks == 2
    check_conservation(pool)


def test_reset_prefix_cache_fires_for_every_hash():
    evicted = []
    pool = sc.BlockPool(3, on_evict=evicted.append)
    blocks = pool.allocate(3)
    for b in blocks:
        pool.publish(b, 100 + b)
    pool.free(blocks[:2])
    assert pool.reset_prefix_cache() == 3
    assert sorted(evicted) == [100, 101, 102] and pool.num_cached == 0 and pool.lookup(102) == -1
    check_conservation(pool)


@pytest.mark.parametrize("seed", range(12))
def test_random_block_pool_sequences_against_a_model(seed):
    """Units and KV blocks against a plain Python model; conservation at every step."""
    rng = random.Random(seed)
    n = rng.choice([5, 16, 40])
    evicted = []
    pool = sc.BlockPool(n, on_evict=evicted.append)
    owners = {}  # unit -> owner
    refs = {}  # block -> refcount
    hashed = {}  # hash -> block
    for _step in range(400):
        op = rng.randrange(7)
        if op == 0:
            owner = rng.choice(["a", "b", ("state-checkpoint", rng.randrange(3)), ("state-transfer", rng.randrange(2))])
            count = rng.randrange(0, 6)
            got = pool.reserve_units(count, owner)
            assert (got is None) == (count > n - len(owners) - len(refs))
            for u in got or []:
                owners[u] = owner
        elif op == 1 and owners:
            owner = rng.choice(list(set(owners.values())))
            mine = [u for u, o in owners.items() if o == owner]
            pick = rng.sample(mine, rng.randrange(1, len(mine) + 1))
            if rng.random() < 0.2:
                with pytest.raises(ValueError):
                    pool.release_units(pick, ("nobody",))
            pool.release_units(pick, owner)
            for u in pick:
                del owners[u]
        elif op == 2:
            got = pool.allocate(rng.randrange(1, 4))
            for b in got or []:
                refs[b] = 1
        elif op == 3 and refs:
            b = rng.choice(list(refs))
            pool.free([b])
            refs[b] -= 1
            if refs[b] == 0:
                del refs[b]
        elif op == 4 and refs:
            b = rng.choice(list(refs))
            h = rng.randrange(20)
            current = pool.block_hash(b)
            if current not in (-1, h):
                with pytest.raises(ValueError):
                    pool.publish(b, h)  # a block carries one hash for life
                continue
            ok = pool.publish(b, h)
            assert ok == (hashed.get(h, b) == b)
            if ok:
                hashed[h] = b
        elif op == 5:
            h = rng.randrange(20)
            b = pool.lookup(h)
            if b >= 0:
                assert hashed[h] == b
                pool.incref([b])
                refs[b] = refs.get(b, 0) + 1
        elif op == 6:
            for h in evicted:
                hashed.pop(h, None)
            evicted.clear()
        for h in evicted:
            hashed.pop(h, None)
        evicted.clear()
        assert all(pool.owner_of(u) == o for u, o in owners.items())
        assert all(pool.ref_count(b) == c for b, c in refs.items())
        assert all(pool.lookup(h) == b for h, b in hashed.items())
        assert pool.num_free == n - len(owners) - len(refs)
        check_conservation(pool)
