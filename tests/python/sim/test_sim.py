"""The trace simulator on hand-made traces whose hit rates are known exactly."""

import json
import math

import pytest

from statecache.engine import PlacementContext
from statecache.sim import cli, policies, simulator, trace
from statecache.sim.geometry import preset

HBS = 512
G = preset("hybrid-7b")
KV = 64 * 2**30  # 2,048 blocks of 512 tokens: never short in these traces


def reqs(*rows):
    """rows: (seconds, input_length, hash_ids); one output token each."""
    return [trace.TraceRequest(i, t * 1000.0, n, 1, tuple(ids)) for i, (t, n, ids) in enumerate(rows)]


def run(rows, policy="statecache-lru", slots=8, concurrency=1, **kw):
    cfg = simulator.SimConfig(
        policy=policy,
        geometry="hybrid-7b",
        kv_memory=KV,
        state_memory=slots * G.state_bytes,
        concurrency=concurrency,
        **kw,
    )
    return simulator.simulate(reqs(*rows), cfg).to_dict()


def hit(r):
    return r["state_hit_tokens"], r["kv_hit_tokens"]


# A: 6 full blocks. B and C share A's first two blocks, then diverge.
BRANCH = [(0, 3072, [1, 2, 3, 4, 5, 6]), (100, 2048, [1, 2, 7, 8]), (200, 2048, [1, 2, 9, 10])]


def test_multi_turn_resumes_at_the_previous_prompt_end():
    rows = [(0, 1100, [1, 2, 3]), (100, 1600, [1, 2, 4, 5])]
    for name in policies.POLICIES:
        r = run(rows, name)
        # A's prompt-end position is 1024 (its last full block); B shares exactly that
        assert hit(r) == (1024, 1024), name
        assert r["prompt_tokens"] == 2700
        assert r["state_hit_rate"] == pytest.approx(1024 / 2700)
        assert r["saved_flops"] == G.prefill_flops(0, 1024)
        assert r["prompt_flops"] == G.prefill_flops(0, 1100) + G.prefill_flops(0, 1600)
        assert r["checkpoints"]["read"] == 1


@pytest.mark.parametrize(
    "policy, interval, expect",
    [
        # anchor at 2560 only; B's hit is cut short and leaves a demand rung at 1024 for C
        ("statecache-lru", -1, 1024),
        # a ladder rung every 1024 tokens serves B already
        ("statecache-lru", 1024, 2048),
        # the adaptive default: a demand rung; with the engine's interval pinned, that ladder
        ("statecache", -1, 1024),
        ("statecache", 1024, 2048),
        ("statecache-flop", -1, 1024),
        ("statecache-flop", 1024, 2048),  # its own ladder (ladder_tokens)
        ("vllm-all", -1, 2048),  # every block boundary of A
        ("sglang", -1, 2048),  # every 1024 tokens (peer_interval below)
        ("marconi", -1, 1024),  # B's branch point, read by C
        ("vllm-align", -1, 2048),  # chunk ends every 1024 tokens (max_batched_tokens below)
    ],
)
def test_branch_points(policy, interval, expect):
    ladder = (
        {"interval_tokens": interval} if policy in ("statecache", "statecache-lru") else {"ladder_tokens": interval}
    )
    r = run(BRANCH, policy, peer_interval_tokens=1024, max_batched_tokens=1024, **ladder)
    assert r["kv_hit_tokens"] == 2048  # B and C each match blocks 1, 2
    assert r["state_hit_tokens"] == expect
    assert r["kv_hit_rate"] == pytest.approx(2048 / 7168)


def test_no_checkpoint_budget_means_no_state_hits():
    r = run([(0, 1100, [1, 2, 3]), (100, 1600, [1, 2, 4, 5])], slots=0)
    assert hit(r) == (0, 1024)
    assert r["checkpoints"]["kept"] == 0 or r["checkpoints"]["evicted"] >= 1


