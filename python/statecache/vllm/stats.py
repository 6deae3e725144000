"""The connector's counters in vLLM's connector stats and Prometheus
metrics, named in vLLM's style with a ``statecache:`` prefix
(docs/vllm.md, "Metrics")."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats


class StateCacheStats(KVConnectorStats):
    """Counter increases over one interval (``data``: name -> amount)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> StateCacheStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


# Prometheus counter -> (documentation, label name, {label value: counter name})
PROM_COUNTERS: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "statecache:prompt_tokens_resumed": (
        "Prompt tokens resumed at admission, by source: vLLM's own cache (local), statecache's host tier, "
        "the shared tier",
        "source",
        {"local": "tokens_resumed_local", "host": "tokens_resumed_host", "shared": "tokens_resumed_shared"},
    ),
    "statecache:admissions": (
        "Admitted requests by why they were not resumed in full (full_hit: they were)",
        "cause",
        {
            "kv_miss": "admissions_kv_miss",
            "state_miss": "admissions_state_miss",
            "hit_cut_short": "admissions_hit_cut_short",
            "full_hit": "admissions_full_hit",
        },
    ),
    "statecache:loads_failed": (
        "Loads reported failed to vLLM (it recomputed), by reason",
        "reason",
        {
            "any": "loads_failed",
            "untrusted": "loads_untrusted",
            "missing": "loads_missing",
            "timed_out": "loads_timed_out",
        },
    ),
    "statecache:bytes_moved": (
        "Bytes moved between vLLM's KV cache and the host tier",
        "direction",
        {"save": "bytes_saved", "load": "bytes_loaded"},
    ),
    "statecache:values_saved": ("KV blocks and states saved to the host tier", None, {"": "values_saved"}),
    "statecache:saves_dropped": (
        "Values not saved, by reason",
        "reason",
        {"host_full": "saves_dropped_host_full", "unnamed": "saves_skipped_unnamed"},
    ),
    "statecache:saves_deferred": (
        "Values saved a step or more after they were computed (vLLM's async scheduling names a block late)",
        None,
        {"": "saves_deferred"},
    ),
    "statecache:shared_writes": (
        "Values written to the shared tier, by outcome",
        "outcome",
        {"ok": "shared_writes", "failed": "shared_writes_failed"},
    ),
    "statecache:shared_lookups": (
        "Batched lookups in the shared tier (at most one of blocks and one of tails per admission), and "
        "those that failed (the tier down or timing out: it is then skipped for 5 s)",
        "outcome",
        {"any": "shared_lookups", "failed": "shared_lookup_failures"},
    ),
    "statecache:scheduler_seconds": (
        "Time the connector spent in vLLM's scheduler (lookups, load planning, save planning, reports)",
        None,
        {"": "scheduler_seconds"},
    ),
}


class StateCachePromMetrics(KVConnectorPromMetrics):
    """Registers the ``statecache:`` counters per engine and feeds them the
    interval stats."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._bound: dict[tuple[int, str], list[tuple[Any, str]]] = {}
        for name, (doc, label, series) in PROM_COUNTERS.items():
            extra = [label] if label else []
            metric = self._counter_cls(name=name, documentation=doc, labelnames=labelnames + extra)
            for engine, values in per_engine_labelvalues.items():
                for value, counter in series.items():
                    child = metric.labels(*values, *([value] if label else []))
                    self._bound.setdefault((engine, counter), []).append((child, counter))

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for counter, amount in transfer_stats_data.items():
            if amount and amount > 0:
                for child, _ in self._bound.get((engine_idx, counter), ()):
                    child.inc(amount)
