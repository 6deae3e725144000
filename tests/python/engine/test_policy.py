"""The eviction cost model in the library, and the engine's adaptive default."""

import pytest

import statecache as sc
from statecache.engine import (
    AdaptiveCheckpointPolicy,
    AnchorLadderDemand,
    CostModel,
    Engine,
    EngineConfig,
    GuessFirstLRU,
    StateCaches,
)
from statecache.sim import policies, simulator, workload

HBS = 16


def seq(i, tokens=1000, anchor=0):
    s = sc.Sequence(seq_id=i, num_tokens=tokens, num_prompt_tokens=tokens)
    s.checkpoint_end_pos = anchor
    return s


# ------------------------------ setter ---------------------------------- #


@pytest.mark.parametrize(
    "make",
    [
        lambda: sc.StateSlotPool(8, sc.StateTransfer.fork(1)),
        lambda: sc.StateGroupPool(8, sc.StateTransfer.fork(1)),
        lambda: sc.PageUnitCheckpointStore(
            sc.BlockPool(64),
            sc.PagedStateCheckpointSpec(page_unit_bytes=4096, slot_bytes=16384, layout_id="x", image_bytes=16384),
        ),
        lambda: sc.PagedStateCheckpointCoordinator(
            sc.BlockPool(64),
            sc.PagedStateCheckpointSpec(page_unit_bytes=4096, slot_bytes=16384, layout_id="x", image_bytes=16384),
            True,
        ),
    ],
)
def test_setter_defaults_round_trips_and_refuses_bad_values(make):
    cache = make()
    assert cache.eviction_policy["kind"] == "lru"  # the reference behaviour by default
    cache.set_eviction_policy(
        "cost",
        flops_per_token=2.0,
        flops_per_context_token=3.0,
        checkpoint_bytes=10.0,
        tokens_per_position=16,
        weight=0.5,
        guesses_first=False,
    )
    assert cache.eviction_policy == dict(
        kind="cost",
        flops_per_token=2.0,
        flops_per_context_token=3.0,
        checkpoint_bytes=10.0,
        tokens_per_position=16.0,
        weight=0.5,
        guesses_first=False,
    )
    before = cache.eviction_policy
    for kwargs, name in [
        (dict(kind="fifo"), "kind"),
        (dict(weight=-1.0), "weight"),
        (dict(checkpoint_bytes=0.0), "checkpoint_bytes"),
        (dict(tokens_per_position=float("nan")), "tokens_per_position"),
        (dict(flops_per_token=float("inf")), "flops_per_token"),
    ]:
        with pytest.raises(ValueError, match=name):
            cache.set_eviction_policy(**{"kind": "cost", **kwargs})
        assert cache.eviction_policy == before
    with pytest.raises(TypeError):
        cache.set_eviction_policy("cost", weight="heavy")
    cache.set_eviction_policy()  # back to the reference setting
    assert cache.eviction_policy["kind"] == "lru"


def _slot_pool_with_checkpoints(kind):
    pool = sc.StateSlotPool(8, sc.StateTransfer.fork(1), hash_block_size=HBS)
    if kind == "cost":
        pool.set_eviction_policy("cost", tokens_per_position=HBS)
    owners = []
    # oldest first: a 60-block prefix, then three 1-block ones (all anchors)
    for i, blocks in enumerate([60, 1, 1, 1]):
        s = seq(i, tokens=2000, anchor=blocks * HBS)
        s.state_slots = pool.pop_many(1)
        pool.checkpoint(s, blocks, 500 + i)
        owners.append(s)
        pool.release_pins()
        pool.release_pins()
    for s in owners:
        pool.release_many(s.state_slots)
    pool._check_invariants()
    return pool


