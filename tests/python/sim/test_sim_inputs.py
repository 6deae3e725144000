"""Trace loading, token derivation, workload generation and geometry presets."""

import json

import numpy as np
import pytest

from statecache.sim import geometry, trace, workload


def _write(tmp_path, rows, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_hybrid_7b_figures_are_exact():
    g = geometry.preset("hybrid-7b")
    assert g.state_bytes == 26_787_840
    assert g.kv_bytes_per_token == 65_536
    assert (g.recurrent_layers, g.attention_layers) == (24, 4)


def test_presets_and_flops_arithmetic():
    assert {"qwen3-next-80b-a3b", "mamba-codestral-7b", "hybrid-7b"} <= set(geometry.PRESETS)
    q = geometry.preset("qwen3-next-80b-a3b")
    assert q.state_bytes == 36 * 1_097_728
    assert q.kv_bytes_per_token == 24_576
    m = geometry.preset("mamba-codestral-7b")
    assert m.kv_bytes_per_token == 0 and m.state_bytes == 64 * 2_158_592
    for g in geometry.PRESETS.values():
        per_token = [g.flops_per_token + g.attention_flops_per_context_token * (p + 1) for p in range(37)]
        assert g.prefill_flops(0, 37) == sum(per_token)
        assert g.prefill_flops(5, 37) == sum(per_token[5:])
        assert g.prefill_flops(0, 5) + g.prefill_flops(5, 37) == g.prefill_flops(0, 37)
    with pytest.raises(ValueError, match="start"):
        q.prefill_flops(4, 3)
    with pytest.raises(ValueError, match="nope"):
        geometry.preset("nope")


def test_tokens_follow_block_ids(tmp_path):
    rows = [
        {"timestamp": 5, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 1, "input_length": 1024, "output_length": 2, "hash_ids": [7, 8]},
        {"timestamp": 9, "input_length": 600, "output_length": 1, "hash_ids": [7, 4]},
    ]
    reqs = trace.load_trace(_write(tmp_path, rows))
    assert [r.timestamp_ms for r in reqs] == [1, 5, 9]  # sorted by arrival
    assert [r.index for r in reqs] == [1, 0, 2]  # file order kept as the identity
    a, b, c = (r.prompt_tokens(512) for r in reqs)
    assert (len(a), len(b), len(c)) == (1024, 1100, 600)
    assert np.array_equal(a, b[:1024])  # same ids, same tokens
    assert np.array_equal(a[:512], c[:512])
    assert not np.array_equal(a[512:600], c[512:600])  # id 8 vs id 4
    assert np.array_equal(b[1024:], trace.derived_tokens(9, 512)[:76])
    # generated tokens are private to a request
    assert not np.array_equal(reqs[0].output_tokens(), reqs[1].output_tokens()[:2])


def test_tail_past_hash_ids_is_private(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 0, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 700, "output_length": 0, "hash_ids": [1]},
    ]
    a, b = (r.prompt_tokens() for r in trace.load_trace(_write(tmp_path, rows)))
    assert np.array_equal(a[:512], b[:512]) and not np.array_equal(a[512:], b[512:])


@pytest.mark.parametrize(
    "line, what",
    [
        ('{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}', "input_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1.5, "hash_ids": []}', "output_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
        ('{"timestamp": -3, "input_length": 1, "output_length": 1, "hash_ids": []}', "timestamp"),
        ("[1, 2]", "JSON object"),
        ("{oops", "not JSON"),
    ],
)
def test_bad_lines_name_the_field(tmp_path, line, what):
    p = tmp_path / "bad.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(ValueError, match=what):
        trace.load_trace(p)


def test_ideal_hit_rate_counts_prefix_blocks_only():
    R = trace.TraceRequest
    reqs = [R(0, 0, 1536, 1, (1, 2, 3)), R(1, 1, 1536, 1, (1, 2, 4)), R(2, 2, 1536, 1, (5, 2, 3))]
    # second: 1, 2 hit; third: 5 misses so 2 and 3 do not count
    assert trace.ideal_block_hit_rate(reqs) == pytest.approx(2 / 9)


def test_shared_trace_ceiling_matches_readme():
    path = "/work/shared/traces/mooncake_synthetic_trace.jsonl"
    try:
        reqs = trace.load_trace(path)
    except FileNotFoundError:
        pytest.skip("shared trace not present")
    assert len(reqs) == 3993
    assert round(trace.ideal_block_hit_rate(reqs), 2) == 0.64


def test_workload_is_seeded_and_round_trips(tmp_path):
    spec = workload.WorkloadSpec(kind="multi_turn", sessions=20, seed=3)
    a, b = workload.generate(spec), workload.generate(spec)
    assert a == b
    assert workload.generate(workload.WorkloadSpec(kind="multi_turn", sessions=20, seed=4)) != a
    p = tmp_path / "w.jsonl"
    trace.write_trace(a, p)
    back = trace.load_trace(p)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in back] == [
        (r.input_length, r.output_length, r.hash_ids) for r in a
    ]
    for r in a:
        assert len(r.hash_ids) == -(-r.input_length // spec.block_size)
    assert [r.timestamp_ms for r in a] == sorted(r.timestamp_ms for r in a)


def test_multi_turn_sessions_share_their_history():
    spec = workload.WorkloadSpec(kind="multi_turn", sessions=1, turns=6, system_prompts=1, seed=1)
    reqs = workload.generate(spec)
    bs = spec.block_size
    for prev, cur in zip(reqs, reqs[1:]):
        full = prev.input_length // bs
        assert cur.input_length > prev.input_length
        assert cur.hash_ids[:full] == prev.hash_ids[:full]  # the whole previous prompt's full blocks


def test_agentic_branches_share_a_prefix_then_diverge():
    spec = workload.WorkloadSpec(
        kind="agentic", sessions=30, branch_prob=1.0, branch_factor=3, turns=3, seed=2, tool_result_tokens=600
    )
    reqs = workload.generate(spec)
    assert trace.ideal_block_hit_rate(reqs) > 0.5
    # some pair of requests shares a non-empty prefix and then differs (a branch point)
    by_first = {}
    diverging = 0
    for r in reqs:
        for o in by_first.get(r.hash_ids[0], []):
            common = next((i for i, (x, y) in enumerate(zip(r.hash_ids, o.hash_ids)) if x != y), None)
            if common is not None and common > 0:
                diverging += 1
        by_first.setdefault(r.hash_ids[0], []).append(r)
    assert diverging > 0


def test_workload_spec_validation():
    with pytest.raises(ValueError, match="kind"):
        workload.WorkloadSpec(kind="chat")
    with pytest.raises(ValueError, match="sessions"):
        workload.WorkloadSpec(sessions=0)
    with pytest.raises(ValueError, match="branch_prob"):
        workload.WorkloadSpec(branch_prob=1.5)


def test_workload_command_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "agents.jsonl"
    assert workload.main([str(out), "--kind", "agentic", "--sessions", "5", "--seed", "7"]) == 0
    reqs = trace.load_trace(out)
    assert reqs and "requests" in capsys.readouterr().out
    assert [r.hash_ids for r in reqs] == [
        r.hash_ids for r in workload.generate(workload.WorkloadSpec(kind="agentic", sessions=5, seed=7))
    ]
    with pytest.raises(SystemExit):
        workload.main([str(out), "--sessions", "0"])
