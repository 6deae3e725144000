"""PAGE checkpoint scheduler cost: statecache vs the reference Python classes.

A 65,536-unit BlockPool, 16 units per checkpoint, the pool full of READY
checkpoints (4,096 of them). Each workload runs the same seeded call sequence
on statecache and on the reference classes (which run on their own
statecache.BlockPool, so the baseline's pool calls are not the slow part) and
reports microseconds of CPU time per scheduler pass, median over repeats
(the two sides alternate, so both see the same machine).

  pass        one scheduler pass on the store: can_append (has_available_units
              of 1) for 256 running sequences, 32 admissions (check with a
              protected hash, restore a READY hit), 32 new boundaries stored
              (each evicts); complete the previous batch, take the restores.
  churn       per pass, 64 sequences: admission check with a protected hash,
              a restore of a READY hit, a store of a new boundary (which
              evicts); then take the restores and complete the batch.
  admission   per pass, 256 has_available_units calls needing evictions, with
              half of the READY checkpoints pinned at the LRU head.
  coordinator per pass, 64 sequences through the coordinator: resumable_hit
              over 64-block hash lists, begin_restore, checkpoint; then
              take_checkpoint_ops and complete_previous_batch.
  coordinator, batched calls
              the same pass with statecache's batched calls (one
              resumable_hits, one begin_restores, one checkpoint_many)
              against the reference's per-sequence pass.

Run: PYTHONPATH=python python benchmarks/bench_paged.py [--repeats 7] [--eviction cost]

``--eviction cost`` runs statecache's side under the cost model
(``set_eviction_policy("cost")``, Qwen3-Next FLOPs, positions 1-64 blocks
from the hash) instead of the reference LRU; the reference side is unchanged.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

import statecache as sc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from reference import load  # noqa: E402

UNITS = 65_536
UNITS_PER_CHECKPOINT = 16
SPEC = dict(page_unit_bytes=4096, slot_bytes=16 * 4096, layout_id="bench", image_bytes=16 * 4096)
EVICTION = {"kind": "lru"}  # set from --eviction


def with_eviction(mod, cache):
    """statecache's store / coordinator under the chosen setting."""
    if mod is sc and EVICTION["kind"] != "lru":
        cache.set_eviction_policy(**EVICTION)
    return cache


def store_calls(mod, store):
    """begin_store as the coordinator calls it: with the boundary's position
    where the cost model ranks by it."""
    if mod is sc and EVICTION["kind"] != "lru":
        begin = store.begin_store
        return lambda h, slot: begin(h, slot, 1 + h % 64)
    return store.begin_store


def filled_store(mod, rng_seed: int):
    pool = sc.BlockPool(UNITS)
    store = with_eviction(mod, mod.PageUnitCheckpointStore(pool, mod.PagedStateCheckpointSpec(**SPEC)))
    begin_store = store_calls(mod, store)
    rng = random.Random(rng_seed)
    hashes = []
    while pool.num_free >= UNITS_PER_CHECKPOINT:
        h = rng.getrandbits(62)
        begin_store(h, 0)
        hashes.append(h)
    store.complete_inflight()
    return pool, store, hashes


def draw_plans(seed: int, n: int, per_pass: int) -> list:
    """(hit index, new hash, index to replace) per sequence, for 64 passes.

    Drawn up front, so the timed loop is the library's calls."""
    rng = random.Random(seed)
    return [[(rng.randrange(n), rng.getrandbits(62), rng.randrange(n)) for _ in range(per_pass)] for _ in range(64)]


def churn(mod):
    pool, store, hashes = filled_store(mod, 1)
    live = list(hashes)
    draws = draw_plans(2, len(live), 64)
    turn = [0]

    def one_pass():
        plan = draws[turn[0] % len(draws)]
        turn[0] += 1
        has_available_units, begin_restore, begin_store = (
            store.has_available_units,
            store.begin_restore,
            store_calls(mod, store),
        )
        for i, (hit_at, h, replace_at) in enumerate(plan):
            hit = live[hit_at]
            has_available_units(UNITS_PER_CHECKPOINT, protected_hash=hit)
            begin_restore(hit, i)
            if begin_store(h ^ turn[0], i) is not None:
                live[replace_at] = h ^ turn[0]
        store.take_restore_ops()
        store.complete_inflight()

    return one_pass