# X is long (8 blocks), Y, Z, W short (2 blocks); then X comes back.
EVICT = [
    (0, 4200, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    (100, 1100, [20, 21, 22]),
    (200, 1100, [30, 31, 32]),
    (300, 1100, [40, 41, 42]),
    (400, 4300, [1, 2, 3, 4, 5, 6, 7, 8, 50]),
]


def test_lru_spends_the_oldest_and_marconi_the_least_useful():
    # three checkpoints fit; W's needs a fourth
    lru = run(EVICT, "statecache-lru", slots=3)
    assert lru["state_hit_tokens"] == 0  # X's checkpoint (4096) was the oldest: spent for W
    assert lru["kv_hit_tokens"] == 4096
    assert lru["checkpoints"]["evicted"] == 2  # for W's, then for X's own again
    flop = run(EVICT, "marconi", slots=3)
    # Y: neither the newest nor worth many FLOPs, goes instead; X is read back
    assert flop["state_hit_tokens"] == 4096
    assert flop["checkpoints"]["evicted"] == 1
    roomy = run(EVICT, "statecache-lru", slots=4)
    assert roomy["state_hit_tokens"] == 4096 and roomy["checkpoints"]["evicted"] == 0
    # statecache-flop ranks like Marconi where it holds no ladder rungs, and
    # so does the default, through the library's cost model
    assert run(EVICT, "statecache-flop", slots=3)["state_hit_tokens"] == 4096
    adaptive = run(EVICT, "statecache", slots=3)
    assert adaptive["state_hit_tokens"] == 4096 and adaptive["checkpoints"]["evicted"] == 1


def test_ladder_rungs_are_spent_first_and_gated_by_room():
    # X (8 blocks) leaves rungs at 1024/2048/3072 and an anchor at 4096 in
    # room for three: its anchor and Y's spend rungs, and X's anchor is read back.
    rows = [
        (0, 4200, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
        (100, 1100, [20, 21, 22]),
        (200, 4300, [1, 2, 3, 4, 5, 6, 7, 8, 50]),
    ]
    r = run(rows, "statecache-flop", slots=3, ladder_tokens=1024, max_batched_tokens=256)
    assert r["funnel"]["checkpoints_requested_ladder"] == 3
    assert r["checkpoints"]["evicted"] == 2
    assert r["state_hit_tokens"] == 4096
    # fewer spare slots than two passes could pop (2 x concurrency): no rungs at all
    tight = run(rows, "statecache-flop", slots=2, ladder_tokens=1024, max_batched_tokens=256, concurrency=4)
    assert tight["funnel"].get("checkpoints_requested_ladder", 0) == 0
    assert tight["state_hit_tokens"] == 4096


def test_guesses_are_spent_before_anchors(monkeypatch):
    # A keeps its anchor (2560). B shares A's first two blocks: a demand rung
    # (a guess) at 1024 and its anchor at 2048. With room for two, B's anchor
    # spends one: the guess under statecache, A's older anchor under plain LRU.
    # Small chunks let the rung's pin clear before B's anchor is taken.
    rows = [(0, 3072, [1, 2, 3, 4, 5, 6]), (100, 2100, [1, 2, 7, 8, 9]), (200, 3100, [1, 2, 3, 4, 5, 6, 60])]
    r = run(rows, "statecache-lru", slots=2, max_batched_tokens=256)
    assert r["state_hit_tokens"] == 2560  # C resumes at A's anchor
    assert r["checkpoints"]["evicted"] == 2  # B's rung, then one for C's own anchor
    monkeypatch.setitem(
        policies.POLICIES,
        "anchor-ladder-demand-lru",
        policies.PolicySpec(
            "anchor-ladder-demand-lru",
            "statecache placement, plain LRU",
            lambda c: (policies.AnchorLadderDemand(), policies.PlainLRU()),
        ),
    )
    plain = run(rows, "anchor-ladder-demand-lru", slots=2, max_batched_tokens=256)
    assert plain["state_hit_tokens"] == 1024  # only B's rung is left for C
    assert plain["checkpoints"]["evicted"] == 2


def test_shared_memory_budget_uses_page_images():
    rows = [(0, 1100, [1, 2, 3]), (100, 1600, [1, 2, 4, 5])]
    cfg = simulator.SimConfig(
        policy="statecache", geometry="hybrid-7b", memory=4 * 2**30, kv_memory=None, state_memory=None, concurrency=1
    )
    r = simulator.simulate(reqs(*rows), cfg).to_dict()
    assert hit(r) == (1024, 1024)
    assert r["sizes"]["units_per_checkpoint"] == 1  # 26.8 MB image in a 32 MiB block
    assert r["checkpoint_bytes_peak"] == 2 * 32 * 2**20  # A's anchor (1024), B's (1536)


def test_config_and_budget_errors():
    with pytest.raises(ValueError, match="policy"):
        simulator.SimConfig(policy="lfu")
    with pytest.raises(ValueError, match="not both"):
        simulator.SimConfig(memory=2**30)
    with pytest.raises(ValueError, match="concurrency"):
        simulator.SimConfig(concurrency=0)
    with pytest.raises(ValueError, match="kv_memory"):
        simulator.SimConfig(kv_memory=-1)
    cfg = simulator.SimConfig(geometry="hybrid-7b", kv_memory=2 * 2**30, state_memory=2**30)
    with pytest.raises(ValueError, match="KV budget"):
        simulator.simulate(reqs((0, 40000, list(range(79)))), cfg)


def _ctx(**kw):
    base = dict(
        hash_block_size=HBS,
        successor_room=1.0,
        num_prompt_tokens=5000,
        num_tokens=5000,
        resume_position=0,
        kv_hit_position=0,
        interval_tokens=-1,
    )
    base.update(kw)
    return PlacementContext(**base)


def test_peer_placements_name_the_positions_they_model():
    pos = lambda bs: [b.position for b in bs]  # noqa: E731
    ctx = _ctx(resume_position=1024, kv_hit_position=2048)
    assert pos(policies.EveryBlock().prompt_boundaries(ctx)) == [1536, 2048, 2560, 3072, 3584, 4096, 4608]
    assert pos(policies.ChunkEnds(2000).prompt_boundaries(ctx)) == [2560, 4096, 4608]
    assert pos(policies.EveryNTokens(2048).prompt_boundaries(ctx)) == [2048, 4096, 4608]
    assert pos(policies.BranchPointsAndEnd().prompt_boundaries(ctx)) == [2048, 4608]
    assert policies.EveryNTokens(1024).decode_boundary(ctx, 6144).position == 6144
    assert policies.EveryNTokens(1024).decode_boundary(ctx, 6656) is None
    none = _ctx(successor_room=math.inf)
    for p in (
        policies.EveryBlock(),
        policies.ChunkEnds(512),
        policies.EveryNTokens(512),
        policies.BranchPointsAndEnd(),
    ):
        assert p.prompt_boundaries(none) == []
    with pytest.raises(ValueError, match="chunk_tokens"):
        policies.ChunkEnds(0)
    with pytest.raises(ValueError, match="interval_tokens"):
        policies.EveryNTokens(-4)


def test_cli_prints_tables_writes_plot_and_json(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    trace.write_trace(reqs(*BRANCH), path)
    png, js = tmp_path / "p.png", tmp_path / "r.json"
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "simulate",
            str(path),
            "--geometry",
            "hybrid-7b",
            "--state-memory",
            "30MB,200MB",
            "--kv-memory",
            "64GiB",
            "--plot",
            str(png),
            "--json",
            str(js),
            "--jobs",
            "1",
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    for name in policies.POLICIES:
        assert f"[{name}]" in out
    assert "state-gated token hit rate" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert len(data) == 2 * len(policies.POLICIES)
    assert {d["state_memory"] for d in data} == {30 * 10**6, 200 * 10**6}
    big = [d for d in data if d["policy"] == "vllm-all" and d["state_memory"] == 200 * 10**6][0]
    assert big["state_hit_tokens"] == 2048


def test_attention_free_geometry():
    rows = [(0, 1100, [1, 2, 3]), (100, 1600, [1, 2, 4, 5])]
    g = preset("mamba-codestral-7b")
    cfg = simulator.SimConfig(geometry=g.name, kv_memory=0, state_memory=4 * g.state_bytes, concurrency=1)
    r = simulator.simulate(reqs(*rows), cfg).to_dict()
    assert hit(r) == (1024, 1024)  # no KV bytes, yet the index still names prefixes
    with pytest.raises(ValueError, match="no KV blocks"):
        simulator.simulate(
            reqs(*rows), simulator.SimConfig(geometry=g.name, memory=2**34, kv_memory=None, state_memory=None)
        )
