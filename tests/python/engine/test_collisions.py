"""Two prompts whose first blocks share one 64-bit scheduler hash (issue 18,
item 1): under the public seed 0, configured explicitly, the pair below
collides. Serving one must never resume the other's KV or state, neither on
the KV hit nor through a state checkpoint the other filed under that hash
(docs/contract.md, "Reference engine").

These run the engine with a content model of every slot, unit and KV block
(engine_support.ContentRunner: each forward checks it reads only its own
prefix); test_collisions_model.py serves the pair on the real tiny model."""

import random

import pytest

import statecache
from collision_pair import A, B
from engine_support import ContentRunner, caches_for, engine
from statecache.engine import BlockManager, Request
from statecache.engine.deployment_key import deployment_key

HBS = 16


def test_the_pair_collides_under_seed_0_only():
    (ha,), ka = statecache.chain_block_keys(A, HBS, seed=0)
    (hb,), kb = statecache.chain_block_keys(B, HBS, seed=0)
    assert ha == hb and ka != kb
    dk = deployment_key()  # this process's random key
    assert not dk.configured
    (ha,), _ = statecache.chain_block_keys(A, HBS, seed=dk.seed, salt=dk.salt)
    (hb,), _ = statecache.chain_block_keys(B, HBS, seed=dk.seed, salt=dk.salt)
    assert ha != hb


def _serve(eng, prompt, new=3):
    r = Request(prompt, new, scripted_output=[1] * new)
    eng.add_request(r)
    eng.run_until_done()
    return r


def _content_engine(mech, midstep, **kw):
    return engine(mech, hbs=HBS, budget=64, runner=ContentRunner(HBS), hash_seed=0, readable_midstep=midstep, **kw)


@pytest.mark.parametrize("midstep", [False, True])
@pytest.mark.parametrize("mech", ["page", "fork"])
def test_a_colliding_prompt_resumes_nothing_of_the_other(mech, midstep):
    eng = _content_engine(mech, midstep)
    a = _serve(eng, A + list(range(8)))
    b = _serve(eng, B + list(range(8)))  # ContentRunner raises on a wrong KV block or state
    assert b.hashes[0] == a.hashes[0]
    assert b.num_cached_tokens == 0
    # ... while the same prompt again resumes its own checkpoint.
    assert _serve(eng, A + list(range(8, 16))).num_cached_tokens == HBS


@pytest.mark.parametrize("midstep", [False, True])
@pytest.mark.parametrize("mech", ["page", "fork"])
def test_no_state_is_filed_under_another_prompts_kv(mech, midstep):
    """B computes its first block while the KV index holds A's there: B's
    checkpoint at 16 (anchor, or midstep) must not be filed under that hash,
    or A' (A's block, other tail) would resume B's state with A's KV."""
    eng = _content_engine(mech, midstep)
    a = _serve(eng, A + list(range(8)))
    eng.block_manager.drop_checkpoint(a.hashes[0])  # as the store's LRU may: A's KV stays
    _serve(eng, B + list(range(8)))
    again = _serve(eng, A + list(range(30, 38)))
    assert again.num_cached_tokens == 0
    assert eng.checkpoint_funnel()["checkpoints_refused_foreign_kv"] >= 1


def test_a_store_evicting_its_own_kv_block_is_unindexed():
    """The PAGE store's unit reservation can evict the KV block of the very
    image it stores; the eviction's unindex runs before the image is filed.
    ``BlockManager.take_ops`` drops it, so no image outlives its block to be
    resumed by a prefix filing that hash next."""
    pool = statecache.BlockPool(1)  # one block: the image's unit must evict the KV block
    caches = caches_for("page", pool, 4, HBS, image_bytes=100)
    bm = BlockManager(pool, caches, HBS, hash_seed=0)
    seq = Request(A + [1], 1)
    bm.update_hashes(seq)
    h = seq.hashes[0]
    block = pool.allocate(1)
    assert bm.publish_block(block[0], h, seq.prefix_keys[0])
    pool.free(block)
    seq.state_slots = [0]
    coord = caches.coordinator
    coord.checkpoint(seq, 1, h)
    coord.complete_previous_batch()
    ops = bm.take_ops()
    assert ops.stores and pool.lookup(h) < 0 and h not in bm.filed  # its own KV block went
    for _ in range(2):
        coord.complete_previous_batch()
        coord.take_checkpoint_ops()
    assert not coord.contains(h)


def test_filed_keys_mirror_the_kv_index():
    """Every hash ``filed`` names is in the KV index, and under the key of the
    prompt whose block is there, through evictions, resets and preemptions."""
    rng = random.Random(5)
    eng = _content_engine("page", False, num_blocks=12)
    bm = eng.block_manager
    for i in range(40):
        head = A if rng.random() < 0.5 else B
        eng.add_request(
            Request(head + [rng.randrange(1, 4) for _ in range(rng.randrange(1, 30))], 2, scripted_output=[1, 1])
        )
        for _ in range(rng.randrange(1, 4)):
            eng.step()
            for h, key in bm.filed.items():
                assert bm.pool.lookup(h) >= 0 and statecache.scheduler_hash(key) == h
        if i % 9 == 8:
            bm.pool.reset_prefix_cache()
            assert not bm.filed
    eng.run_until_done()
