"""``StateCacheConnector``: statecache's tiers under vLLM, as a KV connector
for hybrid models (docs/vllm.md).

    KVTransferConfig(kv_connector="StateCacheConnector",
                     kv_connector_module_path="statecache.vllm",
                     kv_role="kv_both",
                     kv_connector_extra_config={"host_memory": "4GB"})

vLLM builds one instance in the scheduler (``ConnectorScheduler``: the host
index, matching, load and save planning) and one in each worker
(``ConnectorWorker``: the byte moves and checks). This class only forwards
vLLM's calls to them and times the scheduler side.
"""

from __future__ import annotations

import hashlib
import json
import logging
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from statecache.vllm.config import ConnectorConfig
from statecache.vllm.geometry import UnsupportedGeometry, build_geometry
from statecache.vllm.metadata import StateCacheMeta
from statecache.vllm.scheduler import (
    AFTER_ALLOC,
    FINISHED,
    HIT_SOURCES,
    HOST,
    MATCH,
    SHARED,
    STATS,
    UPDATE,
    ConnectorScheduler,
)
from statecache.vllm.stats import StateCachePromMetrics, StateCacheStats
from statecache.vllm.worker import ConnectorWorker

log = logging.getLogger("statecache.vllm")

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


def model_identity(vllm_config: VllmConfig, model_id: str | None) -> str:
    """What the keys are salted with besides the secret: the model's name,
    revision, config and the dtypes of what is cached (``model_id`` replaces
    the name where one name serves other weights)."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    try:
        hf = json.dumps(mc.hf_config.to_dict(), sort_keys=True, default=str)
    except (TypeError, ValueError, AttributeError) as e:  # a config that will not serialize: its repr names it
        log.info("statecache connector: model config not JSON-serializable (%s); keyed by its repr", e)
        hf = repr(mc.hf_config)
    parts = [
        model_id or str(mc.model),
        str(getattr(mc, "revision", None)),
        str(mc.dtype),
        str(getattr(mc, "quantization", None)),
        str(cc.cache_dtype),
        str(getattr(cc, "mamba_cache_dtype", None)),
        str(getattr(cc, "mamba_ssm_cache_dtype", None)),
        hashlib.blake2b(hf.encode(), digest_size=16).hexdigest(),
    ]
    return "|".join(parts)


class StateCacheConnector(KVConnectorBase_V1, SupportsHMA):
    """Keeps below vLLM's memory the KV blocks and the recurrent states at
    the boundaries vLLM computes (decode boundaries included) and resumes
    admissions from them, never a state without its KV prefix."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config, role, kv_cache_config)
        self.config = ConnectorConfig.from_extra(
            self._kv_transfer_config.kv_connector_extra_config, self._kv_transfer_config.kv_role
        )
        pc = vllm_config.parallel_config
        for name in ("pipeline_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"):
            if getattr(pc, name, 1) > 1:
                raise UnsupportedGeometry(f"StateCacheConnector does not support {name} > 1")
        if not vllm_config.cache_config.enable_prefix_caching:
            raise UnsupportedGeometry("StateCacheConnector needs prefix caching on (enable_prefix_caching=True)")
        if vllm_config.speculative_config is not None:
            raise UnsupportedGeometry("StateCacheConnector does not support speculative decoding yet")
        self.geometry = build_geometry(
            kv_cache_config, model_identity(vllm_config, self.config.model_id), self.config.entry_bytes
        )
        if role == KVConnectorRole.SCHEDULER and self._kv_transfer_config.kv_load_failure_policy != "recompute":
            # A cache must never fail a request: a load that fails its checks is
            # recomputed. (vLLM reads the policy after building this object.)
            log.info(
                "statecache connector: kv_load_failure_policy=%r -> 'recompute' (a failed or untrusted load "
                "is recomputed, never an error)",
                self._kv_transfer_config.kv_load_failure_policy,
            )
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
        self.tp_size = pc.tensor_parallel_size
        self.sched: ConnectorScheduler | None = None
        self.worker: ConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.sched = ConnectorScheduler(self.config, self.geometry, self.tp_size, vllm_config)
            # vLLM calls it every step: straight to the scheduler object, no forwarding frame
            self.build_connector_meta = self.sched.build_meta  # type: ignore[method-assign]
        else:
            rank = 0
            if self.tp_size > 1:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

                rank = get_tensor_model_parallel_rank()
            self.worker = ConnectorWorker(self.config, self.geometry, rank, self.tp_size)

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a later miss

    # ------------------------------------------------------------- worker --

    def _meta(self) -> StateCacheMeta:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StateCacheMeta)
        return meta

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker is not None
        self.worker.register_kv_caches(kv_caches, self._kv_cache_config)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self.worker is not None
        self.worker.start_loads(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are whole-request and finish before vLLM schedules it

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # saves run once per step, in wait_for_save

    def wait_for_save(self) -> None:
        assert self.worker is not None
        self.worker.save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self.worker is not None
        sent, done, _failed = self.worker.get_finished()
        return sent, done

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        assert self.worker is not None
        sent, done, failed = self.worker.get_finished()
        return KVConnectorTransferResults(finished_sending=sent, finished_recving=done, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        # vLLM 0.32 refuses block-level failures for models with several KV
        # cache groups (every hybrid model); failed loads go through
        # failed_recving instead, which makes vLLM recompute the request.
        return set()

    def build_connector_worker_meta(self) -> Any:
        return self.worker.take_report() if self.worker is not None else None

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.sched is not None:
            self.sched.shutdown()

    # ---------------------------------------------------------- scheduler --

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        assert self.sched is not None
        self.sched.bind(kv_cache_manager)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        s = self.sched
        assert s is not None
        t0 = perf_counter()
        n = s.match(request, num_computed_tokens)
        s.hook_seconds[MATCH] += perf_counter() - t0  # list items, no dict: vLLM calls the hooks every step
        s.hook_calls[MATCH] += 1
        return n, n is not None and n > 0

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        s = self.sched
        assert s is not None
        t0 = perf_counter()
        s.after_alloc(request, blocks, num_external_tokens)
        s.hook_seconds[AFTER_ALLOC] += perf_counter() - t0
        s.hook_calls[AFTER_ALLOC] += 1

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict[CacheHitSource, int]:
        s = self.sched
        assert s is not None
        t0 = perf_counter()
        by = s.hit_sources(request)
        out = {CacheHitSource.HOST: by.get(HOST, 0), CacheHitSource.P2P: by.get(SHARED, 0)}
        out = {k: v for k, v in out.items() if v}
        s.hook_seconds[HIT_SOURCES] += perf_counter() - t0
        s.hook_calls[HIT_SOURCES] += 1
        return out

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        # the scheduler-side instance binds the scheduler object's method in
        # its place (__init__), which times itself
        assert self.sched is not None
        return self.sched.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        s = self.sched
        assert s is not None
        t0 = perf_counter()
        o = connector_output  # vLLM's KVConnectorOutput: these fields are always there
        if o.kv_connector_worker_meta is not None or o.finished_recving or o.failed_recving:
            s.update(o)  # most steps save, load and fail nothing: no call
        s.hook_seconds[UPDATE] += perf_counter() - t0
        s.hook_calls[UPDATE] += 1

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self.sched is not None:
            self.sched.finished(request, None)
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        # Values at boundaries were saved in the steps that computed them; the
        # state the request ends with, off a boundary, is saved from its blocks
        # in the next step, and vLLM keeps them until the worker says so.
        s = self.sched
        assert s is not None
        t0 = perf_counter()
        hold = s.finished(request, block_ids)
        s.hook_seconds[FINISHED] += perf_counter() - t0
        s.hook_calls[FINISHED] += 1
        return hold, None

    # ------------------------------------------------------------ metrics --

    def checkpoint_funnel(self) -> dict[str, float]:
        """Cumulative counters in the shape of statecache's engine funnel, so
        ``statecache.metrics.StateCacheMetrics`` can track this connector."""
        assert self.sched is not None, "the funnel lives in the scheduler-side connector"
        return self.sched.funnel()

    def get_kv_connector_stats(self) -> StateCacheStats | None:
        s = self.sched
        if s is None:
            return None  # workers report through the scheduler side
        t0 = perf_counter()  # vLLM asks every step: scheduler-side time like any hook
        stats = None
        if t0 >= s.stats_due:  # most steps: no report due, no call
            data = s.take_interval(t0)
            if data:
                stats = StateCacheStats(data=data)
        s.hook_seconds[STATS] += perf_counter() - t0
        s.hook_calls[STATS] += 1
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> StateCacheStats:
        return StateCacheStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> StateCachePromMetrics:
        return StateCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
