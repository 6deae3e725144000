"""Scheduler-pass latency of StateSlotPool: statecache (C++) against the
reference Python class, the same calls in the same run.

One pass, as a serving loop makes it (docs/contract.md, "The pass"): `release_pins()`, then for
each of 256 running sequences `resumable_hit` over its 64-block hash list and a
fork `checkpoint` at its next ladder rung, then 32 of them finish and are
replaced (`release` + `pop`). 1,024 slots, so the pool runs full: pops spend
LRU checkpoints and checkpoints come back through the pins two passes later.
The batched variants do the same work with one `resumable_hits`, one
`checkpoint_many` and one `release_many` + `pop_many` per pass ("NumPy": the
hash lists as one [256, 64] int64 array and the boundary hashes as its column;
"own seqs": the engine's own plain-Python request objects instead of
statecache.Sequence; "attribute traffic only": the reads and writes of
those objects that pass needs, alone, its floor).

    python benchmarks/bench_pools.py [--passes 40] [--repeats 15]

Where the pool has ``set_eviction_policy``, a variant under the cost model
(Qwen3-Next FLOPs) runs beside the reference setting (LRU, guesses first).

Prints µs per pass (median over repeats) and the ratio to statecache.
"""

from __future__ import annotations

import os

# NumPy's BLAS threads spin on idle cores and would tax whichever variant
# runs next to them; this benchmark needs none.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import operator
import statistics
import sys
import time
from collections import deque
from itertools import repeat
from pathlib import Path

import numpy as np

import statecache as sc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from reference import load  # noqa: E402

NUM_SLOTS = 1024
RUNNING = 256
BLOCKS = 64
HBS = 16
FINISH_PER_PASS = 32


class PySeq:
    """Plain-attribute sequence for the reference: its fastest possible input."""

    def __init__(self, num_tokens=0):
        self.num_tokens = num_tokens
        self.num_prompt_tokens = num_tokens
        self.has_per_req_cache = True
        self.state_slots = [-1]
        self.state_fork_src = -1
        self.checkpoint_end_pos = 0
        self.midstep_anchor_pos = 0

    @property
    def state_slot(self):
        return self.state_slots[0] if self.state_slots else -1

    @state_slot.setter
    def state_slot(self, v):
        self.state_slots[0] = v


