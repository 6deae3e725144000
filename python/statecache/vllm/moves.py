"""Byte moves between vLLM's KV cache tensors and the host tier's rows, with
torch and statecache only (no vLLM import: the GPU tests run it where vLLM
cannot be installed).

vLLM's hybrid allocator keeps every layer's blocks in shared allocations:
layer ``l`` of a group has block ``b`` at ``offset + b * block_stride`` of
its tensor's storage, a page of ``page_bytes`` whose first ``real_bytes``
hold data (a Mamba page is padded to the attention page). Each group's blocks
are a statecache ``StateLayout`` (slot = vLLM block id, image = the real
bytes of the group's layers) moved whole to and from host entries by the
copy engine's ``HostCopyExecutor`` (memcpy on a CPU; the batched kernel or
DMA to pinned host memory on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from statecache.executor import HostCopyExecutor
from statecache.layout import StateLayout


def block_views(
    storage: torch.Tensor, places: Sequence[tuple[int, int]], num_blocks: int, page_bytes: int
) -> list[torch.Tensor]:
    """One ``[num_blocks, page_bytes]`` uint8 view per layer of a group, over
    the flat uint8 ``storage`` of the allocation; ``places``: per layer
    ``(offset, block_stride)`` in bytes. Raises ValueError when a layer's last
    page ends past the storage."""
    if storage.dtype != torch.uint8 or storage.dim() != 1:
        raise ValueError(f"storage must be a flat uint8 tensor, got {storage.dtype} {tuple(storage.shape)}")
    views = []
    for offset, stride in places:
        end = offset + (num_blocks - 1) * stride + page_bytes
        if offset < 0 or stride < page_bytes or end > storage.numel():
            raise ValueError(
                f"places: a layer at offset {offset}, block stride {stride} with {num_blocks} pages of "
                f"{page_bytes} bytes does not fit a storage of {storage.numel()} bytes"
            )
        views.append(torch.as_strided(storage, (num_blocks, page_bytes), (stride, 1), offset))
    return views


class BlockMover:
    """Copies one group's block images (``real_bytes`` at the start of each
    layer's page in ``views``) to and from entries of ``host``, a contiguous
    ``[entries, entry_bytes]`` uint8 CPU tensor (pinned when the views are on
    a GPU). An image takes ``entries_per_image`` entries, filled in order."""

    def __init__(self, views: list[torch.Tensor], real_bytes: int, host: torch.Tensor):
        self.views = views
        state = StateLayout(views, slot_dim=0, image_ranges=[(0, real_bytes)] * len(views))
        self.image_bytes = real_bytes * len(views)
        self.mover = HostCopyExecutor(state, host)
        self.entries_per_image = self.mover.entries_per_item

    @staticmethod
    def _split(pairs: Sequence[tuple[int, Sequence[int]]]) -> tuple[list[int], list[int]]:
        return [b for b, _ in pairs], [e for _, es in pairs for e in es]

    def store(self, pairs: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Block -> host entries, for each ``(block, entries)``; returns when
        the host rows hold the bytes (they are checksummed next)."""
        if pairs:
            blocks, entries = self._split(pairs)
            self.mover.offload(blocks, entries).wait()

    def restore(self, pairs: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Host entries -> block, for each ``(block, entries)``; work queued
        later on the current stream sees the loaded blocks. Returns when the
        copy is done (the entries may be reused at once)."""
        if pairs:
            blocks, entries = self._split(pairs)
            self.mover.load(entries, blocks).wait()
