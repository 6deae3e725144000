"""Hit rate of the default and every peer policy, on every shipped trace.

    python benchmarks/bench_hit_rate.py [--traces mooncake,chat,...] [--jobs 2]
    python benchmarks/bench_hit_rate.py --tiers [--gpu-memory 10GB,100GB] [--host-memory 0,256GB,1TB]

``--tiers``: one shared GPU budget (KV blocks + PAGE images, hybrid-7b) with a
host tier below it; the table gives the state-gated hit rate against the same
GPU budget without a host tier, and against the KV-only rate of the same run.

Traces: the shared Mooncake trace (``../shared/traces/`` beside the checkout,
or ``$STATECACHE_TRACE``) and the generated workloads of
``statecache.sim.workload.PRESETS`` (chat, agentic, tool-calling, RAG). Each
runs with the hybrid-7b and Qwen3-Next-80B-A3B geometries under one shared
budget (``--memory``: KV blocks and PAGE images in one pool) at three sizes:
100 GB / 400 GB / 1 TB for Mooncake (as in issue 13); for the generated
ones, room for the running requests' KV plus 10% / 30% / 100% of the KV
bytes of the trace's distinct blocks.

Printed per trace and geometry: the KV-only hit rate (the ceiling this
budget allows), every policy's state-gated token hit rate, the default
(``statecache``) minus the best other policy, and the default over KV-only.
Then the targets (default >= best other - 0.5 points everywhere; >= 95% of
KV-only at the largest budget) and the library's time per pass, default
against the previous fixed default (``statecache-lru``) in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from statecache.sim import policies, report, simulator, trace, workload
from statecache.sim.geometry import preset

DEFAULT = "statecache"
BASELINE = "statecache-lru"  # the fixed default before the adaptive one
GEOMETRIES = ("hybrid-7b", "qwen3-next-80b-a3b")
MOONCAKE_BUDGETS = (100 * 10**9, 400 * 10**9, 10**12)
FRACTIONS = (0.1, 0.3, 1.0)
TRACE_NAME = "mooncake_synthetic_trace.jsonl"


def find_mooncake() -> str | None:
    """``$STATECACHE_TRACE``, else ``shared/traces`` beside the checkout or
    beside ``$STATECACHE_REFERENCE_DIR``."""
    env = os.environ.get("STATECACHE_TRACE")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cands = [os.path.join(here, "..", "shared", "traces", TRACE_NAME)]
    ref = os.environ.get("STATECACHE_REFERENCE_DIR")
    if ref:
        cands.append(os.path.join(os.path.dirname(os.path.abspath(ref)), "traces", TRACE_NAME))
    for c in cands:
        if os.path.exists(c):
            return os.path.normpath(c)
    return None


def budgets_for(name: str, reqs, geometry: str, concurrency: int = 16) -> list[int]:
    """Mooncake: the issue's budgets. Generated traces: room for the running
    requests' KV (concurrency x mean prompt) plus 10% / 30% / 100% of the KV
    bytes of the trace's distinct blocks, in whole GB."""
    if name == "mooncake":
        return list(MOONCAKE_BUDGETS)
    g = preset(geometry)
    blocks = len({b for r in reqs for b in r.hash_ids})
    foot = blocks * trace.MOONCAKE_BLOCK_SIZE * g.kv_bytes_per_token
    running = concurrency * statistics.fmean(r.input_length for r in reqs) * g.kv_bytes_per_token
    return [int(round((running + f * foot) / 10**9)) * 10**9 for f in FRACTIONS]


