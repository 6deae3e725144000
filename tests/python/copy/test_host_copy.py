"""Host moves (HostCopyExecutor): page units and slot images between device
tensors and host entries, against the byte model of copy_model.py, on the
CPU and (where there is one) on a GPU by every path, bit for bit; validation
before any byte moves; the stream contract of offload / load."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import statecache as sc
from copy_model import Model, make_world, random_bytes
from statecache.executor import HostCopyExecutor

GPU = torch.cuda.is_available() and sc.has_gpu_kernels
# (device, path): the CPU executor everywhere, each GPU path where there is a GPU.
TARGETS = [("cpu", "auto")] + [
    pytest.param("cuda", p, marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a GPU")])
    for p in ("auto", "sm", "dma")
]


def host_buffer(entries: int, entry_bytes: int, device: str, seed: int) -> torch.Tensor:
    buf = random_bytes(entries * entry_bytes, torch.Generator().manual_seed(seed)).view(entries, entry_bytes)
    return buf.pin_memory() if device != "cpu" else buf


def sync(device):
    if device != "cpu":
        torch.cuda.synchronize()


@pytest.mark.parametrize(("device", "path"), TARGETS)
@pytest.mark.parametrize("seed", range(4))
def test_units_round_trip_through_host_entries(device, path, seed):
    rng = random.Random(seed)
    state, page, _, page_buf = make_world(rng, device=device, misaligned=seed % 2 == 0, scale=97, kv=seed != 1)
    model = Model(state, page)
    n_entries = page.num_units + 5
    host = host_buffer(n_entries, page.unit_bytes, device, seed)
    ex = HostCopyExecutor(page, host, path=path)
    assert ex.entries_per_item == 1
    units = rng.sample(range(page.num_units), 9)
    entries = rng.sample(range(n_entries), 9)
    before = host.clone()
    want = {e: model.unit(u).cpu().clone() for u, e in zip(units, entries)}
    move = ex.offload(units, entries)
    move.wait()
    assert move.done() and move.bytes == 9 * page.unit_bytes
    assert move.path in (("cpu",) if device == "cpu" else ("sm", "dma"))
    if path != "auto" and device != "cpu":
        assert move.path == path
    for e in range(n_entries):  # written entries hold their unit, the rest is untouched
        assert torch.equal(host[e], want[e] if e in want else before[e]), e
    # Back into other units: nothing but those units changes.
    dst = rng.sample([u for u in range(page.num_units) if u not in units], 9)
    page_before = page_buf.clone()
    ex.load(entries, dst)  # the current stream waits for it: no sync needed to read
    got = [model.unit(u).cpu() for u in dst]
    for u, e, g in zip(dst, entries, got):
        assert torch.equal(g, host[e]), u
    # Every other byte of the page buffer (guards included) is as it was.
    sync(device)
    changed = (page_buf.cpu() != page_before.cpu()).nonzero().flatten().tolist()
    touched = set()
    for u in dst:
        for r in model.unit_rows(u):
            a = r.data_ptr() - page_buf.data_ptr()
            touched.update(range(a, a + r.numel() * r.element_size()))
    assert set(changed) <= touched


@pytest.mark.parametrize(("device", "path"), TARGETS)
@pytest.mark.parametrize("seed", range(4))
def test_slot_images_round_trip_and_bytes_outside_the_image_stay(device, path, seed):
    """A partial image over several entries (the last one partly used)."""
    rng = random.Random(40 + seed)
    state, page, state_buf, _ = make_world(rng, device=device, misaligned=True, partial=True, scale=61)
    model = Model(state, page)
    entry = max(64, state.image_bytes // 3 + rng.randint(1, 50))
    ex_probe = -(-state.image_bytes // entry)
    host = host_buffer(ex_probe * state.num_slots + 7, entry, device, seed)
    ex = HostCopyExecutor(state, host, path=path, max_items=2)  # > 2 slots: staged in slices
    k = ex.entries_per_item
    assert k == ex_probe and k >= 2
    slots = rng.sample(range(state.num_slots), 3)
    ids = rng.sample(range(host.shape[0]), 3 * k)
    before = host.clone()
    images = [model.image(s).cpu().clone() for s in slots]
    ex.offload(slots, ids).wait()
    for i, img in enumerate(images):
        got = torch.cat([host[e] for e in ids[i * k : (i + 1) * k]])
        assert torch.equal(got[: img.numel()], img)
        tail = ids[(i + 1) * k - 1]  # past the image: the last entry's tail is untouched
        used = img.numel() - (k - 1) * entry
        assert torch.equal(host[tail, used:], before[tail, used:])
    # Into every slot in a new order: the image bytes change, nothing else.
    state_before = state_buf.cpu().clone()
    dst = rng.sample(range(state.num_slots), 3)
    ex.load(ids, dst).wait()
    for i, s in enumerate(dst):
        assert torch.equal(model.image(s).cpu(), images[i])
    sync(device)
    outside = state_buf.cpu() != state_before
    for s in dst:  # only bytes of the destination slots' images moved
        for row, (a, n) in model.slot_rows(s):
            off = row.data_ptr() - state_buf.data_ptr()
            outside[off + a : off + a + n] = False
    assert not outside.any()


@pytest.mark.parametrize(("device", "path"), TARGETS)
def test_bad_moves_raise_before_anything_moves(device, path):
    rng = random.Random(9)
    state, page, _, page_buf = make_world(rng, device=device, misaligned=False, scale=33, kv=True)
    host = host_buffer(page.num_units, page.unit_bytes, device, 1)
    ex = HostCopyExecutor(page, host, path=path)
    before_h, before_p = host.clone(), page_buf.clone()
    cases = [
        (lambda: ex.offload([0, 1], [3, 3]), "also writes"),
        (lambda: ex.load([3, 4], [2, 2]), "also writes"),
        (lambda: ex.offload([0, page.num_units], [1, 2]), "out of range"),
        (lambda: ex.offload([0, 1], [1, host.shape[0]]), "out of range"),
        (lambda: ex.load([1, 2, 3], [0, 1]), "entries has 3 ids for 2 items"),
        (lambda: ex.offload([-1], [0]), "out of range"),
    ]
    for run, match in cases:
        with pytest.raises(ValueError, match=match):
            run()
    sync(device)
    assert torch.equal(host, before_h) and torch.equal(page_buf, before_p)
    # An empty move is a no-op.
    assert ex.offload([], []).path == "none"


def test_host_buffer_is_checked():
    state, page = make_world(random.Random(2), scale=8)[:2]
    with pytest.raises(ValueError, match="contiguous 2-D uint8"):
        HostCopyExecutor(page, torch.zeros(4, page.unit_bytes, dtype=torch.int16))
    with pytest.raises(ValueError, match="contiguous 2-D uint8"):
        HostCopyExecutor(page, torch.zeros(page.unit_bytes, 4, dtype=torch.uint8).t())
    with pytest.raises(TypeError, match="PageLayout or a StateLayout"):
        HostCopyExecutor(page.tensors[0], torch.zeros(4, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="path="):
        HostCopyExecutor(page, torch.zeros(4, 8, dtype=torch.uint8), path="fast")
    host = torch.zeros(4, page.unit_bytes, dtype=torch.uint8)
    ex = HostCopyExecutor(page, host)
    host.set_(torch.zeros(4, page.unit_bytes, dtype=torch.uint8))
    with pytest.raises(ValueError, match="replaced or resized"):
        ex.offload([0], [0])


def test_compile_paged_matches_compile():
    """The array form validates and compiles as the op-object form does."""
    rng = random.Random(5)
    state, page = make_world(rng, scale=4)[:2]
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=8)
    k, lid, n = ex.units_per_image, ex.layout_id, ex.spec.image_bytes
    p = ex._planner
    for trial in range(30):
        count = rng.randint(0, min(state.num_slots, page.num_units // k))
        slots = rng.sample(range(state.num_slots), count)
        units = rng.sample(range(page.num_units), count * k)
        if trial % 3 == 1 and count >= 2:
            units[k] = units[0]  # a unit written twice
        if trial % 5 == 2 and count:
            units[-1] = page.num_units + 3
        restores = trial % 2 == 1
        if restores and trial % 3 == 1 and count >= 2:
            slots[1] = slots[0]
        cls = sc.CheckpointRestoreOp if restores else sc.CheckpointStoreOp
        key = "dst_slot" if restores else "src_slot"
        ops = [
            cls(**{key: s}, unit_ids=tuple(units[i * k : (i + 1) * k]), total_bytes=n, layout_id=lid)
            for i, s in enumerate(slots)
        ]
        try:
            want = p.compile(restores=ops) if restores else p.compile(stores=ops)
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                p.compile_paged(slots, units, restores)
            assert str(got.value) == str(e)
            continue
        got = p.compile_paged(np.array(slots, dtype=np.int64), units, restores)
        assert (got.num_ops, got.bytes, got.num_paged_ops) == (want.num_ops, want.bytes, want.num_paged_ops)
        assert p.spans(got) == p.spans(want)


def test_unit_mover_bounces_rows_outside_its_buffer():
    """Tier rows that are not entries of the attached buffer still move."""
    from statecache.engine.tiering import UnitMover
    from statecache.tiers.host import HostTier

    state, page = make_world(random.Random(3), scale=40, kv=True)[:2]
    model = Model(state, page)
    m = UnitMover(page)
    tier = HostTier(12 * page.unit_bytes, page.unit_bytes)
    m.attach_host(tier._owner)
    assert m.host is not None
    arena_rows = tier.reserve("x", 3 * page.unit_bytes)
    loose = [np.zeros(page.unit_bytes, dtype=np.uint8) for _ in range(3)]
    for rows in (arena_rows, loose):
        want = [model.unit(u).clone() for u in (4, 9, 1)]
        m.to_rows([4, 9, 1], rows)
        for r, w in zip(rows, want):
            assert np.array_equal(r, w.numpy())
        m.from_rows(rows, [11, 2, 7])
        for u, w in zip((11, 2, 7), want):
            assert torch.equal(model.unit(u), w)
