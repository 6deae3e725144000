"""Copy-engine bandwidth on one GPU: PAGE stores of a Qwen3-Next-sized image.

Every figure comes from one run. Each case is timed as CUDA-graph replays
(events around each replay, the L2 flushed before each, median of --reps):
  ceiling      a contiguous ``copy_`` of the batch's bytes
  torch loops  per-segment ``index_select`` into the image, ``index_copy_`` into units
  statecache   StateCopyExecutor: descriptor H2D + one kernel launch
TB/s counts bytes read + written (2 x payload). Prints a table last and
writes every number as JSON to --out.

State per request (36 GDN layers, TP=2): conv [36, slots, 3, 4096] bf16 and
recurrent [36, slots, 16, 128, 128] fp32, 38.6 MB.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

import statecache as sc

LAYERS = 36
UNIT_SIZES = [64 << 10, 256 << 10, 2 << 20]
BATCHES = [1, 4, 16, 64]


def time_replays(fn, reps: int, flush: torch.Tensor) -> float:
    """Median seconds of `fn` over `reps` timed calls, L2 flushed before each."""
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.add_(1)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3


def graph_of(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the graph (allocations, lazy init)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def fill_random(t: torch.Tensor) -> None:
    t.view(torch.uint8).copy_(torch.randint(1, 255, (t.numel() * t.element_size(),),
                                            dtype=torch.uint8, device=t.device).view(t.view(torch.uint8).shape))


def bench(args) -> dict:
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    flush = torch.empty(args.flush_mb << 20, dtype=torch.uint8, device=dev)
    slots = max(BATCHES)
    conv = torch.empty(LAYERS, slots, 3, 4096, dtype=torch.bfloat16, device=dev)
    rec = torch.empty(LAYERS, slots, 16, 128, 128, dtype=torch.float32, device=dev)
    for t in (conv, rec):
        fill_random(t)
    state = sc.StateLayout([conv, rec])
    image = state.image_bytes
    rng = random.Random(0)
    rows = []
    segs = [(t, l) for t in (conv, rec) for l in range(LAYERS)]
    for unit in UNIT_SIZES:
        k = -(-image // unit)
        num_units = slots * k + 8
        kv = torch.empty(num_units, unit // 2, dtype=torch.bfloat16, device=dev)
        fill_random(kv)
        page = sc.PageLayout([kv])
        ex = sc.StateCopyExecutor(state, page, max_num_seqs=slots)
        kv8 = kv.view(torch.uint8)
        for n in BATCHES:
            ids = rng.sample(range(num_units), n * k)
            ops = [sc.CheckpointStoreOp(src_slot=s, unit_ids=tuple(ids[s * k:(s + 1) * k]),
                                        total_bytes=image, layout_id=ex.layout_id) for s in range(n)]
            payload = n * image
            # Ceiling: one contiguous copy of the same bytes.
            src = torch.empty(payload, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            fill_random(src)
            g_ceiling = graph_of(lambda: dst.copy_(src))
            t_ceiling = time_replays(g_ceiling.replay, args.reps, flush)
            del g_ceiling, src, dst
            # Torch loops: gather each segment's rows into a padded image, scatter units.
            slot_idx = torch.arange(n, device=dev)
            unit_idx = torch.tensor(ids, device=dev)
            img = torch.empty(n, k * unit, dtype=torch.uint8, device=dev)

            def torch_store():
                pos = 0
                for t, layer in segs:
                    rows_ = t[layer].index_select(0, slot_idx).view(n, -1).view(torch.uint8)
                    img[:, pos:pos + rows_.shape[1]].copy_(rows_)
                    pos += rows_.shape[1]
                kv8.index_copy_(0, unit_idx, img.view(n * k, unit))

            g_torch = graph_of(torch_store)
            t_torch = time_replays(g_torch.replay, args.reps, flush)
            # Check the torch loop and statecache agree on the units' image bytes.
            g_torch.replay()
            torch.cuda.synchronize()
            want = kv8[unit_idx].view(n, k * unit)[:, :image].clone()
            kv8[unit_idx] = 0
            del g_torch, img
            # statecache: a graph of descriptor copy + one kernel, replayed.
            plan = ex.plan(stores=ops)
            cap = ex.capture(max_spans=plan.num_spans)
            cap.stage(stores=ops)
            t_sc = time_replays(cap.graph.replay, args.reps, flush)
            torch.cuda.synchronize()
            got = kv8[unit_idx].view(n, k * unit)[:, :image]
            assert torch.equal(got, want), "statecache and the torch loop disagree"
            # The kernel alone (descriptors already on the device), and the
            # other kernel builds, for the record.
            extra = {}
            g_kernel = graph_of(lambda: cap._engine.launch(torch.cuda.current_stream().cuda_stream,
                                                           cap.max_spans, False))
            extra["kernel_only_us"] = time_replays(g_kernel.replay, args.reps, flush) * 1e6
            del g_kernel
            # Host cost of one batch: plan + stage (validation included).
            t0 = time.perf_counter()
            for _ in range(10):
                cap.stage(stores=ops)
                cap.graph.replay()
                cap.consumed()
            torch.cuda.synchronize()
            host = (time.perf_counter() - t0) / 10
            del cap
            tb = lambda t: 2 * payload / t / 1e12  # noqa: E731
            rows.append(dict(unit_kib=unit >> 10, ops=n, mbytes=payload / 1e6, spans=plan.num_spans,
                             ceiling_tbs=tb(t_ceiling), torch_tbs=tb(t_torch), statecache_tbs=tb(t_sc),
                             ceiling_us=t_ceiling * 1e6, torch_us=t_torch * 1e6, statecache_us=t_sc * 1e6,
                             vs_ceiling=t_ceiling / t_sc, vs_torch=t_torch / t_sc,
                             batch_wall_us=host * 1e6, **extra))
        del ex, kv, kv8, page
        torch.cuda.empty_cache()

    # A single 1 MiB op from graph replay (32 layers x 4x64x32 fp32, 256 KiB units).
    small = torch.empty(32, 8, 4, 64, 32, dtype=torch.float32, device=dev)
    fill_random(small)
    kv = torch.empty(64, 128 << 10, dtype=torch.bfloat16, device=dev)
    fill_random(kv)
    ex = sc.StateCopyExecutor(sc.StateLayout([small]), sc.PageLayout([kv]), max_num_seqs=4)
    op = sc.CheckpointStoreOp(src_slot=3, unit_ids=(9, 2, 40, 17), total_bytes=ex.spec.image_bytes,
                              layout_id=ex.layout_id)
    plan = ex.plan(stores=[op])
    cap = ex.capture(max_spans=plan.num_spans)
    cap.stage(stores=[op])
    t_small = time_replays(cap.graph.replay, max(args.reps, 200), flush)
    eng = cap._engine
    # The kernel on one contiguous span (no scatter): its own ceiling.
    nbytes = 16 * image
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    fill_random(src)
    raw = sc.SpanPlanner([src.data_ptr(), 0, nbytes], [src.data_ptr(), 0, nbytes],
                         [dst.data_ptr(), 0, nbytes], 1, 1, "raw")
    raw_op = sc.CheckpointStoreOp(src_slot=0, unit_ids=(0,), total_bytes=nbytes, layout_id="raw")
    e = sc.GpuCopyEngine(dev.index or 0, 4, 1)
    e.stage(raw.plan(stores=[raw_op]))
    g = graph_of(lambda: e.launch(torch.cuda.current_stream().cuda_stream, 0))
    contig = {"mbytes": nbytes / 1e6, "kernel_us": time_replays(g.replay, args.reps, flush) * 1e6}
    g = graph_of(lambda: dst.copy_(src))
    contig["copy_us"] = time_replays(g.replay, args.reps, flush) * 1e6
    assert torch.equal(src, dst)
    del g, e, src, dst
    return dict(contiguous=contig,device=props.name, sms=props.multi_processor_count, image_bytes=image,
                grid_blocks=eng.grid_blocks, chunk_bytes=sc.GpuCopyEngine.chunk_bytes, reps=args.reps,
                rows=rows, one_mib_op_us=t_small * 1e6,
                one_mib_op_bytes=ex.spec.image_bytes)


def table(r: dict) -> str:
    out = [f"{r['device']} ({r['sms']} SMs), grid {r['grid_blocks']} blocks, chunk {r['chunk_bytes']} B, "
           f"image {r['image_bytes'] / 1e6:.1f} MB/request, median of {r['reps']} graph replays, "
           "TB/s = (read + written) / time; batch wall = plan + stage + replay, host-serialized",
           f"{'unit':>8} {'ops':>4} {'MB':>7} {'spans':>6} | {'ceiling':>8} {'torch':>8} {'sc':>8} TB/s"
           f" | {'sc/ceil':>7} {'sc/torch':>8} | {'sc us':>8} {'kernel us':>9} {'batch wall us':>13}"]
    for x in r["rows"]:
        out.append(f"{x['unit_kib']:>6}Ki {x['ops']:>4} {x['mbytes']:>7.1f} {x['spans']:>6} | "
                   f"{x['ceiling_tbs']:>8.2f} {x['torch_tbs']:>8.2f} {x['statecache_tbs']:>8.2f}      | "
                   f"{x['vs_ceiling']:>7.3f} {x['vs_torch']:>7.2f}x | {x['statecache_us']:>8.1f} "
                   f"{x['kernel_only_us']:>9.1f} {x['batch_wall_us']:>13.1f}")
    c = r["contiguous"]
    out.append(f"one contiguous {c['mbytes']:.0f} MB span: statecache kernel {c['kernel_us']:.1f} us, "
               f"copy_ {c['copy_us']:.1f} us ({c['copy_us'] / c['kernel_us']:.3f} of copy_)")
    big = [x for x in r["rows"] if x["mbytes"] >= 16]
    out.append(f"targets: min sc/ceiling over batches >= 16 MB: {min(x['vs_ceiling'] for x in big):.3f} "
               f"(>= 0.90); min sc/torch: {min(x['vs_torch'] for x in r['rows']):.2f}x (>= 1.4x); "
               f"1 MiB op from graph replay: {r['one_mib_op_us']:.2f} us (<= 10 us)")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--flush-mb", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not (torch.cuda.is_available() and sc.has_gpu_kernels):
        raise SystemExit("bench_copy needs a GPU and statecache built with GPU kernels")
    r = bench(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)
    print(table(r))


if __name__ == "__main__":
    main()
