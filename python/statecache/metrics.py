"""What the checkpoints are doing, as a plain dict or as Prometheus metrics.

``StateCacheMetrics`` reads live objects when asked (``collect()``, or a
Prometheus scrape); it keeps no copies and runs no thread of its own, so it
costs nothing between scrapes. What it reads:

* an engine's ``checkpoint_funnel()``: where checkpoints were asked for and
  what became of them, and why admitted prompts were not resumed in full --
  no KV hit (*KV miss*), a KV hit but no state checkpoint anywhere in it
  (*state miss*), or a KV hit the state caches shortened (*hit cut short*);
* any cache with ``checkpoint_fates()`` (and ``occupancy()``): kept /
  dropped / evicted / orphaned checkpoints;
* any tier with ``stats()`` (``StateOffloadIndex`` or a tier object);
* a ``StateCopyExecutor``'s ``copy_stats``: batches, bytes, spans, refused
  batches and host time per batch.

Prometheus needs the optional extra (``pip install 'statecache[metrics]'``);
``collect()`` does not.

    metrics = StateCacheMetrics(engine)        # or track_cache / track_tier ...
    metrics.collect()                          # {"hit_rates": {...}, ...}
    metrics.serve(9400)                        # http://127.0.0.1:9400/metrics
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statecache.logs import log_config

# cause label -> engine funnel counter of admissions
ADMISSION_CAUSES = {
    "kv_miss": "admissions_kv_miss",
    "state_miss": "admissions_state_miss",
    "hit_cut_short": "admissions_hit_cut_short",
    "full_hit": "admissions_full_hit",
}


def hit_rates(funnel: Mapping[str, int]) -> dict[str, float]:
    """Token shares of admitted prompts, from an engine funnel.

    ``kv``: matched by the KV index; ``state``: actually resumed. The prompt
    tokens not resumed split by cause: ``lost_kv_miss`` (no KV block),
    ``lost_state_miss`` (KV hit, no checkpoint), ``lost_cut_short`` (the part
    of a KV hit past the last usable checkpoint); state + the three losses = 1.
    Returns the shares as a new dict, all 0.0 before the first admission.
    Raises nothing (missing counters count as 0).
    """
    admitted = funnel.get("admitted_tokens", 0)
    if admitted <= 0:
        return dict.fromkeys(("kv", "state", "lost_kv_miss", "lost_state_miss", "lost_cut_short"), 0.0)
    kv = funnel.get("kv_hit_tokens", 0)
    return {
        "kv": kv / admitted,
        "state": funnel.get("resumed_tokens", 0) / admitted,
        "lost_kv_miss": (admitted - kv) / admitted,
        "lost_state_miss": funnel.get("state_miss_tokens", 0) / admitted,
        "lost_cut_short": funnel.get("cut_short_tokens", 0) / admitted,
    }


def _need(obj: object, attr: str, what: str) -> None:
    if not callable(getattr(obj, attr, None)):
        raise TypeError(f"{what}={type(obj).__name__}: has no {attr}() method")


class StateCacheMetrics:
    """Checkpoint funnel and fates, hit rates by cause, tier stats and copy
    counters of the objects registered with it."""

    def __init__(self, engine: Any = None) -> None:
        # Guards the four registries: sources may be registered from one thread
        # while another collects (docs/contract.md, "Threading").
        self._lock = threading.Lock()
        self._funnels: dict[str, Callable[[], Mapping[str, int]]] = {}
        self._caches: dict[str, Any] = {}
        self._tiers: dict[str, Any] = {}
        self._executors: dict[str, Any] = {}
        if engine is not None:
            self.track_engine(engine)

    # ------------------------------------------------------------ sources --

    def track_engine(self, engine: Any, name: str = "engine") -> None:
        """Registers an engine's funnel, its state caches, the tier attached to
        its coordinator and its runner's copy executor, where it has them.
        Returns None. Raises TypeError if ``engine`` has no ``checkpoint_funnel()``."""
        _need(engine, "checkpoint_funnel", "engine")
        with self._lock:
            self._funnels[name] = engine.checkpoint_funnel
        caches = getattr(engine, "caches", None)
        if caches is not None:
            self.track_cache("slots", caches.slot_pool)
            coord = getattr(caches, "coordinator", None)
            if coord is not None:
                self.track_cache("page", coord)
                if getattr(coord, "offload", None) is not None:
                    self.track_tier("offload", coord.offload)
        executor = getattr(getattr(engine, "runner", None), "executor", None)
        if executor is not None and hasattr(executor, "copy_stats"):
            self.track_executor("runner", executor)

    def track_cache(self, name: str, cache: Any) -> None:
        """Registers anything with ``checkpoint_fates()`` (a pool or the PAGE
        coordinator); its ``occupancy()`` too if it has one. Returns None.
        Raises TypeError for an object without ``checkpoint_fates``."""
        _need(cache, "checkpoint_fates", "cache")
        with self._lock:
            self._caches[name] = cache

    def track_tier(self, name: str, tier: Any) -> None:
        """Registers anything with ``stats() -> dict[str, number]``; returns
        None. Raises TypeError for an object without ``stats``."""
        _need(tier, "stats", "tier")
        with self._lock:
            self._tiers[name] = tier

    def track_executor(self, name: str, executor: Any) -> None:
        """Registers a ``StateCopyExecutor`` (its ``copy_stats``); returns None.
        Raises TypeError for an object without a ``copy_stats`` dict."""
        if not isinstance(getattr(executor, "copy_stats", None), dict):
            raise TypeError(f"executor={type(executor).__name__}: has no copy_stats dict")
        with self._lock:
            self._executors[name] = executor

    # ----------------------------------------------------------- snapshot --

    def collect(self) -> dict[str, Any]:
        """Returns a snapshot as plain dicts: ``funnel`` / ``admissions`` /
        ``hit_rates`` per engine, ``checkpoints`` and ``occupancy`` per cache,
        ``tiers`` per tier, ``copy`` per executor. Raises what the registered
        objects raise. Safe from any thread, also while another registers
        sources: it reads the sources registered when it starts."""
        with self._lock:  # the sources are read outside it: they may be slow
            funnels, caches = list(self._funnels.items()), list(self._caches.items())
            tiers, executors = list(self._tiers.items()), list(self._executors.items())
        out: dict[str, Any] = {
            "funnel": {},
            "admissions": {},
            "hit_rates": {},
            "checkpoints": {},
            "occupancy": {},
            "tiers": {},
            "copy": {},
        }
        for name, funnel_of in funnels:
            f = dict(funnel_of())
            out["funnel"][name] = f
            out["admissions"][name] = {c: f.get(k, 0) for c, k in ADMISSION_CAUSES.items()}
            out["hit_rates"][name] = hit_rates(f)
        for name, cache in caches:
            out["checkpoints"][name] = dict(cache.checkpoint_fates())
            occ = getattr(cache, "occupancy", None)
            if callable(occ):
                out["occupancy"][name] = dict(occ())
        for name, tier in tiers:
            out["tiers"][name] = dict(tier.stats())
        for name, ex in executors:
            out["copy"][name] = dict(ex.copy_stats)
        return out

    # --------------------------------------------------------- prometheus --

    def prometheus_collector(self) -> Any:
        """Returns a prometheus_client collector reading this object at each
        scrape. Raises ImportError naming the extra when prometheus-client is
        missing."""
        return _PrometheusCollector(self)

    def registry(self) -> Any:
        """Returns a new ``CollectorRegistry`` holding only this object's
        metrics. Raises ImportError naming the extra when prometheus-client is
        missing."""
        prometheus_client = _prometheus()
        reg = prometheus_client.CollectorRegistry(auto_describe=False)
        reg.register(self.prometheus_collector())
        return reg

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Starts the exporter (a daemon thread) on ``addr:port``; ``port=0``
        picks a free one (``server.server_port``). Returns the HTTP server;
        ``server.shutdown()`` stops it. Raises ImportError without
        prometheus-client, OSError when the port cannot be bound."""
        prometheus_client = _prometheus()
        server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry())
        with self._lock:
            names = dict(
                engines=list(self._funnels),
                caches=list(self._caches),
                tiers=list(self._tiers),
                executors=list(self._executors),
            )
        log_config(
            "metrics exporter",
            dict(
                addr=addr,
                port=server.server_port,
                **names,
            ),
        )
        return server


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError(
            "statecache.metrics' Prometheus exporter needs prometheus-client: pip install 'statecache[metrics]'"
        ) from e
    return prometheus_client


