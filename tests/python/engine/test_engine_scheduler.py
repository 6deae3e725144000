"""Reference engine without a model: admission, pass timing, preemption,
eviction (docs/contract.md, "The pass", "Reference engine", "Invariants")."""

import random

import pytest

from engine_support import engine
from statecache.engine import Request


def req(prompt, n=4):
    return Request(prompt, n, scripted_output=[900 + i for i in range(n)])


SYS = list(range(1, 23))  # 22 tokens = 5 full blocks of 4


@pytest.mark.parametrize("mech", ["fork", "page"])
def test_second_turn_resumes_from_anchor(mech):
    eng = engine(mech)
    a = req(SYS + [50, 51, 52], 5)
    eng.add_request(a)
    eng.run_until_done()
    assert a.num_cached_tokens == 0 and a.state_source == "none"
    b = req(a.token_ids + [60, 61, 62, 63, 64])
    eng.add_request(b)
    eng.run_until_done()
    # a's anchor: fork(3) -> (25-3)//4*4 = 20; PAGE -> 24
    want = 20 if mech == "fork" else 24
    assert b.num_cached_tokens == want
    assert b.state_source == ("fork" if mech == "fork" else "PAGE")
    assert b.prefill_computed == b.num_prompt_tokens - want
    f = eng.checkpoint_funnel()
    assert f["resumed_tokens"] == want and f["checkpoints_kept"] >= 2


def test_prefix_caching_off_resumes_nothing():
    eng = engine("page", prefix=False)
    for _ in range(2):
        r = req(SYS + [5, 6, 7])
        eng.add_request(r)
        eng.run_until_done()
        assert r.num_cached_tokens == 0 and r.prefill_computed == 25
    assert eng.checkpoint_funnel().get("checkpoints_requested", 0) == 0


