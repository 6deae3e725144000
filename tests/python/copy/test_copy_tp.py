"""Tensor-parallel shards (issue 14, CPU part): one scheduler's op list, run
by every rank's executor on its own shard, restores every shard exactly."""

from __future__ import annotations

import random

import pytest
import torch

import statecache as sc


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def full_model(slots=6, units=64, layers=3, seed=0):
    """GDN-like state (conv channels and heads shard) and KV of two attention
    layers (KV heads shard), filled with random bytes."""
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(layers, slots, 8, 3, generator=g).to(torch.bfloat16)
    rec = torch.randn(layers, slots, 4, 5, 6, generator=g)
    kv = [torch.randn(2, units, 4, 4, 6, generator=g).to(torch.float16) for _ in range(2)]
    return [conv, rec], kv


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_one_op_list_restores_every_ranks_shard(tp_size):
    state, kv = full_model()
    shards = sc.tp_shard_layouts(state, kv, tp_size, state_shard_dims=[2, 2], page_shard_dims=3, slot_dim=1, unit_dim=1)
    assert [s.rank for s in shards] == list(range(tp_size))
    lids = {s.layout_id for s in shards}
    assert len(lids) == 1  # every rank: the same geometry
    full_id = sc.layout_id(sc.StateLayout(state), sc.PageLayout(kv, unit_dim=1))
    assert (next(iter(lids)) == full_id) == (tp_size == 1)
    full_bytes = sum(t[:, 0].numel() * t.element_size() for t in state)
    spec = shards[0].spec
    assert spec.image_bytes * tp_size == full_bytes and spec.layout_id == shards[0].layout_id
    # Each rank holds exactly its slice, in storage of its own.
    for s in shards:
        for t, full in zip(s.state.tensors, state):
            step = full.shape[2] // tp_size
            assert torch.equal(t, full.narrow(2, s.rank * step, step))
            assert t.is_contiguous() and t.untyped_storage().data_ptr() != full.untyped_storage().data_ptr()
    # One scheduler: the op list built once from rank 0's spec.
    rng = random.Random(tp_size)
    k = spec.units_per_checkpoint
    ids = rng.sample(range(64), 2 * k)
    stores = [
        sc.CheckpointStoreOp(
            src_slot=s, unit_ids=tuple(ids[i * k : (i + 1) * k]), total_bytes=spec.image_bytes, layout_id=spec.layout_id
        )
        for i, s in enumerate((1, 3))
    ]
    restores = [
        sc.CheckpointRestoreOp(dst_slot=d, unit_ids=op.unit_ids, total_bytes=spec.image_bytes, layout_id=spec.layout_id)
        for d, op in zip((4, 5), stores)
    ]
    executors = [sc.StateCopyExecutor(s.state, s.page, max_num_seqs=4) for s in shards]
    for ex in executors:
        ex(stores=stores)
    for s in shards:  # poison the destinations on every rank
        for t in s.state.tensors:
            t[:, 4:6].view(torch.uint8).fill_(0xFF)
    for ex in executors:
        ex(restores=restores)
    # Concatenating the ranks' shards rebuilds the full source slots.
    for i, full in enumerate(state):
        for src, dst in ((1, 4), (3, 5)):
            rebuilt = torch.cat([s.state.tensors[i][:, dst] for s in shards], dim=1)
            assert torch.equal(raw(rebuilt), raw(full[:, src]))
    # A rank's units hold that rank's bytes, never another's.
    if tp_size > 1:
        a, b = shards[0], shards[1]
        u = stores[0].unit_ids[0]
        assert not torch.equal(a.page.tensors[0][:, u], b.page.tensors[0][:, u])


def test_shard_errors_name_the_tensor():
    state, kv = full_model()
    with pytest.raises(ValueError, match="does not split evenly"):
        sc.tp_shard_layouts(state, kv, 3, state_shard_dims=[2, 2], page_shard_dims=3, unit_dim=1)
    with pytest.raises(ValueError, match="state_shard_dims\\[0\\]"):
        sc.tp_shard_layouts(state, kv, 2, state_shard_dims=[1, 2], page_shard_dims=3, unit_dim=1)
    with pytest.raises(ValueError, match="tp_size"):
        sc.tp_shard_layouts(state, kv, 0, state_shard_dims=2, page_shard_dims=3, unit_dim=1)
    # A tensor every rank holds whole (None) is copied whole.
    shards = sc.tp_shard_layouts(state, kv, 2, state_shard_dims=[None, 2], page_shard_dims=3, unit_dim=1)
    assert torch.equal(shards[1].state.tensors[0], state[0])