def test_slot_pool_cost_model_keeps_the_valuable_old_checkpoint():
    lru = _slot_pool_with_checkpoints("lru")
    cost = _slot_pool_with_checkpoints("cost")
    # four vacant slots go first either way; then a checkpoint must be spent
    for pool in (lru, cost):
        assert pool.occupancy()["slots_vacant"] == 4
        pool.pop_many(5)
        pool._check_invariants()
    assert lru.lookup(500) == -1 and lru.lookup(501) >= 0  # LRU spends the oldest
    assert cost.lookup(500) >= 0 and cost.lookup(501) == -1  # cost spends a cheap one


def test_coordinator_ranks_images_by_the_boundary_it_was_given():
    spec = sc.PagedStateCheckpointSpec(
        page_unit_bytes=4096, slot_bytes=16384, layout_id="x", image_bytes=16384
    )  # 4 units an image
    pool = sc.BlockPool(16)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, True)
    coord.set_eviction_policy("cost", tokens_per_position=HBS)
    s = seq(0)
    s.state_slots = [0]
    for i, blocks in enumerate([60, 1, 1, 1, 1]):  # the fifth needs room
        coord.complete_previous_batch()
        coord.checkpoint(s, blocks, 900 + i)
        coord.take_checkpoint_ops()
    coord.complete_previous_batch()
    coord.complete_previous_batch()
    assert coord.contains(900) and not coord.contains(901) and coord.contains(904)
    coord.store.check_consistency()


def test_group_pool_ranks_checkpoints_by_the_boundary_it_was_given():
    # fork and copy: both file the boundary, so the cost model keeps the
    # 60-block prefix although it is the oldest
    for transfer in (sc.StateTransfer.fork(1), sc.StateTransfer.copy()):
        pool = sc.StateGroupPool(8, transfer, hash_block_size=HBS)
        pool.set_eviction_policy("cost", tokens_per_position=HBS)
        owners = []
        for i, blocks in enumerate([60, 1, 1, 1]):
            s = seq(i, tokens=2000)
            s.per_req_cache_group = pool.pop()
            if transfer.copies:
                pool.checkpoint(s, 2, 500 + i)  # superseded by the later boundary
                pool.checkpoint(s, blocks, 500 + i)
                pool.take_copies()
            else:
                pool.checkpoint(s, blocks, 500 + i)
                pool.release_pins()
                pool.release_pins()
            owners.append(s)
        for s in owners:
            pool.release(s.per_req_cache_group)
        assert all(pool.lookup(h) >= 0 for h in range(500, 504))
        # vacant groups go first; then the first checkpoint spent is a cheap one
        while all(pool.lookup(h) >= 0 for h in range(500, 504)):
            pool.pop()
        assert pool.lookup(500) >= 0 and pool.lookup(501) == -1, transfer.kind


def _store_and_arena(model):
    """A PAGE store and a host arena under one model, given the same uses."""
    spec = sc.PagedStateCheckpointSpec(
        page_unit_bytes=4096, slot_bytes=4096, layout_id="x", image_bytes=4096
    )  # one unit an image
    pool = sc.BlockPool(6)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, True)
    coord.set_eviction_policy(**model)
    arena = sc.HostArena(4096, 6 * 4096, [6 * 4096])
    arena.set_eviction_policy(**coord.eviction_policy)
    s = seq(0)
    s.state_slots = [0]
    blocks = {900: 60, 901: 1, 902: 7, 903: 3, 904: 30, 905: 2}
    for h, b in blocks.items():
        coord.complete_previous_batch()
        coord.checkpoint(s, b, h)
        coord.take_checkpoint_ops()
        arena.allocate(str(h), 0, 1, 4096, b)
        arena.seal(str(h), b"")
    coord.complete_previous_batch()
    coord.complete_previous_batch()
    return pool, coord, arena, s


