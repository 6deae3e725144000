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
    pytest.mark.skipif(
        not (torch.cuda.is_available() and sc.has_gpu_kernels),
        reason="needs a CUDA/HIP device and statecache built with GPU kernels",
    ),
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


@pytest.mark.parametrize("kv", [False, True])
@pytest.mark.parametrize("scale", [1, 1013, 4096])
@pytest.mark.parametrize("seed", range(6))
def test_kernel_matches_cpu_executor(seed, scale, kv):
    """Random dtypes, misaligned rows, partial images; with ``kv`` multi-tensor
    KV page layouts ([2, units, ...] and [units, 2, ...] mixed)."""
    gpu, cpu = twins(seed, misaligned=seed % 2 == 0, partial=seed % 3 != 0, scale=scale, kv=kv)
    eg, ec = executors(gpu, cpu)
    rng = random.Random(100 + seed)
    moved = 0
    for _ in range(3):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
        pg, pc = eg(*batch), ec(*batch)
        assert (pg.num_ops, pg.bytes) == (pc.num_ops, pc.bytes)
        moved += pg.bytes
        assert_same(gpu, cpu)
    assert moved > 0


def test_gdn_store_restore_roundtrip_on_gpu():
    L, slots, units = 4, 6, 64
    g = torch.Generator(device="cuda").manual_seed(3)
    conv = torch.randn(L, slots, 3, 1024, device="cuda", generator=g).to(torch.bfloat16)
    rec = torch.randn(L, slots, 4, 64, 64, device="cuda", generator=g)
    kv = [torch.randn(2, units, 16, 4, 64, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3)]
    state = sc.StateLayout([conv, rec])
    page = sc.PageLayout(kv, unit_dim=1)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    spec = ex.spec
    ids = tuple(random.Random(1).sample(range(units), spec.units_per_checkpoint))
    before = [t[:, 2].clone() for t in (conv, rec)]
    ex(stores=[sc.CheckpointStoreOp(src_slot=2, unit_ids=ids, total_bytes=spec.image_bytes, layout_id=spec.layout_id)])
    for t in (conv, rec):
        t[:, 5].fill_(-7.0)  # poison the destination slot
    ex(
        restores=[
            sc.CheckpointRestoreOp(dst_slot=5, unit_ids=ids, total_bytes=spec.image_bytes, layout_id=spec.layout_id)
        ]
    )
    torch.cuda.synchronize()
    for t, b in zip((conv, rec), before):
        assert torch.equal(t[:, 5].contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("seed", range(3))
def test_graph_capture_replays_new_ops(seed):
    gpu, cpu = twins(50 + seed, misaligned=seed != 1, partial=True, scale=777, kv=seed != 0)
    eg, ec = executors(gpu, cpu)
    captured = eg.capture()
    rng = random.Random(seed)
    # Capturing runs nothing.
    assert_same(gpu, cpu)
    for i in range(4):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
        if i == 2:  # eager batches interleave with replays
            eg(*batch)
        else:
            captured.replay(*batch)
        ec(*batch)
        assert_same(gpu, cpu)


def test_graph_capture_with_a_small_descriptor_budget():
    gpu, cpu = twins(7, misaligned=True, partial=False, scale=513, kv=True)
    eg, ec = executors(gpu, cpu)
    rng = random.Random(3)
    batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
    while len(batch[2]) + len(batch[3]) < 2:
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
    paged, pairs = len(batch[2]) + len(batch[3]), len(batch[0]) + len(batch[1])
    small = eg.capture(max_paged_ops=paged, max_slot_copies=pairs)
    small.replay(*batch)
    ec(*batch)
    assert_same(gpu, cpu)
    tiny = eg.capture(max_paged_ops=paged - 1, max_slot_copies=pairs)
    before = gpu[2].clone(), gpu[3].clone()
    with pytest.raises(ValueError, match="captured for"):
        tiny.replay(*batch)
    torch.cuda.synchronize()
    assert torch.equal(before[0], gpu[2]) and torch.equal(before[1], gpu[3])


def test_replaced_storage_raises_before_a_replay_moves_anything():
    gpu, cpu = twins(13, misaligned=False, partial=False, scale=64, kv=True)
    eg, _ = executors(gpu, cpu)
    cap = eg.capture()
    n, k = eg.spec.image_bytes, eg.units_per_image
    op = sc.CheckpointStoreOp(src_slot=0, unit_ids=tuple(range(k)), total_bytes=n, layout_id=eg.layout_id)
    page_t = gpu[1].tensors[0]
    page_t.set_(torch.empty_like(page_t))
    before = gpu[2].clone(), gpu[3].clone()
    for run in (lambda: cap.replay(stores=[op]), lambda: eg(stores=[op])):
        with pytest.raises(ValueError, match="replaced or resized"):
            run()
    torch.cuda.synchronize()
    assert torch.equal(before[0], gpu[2]) and torch.equal(before[1], gpu[3])


def test_every_visible_gpu_runs_the_same_batch_bit_exactly():
    """One executor per device from one process, each bound to its device
    (launched while another device is current, where there is one)."""
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    cpu = make_world(random.Random(21), device="cpu", misaligned=True, partial=True, scale=300, kv=True)
    ec = sc.StateCopyExecutor(cpu[0], cpu[1], 8)
    rng = random.Random(5)
    batches = [
        random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image) for _ in range(3)
    ]
    worlds, exes, caps = [], [], []
    for d in devices:
        w = make_world(random.Random(21), device=d, misaligned=True, partial=True, scale=300, kv=True)
        e = sc.StateCopyExecutor(w[0], w[1], 8, device="cuda" if d.index == 0 else d)
        assert e.device == d and e.layout_id == ec.layout_id
        worlds.append(w)
        exes.append(e)
        caps.append(e.capture())
    current = torch.cuda.current_device()
    for i, batch in enumerate(batches):
        for d, e, c in zip(devices, exes, caps):
            with torch.cuda.device(devices[(d.index + 1) % len(devices)]):  # another device is current
                (c.replay if i == 1 else e)(*batch)
        assert torch.cuda.current_device() == current
        ec(*batch)
    for d, w in zip(devices, worlds):
        torch.cuda.synchronize(d)
        assert torch.equal(w[2].cpu(), cpu[2]) and torch.equal(w[3].cpu(), cpu[3]), d


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


