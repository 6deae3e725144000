"""The one-launch GPU kernel against the CPU executor, bit for bit, on random
data (never zeros): eager batches, misaligned and odd sizes, and graph capture
replayed with new ops. Skipped without a CUDA/HIP device and GPU kernels."""

from __future__ import annotations

import random

import pytest
import torch

import statecache as sc
from copy_model import make_world, random_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and sc.has_gpu_kernels),
                       reason="needs a CUDA/HIP device and statecache built with GPU kernels"),
]


def twins(seed, **kw):
    """The same random world on the GPU and on the CPU."""
    gpu = make_world(random.Random(seed), device="cuda", **kw)
    cpu = make_world(random.Random(seed), device="cpu", **kw)
    assert torch.equal(gpu[2].cpu(), cpu[2]) and torch.equal(gpu[3].cpu(), cpu[3])
    return gpu, cpu


def executors(gpu, cpu, max_num_seqs=8):
    eg = sc.StateCopyExecutor(gpu[0], gpu[1], max_num_seqs)
    ec = sc.StateCopyExecutor(cpu[0], cpu[1], max_num_seqs)
    assert eg.layout_id == ec.layout_id and eg.device.type == "cuda"
    return eg, ec


def assert_same(gpu, cpu):
    torch.cuda.synchronize()
    # Whole buffers, guard bytes around the tensors included.
    assert torch.equal(gpu[2].cpu(), cpu[2]), "state bytes differ"
    assert torch.equal(gpu[3].cpu(), cpu[3]), "page bytes differ"


@pytest.mark.parametrize("scale", [1, 1013, 4096])
@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_cpu_executor(seed, scale):
    gpu, cpu = twins(seed, misaligned=seed % 2 == 0, partial=seed % 3 != 0, scale=scale)
    eg, ec = executors(gpu, cpu)
    rng = random.Random(100 + seed)
    moved = 0
    for _ in range(3):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes,
                             ec.units_per_image)
        pg, pc = eg(*batch), ec(*batch)
        assert (pg.num_spans, pg.bytes) == (pc.num_spans, pc.bytes)
        moved += pg.bytes
        assert_same(gpu, cpu)
    assert moved > 0


def test_gdn_store_restore_roundtrip_on_gpu():
    L, slots, units = 4, 6, 64
    g = torch.Generator(device="cuda").manual_seed(3)
    conv = torch.randn(L, slots, 3, 1024, device="cuda", generator=g).to(torch.bfloat16)
    rec = torch.randn(L, slots, 4, 64, 64, device="cuda", generator=g)
    kv = [torch.randn(2, units, 16, 4, 64, device="cuda", generator=g).to(torch.bfloat16)
          for _ in range(3)]
    state = sc.StateLayout([conv, rec])
    page = sc.PageLayout(kv, unit_dim=1)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    spec = ex.spec
    ids = tuple(random.Random(1).sample(range(units), spec.units_per_checkpoint))
    before = [t[:, 2].clone() for t in (conv, rec)]
    ex(stores=[sc.CheckpointStoreOp(src_slot=2, unit_ids=ids, total_bytes=spec.image_bytes,
                                    layout_id=spec.layout_id)])
    for t in (conv, rec):
        t[:, 5].fill_(-7.0)  # poison the destination slot
    ex(restores=[sc.CheckpointRestoreOp(dst_slot=5, unit_ids=ids, total_bytes=spec.image_bytes,
                                        layout_id=spec.layout_id)])
    torch.cuda.synchronize()
    for t, b in zip((conv, rec), before):
        assert torch.equal(t[:, 5].contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("seed", range(3))
def test_graph_capture_replays_new_ops(seed):
    gpu, cpu = twins(50 + seed, misaligned=seed != 1, partial=True, scale=777)
    eg, ec = executors(gpu, cpu)
    captured = eg.capture()
    rng = random.Random(seed)
    # Capturing runs nothing.
    assert_same(gpu, cpu)
    for i in range(4):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes,
                             ec.units_per_image)
        if i == 2:  # eager batches interleave with replays
            eg(*batch)
        else:
            captured.replay(*batch)
        ec(*batch)
        assert_same(gpu, cpu)


def test_graph_capture_with_a_small_descriptor_budget():
    gpu, cpu = twins(7, misaligned=True, partial=False, scale=513)
    eg, ec = executors(gpu, cpu)
    batch = random_batch(random.Random(3), cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes,
                         ec.units_per_image)
    need = ec.plan(*batch).num_spans
    assert need > 1
    small = eg.capture(max_spans=need)
    small.replay(*batch)
    ec(*batch)
    assert_same(gpu, cpu)
    tiny = eg.capture(max_spans=need - 1)
    before = gpu[2].clone(), gpu[3].clone()
    with pytest.raises(ValueError, match="captured for"):
        tiny.replay(*batch)
    torch.cuda.synchronize()
    assert torch.equal(before[0], gpu[2]) and torch.equal(before[1], gpu[3])


def test_validation_on_gpu_moves_nothing():
    gpu, cpu = twins(11, misaligned=False, partial=False, scale=64)
    eg, _ = executors(gpu, cpu)
    n, k = eg.spec.image_bytes, eg.units_per_image
    good = sc.CheckpointStoreOp(src_slot=0, unit_ids=tuple(range(k)), total_bytes=n, layout_id=eg.layout_id)
    bad = sc.CheckpointStoreOp(src_slot=1, unit_ids=tuple(range(k)), total_bytes=n, layout_id=eg.layout_id)
    before = gpu[2].clone(), gpu[3].clone()
    with pytest.raises(ValueError, match="also writes"):
        eg(stores=[good, bad])
    torch.cuda.synchronize()
    assert torch.equal(before[0], gpu[2]) and torch.equal(before[1], gpu[3])
