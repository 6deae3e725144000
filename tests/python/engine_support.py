"""Builds a model-free engine for tests from the library's classes."""

import statecache
from statecache.engine import Engine, EngineConfig, StateCaches


def caches_for(
    mech, pool, num_slots, hbs, enabled=True, unit_bytes=100, image_bytes=250, fork_tokens=3, readable_midstep=False
):
    T = statecache.StateTransfer
    if mech == "fork":
        t = T.fork(fork_tokens, readable_midstep=readable_midstep)
    else:
        t = T.copy("L", readable_midstep=readable_midstep)
    spec = statecache.PagedStateCheckpointSpec(
        page_unit_bytes=unit_bytes, slot_bytes=image_bytes, layout_id="L", image_bytes=image_bytes
    )
    return StateCaches.build(t, num_slots, hbs, block_pool=pool, spec=spec, enabled=enabled)


class ScriptRunner:
    """No model: records batches; the engine takes each request's script."""

    def __init__(self):
        self.batches = []

    def execute(self, batch):
        self.batches.append(batch)
        return {}


def engine(mech, hbs=4, num_blocks=64, num_slots=8, budget=16, prefix=True, interval=-1, runner=None, **kw):
    pool = statecache.BlockPool(num_blocks)
    caches = caches_for(mech, pool, num_slots, hbs, enabled=prefix, **kw)
    cfg = EngineConfig(
        hash_block_size=hbs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=prefix,
        checkpoint_interval_tokens=interval,
    )
    return Engine(cfg, pool, caches, runner or ScriptRunner())
