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
* GPU (only with CUDA): 16 images of a Qwen3-Next layout (36 GDN layers, conv
  [36, slots, 3, 4096] bf16 + recurrent [36, slots, 16, 128, 128] fp32 in 64
  KiB units) GPU -> host rows and back through the tiers' ``UnitMover``,
  against one pinned ``copy_`` of the same bytes.
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


def bench_gpu(repeats):
    import torch

    if not torch.cuda.is_available():
        return "GPU <-> host: not run (no CUDA device on this machine)."
    from statecache.engine.tiering import UnitMover
    from statecache.layout import PageLayout

    dev = torch.device("cuda")
    unit = 64 << 10
    image = 36 * 3 * 4096 * 2 + 36 * 16 * 128 * 128 * 4
    upc = -(-image // unit)
    n_img = 16
    units = n_img * upc + 64
    kv = torch.zeros((units, unit), dtype=torch.uint8, device=dev)
    mover = UnitMover(PageLayout([kv], unit_dim=0))
    host = torch.empty((n_img * upc, unit), dtype=torch.uint8, pin_memory=True)
    mover.attach_host(host)  # as Tiering does with the host tier's pinned arena
    rows = [host[i].numpy() for i in range(n_img * upc)]
    ids = list(range(n_img * upc))
    flat = kv[: n_img * upc]
    nbytes = flat.numel()

    def sync(fn):
        def run():
            fn()
            torch.cuda.synchronize()

        return run

    kv.random_(0, 255)
    mover.to_rows(ids, rows)
    torch.cuda.synchronize()
    assert torch.equal(host, flat.cpu()), "mover D2H moved the wrong bytes"
    kv[: n_img * upc].zero_()
    mover.from_rows(rows, ids)
    torch.cuda.synchronize()
    assert torch.equal(flat.cpu(), host), "mover H2D moved the wrong bytes"
    out = {}
    out["copy_ D2H"] = timed(sync(lambda: host.copy_(flat, non_blocking=True)), repeats)
    out["mover D2H"] = timed(sync(lambda: mover.to_rows(ids, rows)), repeats)
    out["copy_ H2D"] = timed(sync(lambda: flat.copy_(host, non_blocking=True)), repeats)
    out["mover H2D"] = timed(sync(lambda: mover.from_rows(rows, ids)), repeats)
    lines = [
        f"GPU <-> host, {n_img} images of {image / 1e6:.1f} MB ({upc} units of 64 KiB):",
        "| path | ms (median) | GB/s | vs pinned copy_ |",
        "|---|---:|---:|---:|",
    ]
    for d in ("D2H", "H2D"):
        base = statistics.median(out[f"copy_ {d}"])
        for k in (f"copy_ {d}", f"mover {d}"):
            med = statistics.median(out[k])
            lines.append(f"| {k} | {1e3 * med:.2f} | {nbytes / med / 1e9:.1f} | {base / med:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1,8,38", help="value sizes in MB")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--skip-shared", action="store_true")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"tiers benchmark, {args.repeats} repeats per row (medians; p99 = the slowest of few)\n")
    if not args.skip_shared:
        print(bench_shared(sizes, args.repeats) + "\n")
    print(bench_checksums(args.repeats) + "\n")
    print(bench_gpu(args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
