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


class ContentRunner:
    """No model, but a model of what every state slot, page unit and KV block
    holds: the token prefix it was computed from. Each forward checks that
    the state it reads and the KV blocks it attends to hold exactly the
    sequence's own tokens (so a hit that resumes another prompt's KV or state
    raises ``WrongState``), then records what it writes. It runs the batch's
    state ops (relocations, PAGE stores, PAGE restores) on the model first,
    as a runner runs them before the forward."""

    class WrongState(AssertionError):
        pass

    def __init__(self, hbs: int):
        self.hbs = hbs
        self.slots: dict[int, tuple] = {}
        self.units: dict[int, tuple] = {}
        self.blocks: dict[int, tuple] = {}
        self.forwards = 0

    def execute(self, batch):
        ops = batch.ops
        for src, dst in ops.relocations:
            self.slots[dst] = self.slots.get(src)
        for op in ops.stores:
            for i, u in enumerate(op.unit_ids):
                self.units[u] = (self.slots.get(op.src_slot), i)
        for op in ops.restores:
            parts = [self.units.get(u) for u in op.unit_ids]
            whole = parts[0] is not None and all(p == (parts[0][0], i) for i, p in enumerate(parts))
            self.slots[op.dst_slot] = parts[0][0] if whole else ("garbled", op.unit_ids)
        hbs = self.hbs
        for item in batch.items:
            toks, start = tuple(item.seq.token_ids), item.start
            if start and self.slots.get(item.read_slot) != toks[:start]:
                raise self.WrongState(
                    f"request {item.seq.request_id} resumes at {start} from a state of "
                    f"{self.slots.get(item.read_slot)!r}, not of its own {start} tokens"
                )
            for j in range(-(-start // hbs)):
                want = toks[: min(start, (j + 1) * hbs)]
                got = self.blocks.get(item.block_table[j])
                if got is None or got[: len(want)] != want:
                    raise self.WrongState(f"request {item.seq.request_id}: KV block {j} holds another prefix")
            end = start + len(item.token_ids)
            for j in range(start // hbs, -(-end // hbs)):
                self.blocks[item.block_table[j]] = toks[: min(end, (j + 1) * hbs)]
            for slot, pos in item.midstep:
                self.slots[slot] = toks[:pos]
            self.slots[item.write_slot] = toks[:end]
            self.forwards += 1
        return {}


def engine(
    mech, hbs=4, num_blocks=64, num_slots=8, budget=16, prefix=True, interval=-1, runner=None, hash_seed=None, **kw
):
    pool = statecache.BlockPool(num_blocks)
    caches = caches_for(mech, pool, num_slots, hbs, enabled=prefix, **kw)
    cfg = EngineConfig(
        hash_block_size=hbs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=prefix,
        checkpoint_interval_tokens=interval,
        hash_seed=hash_seed,
    )
    return Engine(cfg, pool, caches, runner or ScriptRunner())
