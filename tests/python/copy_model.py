"""Shared pieces of the copy-engine tests: random layouts over byte buffers at
odd offsets, random valid batches, and a plain-Python model of what a batch
must do (written from docs/contract.md, "Copying", independent of the span planner)."""

from __future__ import annotations

import random

import torch

import statecache as sc


def random_bytes(n: int, gen: torch.Generator) -> torch.Tensor:
    # Never zeros: a copy that moved nothing must not pass.
    return torch.randint(1, 256, (n,), dtype=torch.uint8, generator=gen)


def rows_view(buf: torch.Tensor, offset: int, shape, dtype) -> torch.Tensor:
    """A view of `buf` at byte `offset` (may be odd for uint8) with `shape`."""
    item = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    return buf[offset : offset + n * item].view(dtype).view(shape)


DTYPES = [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int64]


def _item(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _place(off: int, dtype, rng: random.Random, misaligned: bool) -> int:
    """The next offset for a tensor of `dtype`: aligned to its elements, and
    when `misaligned`, shifted by whole elements so rows are off 16 bytes."""
    off = (off + _item(dtype) - 1) // _item(dtype) * _item(dtype)
    return off + (_item(dtype) * rng.randint(0, 3) if misaligned else 0)


def make_world(rng: random.Random, device="cpu", misaligned=True, partial=True, scale=1, kv=False):
    """Random state and page tensors carved out of two byte buffers.

    Returns (state_layout, page_layout, state_buf, page_buf) where the buffers
    hold every byte the layouts may touch (plus guard bytes). ``scale``
    multiplies the innermost sizes (GPU tests use large rows). ``kv``: the page
    side is 2-5 attention-style KV tensors of random dtypes, each
    ``[2, units, heads, dim]`` (unit_dim 1) or ``[units, 2, heads, dim]``
    (unit_dim 0); otherwise 1-3 uint8 tensors.
    """
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    num_slots = rng.randint(3, 7)
    num_units = rng.randint(24, 48)
    st_shapes, st_dims, st_dtypes = [], [], []
    for _ in range(rng.randint(1, 3)):
        dtype = rng.choice(DTYPES)
        if rng.random() < 0.5:
            shape = (rng.randint(1, 3), num_slots, rng.randint(1, 3), rng.randint(1, 9) * scale)
            dim = 1
        else:
            shape = (num_slots, rng.randint(1, 4), rng.randint(1, 11) * scale)
            dim = 0
        st_shapes.append(shape)
        st_dims.append(dim)
        st_dtypes.append(dtype)
    pg_shapes, pg_dims, pg_dtypes = [], [], []
    for _ in range(rng.randint(2, 5) if kv else rng.randint(1, 3)):
        if kv:
            pg_dtypes.append(rng.choice(DTYPES))
            heads, dim = rng.randint(1, 3), rng.randint(1, 6) * scale
            if rng.random() < 0.5:
                pg_shapes.append((2, num_units, heads, dim))
                pg_dims.append(1)
            else:
                pg_shapes.append((num_units, 2, heads, dim))
                pg_dims.append(0)
            continue
        pg_dtypes.append(torch.uint8)
        if rng.random() < 0.5:
            pg_shapes.append((num_units, rng.randint(1, 7) * scale))
            pg_dims.append(0)
        else:
            pg_shapes.append((2, num_units, rng.randint(1, 5) * scale))
            pg_dims.append(1)
    st_total = sum(_item(d) * (_numel(s) + 4) for s, d in zip(st_shapes, st_dtypes))
    pg_total = sum(_item(d) * (_numel(s) + 4) for s, d in zip(pg_shapes, pg_dtypes))
    state_buf = random_bytes(st_total + 64, gen).to(device)
    page_buf = random_bytes(pg_total + 64, gen).to(device)
    off = rng.randint(0, 7) if misaligned else 0
    tensors = []
    for s, d in zip(st_shapes, st_dtypes):
        off = _place(off, d, rng, misaligned)
        tensors.append(rows_view(state_buf, off, s, d))
        off += _item(d) * _numel(s)
    ranges = None
    if partial:
        ranges = []
        for t, dim in zip(tensors, st_dims):
            row = _numel(t.shape[dim + 1 :]) * t.element_size()
            if rng.random() < 0.5:
                ranges.append(None)
            else:
                a = rng.randint(0, row - 1)
                ranges.append((a, rng.randint(1, row - a)))
    state = sc.StateLayout(tensors, slot_dim=st_dims, image_ranges=ranges)
    off = rng.randint(0, 7) if misaligned else 0
    pages = []
    for s, d in zip(pg_shapes, pg_dtypes):
        off = _place(off, d, rng, misaligned)
        pages.append(rows_view(page_buf, off, s, d))
        off += _item(d) * _numel(s)
    page = sc.PageLayout(pages, unit_dim=pg_dims)
    return state, page, state_buf, page_buf


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def random_batch(rng: random.Random, state, page, lid: str, image_bytes: int, units_per: int):
    """A valid batch: one writer per slot and unit, no op reading what another writes."""
    slots = list(range(state.num_slots))
    rng.shuffle(slots)
    units = list(range(page.num_units))
    rng.shuffle(units)
    relocations, copies, stores, restores = [], [], [], []
    # Readers and writers are taken from disjoint parts of the shuffled slots.
    half = len(slots) // 2
    readers, writers = slots[:half], slots[half:]
    for w in writers:
        kind = rng.choice(["reloc", "copy", "restore", "none"])
        if kind in ("reloc", "copy"):
            (relocations if kind == "reloc" else copies).append((rng.choice(readers), w))
        elif kind == "restore" and len(units) >= units_per:
            ids = tuple(units.pop() for _ in range(units_per))
            restores.append(sc.CheckpointRestoreOp(dst_slot=w, unit_ids=ids, total_bytes=image_bytes, layout_id=lid))
    for r in readers:
        if rng.random() < 0.7 and len(units) >= units_per:
            ids = tuple(units.pop() for _ in range(units_per))
            stores.append(sc.CheckpointStoreOp(src_slot=r, unit_ids=ids, total_bytes=image_bytes, layout_id=lid))
    return relocations, copies, stores, restores


class Model:
    """Byte-level model of the tensors a layout pair describes."""

    def __init__(self, state, page):
        self.state, self.page = state, page

    def slot_rows(self, slot):
        """(tensor_row_bytes view, image_range) per row of one slot, in image order."""
        out = []
        for t, dim, rng_ in zip(self.state.tensors, self.state.slot_dims, self.state.image_ranges):
            if dim == 1:
                for layer in range(t.shape[0]):
                    out.append((t[layer, slot], rng_))
            else:
                out.append((t[slot], rng_))
        return out

    def unit_rows(self, unit):
        out = []
        for t, dim in zip(self.page.tensors, self.page.unit_dims):
            if dim == 1:
                for k in range(t.shape[0]):
                    out.append(t[k, unit])
            else:
                out.append(t[unit])
        return out

    @staticmethod
    def _bytes(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.uint8).flatten() if t.dim() else t.reshape(1).view(torch.uint8)

    def image(self, slot) -> torch.Tensor:
        parts = [self._bytes(row)[a : a + n] for row, (a, n) in self.slot_rows(slot)]
        return torch.cat(parts)

    def whole(self, slot) -> torch.Tensor:
        return torch.cat([self._bytes(row) for row, _ in self.slot_rows(slot)])

    def unit(self, u) -> torch.Tensor:
        return torch.cat([self._bytes(r) for r in self.unit_rows(u)])

    def set_unit(self, u, data: torch.Tensor) -> None:
        pos = 0
        for r in self.unit_rows(u):
            n = r.numel() * r.element_size()
            r.reshape(-1).view(torch.uint8).copy_(data[pos : pos + n])
            pos += n

    def set_image(self, slot, data: torch.Tensor) -> None:
        pos = 0
        for row, (a, n) in self.slot_rows(slot):
            row.reshape(-1).view(torch.uint8)[a : a + n].copy_(data[pos : pos + n])
            pos += n

    def set_whole(self, slot, data: torch.Tensor) -> None:
        pos = 0
        for row, _ in self.slot_rows(slot):
            n = row.numel() * row.element_size()
            row.reshape(-1).view(torch.uint8).copy_(data[pos : pos + n])
            pos += n

    def run(self, relocations, copies, stores, restores, unit_bytes):
        """Apply a batch sequentially in the order of docs/contract.md, "The pass"."""
        for src, dst in list(relocations) + list(copies):
            self.set_whole(dst, self.whole(src).clone())
        for op in stores:
            img = self.image(op.src_slot)
            for k, u in enumerate(op.unit_ids):
                piece = img[k * unit_bytes : (k + 1) * unit_bytes]
                full = torch.cat([piece, self.unit(u)[piece.numel() :]])
                self.set_unit(u, full)
        for op in restores:
            img = torch.cat([self.unit(u) for u in op.unit_ids])[: self.state.image_bytes]
            self.set_image(op.dst_slot, img.clone())