@pytest.mark.parametrize(
    "model",
    [
        dict(kind="cost", tokens_per_position=HBS, flops_per_context_token=1.0, weight=1.0),
        dict(kind="cost", tokens_per_position=HBS, weight=4.0),
        dict(kind="lru"),
    ],
)
def test_host_arena_evicts_in_the_order_the_page_store_does(model):
    pool, coord, arena, s = _store_and_arena(model)
    # Spend one image at a time in both: the same hashes go, in the same order.
    store_order, arena_order = [], []
    for k in range(6):
        before = {h for h in range(900, 906) if coord.contains(h)}
        coord.complete_previous_batch()
        coord.checkpoint(s, 1, 1000 + k)
        coord.take_checkpoint_ops()
        coord.complete_previous_batch()
        coord.complete_previous_batch()
        store_order += sorted(before - {h for h in range(900, 906) if coord.contains(h)})
        got = arena.allocate(f"new{k}", 0, 1, 4096, 1)
        arena_order += [int(e) for e in got[1] if not e.startswith(b"new")]
        arena.seal(f"new{k}", b"")
        coord.store.check_consistency()
        arena.check_consistency()
    assert store_order == arena_order and len(store_order) >= 4
    if model["kind"] == "cost":
        assert 900 not in store_order  # the deepest prefix outlives newer shallow ones
    else:
        assert store_order == list(range(900, 906))  # oldest first


# --------------------------- adaptive default ---------------------------- #


def test_adaptive_arguments_are_checked():
    with pytest.raises(ValueError, match="sample_every"):
        AdaptiveCheckpointPolicy(sample_every=0)
    with pytest.raises(ValueError, match="initial_ladder"):
        AdaptiveCheckpointPolicy(initial_ladder=12345)
    with pytest.raises(ValueError, match="ladder_candidates"):
        AdaptiveCheckpointPolicy(ladder_candidates=(4096, 4096))
    with pytest.raises(ValueError, match="margin"):
        AdaptiveCheckpointPolicy(margin=2.0)
    with pytest.raises(ValueError, match="seed"):
        AdaptiveCheckpointPolicy(seed="x")
    with pytest.raises(TypeError, match="cost"):
        AdaptiveCheckpointPolicy(cost={"weight": 1})


def test_engine_default_is_adaptive_and_a_fixed_policy_can_be_pinned():
    pool = sc.BlockPool(64)
    caches = StateCaches.build(sc.StateTransfer.fork(1), 8, HBS)
    eng = Engine(EngineConfig(hash_block_size=HBS), pool, caches, runner=None)
    assert isinstance(eng.block_manager.placement, AdaptiveCheckpointPolicy)
    assert eng.block_manager.eviction is eng.block_manager.placement
    pinned = Engine(
        EngineConfig(hash_block_size=HBS),
        sc.BlockPool(64),
        StateCaches.build(sc.StateTransfer.fork(1), 8, HBS),
        runner=None,
        placement=AnchorLadderDemand(),
        eviction=GuessFirstLRU(),
    )
    assert type(pinned.block_manager.placement) is AnchorLadderDemand
    assert type(pinned.block_manager.eviction) is GuessFirstLRU


RAG = workload.WorkloadSpec(
    kind="rag",
    sessions=120,
    session_rate_per_s=4.0,
    system_prompts=1,
    system_prompt_tokens=1024,
    turns=1.5,
    user_tokens=100,
    output_tokens=50,
    documents=12,
    document_tokens=1500,
    documents_per_request=3,
    think_time_ms=2000.0,
    seed=3,
)


def _simulate(memory, seed=0):
    """The RAG workload under the adaptive default, deciding early enough
    for a short trace; returns the result and the policy object."""
    reqs = workload.generate(RAG)
    built = {}

    def build(c):
        p = AdaptiveCheckpointPolicy(
            CostModel.from_geometry(c.geometry), seed=c.seed, warmup=32, decide_every=8, horizon=256
        )
        built["policy"] = p
        return p, p

    name = "adaptive-short"
    policies.POLICIES[name] = policies.PolicySpec(name, "adaptive, short warm-up", build)
    try:
        cfg = simulator.SimConfig(
            policy=name,
            geometry="hybrid-7b",
            memory=memory,
            kv_memory=None,
            state_memory=None,
            max_output_tokens=8,
            seed=seed,
        )
        res = simulator.simulate(reqs, cfg).to_dict()
    finally:
        del policies.POLICIES[name]
    return res, built["policy"]


