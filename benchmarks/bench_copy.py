"""Copy-engine bandwidth on real KV page layouts: PAGE stores and restores.

Every ratio compares figures measured in the same run. Each case is timed as
CUDA-graph replays (events around each replay, the L2 flushed before each,
median of --reps):
  copy_        a contiguous ``copy_`` of the batch's bytes (the ceiling)
  torch        per-row ``index_select`` into a padded image, ``index_copy_`` into the
               page rows (stores only; the baseline a user would write)
  sc           StateCopyExecutor graph: descriptor fetch kernel + the copy kernel
  kernel       the kernel alone (descriptors already on the device)
  whole        plan + stage + replay, host-serialized, per batch (wall clock over
               rotating op sets, so consecutive batches touch different memory)
  serial       one eager batch from an idle GPU: the executor call (checks, plan,
               launch: the batch rides in the kernel's parameters when small)
               through the end of its kernel, wall clock, L2 flushed and the
               GPU idle before each; against copy_ timed the same way ("serial
               copy_") and against the graph-timed copy_ above
  host         plan + stage alone (tensor checks, validation, descriptors), median
TB/s counts bytes read + written (2 x payload).

Layouts (--layouts): state = 36 GDN layers (conv [36, slots, 3, 4096] bf16 +
recurrent [36, slots, 16, 128, 128] fp32, 38.6 MB) into
  kv16   12 tensors [2, blocks, 16, 2, 256] bf16, unit_dim 1 (24 rows of 16 KiB a unit)
  kv32   12 tensors [blocks, 2, 16, 2, 256] bf16, unit_dim 0 (12 rows of 32 KiB)
  flat   1 tensor, one 384 KiB row a unit
and hybrid-7b: 24 Mamba2 layers (conv [24, slots, 8448, 4] fp16 + SSM [24, slots, 32, 128, 128]
fp16, 26.8 MB) into its 4 attention layers [2, blocks, 16, 32, 128] fp16, unit_dim 1.

``--devices N``: the kv16 layout at 16 ops on each of N GPUs from one process
(one executor and graph per device), all replayed together: aggregate and
per-GPU bandwidth against the one-GPU figure of the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

import statecache as sc
from statecache import _C

BATCHES = [1, 4, 16, 64]
GDN_LAYERS = 36


def gdn_state(slots, dev):
    return [
        torch.empty(GDN_LAYERS, slots, 3, 4096, dtype=torch.bfloat16, device=dev),
        torch.empty(GDN_LAYERS, slots, 16, 128, 128, dtype=torch.float32, device=dev),
    ], 1


def hybrid_state(slots, dev):
    return [
        torch.empty(24, slots, 8448, 4, dtype=torch.float16, device=dev),
        torch.empty(24, slots, 32, 128, 128, dtype=torch.float16, device=dev),
    ], 1


def kv16(blocks, dev):
    return [torch.empty(2, blocks, 16, 2, 256, dtype=torch.bfloat16, device=dev) for _ in range(12)], 1


def kv32(blocks, dev):
    return [torch.empty(blocks, 2, 16, 2, 256, dtype=torch.bfloat16, device=dev) for _ in range(12)], 0


def flat(blocks, dev):
    return [torch.empty(blocks, 384 << 10, dtype=torch.uint8, device=dev)], 0


def hybrid_kv(blocks, dev):
    return [torch.empty(2, blocks, 16, 32, 128, dtype=torch.float16, device=dev) for _ in range(4)], 1


LAYOUTS = {
    "kv16": ("12 x [2, blocks, 16, 2, 256] bf16, unit_dim 1 (16 KiB rows)", gdn_state, kv16),
    "kv32": ("12 x [blocks, 2, 16, 2, 256] bf16, unit_dim 0 (32 KiB rows)", gdn_state, kv32),
    "flat": ("1 tensor, one 384 KiB row a unit", gdn_state, flat),
    "hybrid7b": ("hybrid-7b: 24 x (conv + SSM) fp16 into 4 x [2, blocks, 16, 32, 128] fp16", hybrid_state, hybrid_kv),
}


def time_replays(fn, reps: int, flush: torch.Tensor) -> float:
    """Median seconds of `fn` over `reps` timed calls, L2 flushed before each."""
    return time_many([fn], reps, flush)[0]


def time_many(fns, reps: int, flush: torch.Tensor) -> list[float]:
    """Median seconds of each of `fns`, timed interleaved (fn0, fn1, ..., fn0,
    ...) so that every ratio between them compares like conditions; the L2 is
    flushed before each call."""
    for _ in range(3):
        for fn in fns:
            fn()
    ev = [
        [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)] for _ in fns
    ]
    for i in range(reps):
        for fn, e in zip(fns, ev):
            flush.add_(1)
            e[i][0].record()
            fn()
            e[i][1].record()
    torch.cuda.synchronize()
    return [statistics.median(a.elapsed_time(b) for a, b in e) / 1e3 for e in ev]


def current_stream() -> int:
    return torch.cuda.current_stream().cuda_stream


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
    b = t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
    g = torch.Generator(device=t.device).manual_seed(t.numel() % 9973)
    b.copy_(torch.randint(1, 255, b.shape, dtype=torch.uint8, device=t.device, generator=g))


def u8_rows(t: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """The [count, row_bytes] uint8 views of a tensor's rows along dim 0 or 1."""
    parts = [t[i] for i in range(t.shape[0])] if dim == 1 else [t]
    return [p.reshape(p.shape[0], -1).view(torch.uint8) for p in parts]


