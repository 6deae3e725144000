"""``statecache info``: what this installation is and what it can run.

Version, how the extension was built (build type, compiler, GPU kernels and
their architectures, or why there are none), and the torch / CUDA / optional
packages this interpreter sees. ``--json`` prints the same as one object.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``info`` to the ``statecache`` subcommands; returns its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "info",
        help="version, build facts (GPU kernels, archs), torch/CUDA seen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return p


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _arch_coverage(archs: str, major: int, minor: int) -> str:
    """How a device of compute capability major.minor gets the kernels."""
    cc = major * 10 + minor
    real = set()
    virtual = []
    for a in filter(None, archs.split(",")):
        num, _, kind = a.partition("-")
        if not num.isdigit():
            continue
        if kind in ("", "real"):
            real.add(int(num))
        if kind in ("", "virtual"):
            virtual.append(int(num))
    if cc in real:
        return f"sm_{cc}: SASS built"
    # A cubin runs on later minor revisions of the same major architecture.
    same_major = [r for r in real if r // 10 == major and r <= cc]
    if same_major:
        return f"sm_{cc}: runs the sm_{max(same_major)} SASS"
    ptx = [v for v in virtual if v <= cc]
    if ptx:
        return f"sm_{cc}: JIT-compiled from compute_{max(ptx)} PTX at first launch"
    return f"sm_{cc}: NOT COVERED by this build ({archs}); kernels will fail to launch"


def collect() -> dict[str, Any]:
    """Everything ``statecache info`` reports, as a plain dict."""
    import statecache
    from statecache import _C

    build = dict(_C.build_info())
    out: dict[str, Any] = {
        "version": statecache.__version__,
        "extension": _C.__file__,
        "build": build,
        "gpu_kernels": bool(_C.has_gpu_kernels),
        "python": sys.version.split()[0],
        "numpy": _dist_version("numpy"),
        "transformers": _dist_version("transformers"),
        "prometheus_client": _dist_version("prometheus-client") or _dist_version("prometheus_client"),
        "torch": None,
        "devices": [],
        "warnings": [],
    }
    warnings = out["warnings"]
    if not out["gpu_kernels"] and "AUTO" in str(build.get("gpu_note", "")):
        warnings.append(f"built WITHOUT GPU kernels: {build['gpu_note']}")
    if not build.get("build_type"):
        warnings.append("built with no CMAKE_BUILD_TYPE: unoptimized; use -DCMAKE_BUILD_TYPE=Release")
    try:
        import torch
    except ImportError:
        return out
    cuda_ok = bool(torch.cuda.is_available())
    out["torch"] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cuda_available": cuda_ok,
    }
    if cuda_ok:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            dev = {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "capability": f"{major}.{minor}",
            }
            if build.get("gpu_backend") == "cuda":
                dev["kernels"] = _arch_coverage(str(build.get("gpu_archs", "")), major, minor)
                if "NOT COVERED" in dev["kernels"]:
                    warnings.append(f"device {i}: {dev['kernels']}")
            out["devices"].append(dev)
        if not out["gpu_kernels"]:
            warnings.append(
                "a GPU is visible but this build has no GPU kernels: StateCopyExecutor runs on CPU tensors only"
            )
    return out


def format_info(info: dict[str, Any]) -> str:
    """The text ``statecache info`` prints for a ``collect()`` result."""
    b = info["build"]
    if info["gpu_kernels"]:
        gpu = f"yes: {b['gpu_backend']} ({b['gpu_compiler']}), archs {b['gpu_archs']}"
    else:
        gpu = f"no ({b['gpu_note'] or 'not requested'})"
    rows = [
        ("statecache", info["version"]),
        ("extension", info["extension"]),
        ("build type", b["build_type"] or "(none: unoptimized)"),
        (
            "compiler",
            f"{b['cxx_compiler']}, pybind11 {b['pybind11']}" + (", ASan+UBSan" if b.get("sanitized") else ""),
        ),
        ("GPU kernels", gpu),
        ("python", info["python"]),
        ("numpy", info["numpy"] or "not installed"),
    ]
    t = info["torch"]
    if t is None:
        rows.append(("torch", "not installed (needed by layouts, executor, models)"))
    else:
        accel = f"CUDA {t['cuda']}" if t["cuda"] else (f"HIP {t['hip']}" if t["hip"] else "CPU build")
        rows.append(
            (
                "torch",
                f"{t['version']} ({accel}); " + ("GPU visible" if t["cuda_available"] else "no GPU visible"),
            )
        )
    for d in info["devices"]:
        rows.append(
            (
                f"  device {d['index']}",
                f"{d['name']} (capability {d['capability']})" + (f": {d['kernels']}" if "kernels" in d else ""),
            )
        )
    rows.append(("transformers", info["transformers"] or "not installed (statecache demo needs it)"))
    rows.append(
        (
            "prometheus-client",
            info["prometheus_client"] or "not installed (metrics exporter: pip install 'statecache[metrics]')",
        )
    )
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"WARNING: {w}" for w in info["warnings"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Prints the report (``--json``: as JSON); returns the exit status 0."""
    info = collect()
    print(json.dumps(info, indent=1) if args.json else format_info(info))
    return 0
