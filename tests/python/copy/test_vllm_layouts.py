"""The byte moves the vLLM connector makes, on tensors laid out as vLLM lays
them out (/work/shared/VLLM.md; vLLM's CUDA build cannot run here): Mamba /
GDN state pages (``[num_blocks, 1, 1, 35840]`` int8 views of 65,536-byte
padded pages holding conv [3, 512] bf16 + SSM [4, 64, 64] bf16; with an fp32
SSM the page mixes bf16 conv + fp32 SSM), and one KV tensor per attention
layer (``[num_blocks, 2, 128, 128]`` / ``[num_blocks, 2, 16, 8, 128]`` bf16),
each as its own buffer or packed block-outermost in one buffer. PAGE stores
and restores, slot copies and relocations, and moves to and from pinned host
memory, on the CPU and on a GPU, bit for bit against the byte model; padding
and every byte outside the destinations stay untouched."""

from __future__ import annotations

import random

import pytest
import torch

import statecache as sc
from copy_model import Model
from statecache.executor import HostCopyExecutor

GPU = torch.cuda.is_available() and sc.has_gpu_kernels
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a GPU")])]

CONV, SSM = (3, 512), (4, 64, 64)
BLOCKS = 40


def _pages(raw: torch.Tensor, layers: int, page: int, packing: str) -> list[torch.Tensor]:
    """Per layer, the [blocks, page] uint8 view vLLM's packing gives it."""
    if packing == "per-layer":  # layer-outermost: one region a layer
        return [raw[layer * BLOCKS * page : (layer + 1) * BLOCKS * page].view(BLOCKS, page) for layer in range(layers)]
    grid = raw.view(BLOCKS, layers, page)  # block-outermost: a block's pages of every layer side by side
    return [grid[:, layer] for layer in range(layers)]


def vllm_world(device, seed: int, packing: str, ssm_dtype, attn: tuple, mamba_layers=3, attn_layers=2):
    """(state_layout, page_layout, state_raw, kv_raw, state_bytes): Mamba pages
    with the state views vLLM's kernels use, and attention KV tensors."""
    conv_b = 2 * CONV[0] * CONV[1]
    ssm_b = torch.empty((), dtype=ssm_dtype).element_size() * SSM[0] * SSM[1] * SSM[2]
    state_bytes = conv_b + ssm_b  # 35,840 with a bf16 SSM
    page = 65536 if state_bytes <= 65536 else 131072  # padded to the attention page
    g = torch.Generator().manual_seed(seed)
    state_raw = torch.randint(1, 256, (mamba_layers * BLOCKS * page,), dtype=torch.uint8, generator=g).to(device)
    kv_page = 2 * 2 * int(torch.tensor(attn).prod())
    kv_raw = torch.randint(1, 256, (attn_layers * BLOCKS * kv_page,), dtype=torch.uint8, generator=g).to(device)
    # What register_kv_caches hands over for a Mamba layer: [blocks, 1, 1, state_bytes] over the page.
    layer_views = [
        p[:, :state_bytes].view(BLOCKS, 1, 1, state_bytes) for p in _pages(state_raw, mamba_layers, page, packing)
    ]
    conv = [v.view(BLOCKS, state_bytes)[:, :conv_b].view(torch.bfloat16).view(BLOCKS, *CONV) for v in layer_views]
    ssm = [v.view(BLOCKS, state_bytes)[:, conv_b:].view(ssm_dtype).view(BLOCKS, *SSM) for v in layer_views]
    kv = [p.view(torch.bfloat16).view(BLOCKS, 2, *attn) for p in _pages(kv_raw, attn_layers, kv_page, packing)]
    # Two readings of the same bytes: the page views, or the conv and SSM views.
    state = sc.StateLayout(layer_views if seed % 2 == 0 else conv + ssm, slot_dim=0)
    return state, sc.PageLayout(kv, unit_dim=0), state_raw, kv_raw, state_bytes


CASES = [
    ("per-layer", torch.bfloat16, (128, 128)),
    ("block-outermost", torch.bfloat16, (16, 8, 128)),
    ("per-layer", torch.float32, (16, 8, 128)),
    ("block-outermost", torch.float32, (128, 128)),
]


