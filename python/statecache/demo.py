"""``statecache demo``: a multi-turn workload on a real hybrid model, served
twice -- prefix caching on, then off -- with identical greedy outputs.

Several conversations share one system prompt; each runs ``--turns`` turns,
and some branch off another conversation's history part way. Turns that are
ready run concurrently through the engine's continuous batching.
"""

from __future__ import annotations

import argparse
import time


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="multi-turn chat on a tiny hybrid model, prefix caching on vs off",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="qwen3next",
        choices=["qwen3next", "granite"],
        help="Qwen3-Next (GDN + attention) or GraniteMoeHybrid (Mamba2 + attention)",
    )
    p.add_argument(
        "--mechanism",
        default="page",
        choices=["fork", "page"],
        help="fork: hand the slot over; page: copy the state into KV page units",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--conversations", type=int, default=4, help="conversations (default 4)")
    p.add_argument("--seed", type=int, default=0, help="weights and workload seed")
    p.add_argument(
        "--interval", type=int, default=-1, help="checkpoint_interval_tokens: -1 anchor+demand, 0 off, N ladder"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--tiers",
        action="store_true",
        help="tiers below GPU memory: GPU only, + host tier, then a fresh process "
        "resuming from Mooncake Store (starts and stops mooncake_master)",
    )
    p.add_argument(
        "--tiers-resume", nargs=2, metavar=("MASTER", "METADATA"), help=argparse.SUPPRESS
    )  # the fresh process of --tiers
    return p


# --------------------------------- run ------------------------------------ #


def run(args) -> int:
    if args.tiers or args.tiers_resume:
        from statecache import demo_tiers

        return demo_tiers.run(args)
    try:
        import torch
        from tqdm import tqdm

        from statecache.engine.conversations import make_workload, serve
        from statecache.models import build_engine, build_model
    except ImportError as e:  # torch, tqdm, or a transformers too old: say which
        import sys

        print(f"statecache demo: {e}", file=sys.stderr)
        return 2

    if args.turns < 2:
        raise SystemExit(f"--turns={args.turns}: need at least 2")
    if args.conversations < 1:
        raise SystemExit(f"--conversations={args.conversations}: need at least 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device={args.device}: no CUDA device is visible")
    # A tiny model gains nothing from intra-op threads, and on a busy machine
    # their synchronisation costs more than the arithmetic.
    torch.set_num_threads(1)
    model_and_geom = build_model(args.model, seed=args.seed, device=args.device)
    new_tokens = 6
    n_req = args.conversations * args.turns + ((args.conversations + 1) // 2) * (args.turns - max(1, args.turns // 2))
    results, times, funnels = {}, {}, {}
    bar = tqdm(total=2 * n_req, desc="serving", unit="turn", disable=args.no_progress)
    for caching in (True, False):
        engine = build_engine(
            args.model,
            args.mechanism,
            seed=args.seed,
            device=args.device,
            enable_prefix_caching=caching,
            model_and_geom=model_and_geom,
            checkpoint_interval_tokens=args.interval,
        )
        bar.set_postfix_str("prefix caching " + ("on" if caching else "off"))
        convs, branches, at = make_workload(args.seed, args.conversations, args.turns)
        t0 = time.perf_counter()
        results[caching] = serve(engine, convs, branches, at, new_tokens, bar)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times[caching] = time.perf_counter() - t0
        funnels[caching] = engine.checkpoint_funnel()
    bar.close()
    print(report(args, results, times, funnels))
    on, off = results[True], results[False]
    same = all(a.output_token_ids == b.output_token_ids for a, b in zip(on, off))
    return 0 if same else 1


def report(args, results, times, funnels) -> str:
    on, off = results[True], results[False]
    lines = [f"model={args.model} mechanism={args.mechanism} device={args.device} seed={args.seed}", ""]
    hdr = f"{'conv':<5} {'turn':>4} {'prompt':>6} {'resumed':>7} {'state from':>10} {'computed':>8}"
    lines += [hdr, "-" * len(hdr)]
    for r in sorted(on, key=lambda r: (r.request_id[0], r.request_id[1])):
        name, turn = r.request_id
        lines.append(
            f"{name:<5} {turn:>4} {r.num_prompt_tokens:>6} {r.num_cached_tokens:>7} "
            f"{r.state_source:>10} {r.prefill_computed:>8}"
        )
    computed_on = sum(r.prefill_computed for r in on)
    computed_off = sum(r.prefill_computed for r in off)
    saved = computed_off - computed_on
    n_tok = sum(len(r.output_token_ids) for r in on)
    same_tok = sum(sum(x == y for x, y in zip(a.output_token_ids, b.output_token_ids)) for a, b in zip(on, off))
    diff = 0.0
    for a, b in zip(on, off):
        for x, y in zip(a.logits, b.logits):
            diff = max(diff, float((x - y).abs().max()))
    f = funnels[True]
    lines += [
        "",
        f"prefill tokens computed: {computed_on} with prefix caching, {computed_off} without "
        f"-> saved {saved} ({100.0 * saved / max(computed_off, 1):.1f}%)",
        f"wall time: {times[True]:.2f} s with, {times[False]:.2f} s without",
        f"generated tokens identical: {same_tok}/{n_tok} "
        f"({'all identical' if same_tok == n_tok else 'MISMATCH'}); "
        f"max |logit difference| {diff:.2e}",
        "checkpoints: "
        + ", ".join(
            f"{k}={f.get(k, 0)}"
            for k in (
                "checkpoints_requested",
                "checkpoints_kept",
                "checkpoints_dropped",
                "checkpoints_evicted",
                "checkpoints_orphaned",
                "hits_cut_short",
            )
        ),
    ]
    return "\n".join(lines)