def test_adaptive_is_deterministic_and_shows_its_decisions():
    a, pa = _simulate(7 * 10**9)
    b, pb = _simulate(7 * 10**9)
    assert a["funnel"] == b["funnel"] and a["state_hit_tokens"] == b["state_hit_tokens"]
    assert list(pa.decisions) == list(pb.decisions)
    f = a["funnel"]
    assert f["adaptive_sampled"] > 0 and f["adaptive_decisions"] == len(pa.decisions)
    assert f["adaptive_ladder_tokens"] == pa.ladder_tokens  # the setting in force
    assert f.get("adaptive_switches", 0) >= 0
    other, po = _simulate(7 * 10**9, seed=5)
    assert po.salt != pa.salt  # another sample of prefix families


def test_ample_memory_takes_room_rungs_and_scarce_memory_decides():
    ample, pa = _simulate(2000 * 10**9)
    scarce, ps = _simulate(7 * 10**9)
    # Ample: the pool never turned over, so images cost nothing: no ladder
    # decision is taken, room rungs place fine rungs, and none had to yield.
    assert pa.clock < pa.pool_blocks and not pa.decisions
    fa, fs = ample["funnel"], scarce["funnel"]
    assert fa["adaptive_rungs_roomy"] > 0 and fa.get("adaptive_room_dropped", 0) == 0
    # Scarce: the pool turned over, the shadows decide, and the room rungs
    # placed while it was still vacant yielded as it filled.
    assert ps.clock > ps.pool_blocks and ps.decisions
    assert fs["adaptive_decisions"] == len(ps.decisions)
    assert 0 < fs["adaptive_rungs_roomy"] < fa["adaptive_rungs_roomy"]
    assert fs["adaptive_room_dropped"] > 0
    assert ample["state_hit_rate"] > scarce["state_hit_rate"]


# ------------------------------ workloads -------------------------------- #


def test_tool_calling_shares_the_long_system_prompt_and_takes_short_steps():
    spec = workload.WorkloadSpec(
        kind="tool_calling",
        sessions=6,
        system_prompts=1,
        system_prompt_tokens=4096,
        turns=4.0,
        user_tokens=50,
        output_tokens=30,
        tool_result_tokens=80,
        seed=2,
    )
    reqs = workload.generate(spec)
    sys_blocks = 4096 // spec.block_size
    assert len({r.hash_ids[:sys_blocks] for r in reqs}) == 1
    by_session = {}
    for r in sorted(reqs, key=lambda r: r.input_length):
        by_session.setdefault(r.hash_ids[sys_blocks] if len(r.hash_ids) > sys_blocks else None, []).append(r)
    steps = [b.input_length - a.input_length for rs in by_session.values() for a, b in zip(rs, rs[1:])]
    assert steps and max(steps) < 4096  # a step adds an answer and a tool result, no more


def test_rag_puts_shared_documents_at_varying_positions():
    spec = workload.WorkloadSpec(
        kind="rag",
        sessions=40,
        system_prompts=1,
        system_prompt_tokens=512,
        documents=2,
        document_tokens=2048,
        documents_per_request=2,
        turns=1.0,
        seed=4,
    )
    reqs = workload.generate(spec)
    first_doc = {r.hash_ids[1] for r in reqs}  # the block right after the system prompt
    assert len(first_doc) == 2  # each document comes first in some requests, second in others
    with pytest.raises(ValueError, match="documents_per_request"):
        workload.WorkloadSpec(kind="rag", documents=2, documents_per_request=3)
    with pytest.raises(ValueError, match="kind"):
        workload.WorkloadSpec(kind="search")
