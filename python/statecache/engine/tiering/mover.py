"""The unit mover: whole page units between the GPU's KV tensors and host rows.

The one place bytes cross between GPU memory and the host tier. ``to_rows``
gathers units into host rows (one DMA into the pinned arena when the rows are
consecutive), ``from_rows`` scatters host rows into units. Synchronous on
CPU; on a GPU the copies are ordered on the current stream before the batch
that reuses the units.
"""

from __future__ import annotations

import numpy as np


class UnitMover:
    """Copies whole page units between the KV tensors and host rows."""

    def __init__(self, page_layout):
        import torch

        self.torch = torch
        self.unit_bytes = page_layout.unit_bytes
        self.views = []
        for t, d in zip(page_layout.tensors, page_layout.unit_dims):
            if not t.is_contiguous():
                raise ValueError("page tensors must be contiguous for the tiers")
            n = t.shape[d]
            flat = t.reshape(-1).view(torch.uint8)
            self.views.append(flat.view(-1, n, flat.numel() // (n * max(1, int(np.prod(t.shape[:d], dtype=np.int64))))))
        if sum(v.shape[0] * v.shape[2] for v in self.views) != self.unit_bytes:
            raise AssertionError("unit mover: views do not cover one unit")
        self.device = page_layout.tensors[0].device
        self.host = None  # the host arena's (pinned) tensor, when attached

    def attach_host(self, tensor) -> None:
        """Rows inside this [entries, unit_bytes] uint8 CPU tensor are copied
        through it, so torch sees pinned memory and copies at DMA speed."""
        self.host = tensor if tensor is not None and tensor.dim() == 2 else None

    def _host_rows(self, block):
        """The attached tensor's rows under ``block`` (a 2-D numpy view), or None."""
        h = self.host
        if h is None or block is None:
            return None
        base = h.data_ptr()
        addr = block.__array_interface__["data"][0]
        first, rem = divmod(addr - base, self.unit_bytes)
        if rem or first < 0 or first + block.shape[0] > h.shape[0] or h.shape[1] != self.unit_bytes:
            return None
        return h[first : first + block.shape[0]]

    def gather(self, units) -> object:
        """``[len(units), unit_bytes]`` uint8 on the KV device."""
        torch = self.torch
        idx = torch.as_tensor(list(units), dtype=torch.long, device=self.device)
        parts = [v.index_select(1, idx).permute(1, 0, 2).reshape(len(units), -1) for v in self.views]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def scatter(self, units, data) -> None:
        torch = self.torch
        idx = torch.as_tensor(list(units), dtype=torch.long, device=self.device)
        # Synchronous: the host rows may be reused as soon as this returns.
        data = data.to(self.device)
        col = 0
        for v in self.views:
            w = v.shape[0] * v.shape[2]
            part = data[:, col : col + w].reshape(len(units), v.shape[0], v.shape[2]).permute(1, 0, 2)
            v.index_copy_(1, idx, part)
            col += w

    def to_rows(self, units, rows) -> None:
        """Units -> host rows (numpy views of ``unit_bytes`` each): one gather
        on the KV device, then one copy into consecutive rows (a DMA into the
        pinned arena on a GPU) or one per row."""
        torch = self.torch
        data = self.gather(units)
        block = _consecutive(rows, self.unit_bytes)
        pinned = self._host_rows(block)
        if pinned is not None:
            pinned.copy_(data)
            return
        if block is not None:
            torch.from_numpy(block).copy_(data)
            return
        data = data.cpu().numpy()
        for r, row in enumerate(rows):
            row[:] = data[r]

    def from_rows(self, rows, units) -> None:
        torch = self.torch
        block = _consecutive(rows, self.unit_bytes)
        data = self._host_rows(block)
        if data is None:
            data = torch.from_numpy(block if block is not None else np.stack([np.asarray(r) for r in rows]))
        self.scatter(units, data)


def _consecutive(rows, unit_bytes: int):
    """``rows`` as one 2-D view when they are consecutive full rows of one
    buffer, else None."""
    if not rows or any(r.nbytes != unit_bytes or r.ndim != 1 or r.strides != (1,) for r in rows):
        return None
    first = rows[0].__array_interface__["data"][0]
    for i, r in enumerate(rows):
        if r.__array_interface__["data"][0] != first + i * unit_bytes:
            return None
    # Every row was checked to start where the previous one ends, so one
    # strided view over the first covers exactly their bytes.
    return np.lib.stride_tricks.as_strided(rows[0], shape=(len(rows), unit_bytes), strides=(unit_bytes, 1))
