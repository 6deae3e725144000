"""The vLLM connector's byte moves (``statecache.vllm.moves``, what its
worker runs) on tensors laid out as vLLM 0.32 lays out a hybrid model's KV
cache: allocations shared by one layer of each KV cache group, a page per
block, attention pages ``[2, block, heads, head_dim]`` bf16 and GDN pages
(conv state bf16 + SSM state fp32) padded to the attention page. No vLLM
import: on a GPU machine where vLLM cannot be installed this runs the CUDA
path (HostCopyExecutor into pinned host rows); the CUDA case skips only where
there is no CUDA device.

    PYTHONPATH=$PWD/python python3 -m pytest -q tests/python/copy/test_vllm_moves.py
"""

from __future__ import annotations

import pytest
import torch

from statecache.vllm.moves import BlockMover, block_views

NUM_BLOCKS, BS, HEADS, HEAD_DIM = 40, 32, 2, 64
ATTN_PAGE = 2 * BS * HEADS * HEAD_DIM * 2  # K and V, bf16: 16 KiB
CONV, SSM = (3, 256), (2, 32, 32)  # one GDN layer's states
CONV_BYTES, SSM_BYTES = 3 * 256 * 2, 2 * 32 * 32 * 4  # bf16, fp32
MAMBA_REAL = CONV_BYTES + SSM_BYTES  # 9.5 KiB of a 16 KiB page: the rest is padding
ENTRY = 4096  # host entries: an attention image of 2 layers takes 8, a GDN image 5 (the last partly used)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


