"""Replay a request trace through the reference engine, with no model.

The engine (``statecache.engine``) runs its own block manager and scheduler
over the real statecache pools and store; the simulator only feeds it
requests at their arrival times, stands in for the model runner (it returns
no tokens, so the engine takes each request's scripted output, and it moves
a simulated clock by the forward's FLOPs), and reads the results back.

Memory is given in bytes and turned into the engine's sizes:

* separate budgets (``kv_memory`` + ``state_memory``): KV blocks in a
  ``BlockPool`` of ``kv_memory // (hash_block_size * kv_bytes_per_token)``
  blocks; state in a ``StateSlotPool`` under ``fork`` with one slot per live
  request plus ``state_memory // state_bytes`` for checkpoints.
* one shared budget (``memory``): a single ``BlockPool`` holds KV blocks and
  PAGE checkpoint images (``ceil(state_bytes / block_bytes)`` units each),
  through the ``PagedStateCheckpointCoordinator``; live states sit in a slot
  pool beside it, one slot per running request, not charged to the budget.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import statecache
from statecache.engine import Engine, EngineConfig, Request, StateCaches

from .geometry import DEFAULT_PRESET, ModelGeometry, preset
from .policies import PolicyContext
from .policies import policy as policy_spec
from .trace import TraceRequest, ideal_block_hit_rate

# The library's time per pass is this thread's CPU time: on a shared machine
# wall time would also count the time other processes held the core.
_now_ns = time.thread_time_ns

# Pure-recurrent models have no KV bytes; their "KV" pool only names
# prefixes, so it is made big enough never to matter.
_UNBOUNDED_BLOCKS = 1 << 20


@dataclass(frozen=True)
class SimConfig:
    """One simulation: a policy, a geometry, budgets and an engine shape.

    ``memory`` (shared KV + PAGE images) and ``kv_memory``/``state_memory``
    (separate pools) are exclusive. ``interval_tokens`` is statecache's
    ladder (-1: anchor and demand only); ``peer_interval_tokens`` is the N
    of SGLang's every-N. ``arrivals="trace"`` admits requests at their
    timestamps on a clock the modelled forwards advance (``device_flops``
    effective FLOP/s, at least ``pass_floor_ms`` a pass); ``"asap"`` keeps
    the queue full and ignores timestamps.
    """

    policy: str = "statecache"
    geometry: str = DEFAULT_PRESET
    kv_memory: int | None = 64 * 2**30
    state_memory: int | None = 8 * 2**30
    memory: int | None = None
    concurrency: int = 16
    max_batched_tokens: int = 8192
    hash_block_size: int = 512
    interval_tokens: int = -1
    peer_interval_tokens: int = 4096
    ladder_tokens: int = 16384
    fork_tokens: int = 1
    arrivals: str = "trace"
    max_output_tokens: int | None = None
    device_flops: float = 4.0e14
    pass_floor_ms: float = 5.0
    # Tiers below GPU memory (shared-memory mode only): byte budgets and the
    # bandwidths a load costs on the simulated clock.
    host_memory: int = 0
    shared_tier_memory: int = 0
    host_gbps: float = 55.0
    remote_gbps: float = 25.0
    # None: each tier is one budget for KV blocks and images, ranked together;
    # a float: that share of each tier kept for KV blocks, the rest for images
    tier_kv_share: float | None = None
    seed: int = 0
    # The engine's deployment key (EngineConfig.hash_seed). None: random per
    # process, so the adaptive policy samples other requests each run; give
    # one for runs that repeat exactly.
    hash_seed: int | None = None

    def __post_init__(self) -> None:
        policy_spec(self.policy)
        preset(self.geometry)
        if self.memory is not None:
            if self.kv_memory is not None or self.state_memory is not None:
                raise ValueError("give either memory, or kv_memory and state_memory, not both")
            _non_negative("memory", self.memory)
        else:
            if self.kv_memory is None or self.state_memory is None:
                raise ValueError("kv_memory and state_memory are both needed without memory")
            _non_negative("kv_memory", self.kv_memory)
            _non_negative("state_memory", self.state_memory)
        for name in ("concurrency", "max_batched_tokens", "hash_block_size", "peer_interval_tokens", "fork_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if self.hash_seed is not None and (isinstance(self.hash_seed, bool) or not isinstance(self.hash_seed, int)):
            raise ValueError(f"hash_seed must be an int or None, got a {type(self.hash_seed).__name__}")
        for name in ("interval_tokens", "ladder_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise ValueError(f"{name} must be an int >= -1, got {value!r}")
        if self.max_output_tokens is not None and (
            isinstance(self.max_output_tokens, bool)
            or not isinstance(self.max_output_tokens, int)
            or self.max_output_tokens <= 0
        ):
            raise ValueError(f"max_output_tokens must be a positive int or None, got {self.max_output_tokens!r}")
        if self.arrivals not in ("trace", "asap"):
            raise ValueError(f"arrivals must be 'trace' or 'asap', got {self.arrivals!r}")
        _non_negative("host_memory", self.host_memory)
        _non_negative("shared_tier_memory", self.shared_tier_memory)
        if (self.host_memory or self.shared_tier_memory) and self.memory is None:
            raise ValueError(
                "host_memory / shared_tier_memory model tiers under PAGE images: "
                "give memory (shared KV + checkpoints), not kv_memory/state_memory"
            )
        if self.tier_kv_share is not None and not 0.0 <= self.tier_kv_share <= 1.0:
            raise ValueError(f"tier_kv_share must be in [0, 1], got {self.tier_kv_share!r}")
        if not self.host_gbps > 0 or not self.remote_gbps > 0:
            raise ValueError(f"host_gbps and remote_gbps must be > 0, got {self.host_gbps!r}, {self.remote_gbps!r}")
        if not self.device_flops > 0 or not self.pass_floor_ms >= 0:
            raise ValueError(
                f"device_flops must be > 0 and pass_floor_ms >= 0, got {self.device_flops!r}, {self.pass_floor_ms!r}"
            )

    @property
    def shared(self) -> bool:
        return self.memory is not None


def _non_negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int of bytes, got {value!r}")


class _ClockRunner:
    """Model-free runner: no tokens (the engine uses scripted outputs); the
    clock advances by the forward's modelled time."""

    def __init__(self, geometry: ModelGeometry, device_flops: float, floor_s: float) -> None:
        self.geometry = geometry
        self.device_flops = device_flops
        self.floor_s = floor_s
        self.now_s = 0.0
        self.busy_ns = 0

    def execute(self, batch) -> dict:
        t0 = _now_ns()
        flops = 0
        for item in batch.items:
            flops += self.geometry.prefill_flops(item.start, item.start + len(item.token_ids))
        self.now_s += max(self.floor_s, flops / self.device_flops)
        self.busy_ns += _now_ns() - t0
        return {}