def test_page_store_ready_two_passes_later():
    """A store recorded in pass N is scattered by batch N+1, READY at N+2."""
    eng = engine("page", budget=64)
    a = req(SYS + [50, 51, 52], 8)
    eng.add_request(a)
    coord = eng.caches.coordinator
    h = None
    for n in range(1, 6):
        eng.step()
        batch = eng.runner.batches[-1]
        if n == 1:
            h = a.hashes[24 // 4 - 1]
            assert not batch.ops.stores and not coord.contains(h)  # recorded only
        if n == 2:
            assert len(batch.ops.stores) == 1 and not coord.contains(h)
        if n == 3:
            assert coord.contains(h)


def test_fork_source_pinned_until_read():
    eng = engine("fork", budget=64)
    a = req(SYS + [50, 51, 52], 8)
    eng.add_request(a)
    sp = eng.caches.slot_pool
    eng.step()  # prefill to the anchor (20), checkpoint forks
    src = sp.lookup(a.hashes[4])
    assert src >= 0 and sp.is_pinned(src) and a.state_fork_src == src
    eng.step()  # the forward that reads src
    assert eng.runner.batches[-1].items[0].read_slot == src
    assert a.state_fork_src == -1 and sp.is_pinned(src)  # clears next top of pass
    eng.step()
    assert not sp.is_pinned(src) and sp.is_free(src) and sp.lookup(a.hashes[4]) == src


@pytest.mark.parametrize("mech", ["fork", "page"])
def test_preemption_during_pending_checkpoint(mech):
    """A tiny KV pool forces preemption right after a checkpoint was recorded;
    everything returns, nothing stays pinned, and every request completes."""
    eng = engine(mech, num_blocks=14, num_slots=4, budget=32)
    reqs = [req(SYS[:18] + [40 + i, 41 + i, 42 + i], 12) for i in range(3)]
    for r in reqs:
        eng.add_request(r)
    eng.run_until_done(max_passes=500)
    assert all(len(r.output_token_ids) == 12 for r in reqs)
    assert eng.num_preemptions > 0
    sp = eng.caches.slot_pool
    for _ in range(3):
        eng.step()
    assert sp.num_free() == sp.num_slots
    if mech == "page":
        coord = eng.caches.coordinator
        ready = sum(len(r.unit_ids) for r in coord.store.records.values())
        assert eng.block_manager.pool.num_free + ready == 14  # units conserved


@pytest.mark.parametrize("mech", ["fork", "page"])
def test_eviction_under_tiny_pool_keeps_index_consistent(mech):
    rng = random.Random(7)
    eng = engine(mech, num_blocks=24, num_slots=3, budget=24, interval=8)
    convs = [list(range(100 * c, 100 * c + 9)) for c in range(4)]
    for _ in range(20):
        c = rng.randrange(4)
        r = req(convs[c] + [rng.randrange(1000) for _ in range(rng.randrange(1, 6))], 3)
        eng.add_request(r)
        eng.run_until_done(max_passes=500)
        convs[c] = r.token_ids
        # every checkpoint is reachable only while its KV block is indexed
        pool = eng.block_manager.pool
        if mech == "fork":
            for h, s in eng.caches.slot_pool.hash_to_slot.items():
                assert eng.caches.slot_pool.slot_hash[s] == h
                assert pool.lookup(h) >= 0
        else:
            for h in eng.caches.coordinator.store.hash_to_checkpoint:
                assert pool.lookup(h) >= 0
    f = eng.checkpoint_funnel()
    assert f["kv_blocks_evicted"] > 0 and f["resumed_tokens"] > 0


def test_custom_policies_plug_in():
    """A peer placement (every block) and a recording eviction policy go
    through the same interface the default uses; the engine calls both."""
    from statecache.engine import Boundary, EvictionPolicy, PlacementPolicy

    class EveryBlock(PlacementPolicy):
        name = "every-block"

        def prompt_boundaries(self, ctx):
            hbs = ctx.hash_block_size
            return [Boundary(p, "all", True) for p in range(hbs, ctx.num_prompt_tokens, hbs)]

    class Recording(EvictionPolicy):
        def __init__(self):
            self.kept, self.resumed = [], []

        def on_checkpoint(self, caches, seq, boundary):
            self.kept.append(boundary.position)

        def on_resume(self, caches, seq, prefix_hash):
            self.resumed.append(seq.num_cached_tokens)

    eng = engine("page", budget=64)
    rec = Recording()
    eng.block_manager.placement = EveryBlock()
    eng.block_manager.eviction = rec
    a = req(SYS + [50, 51, 52], 3)
    eng.add_request(a)
    eng.run_until_done()
    assert rec.kept == [4, 8, 12, 16, 20, 24]
    assert a.prefill_chunks == 7  # cut at every block
    b = req(SYS[:13] + [7, 7, 7])
    eng.add_request(b)
    eng.run_until_done()
    assert rec.resumed == [12] and b.state_source == "PAGE"


def test_state_capacity_gates_admission():
    """With one state slot, the second request waits for the first to finish
    (has_free is the gate), then runs."""
    eng = engine("page", num_slots=1, budget=64)
    a, b = req(SYS + [1]), req(SYS + [2])
    eng.add_request(a)
    eng.add_request(b)
    eng.step()
    assert a.status == "running" and b.status == "waiting"
    eng.run_until_done()
    assert a.status == b.status == "finished"
    assert b.num_cached_tokens > 0  # and it resumed from a's checkpoint


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(hash_block_size=0), "hash_block_size"),
        (dict(max_num_batched_tokens=-1), "max_num_batched_tokens"),
        (dict(checkpoint_interval_tokens=-2), "checkpoint_interval_tokens"),
        (dict(max_num_seqs=True), "max_num_seqs"),
    ],
)
def test_bad_config(kw, name):
    from statecache.engine import EngineConfig

    with pytest.raises(ValueError, match=name):
        EngineConfig(**kw)


def test_bad_requests():
    eng = engine("fork")
    with pytest.raises(ValueError, match="empty"):
        eng.add_request(req([]))
    r = req(SYS)
    eng.add_request(r)
    with pytest.raises(ValueError, match="already added"):
        eng.add_request(r)
    assert len(eng.waiting) == 1


def test_pool_too_small_for_a_request_raises():
    eng = engine("fork", num_blocks=2)
    eng.add_request(req(SYS))
    with pytest.raises(RuntimeError, match="too small"):
        eng.step()


@pytest.mark.parametrize("mech,resumed", [("page", 28), ("fork", 20)])
def test_decode_boundaries_through_the_placement(mech, resumed):
    """A placement that keeps block ends reached while decoding: a copy
    backend keeps them (the next turn resumes inside the last output); a
    fork cannot (one decode token does not cover its room)."""
    from statecache.engine import AnchorLadderDemand, Boundary

    class AlsoDecode(AnchorLadderDemand):
        def decode_boundary(self, ctx, position):
            return Boundary(position, "decode", True)

    eng = engine(mech, budget=64)
    eng.block_manager.placement = AlsoDecode()
    a = req(SYS + [50, 51, 52], 7)  # 25 prompt tokens, decodes through 28 and 31
    eng.add_request(a)
    eng.run_until_done()
    b = req(a.token_ids + [60, 61])
    eng.add_request(b)
    eng.run_until_done()
    assert b.num_cached_tokens == resumed
