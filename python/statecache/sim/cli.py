"""``statecache simulate TRACE``: hit rates of every policy over a budget sweep."""

from __future__ import annotations

import argparse
import os
import sys

from . import report
from .geometry import DEFAULT_PRESET, PRESETS
from .policies import POLICIES

DEFAULT_STATE_MEMORY = "2GiB,8GiB,32GiB"
DEFAULT_KV_MEMORY = "256GiB"
DEFAULT_MAX_OUTPUT = 32


def _byte_list(text: str) -> list[int]:
    try:
        return [report.parse_bytes(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _policy_list(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"policies must be 'all' or some of {sorted(POLICIES)}, got {text!r}")
    return names


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to a ``statecache`` argument parser."""
    p = subparsers.add_parser(
        "simulate", help="replay a Mooncake-format trace; hit rates per checkpoint policy", description=__doc__
    )
    p.add_argument("trace", help="Mooncake-format JSONL (timestamp, input_length, output_length, hash_ids)")
    p.add_argument("--geometry", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument(
        "--policies", type=_policy_list, default=list(POLICIES), help=f"'all' or a comma list of {', '.join(POLICIES)}"
    )
    p.add_argument(
        "--state-memory",
        type=_byte_list,
        default=None,
        help=f"state budgets to sweep, e.g. 4GiB,16GiB (default {DEFAULT_STATE_MEMORY})",
    )
    p.add_argument(
        "--kv-memory", type=report.parse_bytes, default=None, help=f"KV budget (default {DEFAULT_KV_MEMORY})"
    )
    p.add_argument(
        "--memory",
        type=_byte_list,
        default=None,
        help="shared KV + checkpoint budgets to sweep instead (PAGE images in KV blocks)",
    )
    p.add_argument(
        "--host-memory",
        type=report.parse_bytes,
        default=0,
        help="a host tier below GPU memory (with --memory), e.g. 1TB",
    )
    p.add_argument(
        "--shared-memory",
        type=report.parse_bytes,
        default=0,
        help="a shared (remote) tier below the host tier (with --memory)",
    )
    p.add_argument("--host-bandwidth", type=float, default=55.0, help="GB/s of a load from the host tier (default 55)")
    p.add_argument(
        "--remote-bandwidth", type=float, default=25.0, help="GB/s of a load from the shared tier (default 25)"
    )
    p.add_argument(
        "--tier-kv-share",
        type=float,
        default=None,
        help="optional fixed split: this share of each tier's bytes for KV blocks, the rest for state "
        "images (default: one budget, KV blocks and state images ranked together)",
    )
    p.add_argument("--concurrency", type=int, default=16, help="max running requests")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="tokens per pass")
    p.add_argument(
        "--interval",
        type=int,
        default=-1,
        help="the engine's ladder: N > 0 a rung every N tokens (pins the adaptive "
        "default's ladder); -1 statecache chooses online, statecache-lru keeps "
        "anchor and demand only",
    )
    p.add_argument("--ladder", type=int, default=16384, help="statecache-flop's ladder interval in tokens (-1: none)")
    p.add_argument("--peer-interval", type=int, default=4096, help="SGLang's every-N tokens")
    p.add_argument(
        "--max-output-tokens",
        type=int,
        default=DEFAULT_MAX_OUTPUT,
        help="cap each request's generated tokens (0: as in the trace); decode only "
        f"moves the clock and holds a slot, so the cap trades little accuracy "
        f"for speed (default {DEFAULT_MAX_OUTPUT})",
    )
    p.add_argument("--arrivals", choices=("trace", "asap"), default="trace")
    p.add_argument("--limit", type=int, default=None, help="first N requests only")
    p.add_argument("--plot", default="statecache_sim.png", help="PNG path ('' for none)")
    p.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="PATH", help="results as JSON, to PATH or stdout"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations run in parallel processes")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the adaptive default's sampling salt (runs repeat exactly per --seed and --hash-seed)",
    )
    p.add_argument(
        "--hash-seed",
        type=int,
        default=None,
        help="the engine's deployment key (default: random per process, so the adaptive "
        "policy samples other requests each run)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
    return p


def configs_from_args(args) -> list:
    from .simulator import SimConfig

    if args.memory is not None and (args.state_memory is not None or args.kv_memory is not None):
        raise SystemExit("statecache simulate: --memory excludes --state-memory and --kv-memory")
    common = dict(
        geometry=args.geometry,
        concurrency=args.concurrency,
        max_batched_tokens=args.max_batched_tokens,
        interval_tokens=args.interval,
        peer_interval_tokens=args.peer_interval,
        ladder_tokens=args.ladder,
        arrivals=args.arrivals,
        max_output_tokens=args.max_output_tokens or None,
        seed=args.seed,
        hash_seed=args.hash_seed,
    )
    tiers = dict(
        host_memory=args.host_memory,
        shared_tier_memory=args.shared_memory,
        host_gbps=args.host_bandwidth,
        remote_gbps=args.remote_bandwidth,
        tier_kv_share=args.tier_kv_share,
    )
    if (args.host_memory or args.shared_memory) and args.memory is None:
        raise SystemExit(
            "statecache simulate: --host-memory / --shared-memory need --memory "
            "(tiers hold PAGE images, which live in the shared KV budget)"
        )
    out = []
    if args.memory is not None:
        for m in args.memory:
            out += [
                SimConfig(policy=p, memory=m, kv_memory=None, state_memory=None, **common, **tiers)
                for p in args.policies
            ]
    else:
        kv = args.kv_memory if args.kv_memory is not None else report.parse_bytes(DEFAULT_KV_MEMORY)
        states = args.state_memory or _byte_list(DEFAULT_STATE_MEMORY)
        for s in states:
            out += [SimConfig(policy=p, kv_memory=kv, state_memory=s, **common) for p in args.policies]
    return out


def summary(results: list[dict]) -> str:
    """State-gated hit rate: one row per budget, one column per policy."""
    policies = list(dict.fromkeys(r["policy"] for r in results))
    budgets = sorted({r["state_memory"] for r in results})
    by = {(r["state_memory"], r["policy"]): r for r in results}
    cols = [
        ("budget", lambda b: report.format_bytes(b)),
        ("KV-only", lambda b: f"{100 * by[(b, policies[0])]['kv_hit_rate']:.1f}%"),
    ]

    def state_rate(policy: str):
        return lambda b: f"{100 * by[(b, policy)]['state_hit_rate']:.1f}%" if (b, policy) in by else "-"

    cols += [(p, state_rate(p)) for p in policies]
    rows = [[name for name, _ in cols]] + [[get(b) for _, get in cols] for b in budgets]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(args) -> int:
    from .simulator import sweep
    from .trace import load_trace

    try:
        configs = configs_from_args(args)
        trace = load_trace(args.trace, limit=args.limit)
    except (ValueError, OSError) as e:
        print(f"statecache simulate: {e}", file=sys.stderr)
        return 2
    progress = not args.no_progress and sys.stderr.isatty()
    try:
        results = sweep(trace, configs, jobs=args.jobs, progress=progress)
    except ValueError as e:
        print(f"statecache simulate: {e}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(report.to_json(results))
    else:
        g = PRESETS[args.geometry]
        shared = args.memory is not None
        print(
            f"trace {args.trace}: {len(trace)} requests, unbounded prefix-block ceiling "
            f"{100 * results[0]['ideal_block_hit_rate']:.1f}%; geometry {g.name} "
            f"({report.format_bytes(g.state_bytes)} state, {g.kv_bytes_per_token} B KV/token); "
            + (
                "shared memory (KV + PAGE images)"
                if shared
                else f"KV {report.format_bytes(results[0]['config']['kv_memory'])}"
            )
            + f"; concurrency {args.concurrency}"
            + (f"; outputs capped at {args.max_output_tokens} tokens" if args.max_output_tokens else "")
        )
        for name in dict.fromkeys(r["policy"] for r in results):
            print(f"\n[{name}] {POLICIES[name].description}")
            print(report.table([r for r in results if r["policy"] == name]))
        print("\nstate-gated token hit rate by " + ("memory" if shared else "state memory"))
        print(summary(results))
        if args.host_memory or args.shared_memory:
            print(
                f"\nresumed from each tier (host {report.format_bytes(args.host_memory)} at "
                f"{args.host_bandwidth:g} GB/s, shared {report.format_bytes(args.shared_memory)} "
                f"at {args.remote_bandwidth:g} GB/s; loads charged to the simulated clock)"
            )
            for r in results:
                t = r["tier_hit_rate"]
                print(
                    f"  {r['policy']:<18} {report.format_bytes(r['state_memory']):>9}: "
                    + ", ".join(f"{k} {100 * v:.1f}%" for k, v in t.items())
                )
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(report.to_json(results))
    if args.plot:
        report.plot_hit_rates(results, args.plot, title=f"{args.trace} - {args.geometry}")
        if args.json != "-":
            print(f"\nplot: {args.plot}")
    return 0
