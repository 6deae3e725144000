"""The unit mover: whole page units between the GPU's KV tensors and host rows.

The one place bytes cross between GPU memory and the host tier, through the
copy engine's host path (``statecache.executor.HostCopyExecutor``: the copy
kernel on a few SMs for short rows, batched DMA for long ones, on side
streams). ``to_rows`` returns once the rows hold the units (the tier
checksums them next); ``from_rows`` returns once the rows may be reused, and
work queued after it on the current stream reads the loaded units. Rows
outside the attached host buffer go through a scratch buffer of the mover's.
"""

from __future__ import annotations

import numpy as np


class UnitMover:
    """Copies whole page units between the KV tensors and host rows."""

    def __init__(self, page_layout):
        self.page_layout = page_layout
        self.unit_bytes = page_layout.unit_bytes
        self.device = page_layout.device
        self.host = None  # the host arena's buffer, when attached
        self._arena = None  # HostCopyExecutor over it
        self._scratch = None  # HostCopyExecutor over a scratch buffer, for other rows

    def attach_host(self, buffer) -> None:
        """Rows inside this ``[entries, unit_bytes]`` uint8 host buffer (a
        tensor, pinned on a GPU; or a NumPy array for a CPU layout) move
        without a bounce. Anything else detaches."""
        import torch

        from statecache.executor import HostCopyExecutor

        if isinstance(buffer, np.ndarray) and self.device.type == "cpu":
            buffer = torch.from_numpy(buffer)
        ok = (
            isinstance(buffer, torch.Tensor)
            and buffer.dim() == 2
            and buffer.dtype == torch.uint8
            and buffer.shape[1] == self.unit_bytes
            and buffer.is_contiguous()
            and (self.device.type == "cpu" or buffer.is_pinned())
        )
        self.host = buffer if ok else None
        self._arena = HostCopyExecutor(self.page_layout, buffer) if ok else None

    def _place(self, rows, n: int):
        """(executor, entry ids, scratch rows to bounce through or None)."""
        if len(rows) != n:
            raise ValueError(f"{len(rows)} host rows for {n} units")
        if self._arena is not None:
            from statecache import _C

            h = self.host
            entries = _C._buffer_entries(rows, h.data_ptr(), self.unit_bytes, h.shape[0])
            if entries is not None:
                return self._arena, entries, None
        scratch = self._scratch
        if scratch is None or scratch.host.shape[0] < n:
            import torch

            from statecache.executor import HostCopyExecutor

            size = max(n, 2 * scratch.host.shape[0] if scratch is not None else 8)
            buf = torch.empty((size, self.unit_bytes), dtype=torch.uint8, pin_memory=self.device.type != "cpu")
            scratch = self._scratch = HostCopyExecutor(self.page_layout, buf)
        return scratch, np.arange(n), scratch.host.numpy()[:n]

    def to_rows(self, units, rows, wait: bool = True):
        """Units -> host rows (``unit_bytes`` each). With ``wait`` (always for
        rows outside the attached buffer) the rows hold the units on return.
        Returns the ``HostCopy``."""
        ex, entries, bounce = self._place(rows, len(units))
        move = ex.offload(units, entries)
        if bounce is not None or wait:
            move.wait()
        if bounce is not None:
            for r, row in enumerate(rows):
                row[:] = bounce[r]
        return move

    def from_rows(self, rows, units, wait: bool = True):
        """Host rows -> units; work queued later on the current stream reads
        them. With ``wait`` (always for rows outside the attached buffer) the
        rows may be reused on return. Returns the ``HostCopy``."""
        ex, entries, bounce = self._place(rows, len(units))
        if bounce is not None:
            for r, row in enumerate(rows):
                bounce[r] = row
        move = ex.load(entries, units)
        if bounce is not None or wait:
            move.wait()
        return move


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