@pytest.mark.parametrize("variant", range(sc._C._GpuCopyEngine.num_variants if sc.has_gpu_kernels else 0))
def test_every_kernel_build_matches_cpu_executor(variant):
    """The benchmark times every kernel build; each must be bit-exact too
    (slot copies included, which the speculating build guesses around)."""
    gpu, cpu = twins(31 + variant, misaligned=True, partial=True, scale=1013, kv=True)
    eg, ec = executors(gpu, cpu)
    eg._engine = sc._C._GpuCopyEngine(eg.device.index, eg._planner, eg.max_slot_copies, eg.max_paged_ops, 2, variant)
    rng = random.Random(variant)
    for _ in range(4):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
        eg(*batch)
        ec(*batch)
        assert_same(gpu, cpu)


@pytest.mark.parametrize("seed", range(4))
def test_small_eager_batches_ride_in_the_kernel_parameters(seed):
    """Batches that fit the kernel's parameters skip staging and the
    descriptor fetch; batches past it are staged. Both bit-exact, one after
    the other on one stream."""
    gpu, cpu = twins(60 + seed, misaligned=seed % 2 == 0, partial=True, scale=301, kv=True)
    eg, ec = executors(gpu, cpu)
    inline = sc._C._GpuCopyEngine.inline_bytes
    rng = random.Random(seed)
    sizes = set()
    for _ in range(6):
        batch = random_batch(rng, cpu[0], cpu[1], ec.layout_id, ec.spec.image_bytes, ec.units_per_image)
        n_ops = sum(len(b) for b in batch)
        units = (len(batch[2]) + len(batch[3])) * ec.units_per_image
        sizes.add(16 + 24 * n_ops + 4 * units <= inline)
        eg(*batch)
        ec(*batch)
        assert_same(gpu, cpu)
    assert True in sizes


@pytest.mark.parametrize("path", ["sm", "dma", "auto"])
def test_host_moves_match_the_cpu_executor(path):
    """Units and slot images to pinned host entries and back, GPU against the
    CPU executor over the same bytes; the load orders the current stream."""
    from statecache.executor import HostCopyExecutor

    gpu, cpu = twins(80, misaligned=True, partial=True, scale=257, kv=True)
    rng = random.Random(4)
    for pick in (lambda w: w[1], lambda w: w[0]):  # page layout, then state layout
        lay_g, lay_c = pick(gpu), pick(cpu)
        page = isinstance(lay_c, sc.PageLayout)
        count, item = (lay_c.num_units, lay_c.unit_bytes) if page else (lay_c.num_slots, lay_c.image_bytes)
        entry = 1000
        k = -(-item // entry)
        n = 2 * count * k
        host_g = torch.randint(1, 256, (n, entry), dtype=torch.uint8).pin_memory()
        host_c = host_g.clone()
        xg = HostCopyExecutor(lay_g, host_g, path=path)
        xc = HostCopyExecutor(lay_c, host_c)
        assert xg.entries_per_item == k
        items = rng.sample(range(count), max(1, count // 2))
        entries = rng.sample(range(n), len(items) * k)
        assert xg.offload(items, entries).path in ("sm", "dma")
        xc.offload(items, entries)
        torch.cuda.synchronize()
        assert torch.equal(host_g, host_c)
        back = rng.sample(range(count), len(items))
        xg.load(entries, back)
        xc.load(entries, back)
        assert_same(gpu, cpu)
