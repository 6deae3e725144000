"""Builds an engine for tests from the library's classes; the reference
classes stand in for any that have not landed on this branch yet."""

import os

os.environ.setdefault("STATECACHE_REFERENCE_DIR", "/work/shared/reference")

import statecache
from statecache.engine import Engine, EngineConfig, StateCaches

import reference
from engine_doubles import DoubleBlockPool


def install_stand_ins():
    """Fill in library classes that have not landed on this branch yet with
    the reference's (and a stand-in BlockPool), so the engine code can name
    ``statecache.X`` throughout. No-op once they exist."""
    for name, module in (("StateSlotPool", "slot_pool"),
                         ("PagedStateCheckpointSpec", "paged_checkpoint"),
                         ("PagedStateCheckpointCoordinator", "paged_checkpoint")):
        if not hasattr(statecache, name):
            setattr(statecache, name, getattr(reference.load(module), name))
    if not hasattr(statecache, "BlockPool"):
        statecache.BlockPool = DoubleBlockPool


def _cls(name, module):
    if hasattr(statecache, name):
        return getattr(statecache, name)
    return getattr(reference.load(module), name)


def block_pool(num_blocks):
    if hasattr(statecache, "BlockPool"):
        return statecache.BlockPool(num_blocks)
    return DoubleBlockPool(num_blocks)


def caches_for(mech, pool, num_slots, hbs, enabled=True, unit_bytes=100, image_bytes=250,
               fork_tokens=3, readable_midstep=False):
    T = statecache.StateTransfer
    SlotPool = _cls("StateSlotPool", "slot_pool")
    if mech == "fork":
        t = T.fork(fork_tokens, readable_midstep=readable_midstep)
        return StateCaches(t, SlotPool(num_slots, t, hash_block_size=hbs, enabled=enabled), None, hbs)
    t = T.copy("L", readable_midstep=readable_midstep)
    Spec = _cls("PagedStateCheckpointSpec", "paged_checkpoint")
    Coord = _cls("PagedStateCheckpointCoordinator", "paged_checkpoint")
    spec = Spec(page_unit_bytes=unit_bytes, slot_bytes=image_bytes, layout_id="L",
                image_bytes=image_bytes)
    slots = SlotPool(num_slots, T.none(), hash_block_size=hbs)
    coord = Coord(pool, spec, enabled, readable_midstep=readable_midstep)
    if readable_midstep:
        coord.attach_midstep_scratch(slots, 2 * num_slots)
    return StateCaches(t, slots, coord, hbs)


class ScriptRunner:
    """No model: records batches; the engine takes each request's script."""

    def __init__(self):
        self.batches = []

    def execute(self, batch):
        self.batches.append(batch)
        return {}


def engine(mech, hbs=4, num_blocks=64, num_slots=8, budget=16, prefix=True, interval=-1,
           runner=None, **kw):
    pool = block_pool(num_blocks)
    caches = caches_for(mech, pool, num_slots, hbs, enabled=prefix, **kw)
    cfg = EngineConfig(hash_block_size=hbs, max_num_batched_tokens=budget,
                       enable_prefix_caching=prefix, checkpoint_interval_tokens=interval)
    return Engine(cfg, pool, caches, runner or ScriptRunner())
