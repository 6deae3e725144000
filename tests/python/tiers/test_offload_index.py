"""StateOffloadIndex (docs/contract.md, "Tiers"): capped LRU membership and load bookkeeping."""

import random

import pytest

import statecache as sc


def test_defaults_and_membership():
    t = sc.StateOffloadIndex()
    assert (t.can_store, t.can_load, t.capacity) == (True, True, None)
    t.note_stored(5)
    t.note_stored(-1)
    assert 5 in t.hashes and len(t.hashes) == 2 and t.could_serve(5) and not t.could_serve(6)
    assert t.forget(5) is True and t.forget(5) is False and not t.could_serve(5)
    assert "x" not in t.hashes


def test_capacity_evicts_least_recently_used():
    t = sc.StateOffloadIndex(capacity=2)
    t.note_stored(1)
    t.note_stored(2)
    t.note_stored(1)  # refresh
    t.note_stored(3)
    assert list(t.hashes) == [1, 3] and t.stats()["evicted"] == 1
    assert t.request_load(1)
    t.complete_load(1)  # a served load refreshes too
    t.note_stored(4)
    assert list(t.hashes) == [1, 4]
    assert list(sc.StateOffloadIndex(capacity=0).hashes) == []


def test_load_only_and_store_only_roles():
    store_only = sc.StateOffloadIndex(can_load=False)
    store_only.note_stored(1)
    assert 1 in store_only.hashes and not store_only.could_serve(1) and not store_only.request_load(1)


def test_load_bookkeeping_and_stats():
    t = sc.StateOffloadIndex()
    for h in (1, 2, 3):
        t.note_store_started(h)
        t.note_stored(h)
    t.note_store_started(4)
    t.note_store_failed(4)
    t.note_store_failed(5, untrusted=True)
    assert not t.request_load(9)
    assert t.request_load(1) and t.request_load(2) and t.request_load(3) and t.loads_in_flight == 3
    t.complete_load(1)
    t.fail_load(2)  # a transient failure keeps the hash
    t.fail_load(3, missing=True)  # the tier lost it: forgotten
    assert 2 in t.hashes and 3 not in t.hashes and t.loads_in_flight == 0
    assert t.request_load(2)
    t.abandon_load(2)
    assert t.stats() == {
        "stores_attempted": 4,
        "stores_completed": 3,
        "stores_failed": 1,
        "stores_untrusted": 1,
        "loads_attempted": 4,
        "loads_completed": 1,
        "loads_failed": 2,
        "loads_missing": 1,
        "loads_abandoned": 1,
        "loads_untrusted": 0,
        "hashes": 2,
        "evicted": 0,
    }


def test_untrusted_loads_are_counted():
    t = sc.StateOffloadIndex()
    t.note_stored(5)
    assert t.request_load(5)
    t.fail_load(5, missing=True, untrusted=True)  # a copy failed its checksum: removed
    s = t.stats()
    assert s["loads_untrusted"] == 1 and s["loads_failed"] == 1 and 5 not in t.hashes


def test_bad_input():
    with pytest.raises(ValueError, match="capacity"):
        sc.StateOffloadIndex(capacity=-1)
    with pytest.raises(TypeError):
        sc.StateOffloadIndex(capacity="10")
    t = sc.StateOffloadIndex()
    with pytest.raises(ValueError, match="prefix_hash=7"):
        t.complete_load(7)  # no load in flight
    with pytest.raises(ValueError):
        t.fail_load(7, missing=True)
    with pytest.raises(TypeError):
        t.fail_load(7, True)  # missing is keyword-only
    assert t.stats()["loads_failed"] == 0


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_keep_a_capped_lru(seed):
    rng = random.Random(seed)
    cap = rng.choice([None, 1, 3, 8])
    t = sc.StateOffloadIndex(capacity=cap)
    model: list[int] = []
    for _ in range(300):
        h = rng.randrange(12)
        op = rng.randrange(4)
        if op == 0:
            t.note_stored(h)
            if h in model:
                model.remove(h)
            model.append(h)
            if cap is not None and len(model) > cap:
                model.pop(0)
        elif op == 1:
            assert t.forget(h) == (h in model)
            if h in model:
                model.remove(h)
        elif op == 2 and t.request_load(h):
            t.complete_load(h)
            model.remove(h)
            model.append(h)
        elif op == 3:
            assert t.could_serve(h) == (h in model)
        assert list(t.hashes) == model