def table(results: list[dict], names: list[str]) -> tuple[str, list[dict]]:
    """Markdown rows per budget; and the target check per budget."""
    budgets = sorted({r["state_memory"] for r in results})
    by = {(r["state_memory"], r["policy"]): r for r in results}
    head = ["memory", "KV-only"] + names + ["default - best other", "default / KV-only"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    checks = []
    for i, b in enumerate(budgets):
        kv = max(by[(b, n)]["kv_hit_rate"] for n in names if (b, n) in by)
        rates = {n: 100 * by[(b, n)]["state_hit_rate"] for n in names if (b, n) in by}
        others = {n: v for n, v in rates.items() if n != DEFAULT}
        best = max(others, key=others.get) if others else None
        gap = rates[DEFAULT] - others[best] if best else float("nan")
        # KV-only of the default's own run (what its KV cache alone matched)
        kv_own = 100 * by[(b, DEFAULT)]["kv_hit_rate"]
        share = rates[DEFAULT] / kv_own if kv_own else float("nan")
        cells = [f"{b / 10**9:.0f} GB", f"{100 * kv:.1f}%"]
        cells += [("**%.1f%%**" if n == DEFAULT else "%.1f%%") % rates[n] for n in names]
        cells += [f"{gap:+.1f} ({best})", f"{100 * share:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
        checks.append({"budget": b, "gap": gap, "best": best, "share": share, "largest": i == len(budgets) - 1})
    return "\n".join(lines), checks


def per_trace_time(timing: dict, repeats: int) -> str:
    """Library time per pass per trace, default against the old default:
    each cell's median over its runs of mean us/pass, pooled over the
    trace's cells by passes (total library time / total passes)."""
    lines = [
        f"\nlibrary time per pass by trace (thread CPU time; each cell the median of {repeats} "
        f"run(s), pooled over the trace's cells by passes):\n",
        f"| trace | {DEFAULT} us/pass | {BASELINE} us/pass | ratio | per-cell ratios |",
        "|---|---:|---:|---:|---|",
    ]
    traces = sorted({k[0] for k in timing}, key=[k[0] for k in timing].index)
    for t in traces:
        tot = {DEFAULT: [0.0, 0], BASELINE: [0.0, 0]}
        ratios = []
        for key, runs in timing.items():
            if key[0] != t or key[3] not in tot:
                continue
            us = statistics.median(u for u, _ in runs)
            tot[key[3]][0] += us * runs[0][1]
            tot[key[3]][1] += runs[0][1]
            other = timing.get(key[:3] + (BASELINE,)) if key[3] == DEFAULT else None
            if other:
                ratios.append(us / statistics.median(u for u, _ in other))
        if not (tot[DEFAULT][1] and tot[BASELINE][1]):
            continue
        a, b = (tot[n][0] / tot[n][1] for n in (DEFAULT, BASELINE))
        lines.append(f"| {t} | {a:.1f} | {b:.1f} | {a / b:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    return "\n".join(lines)


def tiers_markdown(results: list[dict]) -> str:
    base = {r["config"]["memory"]: r for r in results if not r["host_memory"]}
    lines = [
        "| GPU memory | host tier | KV-only hit | state-gated hit | x no host tier | "
        "of KV-only | resumed from GPU / host | checkpoints kept | load time (sim s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (r["config"]["memory"], r["host_memory"])):
        b = base.get(r["config"]["memory"])
        ratio = r["state_hit_rate"] / b["state_hit_rate"] if b and b["state_hit_rate"] else float("nan")
        t = r["tier_hit_rate"]
        lines.append(
            f"| {report.format_bytes(r['config']['memory'])} | "
            f"{report.format_bytes(r['host_memory']) if r['host_memory'] else '-'} | "
            f"{100 * r['kv_hit_rate']:.1f}% | {100 * r['state_hit_rate']:.1f}% | {ratio:.2f} | "
            f"{100 * r['state_hit_rate'] / max(r['kv_hit_rate'], 1e-12):.0f}% | "
            f"{100 * (t.get('gpu', 0) if r['host_memory'] else r['state_hit_rate']):.1f}% / "
            f"{100 * t.get('host', 0):.1f}% | "
            f"{r['checkpoints']['kept']} | {r['funnel'].get('tier_load_seconds', 0):.1f} |"
        )
    return "\n".join(lines)


def main_tiers(args) -> int:
    gpus = [report.parse_bytes(b) for b in args.gpu_memory.split(",")]
    hosts = [report.parse_bytes(b) for b in args.host_memory.split(",")]
    path = find_mooncake()
    if path is None:
        print("--tiers needs the Mooncake trace (set STATECACHE_TRACE or put ../shared/traces beside the checkout)")
        return 1
    reqs = trace.load_trace(path, limit=args.limit)
    configs = [
        simulator.SimConfig(
            policy=BASELINE,
            geometry="hybrid-7b",
            memory=g,
            kv_memory=None,
            state_memory=None,
            concurrency=16,
            max_output_tokens=args.max_output_tokens or None,
            host_memory=h,
            tier_kv_share=args.tier_kv_share,
        )
        for g in gpus
        for h in hosts
    ]
    t0 = time.perf_counter()
    results = simulator.sweep(reqs, configs, jobs=args.jobs, progress=sys.stderr.isatty())
    print(
        f"{path}: {len(reqs)} requests; hybrid-7b, one GPU budget for KV + PAGE images, "
        f"host tier at 55 GB/s, {100 * args.tier_kv_share:.0f}% of it for KV blocks; policy {BASELINE}; {len(configs)} simulations in "
        f"{time.perf_counter() - t0:.0f} s ({args.jobs} jobs)\n"
    )
    print(tiers_markdown(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--traces",
        default="mooncake," + ",".join(workload.PRESETS),
        help="comma list of 'mooncake' and workload presets",
    )
    p.add_argument("--geometries", default=",".join(GEOMETRIES))
    p.add_argument("--policies", default="all")
    p.add_argument("--limit", type=int, default=None, help="first N requests of each trace")
    p.add_argument(
        "--max-output-tokens", type=int, default=32, help="cap generated tokens per request (0: as in the trace)"
    )
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument("--plot", default=None, help="write the hit-rate plot here")
    p.add_argument("--tiers", action="store_true", help="the host-tier table instead")
    p.add_argument("--gpu-memory", default="10GB,100GB", help="--tiers: GPU budgets")
    p.add_argument("--host-memory", default="0,256GB,1TB", help="--tiers: host tier budgets")
    p.add_argument("--tier-kv-share", type=float, default=0.8, help="--tiers: share of the host tier for KV blocks")
    p.add_argument(
        "--timing-repeats",
        type=int,
        default=1,
        help="runs of the default and the old default per cell for the time per pass "
        "(alternating; each cell's median is used): on a shared machine one run's "
        "figure moves by 10-40%%",
    )
    args = p.parse_args(argv)
    if args.tiers:
        return main_tiers(args)

    names = list(policies.POLICIES) if args.policies == "all" else args.policies.split(",")
    if DEFAULT not in names:
        names.insert(0, DEFAULT)
    traces: list[tuple[str, list]] = []
    for t in args.traces.split(","):
        if t == "mooncake":
            path = find_mooncake()
            if path is None:
                print(
                    "mooncake: trace not found (set STATECACHE_TRACE or put ../shared/traces "
                    "beside the checkout); skipped\n"
                )
                continue
            traces.append((t, trace.load_trace(path, limit=args.limit)))
        elif t in workload.PRESETS:
            reqs = workload.generate(workload.PRESETS[t])
            traces.append((t, reqs[: args.limit] if args.limit else reqs))
        else:
            p.error(f"--traces: unknown trace {t!r}")
    all_results, all_checks, t_start = [], [], time.perf_counter()
    timing: dict = {}  # (trace, geometry, budget, policy) -> [(mean us/pass, passes)]
    for tname, reqs in traces:
        for geo in args.geometries.split(","):
            configs = [
                simulator.SimConfig(
                    policy=n,
                    geometry=geo,
                    memory=m,
                    kv_memory=None,
                    state_memory=None,
                    max_output_tokens=args.max_output_tokens or None,
                )
                for m in budgets_for(tname, reqs, geo)
                for n in names
            ]
            t0 = time.perf_counter()
            results = simulator.sweep(reqs, configs, jobs=args.jobs)
            for r in results:
                r["trace"] = tname
            md, checks = table(results, names)
            print(
                f"### {tname} ({len(reqs)} requests, prefix-block ceiling "
                f"{100 * trace.ideal_block_hit_rate(reqs):.1f}%), {geo}: state-gated token hit "
                f"rate ({len(configs)} simulations, {time.perf_counter() - t0:.0f} s)\n"
            )
            print(md + "\n", flush=True)
            all_results += results
            all_checks += [dict(c, trace=tname, geometry=geo) for c in checks]
            for r in results:
                timing.setdefault((tname, geo, r["state_memory"], r["policy"]), []).append(
                    (r["library_us_per_pass_mean"], r["passes"])
                )
            extra = [
                simulator.SimConfig(
                    policy=n,
                    geometry=geo,
                    memory=m,
                    kv_memory=None,
                    state_memory=None,
                    max_output_tokens=args.max_output_tokens or None,
                )
                for _ in range(args.timing_repeats - 1)
                for m in budgets_for(tname, reqs, geo)
                for n in (DEFAULT, BASELINE)
                if n in names
            ]
            for r in simulator.sweep(reqs, extra, jobs=args.jobs) if extra else []:
                timing[(tname, geo, r["state_memory"], r["policy"])].append(
                    (r["library_us_per_pass_mean"], r["passes"])
                )

    gap_ok = [c for c in all_checks if c["gap"] >= -0.5]
    share_ok = [c for c in all_checks if c["largest"] and c["share"] >= 0.95]
    largest = [c for c in all_checks if c["largest"]]
    print(
        f"targets: default >= best other - 0.5 points: {len(gap_ok)}/{len(all_checks)} "
        f"trace x geometry x budget cells"
        + (
            ""
            if len(gap_ok) == len(all_checks)
            else "; missed: "
            + ", ".join(
                f"{c['trace']}/{c['geometry']}/{c['budget'] / 10**9:.0f} GB ({c['gap']:+.1f} vs {c['best']})"
                for c in all_checks
                if c["gap"] < -0.5
            )
        )
    )
    print(
        f"         default >= 95% of KV-only at the largest budget: {len(share_ok)}/{len(largest)}"
        + (
            ""
            if len(share_ok) == len(largest)
            else "; missed: "
            + ", ".join(f"{c['trace']}/{c['geometry']} ({100 * c['share']:.0f}%)" for c in largest if c["share"] < 0.95)
        )
    )
    # Library time per pass: the default against the fixed default, paired by cell.
    pairs = {}
    for r in all_results:
        pairs.setdefault((r["trace"], r["geometry"], r["state_memory"]), {})[r["policy"]] = r
    med, mean = [], []
    for cell in pairs.values():
        if DEFAULT in cell and BASELINE in cell:
            a, b = cell[DEFAULT], cell[BASELINE]
            if b["library_us_per_pass"] > 0:
                med.append(a["library_us_per_pass"] / b["library_us_per_pass"])
            if b["library_us_per_pass_mean"] > 0:
                mean.append(a["library_us_per_pass_mean"] / b["library_us_per_pass_mean"])
    if med:
        print(
            f"library time per pass, {DEFAULT} / {BASELINE} over {len(med)} cells: median of the "
            f"per-cell ratios of median us/pass {statistics.median(med):.2f}, of mean us/pass "
            f"{statistics.median(mean):.2f} (range {min(mean):.2f}-{max(mean):.2f})"
        )
    print(per_trace_time(timing, args.timing_repeats))
    print(f"\n{len(all_results)} simulations in {time.perf_counter() - t_start:.0f} s ({args.jobs} jobs)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(all_results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
