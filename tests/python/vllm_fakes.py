"""The connector's two sides without a running engine: vLLM's own config
objects for a tiny hybrid geometry, CPU tensors laid out as vLLM lays them,
and the scheduler objects the connector reads (requests, block lists,
scheduler output). For tests of what a real engine cannot show on one CPU
(tensor parallelism, every byte of a round trip)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)

from statecache.vllm.config import ConnectorConfig
from statecache.vllm.geometry import build_geometry
from statecache.vllm.scheduler import ConnectorScheduler
from statecache.vllm.worker import ConnectorWorker

BS = 16  # tokens per block
NUM_BLOCKS = 64
CONV, SSM = (3, 32), (2, 16, 16)


def kv_cache_config(num_blocks: int = NUM_BLOCKS) -> KVCacheConfig:
    """Three GDN groups and one attention group of one layer each, aliasing
    one allocation (what vLLM builds for the tiny Qwen3-Next)."""
    mamba = MambaSpec(
        block_size=BS,
        shapes=(CONV, SSM),
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=4096,
        mamba_cache_mode="align",
    )
    attn = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)
    assert attn.page_size_bytes == 4096 and mamba.real_page_size_bytes < 4096
    names = [f"layers.{i}.linear_attn" for i in range(3)] + ["layers.3.attn"]
    size = num_blocks * 4096
    tensors = [KVCacheTensor(size=size, layers=[n], layer_stride=size, block_stride=4096) for n in names]
    groups = [KVCacheGroupSpec([n], mamba) for n in names[:3]] + [KVCacheGroupSpec([names[3]], attn)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups, hash_block_size=BS)


def layer_tensors(cfg: KVCacheConfig, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One random backing allocation and each layer's view of it."""
    size = cfg.kv_cache_tensors[0].size
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    views = {}
    for t in cfg.kv_cache_tensors:
        for name in t.layers:
            views[name] = raw.view(cfg.num_blocks, 4096)
    return raw, views


def block_hashes(tokens: list[int], salt: bytes = b"") -> list[bytes]:
    """Chained 32-byte block hashes, as vLLM's sha256 hasher makes them."""
    out, parent = [], salt
    for i in range(len(tokens) // BS):
        parent = hashlib.sha256(parent + repr(tokens[i * BS : (i + 1) * BS]).encode()).digest()
        out.append(parent)
    return out


def colliding_block_hashes(tokens: list[int]) -> list[bytes]:
    """Block hashes as a hasher an attacker has fully broken leaves them:
    16 bytes (xxhash's width) that name a block's position, not its tokens,
    so every prompt's block ``i`` collides with every other's."""
    return [hashlib.blake2b(b"block %d" % i, digest_size=16).digest() for i in range(len(tokens) // BS)]


@dataclass
class FakeRequest:
    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    block_hashes: list[bytes] = field(default_factory=list)
    skip_reading_prefix_cache: bool = False

    def __post_init__(self) -> None:
        self.block_hashes = block_hashes(self.tokens)

    num_computed_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens


class FakeBlocks:
    """What ``update_state_after_alloc`` receives (``KVCacheBlocks``)."""

    def __init__(self, ids: tuple[list[int], ...], hashed: int = 0):
        self.ids = ids
        self.blocks = tuple(
            [
                SimpleNamespace(block_id=b, block_hash=(b"h" if i < hashed else None), is_null=b == 0)
                for i, b in enumerate(g)
            ]
            for g in ids
        )

    def get_block_ids(self) -> tuple[list[int], ...]:
        return self.ids


class FakeKVCacheManager:
    def __init__(self, groups: int = 4) -> None:
        self.groups = groups  # kv_cache_config's: three GDN groups and one attention group
        self.ids: dict[str, tuple[list[int], ...]] = {}
        self.block_pool = SimpleNamespace(hash_block_size=BS)
        self.coordinator = SimpleNamespace(get_blocks=self.get_blocks)

    def get_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return self.ids[req_id]

    def get_blocks(self, req_id: str) -> tuple[list[SimpleNamespace], ...]:
        """``KVCacheCoordinator.get_blocks``: each group's blocks (none for a
        request that holds none, freed or preempted)."""
        if req_id not in self.ids:
            return tuple([] for _ in range(self.groups))
        return tuple([SimpleNamespace(block_id=b) for b in g] for g in self.ids[req_id])


def scheduler_output(new=(), cached=()) -> SimpleNamespace:
    """``new`` / ``cached``: (req_id, num_computed_tokens, num_scheduled)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c) for r, c, _ in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r for r, _, _ in cached], num_computed_tokens=[c for _, c, _ in cached], resumed_req_ids=set()
        ),
        num_scheduled_tokens={r: n for r, _, n in (*new, *cached)},
        total_num_scheduled_tokens=sum(n for _, _, n in (*new, *cached)),
    )


class Rig:
    """One scheduler side and ``tp`` worker sides over random tensors."""

    def __init__(
        self,
        tp: int = 1,
        extra: dict | None = None,
        seed: int = 0,
        identity: str = "tiny",
        kv_role: str = "kv_both",
        hash_algo: str | None = "sha256",
    ):
        self.cfg = kv_cache_config()
        self.config = ConnectorConfig.from_extra({"host_memory": 4 << 20, **(extra or {})}, kv_role)
        self.geometry = build_geometry(self.cfg, identity, self.config.entry_bytes)
        vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(hf_text_config=SimpleNamespace(hidden_size=64)),
            cache_config=SimpleNamespace(prefix_caching_hash_algo=hash_algo),  # vLLM's hasher of block_hashes
        )
        self.sched = ConnectorScheduler(self.config, self.geometry, tp, vllm_config)
        self.kvm = FakeKVCacheManager()
        self.sched.bind(self.kvm)
        self.raw, self.workers = [], []
        for rank in range(tp):
            raw, views = layer_tensors(self.cfg, seed * 100 + rank)
            w = ConnectorWorker(self.config, self.geometry, rank, tp)
            w.register_kv_caches(views, self.cfg)
            self.raw.append(raw)
            self.workers.append(w)

    def block(self, rank: int, block: int, nbytes: int = 4096) -> bytes:
        return bytes(self.raw[rank][block * 4096 : block * 4096 + nbytes].numpy())

    def step(self, so) -> SimpleNamespace:
        """One engine step: meta to every worker, loads then saves (as vLLM
        orders them for async loads), reports merged back. Returns the
        aggregated output the scheduler read."""
        meta = self.sched.build_meta(so)
        done_all, sent_all, failed = None, None, set()
        report = None
        for w in self.workers:
            w.start_loads(meta)
            w.save(meta)
            sent, done, bad = w.get_finished()
            done_all = done if done_all is None else done_all & done
            sent_all = sent if sent_all is None else sent_all & sent
            failed |= bad
            r = w.take_report()
            if r is not None:
                report = r if report is None else report.aggregate(r)
        out = SimpleNamespace(
            kv_connector_worker_meta=report,
            finished_recving=done_all or set(),
            finished_sending=sent_all or set(),
            failed_recving=failed,
        )
        self.sched.update(out)
        return out