@dataclass
class _Sizes:
    block_bytes: int
    num_blocks: int
    num_slots: int
    units_per_checkpoint: int
    checkpoint_capacity: int


def _sizes(cfg: SimConfig, g: ModelGeometry) -> _Sizes:
    hbs = cfg.hash_block_size
    block_bytes = hbs * g.kv_bytes_per_token
    live = cfg.concurrency
    if cfg.shared:
        if not block_bytes:
            raise ValueError(
                f"geometry {g.name} has no KV blocks to share memory with: give "
                "kv_memory and state_memory instead of memory"
            )
        units = -(-g.state_bytes // block_bytes)
        return _Sizes(block_bytes, cfg.memory // block_bytes, live, units, cfg.memory // (units * block_bytes))
    blocks = cfg.kv_memory // block_bytes if block_bytes else _UNBOUNDED_BLOCKS
    capacity = cfg.state_memory // g.state_bytes
    return _Sizes(block_bytes, blocks, live + capacity, 0, capacity)


@dataclass
class SimResult:
    """What one simulation measured (``to_dict`` is the JSON form)."""

    config: SimConfig
    requests: int = 0
    prompt_tokens: int = 0
    kv_hit_tokens: int = 0
    state_hit_tokens: int = 0
    resumed_requests: int = 0
    prompt_flops: int = 0
    saved_flops: int = 0
    passes: int = 0
    library_ns: list = field(default_factory=list)
    checkpoint_bytes_samples: list = field(default_factory=list)
    funnel: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    ideal_block_hit_rate: float = 0.0
    simulated_s: float = 0.0
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        cfg = self.config
        f = self.funnel
        state_memory = cfg.memory if cfg.shared else cfg.state_memory
        ns = sorted(self.library_ns)
        return {
            "policy": cfg.policy,
            "geometry": cfg.geometry,
            "config": asdict(cfg),
            "state_memory": state_memory,
            "sizes": self.sizes,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "kv_hit_tokens": self.kv_hit_tokens,
            "state_hit_tokens": self.state_hit_tokens,
            "kv_hit_rate": self.kv_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "state_hit_rate": self.state_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "ideal_block_hit_rate": self.ideal_block_hit_rate,
            "prompt_flops": self.prompt_flops,
            "saved_flops": self.saved_flops,
            "flops_saved_fraction": self.saved_flops / self.prompt_flops if self.prompt_flops else 0.0,
            "checkpoints": {
                "requested": f.get("checkpoints_requested", 0),
                "kept": f.get("checkpoints_kept", 0),
                "read": self.resumed_requests,
                "evicted": f.get("checkpoints_evicted", 0),
                "orphaned": f.get("checkpoints_orphaned", 0),
                "dropped": f.get("checkpoints_dropped", 0),
            },
            "funnel": dict(sorted(f.items())),
            "checkpoint_bytes_peak": max(self.checkpoint_bytes_samples, default=0),
            "checkpoint_bytes_mean": (
                statistics.fmean(self.checkpoint_bytes_samples) if self.checkpoint_bytes_samples else 0.0
            ),
            "passes": self.passes,
            "library_us_per_pass": ns[len(ns) // 2] / 1e3 if ns else 0.0,
            "library_us_per_pass_mean": statistics.fmean(ns) / 1e3 if ns else 0.0,
            "library_us_per_pass_p99": ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1e3 if ns else 0.0,
            "simulated_s": self.simulated_s,
            "wall_s": self.wall_s,
            "host_memory": cfg.host_memory,
            "shared_tier_memory": cfg.shared_tier_memory,
            # state-gated hit rate by where the resumed image came from
            "tier_hit_rate": {
                t: f.get(f"resumed_tokens_{t}", 0) / self.prompt_tokens for t in ("gpu", "host", "shared")
            }
            if self.prompt_tokens
            else {},
        }


def build_engine(cfg: SimConfig, g: ModelGeometry | None = None) -> tuple[Engine, _Sizes, _ClockRunner]:
    """The reference engine for ``cfg`` over real statecache pools, and its runner."""
    g = g or preset(cfg.geometry)
    sizes = _sizes(cfg, g)
    hbs = cfg.hash_block_size
    pool = statecache.BlockPool(sizes.num_blocks)
    if cfg.shared:
        spec = statecache.PagedStateCheckpointSpec(
            page_unit_bytes=sizes.block_bytes,
            slot_bytes=g.state_bytes,
            layout_id=f"sim-{g.name}",
            image_bytes=g.state_bytes,
        )
        caches = StateCaches.build(
            statecache.StateTransfer.copy(f"sim-{g.name}"), sizes.num_slots, hbs, block_pool=pool, spec=spec
        )
    else:
        caches = StateCaches.build(statecache.StateTransfer.fork(cfg.fork_tokens), sizes.num_slots, hbs)
    ctx = PolicyContext(
        geometry=g,
        hash_block_size=hbs,
        chunk_tokens=cfg.max_batched_tokens,
        interval_tokens=cfg.peer_interval_tokens,
        ladder_tokens=cfg.ladder_tokens,
        seed=cfg.seed,
    )
    placement, eviction = policy_spec(cfg.policy).build(ctx)
    econf = EngineConfig(
        hash_block_size=hbs,
        max_num_seqs=cfg.concurrency,
        max_num_batched_tokens=cfg.max_batched_tokens,
        checkpoint_interval_tokens=cfg.interval_tokens,
        hash_seed=cfg.hash_seed,
    )
    runner = _ClockRunner(g, cfg.device_flops, cfg.pass_floor_ms / 1e3)
    engine = Engine(econf, pool, caches, runner, placement=placement, eviction=eviction)
    if cfg.host_memory or cfg.shared_tier_memory:
        from .tiers import SimTiers

        tiers = SimTiers(
            engine,
            runner,
            sizes.block_bytes,
            sizes.units_per_checkpoint,
            cfg.host_memory,
            cfg.shared_tier_memory,
            cfg.host_gbps,
            cfg.remote_gbps,
            kv_share=cfg.tier_kv_share,
        )
        engine.tiering = engine.block_manager.tiering = tiers
    return engine, sizes, runner


def _checkpoint_bytes(engine: Engine, sizes: _Sizes, g: ModelGeometry) -> int:
    caches = engine.caches
    if caches.coordinator is not None:
        return len(caches.coordinator.store.records) * sizes.units_per_checkpoint * sizes.block_bytes
    return len(caches.slot_pool.hash_to_slot) * g.state_bytes


def simulate(trace: Sequence[TraceRequest], cfg: SimConfig, progress=None) -> SimResult:
    """Replay ``trace`` (sorted by arrival) under ``cfg``. ``progress`` is
    called with the number of requests finished since the last call."""
    g = preset(cfg.geometry)
    engine, sizes, runner = build_engine(cfg, g)
    hbs = cfg.hash_block_size
    cap = cfg.max_output_tokens or 1 << 62
    longest = max((-(-(r.input_length + max(1, min(cap, r.output_length))) // hbs) for r in trace), default=0)
    if longest > sizes.num_blocks - cfg.concurrency:
        raise ValueError(
            f"kv memory holds {sizes.num_blocks} blocks of {hbs} tokens; the longest request needs "
            f"{longest} (+{cfg.concurrency} for decode headroom): raise the KV budget"
        )
    res = SimResult(config=cfg, sizes=asdict(sizes), ideal_block_hit_rate=ideal_block_hit_rate(trace))
    pending = deque(r for r in trace if r.input_length > 0)
    res.requests = len(pending)
    queue_cap = 2 * cfg.concurrency
    asap = cfg.arrivals == "asap"
    t_start = time.perf_counter()
    while pending or engine.has_unfinished():
        if not asap and pending and not engine.has_unfinished():
            runner.now_s = max(runner.now_s, pending[0].timestamp_ms / 1e3)
        while pending and len(engine.waiting) < queue_cap and (asap or pending[0].timestamp_ms / 1e3 <= runner.now_s):
            r = pending.popleft()
            out = r.output_tokens().tolist()[: cfg.max_output_tokens] or [0]
            engine.add_request(
                Request(
                    r.prompt_tokens().tolist(),
                    len(out),
                    request_id=r.index,
                    scripted_output=out,
                    arrival=r.timestamp_ms,
                )
            )
        if not engine.has_unfinished():
            continue
        busy0 = runner.busy_ns
        t0 = _now_ns()
        done = engine.step()
        res.library_ns.append(_now_ns() - t0 - (runner.busy_ns - busy0))
        for seq in done:
            resumed = min(seq.num_cached_tokens, seq.num_prompt_tokens)
            res.prompt_tokens += seq.num_prompt_tokens
            res.state_hit_tokens += resumed
            res.resumed_requests += resumed > 0
            res.prompt_flops += g.prefill_flops(0, seq.num_prompt_tokens)
            res.saved_flops += g.prefill_flops(0, resumed)
        if done:
            engine.finished.clear()  # the simulator keeps numbers, not requests
            if progress is not None:
                progress(len(done))
        res.checkpoint_bytes_samples.append(_checkpoint_bytes(engine, sizes, g))
    res.wall_s = time.perf_counter() - t_start
    res.passes = engine.num_passes
    res.simulated_s = runner.now_s
    res.funnel = engine.checkpoint_funnel()
    if engine.tiering is not None:
        res.funnel.update({f"tier_{k}": v for k, v in engine.tiering.stats().items()})
    res.kv_hit_tokens = res.funnel.get("kv_hit_tokens", 0)
    return res


def sweep(
    trace: Sequence[TraceRequest], configs: Iterable[SimConfig], jobs: int = 1, progress: bool = False
) -> list[dict]:
    """Run every config (in processes when ``jobs > 1``); results in order."""
    configs = list(configs)
    if jobs <= 1 or len(configs) <= 1:
        bar = _bar(len(trace) * len(configs), progress)
        out = [simulate(trace, c, progress=bar.update if bar else None).to_dict() for c in configs]
        if bar:
            bar.close()
        return out
    import concurrent.futures as cf
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        futures = [ex.submit(_simulate_dict, trace, c) for c in configs]
        bar = _bar(len(configs), progress, unit="run")
        for _ in cf.as_completed(futures):
            if bar:
                bar.update(1)
        if bar:
            bar.close()
        return [f.result() for f in futures]


def _simulate_dict(trace, cfg):
    return simulate(trace, cfg).to_dict()


def _bar(total: int, enabled: bool, unit: str = "req"):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, dynamic_ncols=True, leave=False)


__all__ = ["SimConfig", "SimResult", "build_engine", "simulate", "sweep"]
