"""``statecache bench``: the benchmarks of a source checkout, short settings.

Runs ``benchmarks/bench_pools.py`` (state pools, one scheduler pass) and
``benchmarks/bench_paged.py`` (PAGE store / coordinator passes) on the CPU,
and ``benchmarks/bench_copy.py`` (the copy kernel) where a GPU and GPU
kernels are present; each prints its own table. The statecache-vs-reference
ratios need the behaviour reference beside the checkout (or
STATECACHE_REFERENCE_DIR). Settings are short (seconds each): the README's
figures come from the benchmarks' defaults (``--full``). The scripts live in
the source tree, not in the wheel: run from a checkout or pass ``--dir``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# name -> (script, short arguments, needs a GPU)
BENCHMARKS: dict[str, tuple[str, list[str], bool]] = {
    "pools": (
        "bench_pools.py",
        ["--passes", "10", "--repeats", "5", "--warmup", "40", "--cpu-time"],
        False,
    ),
    "paged": ("bench_paged.py", ["--repeats", "3", "--passes", "5"], False),
    "copy": ("bench_copy.py", ["--reps", "10"], True),
}


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``bench`` to the ``statecache`` subcommands; returns its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="run the benchmarks (CPU ones; the copy kernel on a GPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "names",
        nargs="*",
        type=_bench_name,
        default=[],
        metavar="NAME",
        help=f"some of {', '.join(BENCHMARKS)} (default: all that can run here)",
    )
    p.add_argument("--full", action="store_true", help="the benchmarks' own (long) settings")
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the checkout's benchmarks/ directory (default: found beside the package)",
    )
    return p


def _bench_name(text: str) -> str:
    if text not in BENCHMARKS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(BENCHMARKS)}")
    return text


def find_benchmarks(explicit: Path | None = None) -> Path | None:
    """The benchmarks/ directory of the source checkout this package runs from."""
    cands = (
        [explicit]
        if explicit is not None
        else [Path(__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"]
    )
    for c in cands:
        if (c / "bench_pools.py").is_file():
            return c
    return None


def gpu_present() -> bool:
    """Whether the copy-kernel benchmark can run: GPU kernels built, torch sees a GPU."""
    from statecache import _C

    if not _C.has_gpu_kernels:
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    """Runs the chosen benchmarks, printing each table; returns 0, 1 if one
    failed or could not run, 2 without a benchmarks/ directory."""
    bdir = find_benchmarks(args.dir)
    if bdir is None:
        where = args.dir if args.dir is not None else "beside the package or in the current directory"
        print(
            f"statecache bench: no benchmarks/ directory with bench_pools.py found ({where}); "
            "the benchmarks ship with the source checkout, not the wheel: run from a checkout "
            "or pass --dir PATH/benchmarks",
            file=sys.stderr,
        )
        return 2
    gpu = gpu_present()
    names = list(args.names) or [n for n, (_s, _a, needs_gpu) in BENCHMARKS.items() if gpu or not needs_gpu]
    if not args.names and not gpu:
        print("(copy kernel benchmark skipped: no GPU, or statecache built without GPU kernels)\n")
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[1])  # the statecache we run, first
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    failed = []
    for name in names:
        script, short, needs_gpu = BENCHMARKS[name]
        if needs_gpu and not gpu:
            print(f"== {name}: needs a GPU and GPU kernels; not run\n")
            failed.append(name)
            continue
        cmd = [sys.executable, str(bdir / script), *([] if args.full else short)]
        print(
            f"== {name}: {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(cmd))}",
            flush=True,
        )
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        out = proc.stdout.rstrip()
        if out:
            print(out)
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            print(f"   FAILED (exit {proc.returncode}): " + (err[-1] if err else "no message"))
            failed.append(name)
        print(f"   ({time.perf_counter() - t0:.1f} s)\n", flush=True)
    return 1 if failed else 0