class _PrometheusCollector:
    def __init__(self, metrics: StateCacheMetrics) -> None:
        self.metrics = metrics
        self.pc = _prometheus()

    def describe(self) -> list[Any]:
        return []  # families are known only at scrape time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily as counter
        from prometheus_client.core import GaugeMetricFamily as gauge
        from prometheus_client.core import SummaryMetricFamily as summary

        snap = self.metrics.collect()

        funnel = counter("statecache_funnel", "engine checkpoint funnel counters", labels=["engine", "stage"])
        causes = counter(
            "statecache_admissions",
            "admitted prompts by why they were not resumed in full (full_hit: they were)",
            labels=["engine", "cause"],
        )
        rates = gauge(
            "statecache_hit_rate",
            "token shares of admitted prompts: kv, state (resumed) and the lost share by cause",
            labels=["engine", "kind"],
        )
        for eng, f in snap["funnel"].items():
            for stage, v in sorted(f.items()):
                if isinstance(v, int):
                    funnel.add_metric([eng, stage], v)
            for cause, v in snap["admissions"][eng].items():
                causes.add_metric([eng, cause], v)
            for kind, r in snap["hit_rates"][eng].items():
                rates.add_metric([eng, kind], r)
        yield from (funnel, causes, rates)

        fates = counter(
            "statecache_checkpoint_fates",
            "checkpoints by fate, per cache",
            labels=["cache", "fate"],
        )
        for cache, fs in snap["checkpoints"].items():
            for fate, v in sorted(fs.items()):
                fates.add_metric([cache, fate.removeprefix("checkpoints_")], v)
        occupancy = gauge("statecache_occupancy", "slot / group occupancy, per cache", labels=["cache", "field"])
        for cache, occ in snap["occupancy"].items():
            for field, v in sorted(occ.items()):
                occupancy.add_metric([cache, field], v)
        tiers = gauge("statecache_tier_stat", "a tier's stats() entries", labels=["tier", "stat"])
        for tier, stats in snap["tiers"].items():
            for stat, v in sorted(stats.items()):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    tiers.add_metric([tier, stat], v)
        yield from (fates, occupancy, tiers)

        batches = counter("statecache_copy_batches", "maintenance batches run", labels=["executor"])
        refused = counter(
            "statecache_copy_refused",
            "maintenance batches refused (nothing moved)",
            labels=["executor"],
        )
        nbytes = counter("statecache_copy_bytes", "bytes copied by maintenance batches", labels=["executor"])
        spans = counter("statecache_copy_spans", "copy spans of maintenance batches", labels=["executor"])
        latency = summary(
            "statecache_copy_batch_seconds",
            "host time to plan and run (CPU) or enqueue (GPU) one batch",
            labels=["executor"],
        )
        for ex, st in snap["copy"].items():
            batches.add_metric([ex], st["batches"])
            refused.add_metric([ex], st["refused"])
            nbytes.add_metric([ex], st["bytes"])
            spans.add_metric([ex], st["spans"])
            latency.add_metric([ex], count_value=st["batches"], sum_value=st["seconds"])
        yield from (batches, refused, nbytes, spans, latency)