def padding_mask(raw: torch.Tensor, layout: sc.StateLayout) -> torch.Tensor:
    """True where a byte of ``raw`` belongs to no slot row (page padding)."""
    mask = torch.ones(raw.numel(), dtype=torch.bool)
    base = raw.data_ptr()
    for s in layout.segments:
        for i in range(layout.num_slots):
            a = s.base - base + i * s.stride
            mask[a : a + s.bytes] = False
    return mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("packing", "ssm_dtype", "attn"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_store_restore_and_slot_copies_match_the_byte_model(device, packing, ssm_dtype, attn, seed):
    state, page, state_raw, kv_raw, state_bytes = vllm_world(device, seed, packing, ssm_dtype, attn)
    cs, cp, cs_raw, ckv_raw, _ = vllm_world("cpu", seed, packing, ssm_dtype, attn)  # the model's twin
    assert state.image_bytes == 3 * state_bytes and page.unit_bytes == 2 * 2 * 2 * int(torch.tensor(attn).prod())
    model = Model(cs, cp)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=8)
    k, lid, n = ex.units_per_image, ex.layout_id, ex.spec.image_bytes
    rng = random.Random(seed)
    pad = padding_mask(cs_raw, cs)
    pad_before = cs_raw[pad].clone()
    src = rng.sample(range(BLOCKS), 6)  # stores from 3 slots, copies and a relocation among the rest
    units = rng.sample(range(BLOCKS), 3 * k)
    stores = [
        sc.CheckpointStoreOp(src_slot=s, unit_ids=tuple(units[i * k : (i + 1) * k]), total_bytes=n, layout_id=lid)
        for i, s in enumerate(src[:3])
    ]
    copies, relocations = [(src[0], src[3])], [(src[1], src[4])]
    for target in (ex, None):
        if target is None:
            model.run(relocations, copies, stores, (), cp.unit_bytes)
        else:
            target(relocations=relocations, copies=copies, stores=stores)
    # Restores of those units into other blocks (the stores' bytes are READY now).
    dst = [b for b in range(BLOCKS) if b not in src][:3]
    restores = [
        sc.CheckpointRestoreOp(dst_slot=d, unit_ids=op.unit_ids, total_bytes=n, layout_id=lid)
        for d, op in zip(dst, stores)
    ]
    ex(restores=restores)
    model.run((), (), (), restores, cp.unit_bytes)
    if device != "cpu":
        torch.cuda.synchronize()
    assert torch.equal(state_raw.cpu(), cs_raw), "state pages differ from the model"
    assert torch.equal(kv_raw.cpu(), ckv_raw), "KV blocks differ from the model"
    assert torch.equal(cs_raw[pad], pad_before), "page padding was written"
    for d, s in zip(dst, src[:3]):  # the restored blocks hold the stored states, bit for bit
        assert torch.equal(model.image(d), model.image(s))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["auto", "sm", "dma"])
@pytest.mark.parametrize(("packing", "ssm_dtype", "attn"), CASES[:2] + CASES[3:])
def test_kv_blocks_and_state_pages_to_host_and_back(device, path, packing, ssm_dtype, attn):
    if device == "cpu" and path != "auto":
        pytest.skip("the CPU executor has one path")
    state, page, state_raw, kv_raw, _ = vllm_world(device, 7, packing, ssm_dtype, attn)
    model = Model(state, page)
    rng = random.Random(3)
    pin = device != "cpu"
    for layout, count, item in ((page, BLOCKS, model.unit), (state, BLOCKS, model.image)):
        host = torch.randint(1, 256, (24, 65536), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        host = host.pin_memory() if pin else host
        ex = HostCopyExecutor(layout, host, path=path)
        k = ex.entries_per_item
        items = rng.sample(range(count), 24 // k)
        entries = rng.sample(range(24), len(items) * k)
        want = [item(i).cpu().clone() for i in items]
        move = ex.offload(items, entries)
        move.wait()
        for j, w in enumerate(want):
            got = torch.cat([host[e] for e in entries[j * k : (j + 1) * k]])[: w.numel()]
            assert torch.equal(got, w), (layout.__class__.__name__, j)
        raw = kv_raw if layout is page else state_raw
        before = raw.cpu().clone()
        back = rng.sample(range(count), len(items))
        ex.load(entries, back)  # read below on the current stream without a host sync
        for j, b in enumerate(back):
            assert torch.equal(item(b).cpu(), want[j])
        if pin:
            torch.cuda.synchronize()
        changed = (raw.cpu() != before).nonzero().flatten()
        rows = layout.segments
        allowed = torch.zeros(raw.numel(), dtype=torch.bool)
        for b in back:
            for s in rows:
                a = s.base - raw.data_ptr() + b * s.stride
                allowed[a : a + s.bytes] = True
        assert allowed[changed].all(), "a host load wrote outside its destination rows"