class World:
    """One layout pair on one device, with an executor and its pools sized for 64 ops."""

    def __init__(self, name, dev, max_ops):
        _, make_state, make_page = LAYOUTS[name]
        self.name, self.dev, self.max_ops = name, dev, max_ops
        state, sdim = make_state(2 * max_ops, dev)
        for t in state:
            fill_random(t)
        self.state = sc.StateLayout(state, slot_dim=sdim)
        probe, _ = make_page(1, "meta")  # one block: each tensor's share of a unit
        unit = sum(t.numel() * t.element_size() for t in probe)
        self.k = -(-self.state.image_bytes // unit)
        self.units = max_ops * self.k + 8
        page, pdim = make_page(self.units, dev)
        for t in page:
            fill_random(t)
        self.page = sc.PageLayout(page, unit_dim=pdim)
        self.ex = sc.StateCopyExecutor(self.state, self.page, max_num_seqs=max_ops)
        self.state_rows = [r for t in state for r in u8_rows(t, sdim)]
        self.page_rows = [r for t in page for r in u8_rows(t, pdim)]
        self.image = self.state.image_bytes
        self.unit = self.page.unit_bytes

    def ops(self, n, rng, first_slot=0):
        ids = rng.sample(range(self.units), n * self.k)
        lid, img = self.ex.layout_id, self.image
        stores = [
            sc.CheckpointStoreOp(
                src_slot=first_slot + s,
                unit_ids=tuple(ids[s * self.k : (s + 1) * self.k]),
                total_bytes=img,
                layout_id=lid,
            )
            for s in range(n)
        ]
        return stores, ids


def bench_layout(name, args, flush, rng):
    dev = torch.device("cuda", 0)
    w = World(name, dev, max(args.batches))
    rows = []
    for n in args.batches:
        stores, ids = w.ops(n, rng)
        restores = [
            sc.CheckpointRestoreOp(
                dst_slot=w.max_ops + s, unit_ids=op.unit_ids, total_bytes=w.image, layout_id=w.ex.layout_id
            )
            for s, op in enumerate(stores)
        ]
        payload = n * w.image
        r = dict(layout=name, ops=n, mbytes=payload / 1e6, units_per_op=w.k)
        # Ceiling: one contiguous copy of the same bytes.
        src = torch.empty(payload, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        g_copy = graph_of(lambda dst=dst, src=src: dst.copy_(src))
        copy_pair = (src, dst)
        # Torch baseline (stores): gather rows into a padded image, scatter unit rows.
        slot_idx = torch.arange(n, device=dev)
        unit_idx = torch.tensor(ids, device=dev)
        img = torch.zeros(n, w.k * w.unit, dtype=torch.uint8, device=dev)
        cols, pos = [], 0
        for pr in w.page_rows:
            cols.append((pr, pos, pr.shape[1]))
            pos += pr.shape[1]

        # The loop's values are bound as defaults: graph_of calls it now, and
        # they are deleted before the next iteration.
        def torch_store(w=w, img=img, slot_idx=slot_idx, unit_idx=unit_idx, cols=cols, n=n):
            p = 0
            for sr in w.state_rows:
                img[:, p : p + sr.shape[1]].copy_(sr.index_select(0, slot_idx))
                p += sr.shape[1]
            units = img.view(n * w.k, w.unit)
            for pr, off, nb in cols:
                pr.index_copy_(0, unit_idx, units[:, off : off + nb])

        g_torch = graph_of(torch_store)
        torch.cuda.synchronize()
        want = [pr[unit_idx].clone() for pr in w.page_rows]
        for pr in w.page_rows:
            pr[unit_idx] = 0
        # statecache: a graph for the stores and one for the restores, each
        # also timed as the kernel alone (descriptors already on the device).
        cap = w.ex.capture(max_paged_ops=n, max_slot_copies=0)
        cap.replay(stores=stores)
        torch.cuda.synchronize()
        ok = all(torch.equal(pr[unit_idx], x) for pr, x in zip(w.page_rows, want))
        assert ok, f"{name}: statecache and the torch loop disagree"
        del want
        cap_r = w.ex.capture(max_paged_ops=n, max_slot_copies=0)
        cap_r.replay(restores=restores)
        torch.cuda.synchronize()
        for sr in w.state_rows:  # images are whole slots here
            assert torch.equal(sr[w.max_ops : w.max_ops + n], sr[:n]), f"{name}: a restore differs from its source"
        g_kernel = graph_of(lambda cap=cap: cap._engine.launch(current_stream(), False, False))
        g_kernel_r = graph_of(lambda cap_r=cap_r: cap_r._engine.launch(current_stream(), False, False))
        times = time_many(
            [g_copy.replay, g_torch.replay, cap.graph.replay, g_kernel.replay, cap_r.graph.replay, g_kernel_r.replay],
            args.reps,
            flush,
        )
        for key, t in zip(("copy", "torch", "sc", "kernel", "sc_restore", "kernel_restore"), times):
            r[f"{key}_us"] = t * 1e6
        del g_copy, g_torch, g_kernel, g_kernel_r, img, src, dst, cap_r
        host = []
        for _ in range(args.host_reps):
            t0 = time.perf_counter()
            cap.stage(stores=stores)
            host.append(time.perf_counter() - t0)
            cap.graph.replay()
            cap.consumed()
            torch.cuda.synchronize()
        r["host_us"] = statistics.median(host) * 1e6
        # Whole batch, host-serialized: rotate op sets over the pools so that
        # consecutive batches touch different memory (as a serving loop does).
        sets = [w.ops(n, rng, first_slot=(i * n) % w.max_ops)[0] for i in range(max(1, w.max_ops // n))]
        for i in range(3):
            cap.replay(stores=sets[i % len(sets)])
        torch.cuda.synchronize()
        reps = max(10, args.reps // 2)
        t0 = time.perf_counter()
        for i in range(reps):
            cap.replay(stores=sets[i % len(sets)])
        torch.cuda.synchronize()
        r["whole_us"] = (time.perf_counter() - t0) / reps * 1e6
        # Serial from an idle GPU, interleaved with a copy_ of the same bytes
        # timed the same way; eager calls, as a decode step with few checkpoints makes.
        src, dst = copy_pair
        ser, ser_copy = [], []
        for i in range(max(20, args.reps)):
            for acc in (ser, ser_copy):
                flush.add_(1)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if acc is ser:
                    w.ex(stores=sets[i % len(sets)])
                else:
                    dst.copy_(src)
                torch.cuda.synchronize()
                if i >= 3:  # warm-up
                    acc.append(time.perf_counter() - t0)
        r["serial_us"] = statistics.median(ser) * 1e6
        r["serial_copy_us"] = statistics.median(ser_copy) * 1e6
        r["serial_vs_serial_copy"] = r["serial_copy_us"] / r["serial_us"]
        del src, dst, copy_pair
        r["host_limit_us"] = n * 1.0 + 10.0
        tb = lambda us, payload=payload: 2 * payload / (us * 1e-6) / 1e12  # noqa: E731
        for key in ("copy", "torch", "sc", "kernel", "whole", "sc_restore", "kernel_restore", "serial"):
            r[f"{key}_tbs"] = tb(r[f"{key}_us"])
        for key in ("sc", "kernel", "whole", "sc_restore", "kernel_restore", "serial"):
            r[f"{key}_vs_copy"] = r["copy_us"] / r[f"{key}_us"]
        r["sc_vs_torch"] = r["torch_us"] / r["sc_us"]
        del cap
        rows.append(r)
    # Kernel builds side by side (the kernel alone, interleaved), at 1 and 16 ops.
    variants = {}
    for n in [b for b in (1, 16) if b in args.batches]:
        stores, _ = w.ops(n, rng)
        batch = w.ex.plan(stores=stores)
        engines, graphs = [], []
        for v in range(_C._GpuCopyEngine.num_variants):
            e = _C._GpuCopyEngine(0, w.ex._planner, 0, n, 1, v)
            e.stage(batch)
            e.launch(torch.cuda.current_stream().cuda_stream)
            engines.append(e)
            graphs.append(graph_of(lambda e=e: e.launch(torch.cuda.current_stream().cuda_stream, False, False)))
        times = time_many([g.replay for g in graphs], args.reps, flush)
        variants[n] = {str(v): t * 1e6 for v, t in enumerate(times)}
        del engines, graphs
    info = dict(
        pieces_per_op=w.ex._planner.pieces_per_paged_op,
        items_per_op=w.ex._engine.items_per_paged_op,
        grid_blocks=w.ex._engine.grid_blocks,
        image_bytes=w.image,
        unit_bytes=w.unit,
        variants_kernel_us=variants,
    )
    del w
    torch.cuda.empty_cache()
    return rows, info


def bench_small(args, flush):
    """One 1 MiB op from graph replay (32 layers x 4x64x32 fp32, 256 KiB units)."""
    dev = torch.device("cuda", 0)
    small = torch.empty(32, 8, 4, 64, 32, dtype=torch.float32, device=dev)
    kv = torch.empty(64, 128 << 10, dtype=torch.bfloat16, device=dev)
    for t in (small, kv):
        fill_random(t)
    ex = sc.StateCopyExecutor(sc.StateLayout([small]), sc.PageLayout([kv]), max_num_seqs=4)
    op = sc.CheckpointStoreOp(
        src_slot=3, unit_ids=(9, 2, 40, 17), total_bytes=ex.spec.image_bytes, layout_id=ex.layout_id
    )
    cap = ex.capture(max_paged_ops=1, max_slot_copies=0)
    cap.replay(stores=[op])
    g = graph_of(lambda: cap._engine.launch(torch.cuda.current_stream().cuda_stream, False, False))
    t, tk = time_many([cap.graph.replay, g.replay], max(args.reps, 200), flush)
    return dict(one_mib_op_us=t * 1e6, one_mib_op_kernel_us=tk * 1e6, one_mib_op_bytes=ex.spec.image_bytes)


def bench_contiguous(args, flush):
    """The kernel on one contiguous 618 MB row (no scatter) against copy_."""
    dev = torch.device("cuda", 0)
    nbytes = 16 * 38_633_472
    src = torch.empty(1, nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    fill_random(src)
    ex = sc.StateCopyExecutor(sc.StateLayout([src], slot_dim=0), sc.PageLayout([dst]), max_num_seqs=1)
    op = sc.CheckpointStoreOp(src_slot=0, unit_ids=(0,), total_bytes=nbytes, layout_id=ex.layout_id)
    cap = ex.capture(max_paged_ops=1, max_slot_copies=0)
    cap.replay(stores=[op])
    g = graph_of(lambda: cap._engine.launch(torch.cuda.current_stream().cuda_stream, False, False))
    out = dict(mbytes=nbytes / 1e6, kernel_us=time_replays(g.replay, args.reps, flush) * 1e6)
    g = graph_of(lambda: dst.copy_(src))
    out["copy_us"] = time_replays(g.replay, args.reps, flush) * 1e6
    assert torch.equal(src, dst)
    return out


def bench_devices(args):
    """The same kv16 batch (16 ops) on N devices at once, one executor and graph each."""
    n_dev = args.devices
    if torch.cuda.device_count() < n_dev:
        raise SystemExit(f"--devices {n_dev}: only {torch.cuda.device_count()} GPU(s) visible")
    rng = random.Random(1)
    worlds, caps = [], []
    for d in range(n_dev):
        with torch.cuda.device(d):
            w = World("kv16", torch.device("cuda", d), 16)
            stores, _ = w.ops(16, rng)
            cap = w.ex.capture(max_paged_ops=16, max_slot_copies=0)
            cap.stage(stores=stores)
            worlds.append(w)
            caps.append(cap)
    payload = 16 * worlds[0].image

    def run(devs, reps):
        for _ in range(3):
            for d in devs:
                caps[d].graph.replay()
        for d in devs:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for _ in range(reps):
            for d in devs:
                caps[d].graph.replay()
        for d in devs:
            torch.cuda.synchronize(d)
        return (time.perf_counter() - t0) / reps

    one = run([0], args.reps)
    alln = run(list(range(n_dev)), args.reps)
    per_gpu = 2 * payload / alln / 1e12
    return dict(
        devices=n_dev,
        mbytes_per_device=payload / 1e6,
        one_gpu_us=one * 1e6,
        all_us=alln * 1e6,
        one_gpu_tbs=2 * payload / one / 1e12,
        per_gpu_tbs=per_gpu,
        aggregate_tbs=per_gpu * n_dev,
        per_gpu_vs_one=one / alln,
    )


def table(r: dict) -> str:
    out = [
        f"{r['device']} ({r['sms']} SMs), median of {r['reps']} graph replays (L2 flushed), "
        "TB/s = (read + written) / time; x/copy_ = copy_ time / x time (same run)"
    ]
    hdr = (
        f"{'layout':>8} {'ops':>3} {'MB':>7} | {'copy_':>6} {'torch':>6} {'sc':>6} {'kernel':>6} "
        f"{'whole':>6} TB/s | {'sc':>5} {'kern':>5} {'whole':>5} {'rs':>5} {'rs kern':>7} /copy_ | "
        f"{'sc/torch':>8} | {'host us':>7} {'limit':>5} | {'serial us':>9} {'/copy_':>6} {'/ser copy_':>10}"
    )
    out.append(hdr)
    for x in r["rows"]:
        out.append(
            f"{x['layout']:>8} {x['ops']:>3} {x['mbytes']:>7.1f} | {x['copy_tbs']:>6.2f} "
            f"{x['torch_tbs']:>6.2f} {x['sc_tbs']:>6.2f} {x['kernel_tbs']:>6.2f} {x['whole_tbs']:>6.2f}      | "
            f"{x['sc_vs_copy']:>5.3f} {x['kernel_vs_copy']:>5.3f} {x['whole_vs_copy']:>5.3f} "
            f"{x['sc_restore_vs_copy']:>5.3f} {x['kernel_restore_vs_copy']:>7.3f}        | "
            f"{x['sc_vs_torch']:>7.1f}x | {x['host_us']:>7.1f} {x['host_limit_us']:>5.0f} | "
            f"{x['serial_us']:>9.1f} {x['serial_vs_copy']:>6.3f} {x['serial_vs_serial_copy']:>10.3f}"
        )
    for name, info in r["layouts"].items():
        v = "; ".join(
            f"{n} ops: " + ", ".join(f"v{k} {us:.1f}" for k, us in t.items())
            for n, t in info["variants_kernel_us"].items()
        )
        out.append(
            f"{name}: {LAYOUTS[name][0]}; {info['pieces_per_op']} pieces, {info['items_per_op']} items "
            f"an op; grid {info['grid_blocks']}; kernel builds (us): {v}"
        )
    if "contiguous" in r:
        c = r["contiguous"]
        out.append(
            f"one contiguous {c['mbytes']:.0f} MB row: kernel {c['kernel_us']:.1f} us, copy_ "
            f"{c['copy_us']:.1f} us ({c['copy_us'] / c['kernel_us']:.3f} of copy_)"
        )
    big = [x for x in r["rows"] if x["mbytes"] >= 16]
    one = [x for x in r["rows"] if x["ops"] == 1 and x["layout"] != "hybrid7b"]
    if big:
        out.append(
            f"target kernel >= 0.90 of copy_ (batches >= 16 MB): min store {min(x['kernel_vs_copy'] for x in big):.3f}, "
            f"min restore {min(x['kernel_restore_vs_copy'] for x in big):.3f}"
        )
        out.append(
            f"target whole batch >= 0.85: min {min(x['whole_vs_copy'] for x in big):.3f}; "
            f"graph (fetch + kernel) min {min(x['sc_vs_copy'] for x in big):.3f}"
        )
    out.append(
        f"target host <= 1 us/op + 10 us: worst margin "
        f"{max(x['host_us'] - x['host_limit_us'] for x in r['rows']):+.1f} us (negative = met)"
    )
    if one:
        out.append(
            f"target one 38.6 MB op >= 0.70 of copy_: graph min {min(x['sc_vs_copy'] for x in one):.3f}, "
            f"whole min {min(x['whole_vs_copy'] for x in one):.3f}"
        )
    for n, goal in ((1, None), (4, 0.80), (16, 0.85)):
        xs = [x for x in r["rows"] if x["ops"] == n]
        if xs:
            lo = min(x["serial_vs_copy"] for x in xs)
            lo_s = min(x["serial_vs_serial_copy"] for x in xs)
            want = f"target >= {goal:.2f}" if goal else "reported"
            out.append(
                f"serial batch from an idle GPU, {n} op(s) ({want}): min {lo:.3f} of graph-timed copy_, "
                f"{lo_s:.3f} of copy_ timed serially"
            )
    if "one_mib_op_us" in r:
        out.append(
            f"target one 1 MiB op from graph replay <= 10 us: {r['one_mib_op_us']:.2f} us "
            f"(the kernel alone {r['one_mib_op_kernel_us']:.2f} us)"
        )
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--host-reps", type=int, default=200)
    p.add_argument("--flush-mb", type=int, default=256)
    p.add_argument("--layouts", default="kv16,kv32,flat,hybrid7b")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--devices", type=int, default=0, help="run the N-GPU aggregate benchmark instead")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not (torch.cuda.is_available() and sc.has_gpu_kernels):
        raise SystemExit("bench_copy needs a GPU and statecache built with GPU kernels")
    if args.devices:
        r = bench_devices(args)
        print(json.dumps(r, indent=1))
        print(
            f"{r['devices']} GPU(s), kv16 x 16 ops ({r['mbytes_per_device']:.0f} MB each): one GPU "
            f"{r['one_gpu_tbs']:.2f} TB/s, all together {r['per_gpu_tbs']:.2f} TB/s per GPU "
            f"({r['per_gpu_vs_one']:.3f} of one), aggregate {r['aggregate_tbs']:.2f} TB/s"
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(r, f, indent=1)
        return
    args.batches = [int(b) for b in args.batches.split(",")]
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(args.flush_mb << 20, dtype=torch.uint8, device="cuda")
    rng = random.Random(0)
    r = dict(
        device=props.name,
        sms=props.multi_processor_count,
        reps=args.reps,
        rows=[],
        layouts={},
        item_bytes=_C._GpuCopyEngine.item_bytes,
    )

    def save():  # after every part, so a failure later keeps what ran
        if args.out:
            with open(args.out, "w") as f:
                json.dump(r, f, indent=1)

    for name in args.layouts.split(","):
        rows, info = bench_layout(name, args, flush, rng)
        r["rows"] += rows
        r["layouts"][name] = info
        save()
        print(f"-- {name} done", flush=True)
    r.update(bench_small(args, flush))
    r["contiguous"] = bench_contiguous(args, flush)
    save()
    print(table(r))


if __name__ == "__main__":
    main()
