"""Where one slot's state and one page unit's bytes live (docs/contract.md, "Copying").

A layout is read off the engine's real tensors: every tensor contributes one
*row* per slot (or per page unit), found along its slot dim (0, or 1 for
``[layers, slots, ...]``, where each layer is a row of its own). The result
is a segment table of plain ints, ``(base, stride, bytes)`` per row, that the
C++ span planner consumes; ``layout_id`` is a digest of the geometry and
dtypes only, so it changes whenever they do and never with addresses.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from statecache import _C


@dataclass(frozen=True)
class Segment:
    """Row ``i`` of this segment is ``bytes`` long at ``base + i * stride``."""

    base: int
    stride: int
    bytes: int


def _as_tensor_list(tensors, name: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    out = list(tensors)
    if not out:
        raise ValueError(f"{name} must name at least one tensor")
    for i, t in enumerate(out):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return out


def _per_tensor(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} tensors")
        return list(value)
    return [value] * n


class _RowTable:
    """Rows of several tensors along one index dim (a slot, or a page unit)."""

    def __init__(self, tensors, index_dim, name: str, index_name: str):
        self.tensors = _as_tensor_list(tensors, name)
        dims = _per_tensor(index_dim, len(self.tensors), f"{index_name}_dim")
        self.dims = list(dims)
        self.rows: list[Segment] = []
        self.row_tensor: list[int] = []  # which tensor each row comes from
        self.geometry: list[tuple] = []
        self.count = None
        self.device = self.tensors[0].device
        for i, (t, dim) in enumerate(zip(self.tensors, dims)):
            where = f"{name}[{i}] (shape {tuple(t.shape)}, stride {tuple(t.stride()) if t.layout == torch.strided else '-'})"
            if dim not in (0, 1) or isinstance(dim, bool):
                raise ValueError(f"{index_name}_dim for {name}[{i}] must be 0 or 1, got {dim!r}")
            if t.layout != torch.strided:
                raise ValueError(f"{where}: only strided tensors can be served, got {t.layout}")
            if t.device != self.device:
                raise ValueError(f"{where}: on {t.device}, but {name}[0] is on {self.device}")
            if t.dim() < dim + 1:
                raise ValueError(f"{where}: has no dim {dim} to index {index_name}s by")
            count = t.shape[dim]
            if self.count is None:
                self.count = count
            elif count != self.count:
                raise ValueError(f"{where}: holds {count} {index_name}s, {name}[0] holds {self.count}")
            item = t.element_size()
            row_shape = t.shape[dim + 1 :]
            row_bytes = math.prod(row_shape) * item
            if row_bytes == 0:
                raise ValueError(f"{where}: a {index_name} row holds no bytes")
            # The row (dims after the index dim) must be one contiguous run.
            expect = 1
            for size, stride in reversed(list(zip(row_shape, t.stride()[dim + 1 :]))):
                if size != 1 and stride != expect:
                    raise ValueError(
                        f"{where}: the dims after dim {dim} are not contiguous; "
                        f"pass a tensor whose {index_name} rows are contiguous"
                    )
                expect *= size
            if t.data_ptr() % item:
                raise ValueError(f"{where}: data_ptr {t.data_ptr():#x} is not aligned to its {item}-byte elements")
            step = t.stride(dim) * item
            if count > 1 and step < row_bytes:
                raise ValueError(
                    f"{where}: {index_name} rows overlap ({index_name} stride {step} bytes < row {row_bytes} bytes)"
                )
            outer = range(t.shape[0]) if dim == 1 else range(1)
            for layer in outer:
                base = t.data_ptr() + layer * t.stride(0) * item * (dim == 1)
                self.rows.append(Segment(base, step, row_bytes))
                self.row_tensor.append(i)
            shape = list(t.shape)
            shape[dim] = -1  # the pool size is not part of an image's geometry
            self.geometry.append((str(t.dtype), tuple(shape), dim))
        if not self.count:
            raise ValueError(f"{name} hold no {index_name}s")
        self.name = name
        # What the rows' addresses were read from; check() compares it before
        # every batch, so a replaced or resized storage never receives bytes.
        # (One C++ call over bound methods: this runs on the scheduler's
        # critical path.)
        self.fingerprint = tuple(storage_fingerprint(t) for t in self.tensors)

    def check(self, owner: str) -> None:
        """ValueError unless every tensor still has the storage, address and
        shape it had when ``owner`` was built."""
        i = _C._first_changed(self.fingerprint)
        if i >= 0:
            raise_changed(self.name, owner, self.fingerprint[i], i)

    @property
    def row_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)


def storage_fingerprint(t: torch.Tensor) -> tuple:
    """(tensor, its data_ptr method, its storage, data_ptr, storage bytes,
    shape): what ``_C._first_changed`` compares before each batch. Holding
    the storage keeps its memory allocated, so a replaced storage cannot
    come back at the same address."""
    storage = t.untyped_storage()
    return (t, t.data_ptr, storage, t.data_ptr(), storage.nbytes(), t.shape)


def raise_changed(name: str, owner: str, entry: tuple, i: int) -> None:
    """Raises the ValueError for tensor ``i`` of ``name`` whose fingerprint
    ``entry`` no longer matches."""
    t, _, _, ptr, nbytes, shape = entry
    raise ValueError(
        f"{name}[{i}]: its storage was replaced or resized since the {owner} was built "
        f"(data_ptr {ptr:#x} -> {t.data_ptr():#x}, shape {tuple(shape)} -> {tuple(t.shape)}, "
        f"storage {nbytes} -> {t.untyped_storage().nbytes()} bytes); build a new layout"
    )


def _flat(rows: Sequence[Segment]) -> list[int]:
    return [v for r in rows for v in (r.base, r.stride, r.bytes)]


class StateLayout:
    """Where one slot's state lives across the engine's state tensors.

    ``tensors``: one tensor or a list (any dtype), each indexed by slot along
    ``slot_dim`` (0, or 1 for ``[layers, slots, ...]``; one value or one per
    tensor). ``image_ranges``: per tensor, ``None`` (the whole row belongs to
    the checkpoint image) or ``(byte_offset, byte_count)`` within each of its
    rows (only that part is stored and restored). Rows must be contiguous.
    Relocations and group copies move whole slots; PAGE images move the image.
    """

    def __init__(self, tensors, slot_dim=1, image_ranges=None):
        self._table = _RowTable(tensors, slot_dim, "state tensors", "slot")
        ranges = _per_tensor(image_ranges, len(self._table.tensors), "image_ranges")
        self.image_ranges = []
        for i, r in enumerate(ranges):
            row = next(s.bytes for s, t in zip(self._table.rows, self._table.row_tensor) if t == i)
            if r is None:
                r = (0, row)
            if (
                not isinstance(r, (tuple, list))
                or len(r) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)
            ):
                raise TypeError(f"image_ranges[{i}] must be None or (byte_offset, byte_count), got {r!r}")
            off, n = r
            if off < 0 or n <= 0 or off + n > row:
                raise ValueError(f"image_ranges[{i}]={tuple(r)!r} does not fit in a {row}-byte row")
            self.image_ranges.append((off, n))
        self.image_segments = [
            Segment(s.base + self.image_ranges[t][0], s.stride, self.image_ranges[t][1])
            for s, t in zip(self._table.rows, self._table.row_tensor)
        ]

    tensors = property(lambda self: self._table.tensors)
    slot_dims = property(lambda self: self._table.dims)
    device = property(lambda self: self._table.device)
    num_slots = property(lambda self: self._table.count)
    segments = property(lambda self: list(self._table.rows), doc="whole-slot rows")
    slot_bytes = property(lambda self: self._table.row_bytes)
    image_bytes = property(lambda self: sum(s.bytes for s in self.image_segments))

    def geometry(self) -> tuple:
        """Returns the address-free description ``layout_id`` digests (shapes,
        strides, dtypes, image ranges). Raises nothing."""
        return ("state", tuple(self._table.geometry), tuple(self.image_ranges))

    def segment_table(self) -> list[int]:
        """Returns the slot segments as a flat ``[base, stride, bytes, ...]``
        list (the span planner's input). Raises nothing."""
        return _flat(self._table.rows)

    def check(self) -> None:
        """Returns None while every tensor keeps the storage it had when this
        layout was built. Raises ValueError if one was replaced or resized."""
        self._table.check("StateLayout")

    def image_segment_table(self) -> list[int]:
        """Returns the checkpoint image's segments as a flat ``[base, stride,
        bytes, ...]`` list. Raises nothing."""
        return _flat(self.image_segments)


class PageLayout:
    """Where one page unit's bytes live across the KV cache tensors.

    ``tensors``: one or more tensors indexed by block along ``unit_dim`` (0 for
    ``[blocks, ...]``, 1 for ``[2, blocks, ...]`` or ``[layers, blocks, ...]``).
    Unit ``u`` is block ``u`` of every tensor, in order: a unit may span the K
    and V blocks of every attention layer.
    """

    def __init__(self, tensors, unit_dim=0):
        self._table = _RowTable(tensors, unit_dim, "page tensors", "unit")

    tensors = property(lambda self: self._table.tensors)
    unit_dims = property(lambda self: self._table.dims)
    device = property(lambda self: self._table.device)
    num_units = property(lambda self: self._table.count)
    segments = property(lambda self: list(self._table.rows))
    unit_bytes = property(lambda self: self._table.row_bytes)

    def geometry(self) -> tuple:
        """Returns the address-free description ``layout_id`` digests. Raises nothing."""
        return ("page", tuple(self._table.geometry))

    def segment_table(self) -> list[int]:
        """Returns the page unit's segments as a flat ``[base, stride, bytes,
        ...]`` list. Raises nothing."""
        return _flat(self._table.rows)

    def check(self) -> None:
        """Returns None while every tensor keeps the storage it had when this
        layout was built. Raises ValueError if one was replaced or resized."""
        self._table.check("PageLayout")


def layout_id(state_layout: StateLayout, page_layout: PageLayout) -> str:
    """Returns a short digest of both geometries and dtypes (addresses
    excluded): equal layouts on other tensors share it. Raises nothing."""
    text = repr((state_layout.geometry(), page_layout.geometry())).encode()
    return "sc-" + hashlib.blake2b(text, digest_size=8).hexdigest()


def paged_checkpoint_spec(state_layout: StateLayout, page_layout: PageLayout):
    """Returns the ``PagedStateCheckpointSpec`` the two layouts imply. Raises
    ValueError when the image is empty or larger than a slot."""
    from statecache import PagedStateCheckpointSpec

    return PagedStateCheckpointSpec(
        page_unit_bytes=page_layout.unit_bytes,
        slot_bytes=state_layout.slot_bytes,
        layout_id=layout_id(state_layout, page_layout),
        image_bytes=state_layout.image_bytes,
    )


@dataclass(frozen=True)
class TPShard:
    """One tensor-parallel rank's share of a model's state and KV tensors.

    Every rank of an evenly split model has the same geometry, hence the same
    ``layout_id`` and ``spec``: one scheduler's op list serves every rank,
    each moving its own shard (``image_bytes`` is per rank).
    """

    rank: int
    tp_size: int
    state: StateLayout
    page: PageLayout

    @property
    def layout_id(self) -> str:
        return layout_id(self.state, self.page)

    @property
    def spec(self):
        return paged_checkpoint_spec(self.state, self.page)


def _shard(tensors, dims, index_dims, tp_size: int, rank: int, device, name: str) -> list[torch.Tensor]:
    out = []
    for i, (t, dim, index_dim) in enumerate(zip(tensors, dims, index_dims)):
        if dim is None:  # every rank holds it whole
            part = t
        else:
            if isinstance(dim, bool) or not isinstance(dim, int) or not index_dim < dim < t.dim():
                raise ValueError(
                    f"{name}_shard_dims[{i}]={dim!r} must be a dim after the "
                    f"{'slot' if name == 'state' else 'unit'} dim {index_dim} of a "
                    f"{t.dim()}-dim tensor (heads and channels are inside a row)"
                )
            if t.shape[dim] % tp_size:
                raise ValueError(
                    f"{name} tensors[{i}] (shape {tuple(t.shape)}): dim {dim} of "
                    f"{t.shape[dim]} does not split evenly across tp_size={tp_size} ranks"
                )
            step = t.shape[dim] // tp_size
            part = t.narrow(dim, rank * step, step)
        # Each rank owns its own storage, as on its own GPU.
        out.append(part.to(device if device is not None else t.device, copy=True).contiguous())
    return out


def tp_shard_layouts(
    state_tensors,
    page_tensors,
    tp_size: int,
    *,
    state_shard_dims,
    page_shard_dims,
    slot_dim=1,
    unit_dim=0,
    devices=None,
) -> list[TPShard]:
    """Split a model's full (TP=1) state and KV tensors by heads across
    ``tp_size`` ranks and derive each rank's layouts.

    ``state_shard_dims`` / ``page_shard_dims``: per tensor, the dim that holds
    heads or channels (conv channels, SSM/GDN heads, KV heads; it must come
    after the slot / unit dim), or ``None`` for a tensor every rank holds
    whole. A dim that is the concatenation of differently sharded parts (a
    Mamba2 conv state's x | B | C channels) is passed as one tensor per part.
    Rank ``r`` gets contiguous copies of slice ``r`` of each tensor, on
    ``devices[r]`` (default: where the tensor lives). Returns one ``TPShard``
    per rank. Raises ValueError for a bad ``tp_size``, a shard dim that is not
    after the slot / unit dim or does not divide by ``tp_size``, or a wrong
    number of dims or devices.
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size={tp_size!r} must be a positive int")
    state_tensors = _as_tensor_list(state_tensors, "state tensors")
    page_tensors = _as_tensor_list(page_tensors, "page tensors")
    sdims = _per_tensor(state_shard_dims, len(state_tensors), "state_shard_dims")
    pdims = _per_tensor(page_shard_dims, len(page_tensors), "page_shard_dims")
    slot_dims = _per_tensor(slot_dim, len(state_tensors), "slot_dim")
    unit_dims = _per_tensor(unit_dim, len(page_tensors), "unit_dim")
    if devices is not None and len(devices) != tp_size:
        raise ValueError(f"devices has {len(devices)} entries for tp_size={tp_size}")
    shards = []
    for r in range(tp_size):
        dev = devices[r] if devices is not None else None
        st = _shard(state_tensors, sdims, slot_dims, tp_size, r, dev, "state")
        pg = _shard(page_tensors, pdims, unit_dims, tp_size, r, dev, "page")
        shards.append(TPShard(r, tp_size, StateLayout(st, slot_dim=slot_dims), PageLayout(pg, unit_dim=unit_dims)))
    return shards