def scheduler_pass(mod):
    pool, store, hashes = filled_store(mod, 6)
    live = list(hashes)
    draws = draw_plans(7, len(live), 32)
    turn = [0]

    def one_pass():
        plan = draws[turn[0] % len(draws)]
        turn[0] += 1
        store.complete_inflight()
        has_available_units, begin_restore, begin_store = (
            store.has_available_units,
            store.begin_restore,
            store_calls(mod, store),
        )
        for _ in range(256):  # can_append for every running sequence
            has_available_units(1)
        for i, (hit_at, h, replace_at) in enumerate(plan):  # admissions, then new boundaries
            hit = live[hit_at]
            if has_available_units(UNITS_PER_CHECKPOINT, protected_hash=hit):
                begin_restore(hit, i)
            if begin_store(h ^ turn[0], 100 + i) is not None:
                live[replace_at] = h ^ turn[0]
        store.take_restore_ops()

    return one_pass


def admission(mod):
    pool, store, hashes = filled_store(mod, 3)
    for i, h in enumerate(hashes[: len(hashes) // 2]):  # the LRU head, pinned by readers
        store.begin_restore(h, i)
    store.take_restore_ops()
    rng = random.Random(4)
    counts = [UNITS_PER_CHECKPOINT * rng.randrange(1, 64) for _ in range(256)]

    def one_pass():
        for c in counts:
            store.has_available_units(c)

    return one_pass


class EngineSeq:
    """An engine's own request object: plain attributes, the two the
    coordinator reads (what the reference reads on a sequence)."""

    def __init__(self, slot: int):
        self.state_slot = slot
        self.has_per_req_cache = True


def warm_coordinator(mod, engine_owned: bool = False):
    """A coordinator whose store holds every 8th boundary of 512 prompts, its
    64 running sequences (``statecache.Sequence``, or the engine's own
    objects), and 64 passes' draws as a scheduler keeps them: per request,
    its hash list and (the benchmark's) salt."""
    pool = sc.BlockPool(UNITS)
    c = with_eviction(mod, mod.PagedStateCheckpointCoordinator(pool, mod.PagedStateCheckpointSpec(**SPEC), True))
    rng = random.Random(5)
    seqs = []
    for i in range(64):
        if engine_owned:
            s = EngineSeq(i)
        else:
            s = sc.Sequence(seq_id=i)
            s.state_slots = [i]
        seqs.append(s)
    prompts = [[rng.getrandbits(62) for _ in range(64)] for _ in range(512)]
    for p in prompts:
        for b in range(7, 64, 8):
            c.checkpoint(seqs[0], b + 1, p[b])
            c.take_checkpoint_ops()
        c.complete_previous_batch()
    draws = [[(rng.randrange(len(prompts)), rng.getrandbits(8)) for _ in seqs] for _ in range(64)]
    batches = [([prompts[p_at] for p_at, _ in plan], [salt for _, salt in plan]) for plan in draws]
    return c, seqs, batches


def coordinator(mod, engine_owned: bool = False):
    c, seqs, batches = warm_coordinator(mod, engine_owned)
    turn = [0]

    def one_pass():
        ps, salts = batches[turn[0] % len(batches)]
        turn[0] += 1
        t = turn[0]
        c.complete_previous_batch()
        resumable_hit, begin_restore, checkpoint = c.resumable_hit, c.begin_restore, c.checkpoint
        for s, p, salt in zip(seqs, ps, salts):
            hit = resumable_hit(s, 63, p)
            if hit:
                begin_restore(p[hit - 1], s.state_slot)
            checkpoint(s, hit + 8, p[min(hit + 7, 63)] ^ salt ^ t)
        c.take_checkpoint_ops()

    return one_pass


def coordinator_batched(mod, engine_owned: bool = False):
    """The coordinator pass written with the batched calls (statecache):
    one ``resumable_hits``, one ``begin_restores``, one ``checkpoint_many``;
    the reference side runs the per-sequence pass."""
    if mod is not sc:
        return coordinator(mod, engine_owned)
    c, seqs, batches = warm_coordinator(mod, engine_owned)
    caps = [63] * len(seqs)  # the batch's hit caps and slots, as a scheduler keeps them
    slots = [s.state_slot for s in seqs]
    turn = [0]

    def one_pass():
        ps, salts = batches[turn[0] % len(batches)]
        turn[0] += 1
        t = turn[0]
        c.complete_previous_batch()
        hits = c.resumable_hits(seqs, caps, ps)
        c.begin_restores(
            [p[hit - 1] for p, hit in zip(ps, hits) if hit], [slot for slot, hit in zip(slots, hits) if hit]
        )
        c.checkpoint_many(
            seqs, [hit + 8 for hit in hits], [p[min(hit + 7, 63)] ^ salt ^ t for p, hit, salt in zip(ps, hits, salts)]
        )
        c.take_checkpoint_ops()

    return one_pass


def time_side_by_side(ours, theirs, passes: int, repeats: int) -> tuple[float, float]:
    """Median µs per pass of each side, alternating the two every repeat.

    Timed on this thread's CPU clock: on a shared machine, wall time would
    also count the time other processes held the core.
    """
    ours()
    theirs()  # warm up
    samples: dict = {ours: [], theirs: []}
    for _ in range(repeats):
        for one_pass in (ours, theirs):
            t0 = time.thread_time()
            for _ in range(passes):
                one_pass()
            samples[one_pass].append((time.thread_time() - t0) / passes * 1e6)
    return statistics.median(samples[ours]), statistics.median(samples[theirs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument(
        "--eviction",
        choices=("lru", "cost"),
        default="lru",
        help="statecache's eviction setting (the reference is always LRU)",
    )
    args = ap.parse_args()
    if args.eviction == "cost":
        from statecache.engine.adaptive import CostModel
        from statecache.sim.geometry import preset

        EVICTION.update(kind="cost", **CostModel.from_geometry(preset("qwen3-next-80b-a3b")).settings(16))
    logging.disable(logging.WARNING)
    ref = load("paged_checkpoint")
    if ref is None:
        sys.exit("reference modules not found; set STATECACHE_REFERENCE_DIR")
    rows = []
    workloads = (
        ("pass", scheduler_pass),
        ("churn", churn),
        ("admission", admission),
        ("coordinator", coordinator),
        ("coordinator, batched calls", coordinator_batched),
        ("coordinator, engine-owned objects", lambda mod: coordinator(mod, True)),
        ("coordinator, batched calls, engine-owned objects", lambda mod: coordinator_batched(mod, True)),
    )
    for name, build in workloads:
        ours, theirs = time_side_by_side(build(sc), build(ref), args.passes, args.repeats)
        rows.append((name, ours, theirs, theirs / ours))
    print(
        f"statecache eviction: {args.eviction}; "
        f"pool {UNITS} units, {UNITS_PER_CHECKPOINT} units per checkpoint, "
        f"{UNITS // UNITS_PER_CHECKPOINT} READY checkpoints; median of {args.repeats} x {args.passes} passes "
        f"(thread CPU time, {os.cpu_count()} CPUs)"
    )
    print("| workload | statecache µs/pass | reference µs/pass | speed-up |")
    print("|---|---:|---:|---:|")
    for name, ours, theirs, ratio in rows:
        print(f"| {name} | {ours:,.1f} | {theirs:,.1f} | {ratio:,.1f}× |")


if __name__ == "__main__":
    main()
