"""One scheduler, one process per tensor-parallel rank (issue 14): rank 0 builds
the op list and broadcasts it over torch.distributed (NCCL); every rank runs
it on its own shard with an executor bound to its own GPU, and compares with
the CPU executor on the same shard. Runs with as many ranks as visible GPUs
(one rank on a one-GPU machine)."""

from __future__ import annotations

import os
import random

import pytest
import torch

import statecache as sc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (
            torch.cuda.is_available()
            and sc.has_gpu_kernels
            and torch.distributed.is_available()
            and torch.distributed.is_nccl_available()
        ),
        reason="needs CUDA GPUs, statecache's GPU kernels and NCCL",
    ),
]


def full_model(seed=3, slots=8, units=96):
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(4, slots, 64, 3, generator=g).to(torch.bfloat16)
    rec = torch.randn(4, slots, 8, 32, 32, generator=g)
    kv = [torch.randn(2, units, 16, 8, 64, generator=g).to(torch.bfloat16) for _ in range(3)]
    return [conv, rec], kv


def _rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (the machine's notes)
    dev = torch.device("cuda", rank)
    torch.distributed.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=dev
    )
    try:
        state, kv = full_model()
        shard = sc.tp_shard_layouts(state, kv, world, state_shard_dims=2, page_shard_dims=3, unit_dim=1)[rank]
        cpu = sc.StateCopyExecutor(shard.state, shard.page, max_num_seqs=4)
        gpu_state = sc.StateLayout([t.to(dev) for t in shard.state.tensors])
        gpu_page = sc.PageLayout([t.to(dev) for t in shard.page.tensors], unit_dim=1)
        gpu = sc.StateCopyExecutor(gpu_state, gpu_page, max_num_seqs=4)
        assert gpu.device == dev and gpu.layout_id == cpu.layout_id == shard.layout_id
        # The one scheduler: rank 0 decides, every rank receives the same list.
        plan = [None]
        if rank == 0:
            rng = random.Random(9)
            k = shard.spec.units_per_checkpoint
            ids = rng.sample(range(96), 3 * k)
            plan = [[(s, tuple(ids[i * k : (i + 1) * k])) for i, s in enumerate((0, 2, 5))]]
        torch.distributed.broadcast_object_list(plan, src=0)
        spec = shard.spec
        stores = [
            sc.CheckpointStoreOp(src_slot=s, unit_ids=u, total_bytes=spec.image_bytes, layout_id=spec.layout_id)
            for s, u in plan[0]
        ]
        restores = [
            sc.CheckpointRestoreOp(
                dst_slot=d, unit_ids=op.unit_ids, total_bytes=spec.image_bytes, layout_id=spec.layout_id
            )
            for d, op in zip((1, 3, 7), stores)
        ]
        for ex in (gpu, cpu):
            ex(stores=stores)
            ex(restores=restores)
        torch.cuda.synchronize(dev)
        ok = all(
            torch.equal(g.cpu().view(torch.uint8), c.view(torch.uint8))
            for g, c in zip(gpu_state.tensors + gpu_page.tensors, shard.state.tensors + shard.page.tensors)
        )
        # The restored slots hold this rank's slice of the full sources.
        for t, full in zip(shard.state.tensors, state):
            step = full.shape[2] // world
            for src, dst in ((0, 1), (2, 3), (5, 7)):
                ok &= torch.equal(
                    t[:, dst].view(torch.uint8),
                    full[:, src].narrow(1, rank * step, step).contiguous().view(torch.uint8),
                )
        flag = torch.tensor([1 if ok else 0], device=dev)
        torch.distributed.all_reduce(flag)
        with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
            f.write(f"{int(ok)} {int(flag.item())}")
    finally:
        torch.distributed.destroy_process_group()


def test_one_process_per_rank_restores_every_shard(tmp_path):
    world = torch.cuda.device_count()
    torch.multiprocessing.spawn(_rank, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world)
    for r in range(world):
        own, total = (int(x) for x in (tmp_path / f"rank{r}").read_text().split())
        assert own == 1 and total == world, f"rank {r}: own {own}, ranks ok {total} of {world}"
