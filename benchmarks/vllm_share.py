"""The connector row of bench_vllm.py alone: the share of the connector's
scheduler-side hooks in vLLM's scheduler step (wall, as bench_vllm.py
computes it) and, with ``--cpu``, in thread CPU time (the harness's
``time_hooks``, which preemption by other processes does not inflate; it
adds about 4.5 us to each hook's wall figure on a VM where
``time.thread_time`` is a 4 us system call, so its wall share overstates).
The share is of vLLM's scheduler alone (``schedule`` + ``update_from_output``,
the target's denominator); the share of the whole engine step, forward
included, is printed beside it for scale, not as the result.

    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --cpu                 # the bench's 80 trace requests
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --workload multi-turn --cpu
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --workload multi-turn --max-tokens 512  # longer answers
    TREE=/other/checkout /opt/vllm-venv/bin/python benchmarks/vllm_share.py  # that tree's statecache
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --null --cpu           # the floor: hooks that do nothing
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --internals            # where a hook's time goes
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --trace conversation_trace.jsonl --requests 500
    /opt/vllm-venv/bin/python benchmarks/vllm_share.py --trace-max-tokens 16    # answers cut to 16: the worst case
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

TREE = os.environ.get("TREE") or str(Path(__file__).resolve().parents[1])
for sub in ("python", "benchmarks", os.path.join("tests", "python")):
    sys.path.insert(0, os.path.join(TREE, sub))

import bench_vllm as bv  # noqa: E402
import vllm_support as vs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="trace", choices=("trace", "multi-turn"))
    ap.add_argument("--cpu", action="store_true", help="also thread CPU time and per-call times (time_hooks)")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument(
        "--max-tokens", type=int, default=64, help="multi-turn: tokens each answer decodes (the bench's: 64)"
    )
    ap.add_argument("--max-num-seqs", type=int, default=4, help="vLLM's batch (the bench's: 4)")
    ap.add_argument("--blocks", type=int, default=48, help="vLLM's KV budget in blocks (the bench's: 48)")
    ap.add_argument(
        "--null",
        action="store_true",
        help="the floor: the connector's scheduler object does nothing (no hits, no saves)",
    )
    ap.add_argument(
        "--internals",
        action="store_true",
        help="also time the scheduler object's inner steps and its arena calls (adds about 0.3 us a call)",
    )
    ap.add_argument("--trace", default=None, help="trace: any Mooncake-format file (the bench's: the shared one)")
    ap.add_argument("--requests", type=int, default=80, help="trace: its first requests that fit (the bench's: 80)")
    ap.add_argument(
        "--trace-max-tokens",
        type=int,
        default=512,
        help="trace: each answer's tokens, the trace's output_length cut to this (the bench's: 512; "
        "16 makes events dense, the share's worst case)",
    )
    ap.add_argument("--host-gib", type=float, default=0.5, help="the connector's host tier, GiB (the bench's: 0.5)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    log_dir = tempfile.mkdtemp(prefix="vllm-share-")
    model = bv.vs_model(log_dir)
    kw = vs.base_llm_kwargs(
        model,
        max_num_seqs=a.max_num_seqs,
        num_gpu_blocks_override=a.blocks,
        kv_transfer_config=vs.connector_config({"host_memory": int(a.host_gib * (1 << 30))}),
    )
    e = vs.Engine("sc", kw, log_dir)
    if a.null:
        e.call("null_hooks")
    if a.cpu:
        e.call("time_hooks")
    if a.internals:
        e.call("time_internals")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    if a.workload == "trace":
        prompts, outs, arrivals = bv.trace_requests(a.trace or bv.TRACE, a.requests, 32, 4096, a.trace_max_tokens)
        e.call("generate", prompts=prompts, max_tokens=outs, logprobs=0, arrivals=arrivals)
    else:
        vs.run_turns(e, vs.first_prompts(a.conversations, 0), a.turns, a.max_tokens)
    wall = time.perf_counter() - t0
    tm, fu = e.call("timing"), e.call("funnel")
    ht = e.call("hook_times") if a.cpu else None
    inner = e.call("internals") if a.internals else None
    e.close()
    sched = tm["schedule_s"] + tm["update_s"]
    conn = fu["scheduler_seconds"]
    hooks = {k[len("scheduler_seconds_") :]: v for k, v in fu.items() if k.startswith("scheduler_seconds_")}
    print(
        f"[{a.tag}] {a.workload} seqs {a.max_num_seqs} wall {wall:.1f}s load {load0:.1f} steps {tm['steps']} sched {1e3 * sched:.1f}ms "
        f"({1e3 * sched / tm['steps']:.3f} ms/step) conn {1e3 * conn:.2f}ms WALL SHARE {100 * conn / sched:.2f}% "
        f"(of the engine step with the forward, {1e3 * tm['engine_step_s'] / tm['steps']:.2f} ms: "
        f"{100 * conn / tm['engine_step_s']:.2f}%) "
        f"resumed host {fu.get('tokens_resumed_host')} tail {fu.get('tokens_resumed_tail')} "
        f"saved {fu.get('values_saved')} host evictions {fu.get('host_evictions')}"
    )
    print("  by hook: " + ", ".join(f"{k} {100 * v / sched:.2f}% ({1e6 * v:.0f}us)" for k, v in sorted(hooks.items())))
    if ht:
        for name, d in ht["hooks"].items():
            print(
                f"  {name:30} n {d['n']:5d} sum {1e3 * d['sum']:7.2f} ms p50 {1e6 * d['p50']:7.1f} us "
                f"p99 {1e6 * d['p99']:7.1f}"
            )
        cpu = ht["cpu_s"]
        vllm_cpu = cpu.get("schedule", 0) + cpu.get("update_from_output", 0)
        hk = {k: v for k, v in cpu.items() if k in vs.SCHEDULER_HOOKS}
        print(
            f"  CPU: vLLM sched {1e3 * vllm_cpu:.1f} ms, hooks {1e3 * sum(hk.values()):.2f} ms, "
            f"CPU SHARE {100 * sum(hk.values()) / vllm_cpu:.2f}%: "
            + ", ".join(f"{k} {100 * v / vllm_cpu:.2f}%" for k, v in hk.items())
        )
        print("  gc:", {k: (round(v * 1e3, 2) if k.endswith("_s") else v) for k, v in sorted(ht["gc"].items())})
    for label, (us, n) in sorted((inner or {}).items(), key=lambda kv: -kv[1][0]):
        print(f"  {label:30} {us:7d} us in {n:4d} calls, {us / max(n, 1):6.1f} us a call")


if __name__ == "__main__":
    main()