def vllm_cache(device: str, packing: str, layers: int = 2):
    """``layers`` attention + ``layers`` GDN layers. ``shared``: allocation
    ``i`` holds attention layer ``i`` and GDN layer ``i`` (vLLM's hybrid
    allocator), each at offset 0 with the page as block stride; ``stacked``:
    one allocation, layer ``l`` of a group at ``l * NUM_BLOCKS * page``
    (per-layer tensors back to back). Returns the raw storages, the places of
    each group and typed views as the model sees them."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    if packing == "shared":
        raws = [
            torch.randint(0, 256, (NUM_BLOCKS * ATTN_PAGE,), dtype=torch.uint8, generator=gen).to(device)
            for _ in range(layers)
        ]
        attn = [(i, 0, ATTN_PAGE) for i in range(layers)]
        gdn = [(i, 0, ATTN_PAGE) for i in range(layers)]
    else:
        raws = [
            torch.randint(0, 256, (2 * layers * NUM_BLOCKS * ATTN_PAGE,), dtype=torch.uint8, generator=gen).to(device)
        ]
        attn = [(0, i * NUM_BLOCKS * ATTN_PAGE, ATTN_PAGE) for i in range(layers)]
        gdn = [(0, (layers + i) * NUM_BLOCKS * ATTN_PAGE, ATTN_PAGE) for i in range(layers)]
    typed = []
    for t, off, _stride in attn:  # [blocks, 2, bs, heads, head_dim] bf16
        kv = raws[t][off : off + NUM_BLOCKS * ATTN_PAGE].view(torch.bfloat16)
        typed.append(kv.view(NUM_BLOCKS, 2, BS, HEADS, HEAD_DIM))
    for t, off, stride in gdn:  # conv bf16 then ssm fp32 at the start of each padded page
        page = torch.as_strided(raws[t], (NUM_BLOCKS, ATTN_PAGE), (stride, 1), off)
        typed.append(page[:, :CONV_BYTES].view(torch.bfloat16).view(NUM_BLOCKS, *CONV))
        typed.append(page[:, CONV_BYTES:MAMBA_REAL].view(torch.float32).view(NUM_BLOCKS, *SSM))
    return raws, attn, gdn, typed


def movers(raws, attn, gdn, host):
    def views(places):
        out = []
        for t, off, stride in places:
            out += block_views(raws[t], [(off, stride)], NUM_BLOCKS, ATTN_PAGE)
        return out

    av, gv = views(attn), views(gdn)
    return BlockMover(av, ATTN_PAGE, host), BlockMover(gv, MAMBA_REAL, host), av, gv


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (random bits hold NaNs, which never compare equal)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def image(views, block: int, real: int) -> torch.Tensor:
    return torch.cat([v[block, :real].cpu() for v in views])


@pytest.mark.parametrize("packing", ["shared", "stacked"])
@pytest.mark.parametrize("device", DEVICES)
def test_blocks_to_host_rows_and_back_every_real_byte_and_nothing_else(device, packing):
    raws, attn, gdn, typed = vllm_cache(device, packing)
    host = torch.zeros((64, ENTRY), dtype=torch.uint8, pin_memory=device == "cuda")
    am, gm, av, gv = movers(raws, attn, gdn, host)
    assert (am.entries_per_image, gm.entries_per_image) == (8, 5)

    # save: scattered blocks into scattered entries (a step's saves)
    a_pairs = [(7, [40, 3, 12, 9, 50, 1, 33, 20]), (2, [0, 2, 4, 6, 8, 10, 11, 13])]
    g_pairs = [(11, [63, 62, 61, 5, 60]), (30, [14, 15, 16, 17, 18])]
    am.store(a_pairs)
    gm.store(g_pairs)
    for m, pairs, views, real in ((am, a_pairs, av, ATTN_PAGE), (gm, g_pairs, gv, MAMBA_REAL)):
        for b, entries in pairs:
            rows = host[entries].reshape(-1)[: m.image_bytes]
            assert torch.equal(rows, image(views, b, real)), (device, packing, b)

    # load into other blocks: the real bytes arrive, padding and every other block stay
    before = [r.clone() for r in raws]
    typed_before = [t.clone() for t in typed]
    am.restore([(21, a_pairs[0][1]), (22, a_pairs[1][1])])
    gm.restore([(23, g_pairs[0][1]), (24, g_pairs[1][1])])
    if device == "cuda":
        torch.cuda.synchronize()
    for dst, src in ((21, 7), (22, 2)):
        for i in range(2):
            assert same(typed[i][dst], typed_before[i][src])
    for dst, src in ((23, 11), (24, 30)):
        for i in range(2, len(typed)):
            assert same(typed[i][dst], typed_before[i][src])  # conv bf16, ssm fp32 bit for bit
    for t, off, stride in gdn:  # the GDN page's padding was not written
        for dst in (23, 24):
            lo = off + dst * stride
            assert torch.equal(raws[t][lo + MAMBA_REAL : lo + ATTN_PAGE], before[t][lo + MAMBA_REAL : lo + ATTN_PAGE])
    changed = set()
    for t, r in enumerate(raws):
        diff = (r != before[t]).nonzero().reshape(-1).cpu()
        for byte in diff.tolist():
            for tt, off, stride in attn + gdn:
                if tt == t and off <= byte < off + NUM_BLOCKS * stride:
                    changed.add((byte - off) // stride)
    assert changed <= {21, 22, 23, 24}, changed


@pytest.mark.parametrize("device", DEVICES)
def test_bad_moves_are_refused_before_anything_moves(device):
    raws, attn, gdn, _typed = vllm_cache(device, "shared")
    host = torch.zeros((64, ENTRY), dtype=torch.uint8, pin_memory=device == "cuda")
    am, _gm, _av, _gv = movers(raws, attn, gdn, host)
    snap = host.clone()
    with pytest.raises(ValueError):
        am.store([(NUM_BLOCKS, list(range(8)))])  # no such block
    with pytest.raises(ValueError):
        am.store([(1, list(range(7)))])  # one entry short
    with pytest.raises(ValueError):
        am.store([(1, list(range(8))), (2, list(range(7, 15)))])  # entry 7 written twice
    assert torch.equal(host, snap)
    with pytest.raises(ValueError, match="places"):
        block_views(raws[0], [(0, ATTN_PAGE)], NUM_BLOCKS + 1, ATTN_PAGE)
