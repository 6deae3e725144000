"""The README's examples as code that runs and that `mypy --strict` checks
(see api/test_stubs.py). api/test_stubs.py also checks that every ```python block of
the README appears here line for line, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import statecache as sc


def test_one_scheduler_pass() -> None:
    # README: "One scheduler pass"
    import statecache as sc

    pool = sc.StateSlotPool(1024, sc.StateTransfer.fork(16), hash_block_size=16)
    seqs = [sc.Sequence(seq_id=i, num_tokens=1056, num_prompt_tokens=1056) for i in range(4)]
    for seq in seqs:
        seq.state_slots = pool.pop_many(1)                 # admitted: one committed slot each
        seq.block_hashes = [1000 * seq.seq_id + b for b in range(66)]  # chained hashes of its full blocks

    pool.release_pins()                                    # top of pass: last batch was issued
    hits = pool.resumable_hits(seqs, [64] * len(seqs))     # cap each 64-block KV hit: 0 here
    relocations = pool.take_relocations()                  # maintenance ops before the forward
    # ... forward runs ...
    pool.checkpoint_many(seqs, [32] * len(seqs),           # postprocess: keep block 32 of each
                         [seq.block_hashes[31] for seq in seqs])
    assert pool.lookup(seqs[0].block_hashes[31]) == seqs[0].state_fork_src  # filed, pinned through next pass
    done = seqs[:2]                                        # two requests finished
    pool.release_many([slot for seq in done for slot in seq.state_slots])
    for seq in done:
        pool.drop_reader(seq.state_fork_src)               # ... and their read obligations
    print(pool.checkpoint_fates(), pool.occupancy())

    assert hits == [0, 0, 0, 0] and relocations == ()
    assert pool.checkpoint_fates()["checkpoints_kept"] == 4 and pool.num_free() == 1024 - 2 - 2


def test_paged_checkpoints() -> None:
    # README: "PAGE checkpoints"
    import statecache as sc

    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=4096, slot_bytes=65536, layout_id="gdn", image_bytes=65536)
    pool = sc.BlockPool(65536)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, enabled=True)
    pool.on_evict = coord.unindex          # a checkpoint is reachable only while its KV block is

    seq = sc.Sequence(seq_id=1); seq.state_slots = [3]
    coord.complete_previous_batch()        # top of pass N
    coord.checkpoint(seq, 4, 1234)         # postprocess of pass N
    coord.complete_previous_batch()        # top of pass N+1
    stores, restores = coord.take_checkpoint_ops()   # the runner scatters slot 3 into 16 units
    coord.complete_previous_batch()        # top of pass N+2: READY
    assert coord.resumable_hit(seq, 5, [11, 12, 13, 1234, 99]) == 4

    assert len(stores) == 1 and stores[0].src_slot == 3 and restores == ()


def test_copy_engine() -> None:
    # README: "Copy engine"
    import torch

    import statecache as sc

    conv = torch.randn(2, 8, 3, 64).to(torch.bfloat16)      # [layers, slots, ...] state tensors
    rec = torch.randn(2, 8, 4, 16, 16)                       # fp32
    kv = torch.zeros(2, 64, 16, 2, 16)                       # [K/V, blocks, block_size, heads, dim]
    state = sc.StateLayout([conv, rec], slot_dim=1)          # a slot: its rows of conv and rec
    page = sc.PageLayout([kv], unit_dim=1)                   # unit u = block u of K and of V
    spec = sc.paged_checkpoint_spec(state, page)             # slot_bytes, image_bytes, page_unit_bytes, layout_id
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)   # the tensors' device ("cpu": memcpy)
    store = sc.PageUnitCheckpointStore(sc.BlockPool(64), spec)
    op = store.begin_store(1234, 3)                          # slot 3's image -> page units
    assert op is not None
    ex(stores=[op])                                          # one launch on the current stream
    store.complete_inflight()                                # next pass: READY
    restore = store.begin_restore(1234, 5)                   # resume into slot 5
    assert restore is not None
    ex(restores=store.take_restore_ops())
    assert torch.equal(conv[:, 5], conv[:, 3]) and torch.equal(rec[:, 5], rec[:, 3])
    # on a GPU: cap = ex.capture(max_spans=...); cap.replay(stores=...) replays a CUDA graph


def test_metrics() -> None:
    # README: "Metrics and logs"
    import statecache as sc
    from statecache.metrics import StateCacheMetrics

    pool = sc.StateSlotPool(64, sc.StateTransfer.fork(16), hash_block_size=16)
    metrics = StateCacheMetrics()
    metrics.track_cache("slots", pool)                       # checkpoint fates, occupancy
    snapshot = metrics.collect()                             # a plain dict, no extra needed
    assert snapshot["checkpoints"]["slots"]["checkpoints_kept"] == 0


def test_engine_policies() -> None:
    # README: placement and eviction policies of the engine
    from statecache.engine import EngineConfig, StateCaches
    from statecache.models import build_engine as _build

    base = _build("qwen3next", "page", num_blocks=64)
    config: Any = EngineConfig(hash_block_size=16, max_num_seqs=4, max_num_batched_tokens=256)
    runner: Any = base.runner
    pool = sc.BlockPool(64)
    caches: Any = StateCaches.build(
        base.caches.transfer, 32, 16, block_pool=pool, spec=runner.checkpoint_spec(),
        enabled=True, max_num_seqs=4,
    )

    from statecache.engine import AnchorLadderDemand, Engine, GuessFirstLRU
    engine = Engine(config, pool, caches, runner,
                    placement=AnchorLadderDemand(), eviction=GuessFirstLRU())  # the pre-adaptive default
    # a fixed ladder under the adaptive policy: EngineConfig(checkpoint_interval_tokens=16384)
    # a peer: statecache.sim.policies.POLICIES["sglang"].build(ctx) -> (placement, eviction)

    assert engine.runner is runner


@dataclass(frozen=True)
class _Geometry:
    flops_per_token: float
    attention_flops_per_context_token: float
    state_bytes: int


def test_eviction_policy() -> None:
    # README: "set_eviction_policy"
    g = _Geometry(flops_per_token=2.0e9, attention_flops_per_context_token=1.0e5, state_bytes=65536)
    hash_block_size = 16
    pool = sc.StateSlotPool(64, sc.StateTransfer.fork(16), hash_block_size=hash_block_size)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=4096, slot_bytes=65536, layout_id="gdn", image_bytes=65536)
    coord = sc.PagedStateCheckpointCoordinator(sc.BlockPool(256), spec, enabled=True)

    pool.set_eviction_policy("lru")                        # the reference behaviour (default): LRU, guesses first
    coord.set_eviction_policy("cost", flops_per_token=g.flops_per_token,
                              flops_per_context_token=g.attention_flops_per_context_token,
                              checkpoint_bytes=g.state_bytes, tokens_per_position=hash_block_size,
                              weight=1.0, guesses_first=True)
    coord.eviction_policy                                  # the setting, as a dict

    assert pool.eviction_policy["kind"] == "lru"
    policy = coord.eviction_policy
    assert policy["kind"] == "cost" and policy["checkpoint_bytes"] == 65536.0
    with pytest.raises(ValueError):
        pool.set_eviction_policy("fifo")  # type: ignore[arg-type]


class _FakeMooncakeStore:
    """Stands in for a Mooncake Store client (the README's cluster is not here)."""

    def setup(self, *args: object) -> int:
        return 0

    def register_buffer(self, address: int, nbytes: int) -> int:
        return 0

    def close(self) -> int:
        return 0


def test_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    # README: tiers below GPU memory. Runs without 512 GiB of host memory or a
    # Mooncake cluster: the host buffer is one row, the store a stand-in.
    import statecache.tiers.host as host_module
    import statecache.tiers.mooncake_tier as mooncake_tier

    def small_buffer(
        num_entries: int, entry_bytes: int, pin_memory: bool | None
    ) -> tuple[host_module.Rows, Any]:
        arr = np.empty((1, entry_bytes), dtype=np.uint8)
        return arr, arr

    monkeypatch.setattr(host_module, "_allocate_buffer", small_buffer)
    monkeypatch.setattr(mooncake_tier, "_import_store", lambda: _FakeMooncakeStore)
    unit_bytes = 8192                                    # the tiny qwen3next's page unit

    monkeypatch.setenv("STATECACHE_HASH_KEY", "5f0c0b6a8c1d4e2f9a7b3c5d6e8f1a2b")
    import os

    from statecache.models import build_engine
    from statecache.tiers import HostTier, MooncakeTier

    host = HostTier(512 << 30, unit_bytes)            # entry = one page unit; KV + states, one budget
    shared = MooncakeTier("10.0.0.5:50051", "http://10.0.0.5:8080/metadata", protocol="rdma",
                          device_names="mlx5_0", local_host="10.0.0.7")  # this node's internal address
    fleet_key = bytes.fromhex(os.environ["STATECACHE_HASH_KEY"])  # the deployment key: one secret per fleet
    engine = build_engine("qwen3next", "page", tiers=[host, shared], hash_salt=fleet_key)  # or Engine(...)

    assert engine.tiering is not None
    assert engine.block_manager.deployment_key.configured
    shared.close()
    host.close()


def test_deployment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/operations.md: "The deployment key"
    monkeypatch.setenv("STATECACHE_HASH_KEY", "5f0c0b6a8c1d4e2f9a7b3c5d6e8f1a2b")
    import os

    from statecache.engine import EngineConfig

    # one secret per fleet, from the secrets store (here: the environment), never a command line
    config = EngineConfig(hash_block_size=16, hash_salt=bytes.fromhex(os.environ["STATECACHE_HASH_KEY"]))

    assert "5f0c" not in repr(config)


def _start_vllm(MODEL: str) -> Any:
    # docs/vllm.md: "Turning it on" (an engine start: checked by mypy, run by tests/python/vllm_connector)
    from vllm import LLM
    from vllm.config import KVTransferConfig

    # fmt: off
    llm = LLM(model=MODEL, kv_transfer_config=KVTransferConfig(
        kv_connector="StateCacheConnector", kv_connector_module_path="statecache.vllm",
        kv_role="kv_both", kv_connector_extra_config={"host_memory": "4GB"}))
    # fmt: on
    return llm


def test_vllm_connector_config() -> None:
    # vllm.config, not vllm: a test folder named vllm would import as a namespace package
    pytest.importorskip("vllm.config", reason="vLLM is not installed here (.ci/vllm has it)")
    import importlib

    from vllm.config import KVTransferConfig

    cfg = KVTransferConfig(
        kv_connector="StateCacheConnector", kv_connector_module_path="statecache.vllm",
        kv_role="kv_both", kv_connector_extra_config={"host_memory": "4GB"})  # fmt: skip
    cls = getattr(importlib.import_module(cfg.kv_connector_module_path), cfg.kv_connector)
    assert cls.__name__ == "StateCacheConnector" and cls.__module__ == "statecache.vllm.connector"


def test_typed_api_catches_misuse() -> None:
    """What the stubs give a caller: real types, not ``object``."""
    pool = sc.StateSlotPool(4, sc.StateTransfer.fork(2), hash_block_size=2)
    slots: list[int] = pool.pop_many(2)
    fates: dict[str, int] = pool.checkpoint_fates()
    transfer: sc.StateTransfer = pool.transfer
    assert transfer.kind == "fork" and len(slots) == 2 and fates["checkpoints_kept"] == 0
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=8, slot_bytes=16, layout_id="x", image_bytes=16)
    store = sc.PageUnitCheckpointStore(sc.BlockPool(8), spec)
    op = store.begin_store(7, 0)
    if op is not None:  # Optional: mypy makes the caller handle None
        units: tuple[int, ...] = op.unit_ids
        assert len(units) == spec.units_per_checkpoint
