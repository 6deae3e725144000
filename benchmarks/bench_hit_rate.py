"""Hit rate of every checkpoint policy on a trace, at three state budgets.

    python benchmarks/bench_hit_rate.py [--trace PATH] [--state-memory 2GiB,8GiB,32GiB]
    python benchmarks/bench_hit_rate.py --tiers [--gpu-memory 10GB,100GB] [--host-memory 0,256GB,1TB]

``--tiers``: one shared GPU budget (KV blocks + PAGE images, hybrid-7b) with a
host tier below it; the table gives the state-gated hit rate against the same
GPU budget without a host tier, and against the KV-only rate of the same run.

Replays the trace through the reference engine (real pools, no model) once
per (policy, budget) and prints a Markdown table: the KV-only hit rate (the
ceiling this KV budget allows), each policy's state-gated token hit rate,
the share of prefill FLOPs saved, how that compares with statecache's
default measured in the same run, and the library's median time per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from statecache.sim import policies, report, simulator, trace

DEFAULT_TRACE = os.environ.get("STATECACHE_TRACE",
                               "/work/shared/traces/mooncake_synthetic_trace.jsonl")
BASELINE = "statecache"


def markdown(results: list[dict]) -> str:
    base = {r["state_memory"]: r for r in results if r["policy"] == BASELINE}
    lines = ["| state budget | policy | KV-only hit | state-gated hit | x statecache | "
             "of KV ceiling | FLOPs saved | checkpoints kept / read / evicted | "
             "lib us/pass (median) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(results, key=lambda r: (r["state_memory"], list(policies.POLICIES)
                                            .index(r["policy"]))):
        b = base.get(r["state_memory"])
        ratio = r["state_hit_rate"] / b["state_hit_rate"] if b and b["state_hit_rate"] else float("nan")
        c = r["checkpoints"]
        lines.append(
            f"| {report.format_bytes(r['state_memory'])} | {r['policy']} | "
            f"{100 * r['kv_hit_rate']:.1f}% | {100 * r['state_hit_rate']:.1f}% | {ratio:.2f} | "
            f"{100 * r['state_hit_rate'] / max(r['kv_hit_rate'], 1e-12):.0f}% | "
            f"{100 * r['flops_saved_fraction']:.1f}% | {c['kept']} / {c['read']} / {c['evicted']} | "
            f"{r['library_us_per_pass']:.0f} |")
    return "\n".join(lines)


def tiers_markdown(results: list[dict]) -> str:
    base = {r["config"]["memory"]: r for r in results if not r["host_memory"]}
    lines = ["| GPU memory | host tier | KV-only hit | state-gated hit | x no host tier | "
             "of KV-only | resumed from GPU / host | checkpoints kept | load time (sim s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
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
            f"{r['checkpoints']['kept']} | {r['funnel'].get('tier_load_seconds', 0):.1f} |")
    return "\n".join(lines)


def main_tiers(args) -> int:
    gpus = [report.parse_bytes(b) for b in args.gpu_memory.split(",")]
    hosts = [report.parse_bytes(b) for b in args.host_memory.split(",")]
    reqs = trace.load_trace(args.trace, limit=args.limit)
    configs = [simulator.SimConfig(policy=BASELINE, geometry="hybrid-7b", memory=g, kv_memory=None,
                                   state_memory=None, concurrency=args.concurrency,
                                   max_output_tokens=args.max_output_tokens or None,
                                   host_memory=h, tier_kv_share=args.tier_kv_share)
               for g in gpus for h in hosts]
    t0 = time.perf_counter()
    results = simulator.sweep(reqs, configs, jobs=args.jobs, progress=sys.stderr.isatty())
    print(f"{args.trace}: {len(reqs)} requests; hybrid-7b, one GPU budget for KV + PAGE images, "
          f"host tier at 55 GB/s, {100 * args.tier_kv_share:.0f}% of it for KV blocks; policy {BASELINE}; {len(configs)} simulations in "
          f"{time.perf_counter() - t0:.0f} s ({args.jobs} jobs)\n")
    print(tiers_markdown(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=DEFAULT_TRACE)
    p.add_argument("--geometry", default="qwen3-next-80b-a3b")
    p.add_argument("--kv-memory", default="256GiB")
    p.add_argument("--state-memory", default="2GiB,8GiB,32GiB")
    p.add_argument("--policies", default="all")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-output-tokens", type=int, default=0,
                   help="cap generated tokens per request (0: as in the trace)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument("--plot", default=None, help="write the hit-rate plot here")
    p.add_argument("--tiers", action="store_true", help="the host-tier table instead")
    p.add_argument("--gpu-memory", default="10GB,100GB", help="--tiers: GPU budgets")
    p.add_argument("--host-memory", default="0,256GB,1TB", help="--tiers: host tier budgets")
    p.add_argument("--tier-kv-share", type=float, default=0.8,
                   help="--tiers: share of the host tier for KV blocks")
    args = p.parse_args(argv)
    if args.tiers:
        return main_tiers(args)

    names = list(policies.POLICIES) if args.policies == "all" else args.policies.split(",")
    kv = report.parse_bytes(args.kv_memory)
    budgets = [report.parse_bytes(b) for b in args.state_memory.split(",")]
    reqs = trace.load_trace(args.trace, limit=args.limit)
    configs = [simulator.SimConfig(policy=n, geometry=args.geometry, kv_memory=kv, state_memory=s,
                                   concurrency=args.concurrency,
                                   max_output_tokens=args.max_output_tokens or None)
               for s in budgets for n in names]
    t0 = time.perf_counter()
    results = simulator.sweep(reqs, configs, jobs=args.jobs, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    print(f"{args.trace}: {len(reqs)} requests, unbounded prefix-block ceiling "
          f"{100 * trace.ideal_block_hit_rate(reqs):.1f}%; {args.geometry}, KV "
          f"{report.format_bytes(kv)}, concurrency {args.concurrency}, outputs "
          f"{'capped at %d tokens' % args.max_output_tokens if args.max_output_tokens else 'as traced'}; "
          f"{len(configs)} simulations in {wall:.0f} s ({args.jobs} jobs)\n")
    print(markdown(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=float)
    if args.plot:
        report.plot_hit_rates(results, args.plot, title=f"{os.path.basename(args.trace)} - "
                                                         f"{args.geometry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
