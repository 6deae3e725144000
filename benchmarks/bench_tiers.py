"""Tiers below GPU memory: shared-tier put/get on loopback, checksum cost,
and (with a GPU) GPU <-> host moves of PAGE images.

    PYTHONPATH=python python benchmarks/bench_tiers.py [--sizes 1,8,38] [--repeats 15]

* Mooncake Store (a real mooncake_master + mooncake_client on 127.0.0.1, TCP)
  and Redis (a real redis-server on 127.0.0.1): one value per call, the
  value in registered host memory for Mooncake (zero-copy), p50 / p99 latency
  and GB/s of put and get; then a batch of 8 values per call. Baseline in the
  same run: a host ``memcpy`` (NumPy ``copyto``) of the same bytes.
* Checksums: XXH3-128 and BLAKE3 (one thread and all threads) over a 38 MB
  image, GB/s and ms per GB.
* GPU (only with CUDA), through the copy engine's host path
  (``HostCopyExecutor``), each against one pinned ``copy_`` of the same
  bytes in the same run: page rows of 4, 16 and 64 KiB (16 KV tensors, random
  units into random host entries) by the measured choice and by SM and DMA
  forced; 16 whole 38.6 MB Qwen3-Next images (36 GDN layers, conv [3, 4096]
  bf16 + recurrent [16, 128, 128] fp32) from their slots, and in 64 KiB units
  through the tiers' ``UnitMover`` (with the torch gather it replaced); then
  a forward-sized kernel (bf16 matmuls; an HBM-bound copy) alone and beside
  a 1 GB offload. The start-up probe (SM cap, crossover) is printed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def row(name, op, mb, ts, nbytes, base=None):
    med = statistics.median(ts)
    gbs = nbytes / med / 1e9
    ratio = f"{med / base:.1f}x" if base else "1.0x"
    return f"| {name} | {op} | {mb} | {1e3 * med:.2f} | {1e3 * pct(ts, 0.99):.2f} | {gbs:.2f} | {ratio} |"


def bench_shared(sizes_mb, repeats):
    from statecache.tiers.mooncake_tier import MooncakeTier
    from statecache.tiers.redis_tier import RedisTier
    from statecache.tiers.servers import MooncakeServers, RedisServer

    lines = ["| tier | op | MB | p50 ms | p99 ms | GB/s (p50) | time vs memcpy |", "|---|---|---:|---:|---:|---:|---:|"]
    biggest = max(sizes_mb) << 20
    mc = MooncakeServers(segment_bytes=max(2 << 30, 40 * biggest)).start(timeout_s=60)
    rs = RedisServer().start()
    try:
        tiers = [MooncakeTier(mc.master_addr, mc.metadata_url, timeout_s=30.0), RedisTier(port=rs.port, timeout_s=30.0)]
        src = np.random.default_rng(0).integers(0, 256, 8 * biggest, dtype=np.uint8)
        dst = np.zeros_like(src)
        tiers[0].register(src)
        tiers[0].register(dst)
        for mb in sizes_mb:
            n = mb << 20
            base = statistics.median(timed(lambda: np.copyto(dst[:n], src[:n]), repeats))
            lines.append(row("memcpy (baseline)", "copy", mb, [base] * repeats, n))
            for t in tiers:
                keys = iter(range(10**9))
                made = []

                def put():
                    k = f"bench/{mb}/{next(keys)}"
                    made.append(k)
                    ok = t.put_many([k], [[src[:n]]])
                    assert ok == [True], (t.name, mb, t.stats(), getattr(t, "_last_error", None))
                    return k

                last = {}

                def put_one():
                    last["k"] = put()

                ts_put = timed(put_one, repeats)
                k = last["k"]
                ts_get = timed(lambda: t.get_many_into([k], [[dst[:n]]]), repeats)
                assert (dst[:n] == src[:n]).all()
                lines.append(row(t.name, "put", mb, ts_put, n, base))
                lines.append(row(t.name, "get", mb, ts_get, n, base))
                if mb <= 8:  # batches of 8 values per call

                    def put8():
                        ks = [f"bench8/{mb}/{next(keys)}" for _ in range(8)]
                        assert all(t.put_many(ks, [[src[i * n : (i + 1) * n]] for i in range(8)]))
                        last["ks"] = ks
                        made.extend(ks)

                    ts8 = timed(put8, max(3, repeats // 2))
                    ks = last["ks"]
                    tg8 = timed(
                        lambda: t.get_many_into(ks, [[dst[i * n : (i + 1) * n]] for i in range(8)]),
                        max(3, repeats // 2),
                    )
                    lines.append(row(t.name, "put x8", mb, ts8, 8 * n, 8 * base))
                    lines.append(row(t.name, "get x8", mb, tg8, 8 * n, 8 * base))
                t.remove_many(made)  # the next size starts with an empty store
        for t in tiers:
            t.close()
    finally:
        rs.stop()
        mc.stop()
    return "\n".join(lines)


def bench_checksums(repeats):
    try:
        import blake3
        import xxhash
    except ImportError as e:
        return f"checksums: not run ({e})"

    buf = np.random.default_rng(1).integers(0, 256, 38 << 20, dtype=np.uint8)
    lines = ["| checksum | GB/s (median) | ms per GB | vs XXH3-128 |", "|---|---:|---:|---:|"]
    cases = [
        ("XXH3-128 (chosen)", lambda: xxhash.xxh3_128(buf).digest()),
        ("BLAKE3, 1 thread", lambda: blake3.blake3(buf).digest()),
        ("BLAKE3, all threads", lambda: blake3.blake3(buf, max_threads=blake3.blake3.AUTO).digest()),
    ]
    base = None
    for name, fn in cases:
        med = statistics.median(timed(fn, repeats))
        base = base or med
        lines.append(
            f"| {name} | {buf.nbytes / med / 1e9:.2f} | {1e3 * med / (buf.nbytes / 1e9):.0f} | {med / base:.2f}x time |"
        )
    return "\n".join(lines)


class _Dev:
    """The device calls the GPU part makes; on the CPU (``--cpu-dry-run``:
    the same code on small sizes, to catch mistakes before device time)
    they are no-ops or wall-clock stand-ins."""

    def __init__(self, torch, dry: bool):
        self.torch, self.dry = torch, dry
        self.device = torch.device("cpu" if dry else "cuda")

    def sync(self):
        if not self.dry:
            self.torch.cuda.synchronize()

    def pinned(self, shape):
        return self.torch.empty(shape, dtype=self.torch.uint8, pin_memory=not self.dry)

    def empty_cache(self):
        if not self.dry:
            self.torch.cuda.empty_cache()

    def event(self):
        if not self.dry:
            return self.torch.cuda.Event(enable_timing=True)
        return _WallEvent()

    def profile(self):
        if not self.dry:
            from statecache import _C

            return _C._host_link_profile(0)
        return dict(
            sm_access=False,
            batch_dma=False,
            sm_count=0,
            blocks_to_host=0,
            blocks_from_host=0,
            crossover_to_host=0,
            crossover_from_host=0,
            samples=[],
        )


class _WallEvent:
    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _gpu_timer(g):
    def timed_gpu(fn, repeats, warm=2):
        """Median wall seconds of fn() + device sync, from an idle device."""
        for _ in range(warm):
            fn()
            g.sync()
        out = []
        for _ in range(repeats):
            g.sync()
            t0 = time.perf_counter()
            fn()
            g.sync()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    return timed_gpu


def bench_gpu(repeats, move_mb=256, out=None, dry=False):
    """GPU <-> pinned host through the copy engine's host path, against a
    pinned ``copy_`` of the same bytes in the same run."""
    import torch

    if not dry and not torch.cuda.is_available():
        return "GPU <-> host: not run (no CUDA device on this machine)."
    import statecache as sc
    from statecache.executor import HostCopyExecutor
    from statecache.layout import PageLayout

    if not dry and not sc.has_gpu_kernels:
        return "GPU <-> host: not run (statecache built without GPU kernels)."
    g = _Dev(torch, dry)
    dev = g.device
    timed_gpu = _gpu_timer(g)
    rng = np.random.default_rng(0)
    prof = g.profile()
    lines = [
        f"host link (measured at first use): SM path {prof['blocks_to_host']} blocks to host, "
        f"{prof['blocks_from_host']} from host (of {prof['sm_count']} SMs); DMA from rows of "
        f"{_kib(prof['crossover_to_host'])} to host, {_kib(prof['crossover_from_host'])} from host; "
        f"batched DMA {'yes' if prof['batch_dma'] else 'no'}",
        "| probe rows | to host SM | to host DMA | from host SM | from host DMA |",
        "|---:|---:|---:|---:|---:|",
    ]
    by = {}
    for x in prof["samples"]:
        if x["dma"] or x["blocks"] == prof["blocks_to_host" if x["to_host"] else "blocks_from_host"]:
            by[(x["to_host"], x["dma"], x["row_bytes"])] = x["gb_per_s"]
    for rb in sorted({x["row_bytes"] for x in prof["samples"]}):
        cells = [by.get((d, m, rb)) for d in (True, False) for m in (False, True)]
        lines.append(f"| {_kib(rb)} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    lines.append("")
    rows_out = []

    def versus(name, nbytes, d2h, h2d, base_d2h, base_h2d, note=""):
        for d, t, b in (("GPU->host", d2h, base_d2h), ("host->GPU", h2d, base_h2d)):
            r = dict(case=name, direction=d, mbytes=nbytes / 1e6, ms=t * 1e3, gbps=nbytes / t / 1e9, copy_ms=b * 1e3)
            r["vs_copy"] = b / t
            r["note"] = note
            rows_out.append(r)

    def copy_baseline(nbytes):
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        src.random_(0, 255)
        host = g.pinned(nbytes)
        d2h = timed_gpu(lambda: host.copy_(src, non_blocking=True), repeats)
        h2d = timed_gpu(lambda: src.copy_(host, non_blocking=True), repeats)
        return d2h, h2d  # the buffers go with this frame

    # 1. Page rows of 4, 16 and 64 KiB: units of 16 rows (16 KV tensors), random
    #    units into random host entries, move_mb per move.
    for row_kib in (4, 16, 64):
        row = row_kib << 10
        unit = 16 * row
        n = (move_mb << 20) // unit
        blocks = 2 * n
        kv = [torch.empty(blocks, row, dtype=torch.uint8, device=dev) for _ in range(16)]
        for t in kv:
            t.random_(0, 255)
        page = PageLayout(kv, unit_dim=0)
        host = g.pinned((2 * n, unit))
        units = rng.permutation(blocks)[:n]
        entries = rng.permutation(2 * n)[:n]
        back = rng.permutation(blocks)[:n]
        base = copy_baseline(n * unit)
        # Knobs beside the defaults: DMA runs per batched call (all of them, 256,
        # one memcpy a run), an offload's SM slices twice as long.
        variants = [(p, None, None) for p in (("auto",) if dry else ("auto", "sm", "dma"))]
        if not dry and row_kib == 64:
            variants += [("dma", ("dma_batch", b), f"dma, {b or 'one'} runs a call") for b in (1 << 30, 256, 0)]
        if not dry and row_kib == 4:
            variants += [("sm", ("slice", 2 * prof["slice_to_host"]), "sm, 100 us slices")]
        for path, knob, label in variants:
            ex = HostCopyExecutor(page, host, path=path)
            if knob is not None:
                for e in ex._engines:
                    if knob[0] == "dma_batch":
                        e.set_dma_batch(knob[1])
                    else:
                        e.set_sm_slice_bytes(knob[1])
            ex.offload(units, entries).wait()  # warm, then check the bytes
            want = torch.cat([t[torch.as_tensor(units[:4], device=dev)].cpu() for t in kv], dim=1)
            assert torch.equal(host[torch.as_tensor(entries[:4])], want), f"{row_kib} KiB {path}: offload differs"
            taken = ex.offload(units[:1], entries[:1]).path
            d2h = timed_gpu(lambda ex=ex: ex.offload(units, entries).wait(), repeats)
            h2d = timed_gpu(lambda ex=ex: ex.load(entries, back), repeats)
            got = torch.cat([t[torch.as_tensor(back[:4], device=dev)].cpu() for t in kv], dim=1)
            assert torch.equal(got, want), f"{row_kib} KiB {path}: load differs"
            name = label or f"{path}{' -> ' + taken if path == 'auto' else ''}"
            versus(f"{row_kib} KiB rows ({name})", n * unit, d2h, h2d, *base)
        g.empty_cache()

    # 2. Whole 38.6 MB Qwen3-Next images (36 GDN layers: conv [3, 4096] bf16 +
    #    recurrent [16, 128, 128] fp32, rows of 24 KiB and 1 MiB), 16 of them,
    #    straight from their slots into random 64 KiB host entries; then the
    #    tier path, through the UnitMover from 64 KiB page units.
    n_img, entry = (2 if dry else 16), 64 << 10
    image = 36 * 3 * 4096 * 2 + 36 * 16 * 128 * 128 * 4
    upc = -(-image // entry)
    host = g.pinned((n_img * upc + 64, entry))
    ids = rng.permutation(host.shape[0])[: n_img * upc]
    base = copy_baseline(n_img * image)
    _images_from_slots(torch, dev, host, ids, n_img, timed_gpu, repeats, versus, base)
    _images_through_mover(torch, dev, host, ids, n_img, upc, rng, timed_gpu, repeats, versus, base)

    lines += [
        f"GPU <-> pinned host, median of {repeats} (wall clock of the move + device sync, from idle); "
        "baseline: a pinned copy_ of the same bytes in one piece, same run",
        "| case | direction | MB | ms | GB/s | copy_ ms | vs copy_ |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows_out:
        lines.append(
            f"| {r['case']} | {r['direction']} | {r['mbytes']:.0f} | {r['ms']:.2f} | {r['gbps']:.1f} | "
            f"{r['copy_ms']:.2f} | {r['vs_copy']:.2f} |"
        )
    lines.append("")
    lines.append(bench_overlap(torch, g, repeats))
    if out is not None:
        out["gpu_host_moves"] = rows_out
        out["host_link"] = prof
    return "\n".join(lines)


def _images_from_slots(torch, dev, host, ids, n_img, timed_gpu, repeats, versus, base):
    from statecache.executor import HostCopyExecutor
    from statecache.layout import StateLayout

    conv = torch.empty(36, 2 * n_img, 3, 4096, dtype=torch.bfloat16, device=dev).normal_()
    rec = torch.empty(36, 2 * n_img, 16, 128, 128, dtype=torch.float32, device=dev).normal_()
    state = StateLayout([conv, rec], slot_dim=1)
    src, dst = list(range(n_img)), list(range(n_img, 2 * n_img))
    ex = HostCopyExecutor(state, host)
    ex.offload(src, ids).wait()
    taken = ex.offload(src[:1], ids[: ex.entries_per_item]).path
    d2h = timed_gpu(lambda: ex.offload(src, ids).wait(), repeats)
    h2d = timed_gpu(lambda: ex.load(ids, dst), repeats)
    assert torch.equal(rec[:, n_img:], rec[:, :n_img]) and torch.equal(conv[:, n_img:], conv[:, :n_img])
    versus(
        f"{n_img} images of {state.image_bytes / 1e6:.1f} MB, slot -> host ({taken})",
        n_img * state.image_bytes,
        d2h,
        h2d,
        *base,
    )


def _images_through_mover(torch, dev, host, ids, n_img, upc, rng, timed_gpu, repeats, versus, base):
    from statecache.engine.tiering import UnitMover
    from statecache.layout import PageLayout

    entry = host.shape[1]
    units = n_img * upc + 64
    kv = torch.empty((units, entry), dtype=torch.uint8, device=dev)
    kv.random_(0, 255)
    mover = UnitMover(PageLayout([kv], unit_dim=0))
    mover.attach_host(host)  # as Tiering does with the host tier's pinned arena
    uid = rng.permutation(units)[: n_img * upc].tolist()
    rows = [host[e].numpy() for e in ids]
    mover.to_rows(uid, rows)
    assert torch.equal(host[torch.as_tensor(ids[:8])], kv[torch.as_tensor(uid[:8], device=dev)].cpu())
    taken = mover._arena.offload(uid[:1], ids[:1]).path
    d2h = timed_gpu(lambda: mover.to_rows(uid, rows), repeats)
    h2d = timed_gpu(lambda: mover.from_rows(rows, uid), repeats)
    versus(f"{n_img} images in 64 KiB units, tier UnitMover ({taken})", len(uid) * entry, d2h, h2d, *base)
    if dev.type != "cpu":  # the same through the SM path
        mover._arena._path = 1
        d2h = timed_gpu(lambda: mover.to_rows(uid, rows), repeats)
        h2d = timed_gpu(lambda: mover.from_rows(rows, uid), repeats)
        versus(f"{n_img} images in 64 KiB units, tier UnitMover (sm)", len(uid) * entry, d2h, h2d, *base)
    # What the mover did before: a torch gather on the device, one pinned
    # copy_ (into consecutive rows, its favourable case), and back.
    idx = torch.as_tensor(uid, device=dev)
    flat = host[: len(uid)]
    t_out = timed_gpu(lambda: flat.copy_(kv.index_select(0, idx), non_blocking=True), repeats)
    t_in = timed_gpu(lambda: kv.index_copy_(0, idx, flat.to(dev, non_blocking=True)), repeats)
    versus("same, torch index_select / index_copy_ + copy_ (before)", len(uid) * entry, t_out, t_in, *base)


def _kib(n: int) -> str:
    if n >= 1 << 60:
        return "never"
    return f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB"


def bench_overlap(torch, g, repeats):
    """A forward-sized kernel alone, and while a 1 GB offload runs on the
    host path's side stream (DMA for 64 KiB rows; the SM path forced on 4
    KiB rows, the unflattering case, in its ~50 us slices and in one launch)."""
    from statecache.executor import HostCopyExecutor
    from statecache.layout import PageLayout

    dev = g.device
    side, total = (256, 8 << 20) if g.dry else (8192, 1 << 30)
    a = torch.randn(side, side, device=dev, dtype=torch.bfloat16)
    b = torch.randn(side, side, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    big = torch.empty(total, dtype=torch.uint8, device=dev)
    big2 = torch.empty_like(big)

    def matmuls():  # ~10 ms of bf16 products, as one prefill forward of a mid-size model
        for _ in range(8):
            torch.matmul(a, b, out=c)

    def hbm():  # a memory-bound forward stand-in: 16 GB of reads + writes
        for _ in range(8):
            big2.copy_(big)

    def event_time(fn):
        s, e = g.event(), g.event()
        s.record()
        fn()
        e.record()
        return s, e

    lines = [
        "forward beside a 1 GB offload (events on the compute stream; median of "
        f"{repeats}; the offload is enqueued first on its side stream)",
        "| forward | offload | alone ms | beside ms | ratio | offload GB/s beside |",
        "|---|---|---:|---:|---:|---:|",
    ]
    cases = [(64, "auto", None), (4, "sm", None), (4, "sm", "2x"), (4, "sm", 1 << 62)]
    for row_kib, path, slice_bytes in cases[:2] if g.dry else cases:
        row = row_kib << 10
        n = total // (16 * row)
        kv = [torch.empty(n, row, dtype=torch.uint8, device=dev) for _ in range(16)]
        host = g.pinned((n, 16 * row))
        ex = HostCopyExecutor(PageLayout(kv, unit_dim=0), host, path="auto" if g.dry else path)
        if slice_bytes is not None:  # slices twice as long; one launch (what slicing avoids)
            for e in ex._engines:
                e.set_sm_slice_bytes(2 * g.profile()["slice_to_host"] if slice_bytes == "2x" else slice_bytes)
        units = list(range(n))
        ex.offload(units, units).wait()
        for name, fwd in (("8 bf16 8192^3 matmuls", matmuls), ("16 GB HBM copy", hbm)):
            fwd()
            g.sync()
            alone, beside, rate = [], [], []
            for _ in range(repeats):
                ev = event_time(fwd)
                g.sync()
                alone.append(ev[0].elapsed_time(ev[1]))
                t0 = time.perf_counter()
                move = ex.offload(units, units)
                ev = event_time(fwd)
                move.wait()
                t_move = time.perf_counter() - t0
                g.sync()
                beside.append(ev[0].elapsed_time(ev[1]))
                rate.append(total / t_move / 1e9)
            a_ms, b_ms = statistics.median(alone), statistics.median(beside)
            lines.append(
                f"| {name} | {total >> 20} MiB, {row_kib} KiB rows, {move.path}"
                f"{', 100 us slices' if slice_bytes == '2x' else ', one launch' if slice_bytes else ''} | {a_ms:.2f} | {b_ms:.2f} | {b_ms / a_ms:.3f} | "
                f"{statistics.median(rate):.1f} |"
            )
        del kv, host, ex
        g.empty_cache()
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1,8,38", help="value sizes in MB")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--skip-shared", action="store_true")
    p.add_argument("--skip-checksums", action="store_true")
    p.add_argument("--move-mb", type=int, default=256, help="bytes per GPU <-> host move (page-row cases)")
    p.add_argument("--out", default=None, help="write the GPU rows as JSON here")
    p.add_argument("--cpu-dry-run", action="store_true", help="the GPU part's code on the CPU, small sizes")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"tiers benchmark, {args.repeats} repeats per row (medians; p99 = the slowest of few)\n")
    if not args.skip_shared:
        print(bench_shared(sizes, args.repeats) + "\n")
    if not args.skip_checksums:
        print(bench_checksums(args.repeats) + "\n")
    out = {}
    print(bench_gpu(args.repeats, 8 if args.cpu_dry_run else args.move_mb, out, dry=args.cpu_dry_run))
    if args.out:
        import json

        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
