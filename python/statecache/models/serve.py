"""Wires a model, its runner and the reference engine together."""

from __future__ import annotations

import statecache
from statecache.engine import Engine, EngineConfig, StateCaches

from .hybrid import build_model
from .runner import HybridModelRunner


def transfer_for(mechanism: str, geom, layout_id: str, readable_midstep: bool = False):
    """The StateTransfer the backend declares for ``mechanism``.

    fork: the forward after a checkpoint must refill the conv window
    (kernel - 1 tokens) before the fresh slot stands on its own.
    """
    T = statecache.StateTransfer
    if mechanism == "fork":
        return T.fork(max(1, geom.conv_kernel - 1), readable_midstep=readable_midstep)
    if mechanism == "page":
        return T.copy(layout_id, readable_midstep=readable_midstep)
    raise ValueError(f"mechanism={mechanism!r}: choose 'fork' or 'page'")


def build_engine(
    model="qwen3next",
    mechanism="page",
    *,
    seed=0,
    device="cpu",
    enable_prefix_caching=True,
    block_size=16,
    num_blocks=256,
    num_slots=32,
    max_num_seqs=4,
    max_num_batched_tokens=256,
    checkpoint_interval_tokens=-1,
    readable_midstep=False,
    model_and_geom=None,
    placement=None,
    eviction=None,
    tiers=None,
    tier_options=None,
    hash_seed=None,
    hash_salt=None,
):
    """An Engine serving a tiny random ``model`` with ``mechanism`` checkpoints.

    ``model_and_geom`` reuses an already built model (two engines, one set of
    weights). ``readable_midstep``: the runner can copy out interior states
    (it splits its forward there), so prefill chunks are not cut onto rungs.
    ``hash_seed`` / ``hash_salt``: the deployment key (``EngineConfig``; None
    and None: random per process; engines sharing a tier configure one, a secret).
    """
    m, geom = model_and_geom or build_model(model, seed=seed, device=device)
    runner = HybridModelRunner(
        m,
        geom,
        num_slots=num_slots,
        num_blocks=num_blocks,
        block_size=block_size,
        device=device,
        max_num_seqs=max_num_seqs,
    )
    transfer = transfer_for(mechanism, geom, runner.layout_id, readable_midstep)
    pool = statecache.BlockPool(num_blocks)
    caches = StateCaches.build(
        transfer,
        num_slots,
        block_size,
        block_pool=pool,
        spec=runner.checkpoint_spec() if transfer.copies else None,
        enabled=enable_prefix_caching,
        max_num_seqs=max_num_seqs,
    )
    cfg = EngineConfig(
        hash_block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        checkpoint_interval_tokens=checkpoint_interval_tokens,
        hash_seed=hash_seed,
        hash_salt=hash_salt,
    )
    return Engine(
        cfg, pool, caches, runner, placement=placement, eviction=eviction, tiers=tiers, tier_options=tier_options
    )