class Workload:
    def __init__(self, pool, make_seq, hashes_as="list"):
        self.pool = pool
        self.seqs = []
        self.hashes = []
        self.pass_no = 0
        for i in range(RUNNING):
            s = make_seq(num_tokens=BLOCKS * HBS + 2 * HBS)
            s.state_slots = [pool.pop()]
            s.checkpoint_end_pos = (BLOCKS // 2) * HBS  # rung 32 is this prompt's anchor
            self.seqs.append(s)
            hs = [(i << 20) | b for b in range(BLOCKS)]
            self.hashes.append(np.asarray(hs, dtype=np.int64) if hashes_as == "numpy" else hs)

    def run_pass(self):
        pool, seqs, hashes = self.pool, self.seqs, self.hashes
        resumable_hit, checkpoint = pool.resumable_hit, pool.checkpoint
        rung = self.pass_no % BLOCKS + 1
        pool.release_pins()
        for i in range(RUNNING):
            s = seqs[i]
            hs = hashes[i]
            resumable_hit(s, BLOCKS, hs)
            checkpoint(s, rung, hs[rung - 1])
        first = (self.pass_no * FINISH_PER_PASS) % RUNNING
        for i in range(first, first + FINISH_PER_PASS):
            s = seqs[i]
            pool.release(s.state_slot)
            s.state_slot = pool.pop()
        self.pass_no += 1


class BatchedWorkload(Workload):
    """The same pass written with the batched calls: one ``resumable_hits``,
    one ``checkpoint_many``, one ``release_many`` + ``pop_many`` for the
    finishing requests, from the same Python loop state."""

    def __init__(self, pool, make_seq, hashes_as="list"):
        super().__init__(pool, make_seq, hashes_as)
        self.caps = np.full(RUNNING, BLOCKS, dtype=np.int64) if hashes_as == "numpy" else [BLOCKS] * RUNNING
        # NumPy: one [RUNNING, BLOCKS] int64 array, row i = sequence i's hashes.
        self.matrix = np.stack(self.hashes) if hashes_as == "numpy" else None

    def run_pass(self):
        pool, seqs, hashes = self.pool, self.seqs, self.hashes
        rung = self.pass_no % BLOCKS + 1
        pool.release_pins()
        pool.resumable_hits(seqs, self.caps, hashes if self.matrix is None else self.matrix)
        if self.matrix is not None:
            boundary = self.matrix[:, rung - 1]
        else:
            boundary = [hs[rung - 1] for hs in hashes]
        pool.checkpoint_many(seqs, [rung] * RUNNING, boundary)
        first = (self.pass_no * FINISH_PER_PASS) % RUNNING
        finished = seqs[first : first + FINISH_PER_PASS]
        pool.release_many([s.state_slot for s in finished])
        for s, slot in zip(finished, pool.pop_many(FINISH_PER_PASS)):
            s.state_slot = slot
        self.pass_no += 1


class AttributeTraffic:
    """The floor of the "own seqs" pass: only the attribute reads and writes
    any binding must make on the engine's objects in it, made from C loops
    (``operator.attrgetter``, ``map(setattr, ...)``), with no pool work.
    ``resumable_hits`` reads has_per_req_cache and num_tokens; a fork
    ``checkpoint_many`` reads has_per_req_cache, state_slot (a property
    here, as in the reference's engine), the two anchors and state_fork_src,
    and writes state_slot and state_fork_src."""

    def __init__(self):
        self.seqs = [PySeq(num_tokens=BLOCKS * HBS + 2 * HBS) for _ in range(RUNNING)]
        self.read_hits = operator.attrgetter("has_per_req_cache", "num_tokens")
        self.read_checkpoint = operator.attrgetter(
            "has_per_req_cache", "state_slot", "checkpoint_end_pos", "midstep_anchor_pos", "state_fork_src"
        )
        self.slots = list(range(RUNNING))
        self.pass_no = 0

    def run_pass(self):
        seqs = self.seqs
        deque(map(self.read_hits, seqs), 0)
        deque(map(self.read_checkpoint, seqs), 0)
        deque(map(setattr, seqs, repeat("state_slot"), self.slots), 0)
        deque(map(setattr, seqs, repeat("state_fork_src"), self.slots), 0)
        self.pass_no += 1


def timed(work, passes, clock):
    t0 = clock()
    for _ in range(passes):
        work.run_pass()
    return (clock() - t0) / passes * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=40, help="passes per timed repeat")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=100, help="passes before timing (fills the pool)")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with process CPU time instead of wall time (steadier on a shared machine)",
    )
    args = ap.parse_args(argv)

    transfer = sc.StateTransfer.fork(HBS)
    variants = {
        "statecache": lambda: Workload(sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), sc.Sequence),
        "statecache (NumPy hashes)": lambda: Workload(
            sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), sc.Sequence, "numpy"
        ),
    }
    if hasattr(sc.StateSlotPool, "checkpoint_many"):
        variants["statecache, batched calls"] = lambda: BatchedWorkload(
            sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), sc.Sequence
        )
        variants["statecache, batched, NumPy"] = lambda: BatchedWorkload(
            sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), sc.Sequence, "numpy"
        )
        variants["statecache, batched, own seqs"] = lambda: BatchedWorkload(
            sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), PySeq
        )
        variants["own seqs: attribute traffic only"] = AttributeTraffic
    if hasattr(sc.StateSlotPool, "set_eviction_policy"):
        from statecache.engine.adaptive import CostModel
        from statecache.sim.geometry import preset

        cost = CostModel.from_geometry(preset("qwen3-next-80b-a3b")).settings(HBS)

        def cost_pool():
            pool = sc.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS)
            pool.set_eviction_policy("cost", **cost)
            return Workload(pool, sc.Sequence)

        variants["statecache, cost eviction"] = cost_pool
    ref = load("slot_pool")
    if ref is not None:
        variants["reference (Python seqs)"] = lambda: Workload(
            ref.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), PySeq
        )
        variants["reference (statecache.Sequence)"] = lambda: Workload(
            ref.StateSlotPool(NUM_SLOTS, transfer, hash_block_size=HBS), sc.Sequence
        )
    else:
        print("reference not found beside the checkout: statecache only", file=sys.stderr)

    works = {name: make() for name, make in variants.items()}
    for w in works.values():
        for _ in range(args.warmup):
            w.run_pass()
    clock = time.process_time if args.cpu_time else time.perf_counter
    samples = {name: [] for name in works}
    for _ in range(args.repeats):  # interleaved, so drift hits every variant alike
        for name, w in works.items():
            samples[name].append(timed(w, args.passes, clock))

    base = statistics.median(samples["statecache"])
    ref_name = "reference (Python seqs)"
    ref = statistics.median(samples[ref_name]) if ref_name in samples else None
    print(
        f"StateSlotPool scheduler pass: {NUM_SLOTS} slots, {RUNNING} running seqs, "
        f"{BLOCKS}-block hash lists, {FINISH_PER_PASS} finish/admit per pass"
    )
    print(
        f"median of {args.repeats} repeats x {args.passes} passes (after {args.warmup} warm-up passes), "
        f"{'process CPU' if args.cpu_time else 'wall'} time; 'vs statecache': time / the per-sequence "
        f"statecache pass; 'reference speed-up': the reference's pass (Python seqs) / this pass\n"
    )
    print(
        f"| {'implementation':<32} | {'µs / pass':>10} | {'min':>10} | {'vs statecache':>13} "
        f"| {'reference speed-up':>18} |"
    )
    print(f"|{'-' * 34}|{'-' * 12}|{'-' * 12}|{'-' * 15}|{'-' * 20}|")
    for name, xs in samples.items():
        med = statistics.median(xs)
        speedup = f"{ref / med:>17.1f}x" if ref else f"{'-':>18}"
        print(f"| {name:<32} | {med:>10.1f} | {min(xs):>10.1f} | {med / base:>12.2f}x | {speedup} |")
    if "own seqs: attribute traffic only" in samples:
        native = statistics.median(samples["statecache, batched calls"])
        own = statistics.median(samples["statecache, batched, own seqs"])
        traffic = statistics.median(samples["own seqs: attribute traffic only"])
        print(
            f"\nengine-owned objects, batched pass: {own / native:.2f}x the statecache.Sequence pass; "
            f"floor (that pass + the attribute traffic alone) {(native + traffic) / native:.2f}x; "
            f"beyond the floor {own - native - traffic:.1f} µs / pass"
        )
    pool = works["statecache"].pool
    print(f"\nstatecache pool after the run: {pool.checkpoint_fates()} {pool.occupancy()}")


if __name__ == "__main__":
    main()
