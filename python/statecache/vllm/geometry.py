"""Where vLLM keeps one block of each KV cache group, and what statecache
stores of it (docs/vllm.md, "How it works", "What is stored").

vLLM's hybrid allocator gives every group pages of one size in shared
allocations (``KVCacheTensor``): layer ``l`` of a tensor keeps block ``b`` at
``offset + l * layer_stride + b * block_stride``; a block id belongs to one
group at a time. A group's *image* of block ``b`` is the real (unpadded)
bytes of that page in each of the group's layers. Two kinds of value go below
vLLM's memory, both named by the prefix they end:

* ``kv``: the images of block ``i`` of every full-attention group;
* ``state``: the images of every Mamba/GDN group's state block at a boundary;
* ``tail``: where a request ended off a boundary (the state a finished
  request ends with), the images of its last, partly filled attention block
  and of its state blocks.

Scheduler and workers derive the same geometry from ``kv_cache_config``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec

KV, STATE, TAIL = "kv", "state", "tail"


@dataclass(frozen=True)
class Place:
    """One layer's page of a block: ``tensor`` (index into
    ``kv_cache_tensors``), its layer name, ``offset`` of block 0 and
    ``block_stride``, in bytes of the backing allocation."""

    tensor: int
    layer: str
    offset: int
    block_stride: int


@dataclass(frozen=True)
class GroupImage:
    """What statecache stores of one block of group ``group``."""

    group: int
    kind: str
    page_bytes: int  # the padded page, per layer
    real_bytes: int  # the bytes that hold data, at the start of each page
    places: tuple[Place, ...]

    @functools.cached_property
    def image_bytes(self) -> int:
        return self.real_bytes * len(self.places)


class UnsupportedGeometry(ValueError):
    """A KV cache configuration the connector cannot serve."""


@dataclass(frozen=True)
class Geometry:
    block_size: int
    num_blocks: int
    images: tuple[GroupImage, ...]  # one per KV cache group, in group order
    entry_bytes: int
    identity: str  # model identity the keys are salted with

    # Derived once: the scheduler and the worker ask these for every value of every step.
    @functools.cached_property
    def kv_groups(self) -> tuple[GroupImage, ...]:
        return tuple(g for g in self.images if g.kind == KV)

    @functools.cached_property
    def state_groups(self) -> tuple[GroupImage, ...]:
        return tuple(g for g in self.images if g.kind == STATE)

    @functools.cached_property
    def _by_kind(self) -> dict[str, tuple[tuple[GroupImage, ...], int]]:
        out = {}
        for kind in (KV, STATE, TAIL):
            groups = (
                self.kv_groups + self.state_groups
                if kind == TAIL
                else self.kv_groups
                if kind == KV
                else self.state_groups
            )
            out[kind] = (groups, sum(self.units(g) for g in groups))
        return out

    def groups_of(self, kind: str) -> tuple[GroupImage, ...]:
        """The images one value of ``kind`` holds, in order."""
        return self._by_kind[kind][0]

    def units(self, image: GroupImage) -> int:
        """Host entries one image takes."""
        return -(-image.image_bytes // self.entry_bytes)

    def value_entries(self, kind: str) -> int:
        """Host entries one value of ``kind`` takes."""
        return self._by_kind[kind][1]

    def value_bytes(self, kind: str) -> int:
        return self.value_entries(kind) * self.entry_bytes

    def layout_id(self, kind: str) -> str:
        """The layout part of a tier key: the model identity and the geometry
        of this kind's images (no addresses, no pool size)."""
        desc = repr(
            (
                self.identity,
                kind,
                self.block_size,
                self.entry_bytes,
                [(g.group, g.real_bytes, len(g.places)) for g in self.groups_of(kind)],
            )
        )
        return "v" + hashlib.blake2b(desc.encode(), digest_size=8).hexdigest()


def _default_entry_bytes(real: list[int]) -> int:
    """A power of two near an eighth of the smallest image: little padding,
    few spans per copy."""
    target = max(4096, min(real) // 8)
    e = 4096
    while e * 2 <= min(target, 1 << 20):
        e *= 2
    return e


def build_geometry(kv_cache_config: KVCacheConfig, identity: str, entry_bytes: int | None = None) -> Geometry:
    """Reads the groups and tensors of ``kv_cache_config``; returns the
    Geometry. Raises UnsupportedGeometry for groups other than full attention
    and Mamba/GDN in ``align`` mode, or differing block sizes."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise UnsupportedGeometry("the KV cache config has no groups")
    block_size = None
    kinds = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if isinstance(spec, MambaSpec):
            if spec.mamba_cache_mode != "align":
                raise UnsupportedGeometry(
                    f"group {i} ({type(spec).__name__}): mamba_cache_mode={spec.mamba_cache_mode!r}; the connector "
                    "needs 'align' (prefix caching on, the vLLM default for hybrid models)"
                )
            if spec.num_speculative_blocks:
                raise UnsupportedGeometry(f"group {i}: speculative decoding blocks are not supported")
            kinds.append(STATE)
        elif isinstance(spec, FullAttentionSpec) and getattr(spec, "sliding_window", None) is None:
            kinds.append(KV)
        else:
            raise UnsupportedGeometry(
                f"group {i} is {type(spec).__name__}: the connector serves full attention and Mamba/GDN groups"
            )
        if block_size is None:
            block_size = spec.block_size
        elif spec.block_size != block_size:
            raise UnsupportedGeometry(f"group {i} has block_size {spec.block_size}, group 0 has {block_size}")
    if KV not in kinds:
        raise UnsupportedGeometry("no full-attention group: nothing names a prefix's KV")
    layer_group = {name: i for i, g in enumerate(groups) for name in g.layer_names}
    places: list[list[Place]] = [[] for _ in groups]
    for t_idx, t in enumerate(kv_cache_config.kv_cache_tensors):
        for l_idx, layer in enumerate(t.layers):
            if layer not in layer_group:
                continue  # a layer no group caches (e.g. a draft model's)
            places[layer_group[layer]].append(Place(t_idx, layer, t.offset + l_idx * t.layer_stride, t.block_stride))
    images = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if not places[i]:
            raise UnsupportedGeometry(f"group {i}: none of its layers is in kv_cache_tensors")
        page, real = spec.page_size_bytes, spec.real_page_size_bytes
        for p in places[i]:
            if p.block_stride < page:
                raise UnsupportedGeometry(f"layer {p.layer}: block_stride {p.block_stride} < page {page}")
        images.append(GroupImage(i, kinds[i], page, real, tuple(places[i])))
    if entry_bytes is None:
        entry_bytes = _default_entry_bytes([im.image_bytes for im in images])
    assert block_size is not None
    return Geometry(block_size, kv_cache_config.num_blocks, tuple(images), entry_bytes, identity)
