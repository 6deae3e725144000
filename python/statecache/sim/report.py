"""Tables, JSON and the hit-rate plot for simulation results."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(text: str | int) -> int:
    """``"80GiB"``, ``"1.5GB"``, ``"4096"`` -> bytes (decimal and binary units)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"memory must be >= 0 bytes, got {text!r}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"memory must look like 80GiB, 1.5GB or 4096, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _pct(x: float) -> str:
    return f"{100.0 * x:5.1f}%"


COLUMNS = (
    ("policy", lambda r: r["policy"]),
    ("state mem", lambda r: format_bytes(r["state_memory"])),
    ("KV-only hit", lambda r: _pct(r["kv_hit_rate"])),
    ("state-gated hit", lambda r: _pct(r["state_hit_rate"])),
    ("FLOPs saved", lambda r: _pct(r["flops_saved_fraction"])),
    ("kept", lambda r: str(r["checkpoints"]["kept"])),
    ("read", lambda r: str(r["checkpoints"]["read"])),
    ("evicted", lambda r: str(r["checkpoints"]["evicted"])),
    ("ckpt bytes (peak)", lambda r: format_bytes(r["checkpoint_bytes_peak"])),
    ("lib us/pass", lambda r: f"{r['library_us_per_pass']:.0f}"),
)


def table(results: Iterable[dict], columns=COLUMNS) -> str:
    """A fixed-width text table, one row per result, in the given order."""
    results = list(results)
    shared = any(r["config"].get("memory") is not None for r in results)
    rows = [["memory" if shared and name == "state mem" else name for name, _ in columns]]
    rows += [[get(r) for _, get in columns] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = []
    for k, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(payload: object) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, default=float)


def budget_axis_label(results: Sequence[dict]) -> str:
    """The sweep's x axis: ``--memory`` runs share one budget between KV
    blocks and PAGE images, the others sweep state memory alone."""
    shared = any((r.get("config") or {}).get("memory") is not None for r in results)
    return "memory budget (KV + state, GiB)" if shared else "state memory budget (GiB)"


def plot_hit_rates(results: Sequence[dict], path: str, title: str = "") -> str:
    """State-gated token hit rate vs state memory (or vs the shared KV + state
    budget of ``--memory`` runs), one line per policy, the KV-only ceiling
    dashed; written as a PNG (matplotlib, Agg backend). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
    policies = list(dict.fromkeys(r["policy"] for r in results))
    for name in policies:
        pts = sorted((r["state_memory"], r["state_hit_rate"]) for r in results if r["policy"] == name)
        ax.plot([x / 2**30 for x, _ in pts], [100 * y for _, y in pts], marker="o", label=name)
    best_kv: dict[int, float] = {}
    for r in results:  # KV matched slightly differently per policy: plot the best
        best_kv[r["state_memory"]] = max(best_kv.get(r["state_memory"], 0.0), r["kv_hit_rate"])
    ceiling = sorted(best_kv.items())
    if ceiling:
        ax.plot(
            [x / 2**30 for x, _ in ceiling],
            [100 * y for _, y in ceiling],
            "k--",
            linewidth=1,
            label="KV-only (ceiling)",
        )
    ax.set_xlabel(budget_axis_label(results))
    ax.set_ylabel("state-gated token hit rate (%)")
    if len(best_kv) > 2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
