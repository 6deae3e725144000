"""statecache's PAGE store and coordinator against the reference, step by step.

Both sides receive the same seeded random operation sequence, each on its own
pool (whose on_evict unindexes that side's store); every return value and
public attribute is compared after every step, and page units are checked
conserved (docs/contract.md, "Invariants"). The pools are statecache.BlockPools,
or (docs/paged.md, "Pool protocol") statecache's side takes its units from a
BlockPool through Python, or both sides from a plain-Python ListPool.
"""

from __future__ import annotations

import random

import pytest

import statecache as sc
from paged_harness import FakeClock, FakeScratch, call, check_conservation, make_pool, norm, store_state
from reference import load

ref = load("paged_checkpoint")
if ref is None:  # the reference lives beside the checkout (../shared/reference or STATECACHE_REFERENCE_DIR)
    pytest.skip("reference modules not found", allow_module_level=True)

SPECS = [
    dict(page_unit_bytes=100, slot_bytes=1000, layout_id="L", image_bytes=350),  # 4 units
    dict(page_unit_bytes=64, slot_bytes=64, layout_id="gdn", image_bytes=64),  # 1 unit
    dict(page_unit_bytes=10, slot_bytes=100, layout_id="m2", image_bytes=95),  # 10 units
]


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(ref, "monotonic", c)
    return c


class StoreRun:
    """One statecache store and one reference store driven in lockstep."""

    def __init__(self, rng: random.Random, clock: FakeClock, num_blocks: int, spec: dict, sink: bool, pools=None):
        self.rng = rng
        self.clock = clock
        ours_kind, ref_kind = pools or ("block", "block")
        self.ours_pool = make_pool(ours_kind, num_blocks)
        self.ref_pool = make_pool(ref_kind, num_blocks)
        self.ours = sc.PageUnitCheckpointStore(self.ours_pool, sc.PagedStateCheckpointSpec(**spec), offload_sink=sink)
        self.theirs = ref.PageUnitCheckpointStore(
            self.ref_pool, ref.PagedStateCheckpointSpec(**spec), offload_sink=sink
        )
        self.ours.use_clock(clock)
        self.ours_pool.on_evict = self.ours.unindex
        self.ref_pool.on_evict = self.theirs.unindex
        self.hashes = [rng.randrange(-(2**62), 2**62) for _ in range(10)] + [0, -1, 7]
        self.slots = list(range(6))
        self.ops: list = []  # StateStoreOperationIds seen (same on both sides)
        self.suspended: list = []  # (ours, theirs)
        self.spent: list = []  # suspended restores already resumed or released (ours)
        self.kv: list = []  # KV block lists, same ids on both pools
        self.owner_seq = 0
        self.steps = 0
        self.held = []  # (ours, reference) record objects kept across steps

    def both(self, method, *args, target="store", **kw):
        a = self.ours if target == "store" else self.ours_pool
        b = self.theirs if target == "store" else self.ref_pool
        ra = call(a, method, *args, **kw)
        rb = call(b, method, *args, **kw)
        na = (ra[0], norm(ra[1])) if ra[0] == "ok" else ra
        nb = (rb[0], norm(rb[1])) if rb[0] == "ok" else rb
        assert na == nb, f"step {self.steps}: {method}{args}{kw}: ours={na} reference={nb}"
        return ra, rb

    def refused(self, obj, method, *args, **kw):
        """A deliberate divergence (README): statecache refuses the call with
        ValueError and changes nothing; the reference, which accepts it, is
        not called, so the two sides stay comparable."""
        before = store_state(self.ours)
        ra = call(obj, method, *args, **kw)
        assert ra == ("raise", "ValueError"), f"step {self.steps}: {method}{args}: ours={ra}, expected a refusal"
        assert store_state(self.ours) == before, f"step {self.steps}: refused {method} changed the store"

    def check(self):
        sa, sb = store_state(self.ours), store_state(self.theirs)
        assert sa == sb, f"step {self.steps}: state differs:\n ours={sa}\n  ref={sb}"
        # Records held across steps follow the store, and keep their last state once released.
        if self.ours.records and self.rng.random() < 0.2:
            cid = self.rng.choice(list(self.ours.records))
            self.held.append((self.ours.records[cid], self.theirs.records[cid]))
        self.held = self.held[-12:]
        for a, b in self.held:
            assert norm(a) == norm(b), f"step {self.steps}: held record ours={norm(a)} reference={norm(b)}"
        self.ours.check_consistency()
        check_conservation(self.ours_pool)
        check_conservation(self.ref_pool)
        gen = self.ours.generation
        for g in (gen, gen - 1, gen - 3, gen - 40, -1):
            self.both("changed_since", g)

    def step(self):
        r = self.rng
        h = r.choice(self.hashes)
        slot = r.choice(self.slots)
        kind = r.choices(
            [
                "store",
                "restore",
                "take_restores",
                "complete",
                "cancel",
                "suspend",
                "resume",
                "release_susp",
                "avail",
                "ensure",
                "lookup",
                "unindex",
                "clear",
                "adopt",
                "take_offload",
                "acquire",
                "release_src",
                "settle",
                "reclaim",
                "kv_alloc",
                "kv_free",
                "restore_queued",
            ],
            weights=[14, 8, 5, 8, 2, 2, 2, 1, 4, 2, 3, 3, 0.3, 2, 3, 2, 3, 3, 2, 3, 3, 1],
        )[0]
        self.steps += 1
        if kind == "store":
            if h == -1:
                self.refused(self.ours, "begin_store", h, slot)  # -1 means no hash
            else:
                self.both("begin_store", h, slot)
        elif kind == "restore":
            self.both("begin_restore", h, slot)
        elif kind == "take_restores":
            self.both("take_restore_ops")
        elif kind == "complete":
            self.both("complete_inflight")
        elif kind == "cancel":
            self.both("cancel_queued_restore", slot)
        elif kind == "suspend":
            (sa, a), (sb, b) = self.both("suspend_queued_restore", slot)
            if sa == "ok" and a is not None:
                self.suspended.append((a, b))
        elif kind in ("resume", "release_susp") and self.spent and r.random() < 0.3:
            # Taken back already: a second use would take another restore's pin.
            method = "resume_suspended_restore" if kind == "resume" else "release_suspended_restore"
            self.refused(self.ours, method, r.choice(self.spent))
        elif kind in ("resume", "release_susp") and self.suspended:
            a, b = self.suspended.pop(r.randrange(len(self.suspended)))
            self.spent = (self.spent + [a])[-8:]
            method = "resume_suspended_restore" if kind == "resume" else "release_suspended_restore"
            ra, rb = call(self.ours, method, a), call(self.theirs, method, b)
            assert (ra[0], ra[1] if ra[0] == "raise" else None) == (rb[0], rb[1] if rb[0] == "raise" else None)
        elif kind == "avail":
            count = r.choice([0, 1, 3, 4, 9, 17, 40, self.ours_pool.num_blocks, self.ours_pool.num_blocks + 1])
            if r.random() < 0.5:
                self.both("has_available_units", count, protected_hash=h)
            else:
                self.both("has_available_units", count)
        elif kind == "ensure":
            self.both("ensure_free_units", r.choice([0, 1, 4, 8, 20, 64]))
        elif kind == "lookup":
            for m in ("lookup", "contains", "contains_or_pending"):
                self.both(m, h)
        elif kind == "restore_queued":
            self.both("restore_queued_for", slot)
        elif kind == "unindex":
            self.both("unindex", h)
        elif kind == "clear":
            self.both("clear")
        elif kind == "adopt":
            self.owner_seq += 1
            owner = ("state-transfer", ("load", self.owner_seq)) if r.random() < 0.5 else f"xfer-{self.owner_seq}"
            n = self.ours.units_per_checkpoint
            (_, ua), (_, ub) = self.both("reserve_units", n, owner, target="pool")
            if ua is not None and h == -1:
                self.refused(self.ours, "adopt_units", tuple(ua), owner, h)  # -1 means no hash
                self.both("release_units", ua, owner, target="pool")
            elif ua is not None and r.random() < 0.1:
                self.refused(self.ours, "adopt_units", tuple(ua[:-1]), owner, h)  # not one image's units
                self.both("release_units", ua, owner, target="pool")
            elif ua is not None:
                self.both("adopt_units", tuple(ua), owner, h)
        elif kind == "take_offload":
            (sa, a), _ = self.both("take_offload_stores", r.choice([0, 1, 2, 4]))
            self.ops.extend(op for op, _units in a)
        elif kind == "acquire":
            kw = {"max_inflight": r.choice([1, 3])} if r.random() < 0.5 else {}
            (sa, a), _ = self.both("acquire_checkpoint_source", h, **kw)
            if a is not None:
                self.ops.append(a[0])
        elif kind in ("release_src", "settle") and self.ops:
            op = r.choice(self.ops)
            if r.random() < 0.3:
                op = tuple(op)  # a plain tuple names the same operation
            method = "release_offload_store_source" if kind == "release_src" else "settle_offload_store"
            self.both(method, op)
            self.both("was_reclaimed", op)
        elif kind == "reclaim":
            self.clock.now += r.choice([0.0, 0.5, 2.0, 10.0])
            self.both("reclaim_stale_offload_pins", r.choice([0, -1, 0.25, 1.0, 5.0, 3600]))
            for op in self.ops[-4:]:
                self.both("was_reclaimed", op)
        elif kind == "kv_alloc" and hasattr(self.ours_pool, "allocate"):
            (_, a), _ = self.both("allocate", r.choice([1, 2, 5]), target="pool")
            if a is not None:
                for b in a:
                    if r.random() < 0.6:
                        self.both("publish", b, r.choice(self.hashes), target="pool")
                self.kv.append(a)
        elif kind == "kv_free" and self.kv:
            self.both("free", self.kv.pop(r.randrange(len(self.kv))), target="pool")
        self.check()


# (statecache's pool, the reference's pool) kinds, seeds (paged_harness.make_pool).
POOL_RUNS = [(("block", "block"), s) for s in range(32)] + [
    (pools, s) for pools in (("python", "block"), ("list", "list")) for s in range(16)
]


@pytest.mark.parametrize("pools, seed", POOL_RUNS)
def test_store_matches_reference(pools, seed, clock):
    rng = random.Random(seed)
    spec = SPECS[seed % len(SPECS)]
    run = StoreRun(rng, clock, num_blocks=rng.choice([12, 24, 40, 64]), spec=spec, sink=seed % 4 != 3, pools=pools)
    for _ in range(400):
        run.step()
    if pools[0] == "python":  # the units really went through Python
        assert min(run.ours_pool.calls.get(m, 0) for m in ("num_free", "reserve_units", "release_units")) > 0


def test_a_reference_spec_is_accepted_and_validated():
    spec = ref.PagedStateCheckpointSpec(**SPECS[0])
    store = sc.PageUnitCheckpointStore(sc.BlockPool(8), spec)
    assert store.spec == sc.PagedStateCheckpointSpec(**SPECS[0]) and store.units_per_checkpoint == 4


def _unindex_dropping_queued_midstep(ref_c):
    """The reference coordinator's ``unindex`` with statecache's divergence
    (docs/contract.md, "Divergences"): a queued midstep store dies with its
    hash, its scratch slot goes back and the loss counts as orphaned."""
    unindex = ref_c.unindex

    def patched(h):
        queued = [q for q in ref_c._scratch_queued if q[0] == h]
        ref_c._scratch_queued = [q for q in ref_c._scratch_queued if q[0] != h]
        orphaned = ref_c.checkpoints_orphaned
        unindex(h)
        if queued and ref_c.checkpoints_orphaned == orphaned:
            ref_c.checkpoints_orphaned += 1
        for _, slot in queued:
            ref_c._scratch.release(slot)

    return patched


class CoordinatorRun(StoreRun):
    """One statecache coordinator and one reference coordinator in lockstep."""

    def __init__(self, rng, clock, num_blocks, spec, enabled, readable, tier, pools=None):
        self.rng = rng
        self.clock = clock
        ours_kind, ref_kind = pools or ("block", "block")
        self.ours_pool = make_pool(ours_kind, num_blocks)
        self.ref_pool = make_pool(ref_kind, num_blocks)
        self.tiers = (sc.StateOffloadIndex(capacity=6), sc.StateOffloadIndex(capacity=6)) if tier else (None, None)
        self.ours_c = sc.PagedStateCheckpointCoordinator(
            self.ours_pool,
            sc.PagedStateCheckpointSpec(**spec),
            enabled,
            offload=self.tiers[0],
            readable_midstep=readable,
        )
        self.ref_c = ref.PagedStateCheckpointCoordinator(
            self.ref_pool,
            ref.PagedStateCheckpointSpec(**spec),
            enabled,
            offload=self.tiers[1],
            readable_midstep=readable,
        )
        self.ours, self.theirs = self.ours_c.store, self.ref_c.store
        self.ours.use_clock(clock)
        self.scratch = (FakeScratch(4), FakeScratch(4))
        budget = rng.choice([0, 2, 4, 8])
        self.ours_c.attach_midstep_scratch(self.scratch[0], budget)
        self.ref_c.attach_midstep_scratch(self.scratch[1], budget)
        self.ref_c.unindex = _unindex_dropping_queued_midstep(self.ref_c)
        self.ours_pool.on_evict = self.ours_c.unindex
        self.ref_pool.on_evict = self.ref_c.unindex
        self.hashes = [rng.randrange(-(2**62), 2**62) for _ in range(9)] + [0, 5]
        self.slots = list(range(8))
        self.seqs = [sc.Sequence(seq_id=i) for i in range(5)]
        for s in self.seqs:
            s.state_slots = [rng.choice(self.slots)]
        self.ops, self.suspended, self.kv, self.reservations = [], [], [], []
        self.spent, self.closed = [], []  # taken-back suspended restores, published / cancelled rows
        self.held = []
        self.owners = []
        self.owner_seq = 0
        self.steps = 0

    def coord(self, method, *args, **kw):
        ra = call(self.ours_c, method, *args, **kw)
        rb = call(self.ref_c, method, *args, **kw)
        na = (ra[0], norm(ra[1])) if ra[0] == "ok" else ra
        nb = (rb[0], norm(rb[1])) if rb[0] == "ok" else rb
        assert na == nb, f"step {self.steps}: {method}{args}{kw}: ours={na} reference={nb}"
        return ra, rb

    def check(self):
        super().check()
        for name in ("checkpoints_kept", "checkpoints_dropped", "checkpoints_orphaned", "enabled", "readable_midstep"):
            assert getattr(self.ours_c, name) == getattr(self.ref_c, name), name
        assert (self.ours_c.offload is None) == (self.ref_c.offload is None)
        self.coord("checkpoint_fates")
        assert sorted(self.scratch[0].free) == sorted(self.scratch[1].free)

    def step(self):
        r = self.rng
        h = r.choice(self.hashes)
        slot = r.choice(self.slots)
        seq = r.choice(self.seqs)
        kind = r.choices(
            [
                "checkpoint",
                "forget",
                "take",
                "complete",
                "restore",
                "hit",
                "reserve_mid",
                "publish_mid",
                "cancel_mid",
                "xfer_reserve",
                "xfer_release",
                "xfer_adopt",
                "attach",
                "tier_note",
                "take_offload",
                "acquire",
                "release_src",
                "settle",
                "reclaim",
                "unindex",
                "clear",
                "avail",
                "move_slot",
                "suspend",
                "resume",
                "kv_alloc",
                "kv_free",
                "contains",
            ],
            weights=[16, 2, 9, 9, 6, 6, 3, 3, 1, 2, 1, 2, 0.5, 2, 2, 1, 2, 2, 1, 3, 0.3, 3, 4, 1, 1, 2, 2, 1],
        )[0]
        self.steps += 1
        if kind == "checkpoint" and r.random() < 0.05:
            self.refused(self.ours_c, "checkpoint", seq, r.randrange(8), -1)  # -1 means no hash
        elif kind == "checkpoint":
            self.coord("checkpoint", seq, r.randrange(8), h)
        elif kind == "forget":
            self.coord("forget_pending", seq)
        elif kind == "take":
            self.coord("take_checkpoint_ops")
        elif kind == "complete":
            self.coord("complete_previous_batch")
        elif kind == "restore":
            self.coord("begin_restore", h, slot)
        elif kind == "hit":
            hashes = [r.choice(self.hashes) for _ in range(r.randrange(0, 7))]
            hit = r.randrange(0, len(hashes) + 1)
            if r.random() < 0.2:
                self.coord("resumable_hit", seq, hit, hashes, assume_checkpointed=True)
            else:
                self.coord("resumable_hit", seq, hit, hashes)
        elif kind == "reserve_mid":
            positions = [(r.randrange(100), r.choice(self.hashes)) for _ in range(r.randrange(1, 4))]
            (_, a), _ = self.coord("reserve_midstep", seq, positions)
            if a:
                self.reservations.append(a)
        elif kind in ("publish_mid", "cancel_mid") and self.closed and r.random() < 0.2:
            # A row already published or cancelled: publishing it again would
            # free a slot someone else may hold now.
            self.refused(
                self.ours_c, "publish_midstep" if kind == "publish_mid" else "cancel_midstep", r.choice(self.closed)
            )
        elif kind in ("publish_mid", "cancel_mid") and self.reservations:
            res = self.reservations.pop(r.randrange(len(self.reservations)))
            self.closed = (self.closed + [list(res)])[-6:]
            if kind == "publish_mid":
                self.coord("publish_midstep", res, seq) if r.random() < 0.5 else self.coord("publish_midstep", res)
            else:
                self.coord("cancel_midstep", res)
        elif kind == "xfer_reserve":
            self.owner_seq += 1
            owner = r.choice([("load", self.owner_seq), self.owner_seq, f"o{self.owner_seq}"])
            if self.owners and r.random() < 0.2:
                owner = r.choice(self.owners)  # a duplicate active owner is refused
            self.coord("reserve_transfer_units", owner)
            self.owners.append(owner)
        elif kind == "xfer_release" and self.owners:
            self.coord("release_transfer_units", r.choice(self.owners))
        elif kind == "xfer_adopt" and self.owners and r.random() < 0.1:
            self.refused(self.ours_c, "adopt_transfer_units", r.choice(self.owners), -1)  # -1 means no hash
        elif kind == "xfer_adopt" and self.owners:
            self.coord("adopt_transfer_units", r.choice(self.owners), h)
        elif kind == "attach":
            choice = r.randrange(3)
            if choice == 0:
                self.coord_attach(None)
            else:
                self.coord_attach(
                    self.tiers if self.tiers[0] is not None else (sc.StateOffloadIndex(), sc.StateOffloadIndex()),
                    sink=choice == 1,
                )
        elif kind == "tier_note":
            for t in (self.ours_c.offload, self.ref_c.offload):
                if t is not None:
                    t.note_stored(h)
        elif kind == "take_offload":
            (_, a), _ = self.coord("take_offload_stores", r.choice([1, 2, 4]))
            self.ops.extend(op for op, _u in a)
        elif kind == "acquire":
            (_, a), _ = self.coord("acquire_checkpoint_source", h, max_inflight=r.choice([None, 1, 4]))
            if a is not None:
                self.ops.append(a[0])
        elif kind in ("release_src", "settle") and self.ops:
            op = r.choice(self.ops)
            self.coord("release_offload_store_source" if kind == "release_src" else "settle_offload_store", op)
            self.coord("was_reclaimed", op)
            self.coord("has_offload_pins")
        elif kind == "reclaim":
            self.clock.now += r.choice([0.0, 1.0, 30.0])
            self.coord("reclaim_stale_offload_pins", r.choice([0, 0.5, 10.0]))
        elif kind == "unindex":
            self.coord("unindex", h)
        elif kind == "clear":
            self.coord("clear_index")
        elif kind == "avail":
            n = r.choice([1, 4, 10, 30])
            self.coord("has_available_units", n, h) if r.random() < 0.5 else self.coord("ensure_free_units", n)
        elif kind == "move_slot":
            seq.state_slots = [] if r.random() < 0.15 else [slot]
            if r.random() < 0.05:
                seq.has_per_req_cache = not seq.has_per_req_cache
        elif kind == "suspend":
            (sa, a), (_, b) = self.coord("suspend_queued_restore", slot)
            if sa == "ok" and a is not None:
                self.suspended.append((a, b))
        elif kind == "resume" and self.spent and r.random() < 0.3:
            self.refused(
                self.ours_c, r.choice(["resume_suspended_restore", "release_suspended_restore"]), r.choice(self.spent)
            )
        elif kind == "resume" and self.suspended:
            a, b = self.suspended.pop(r.randrange(len(self.suspended)))
            self.spent = (self.spent + [a])[-8:]
            m = r.choice(["resume_suspended_restore", "release_suspended_restore"])
            ra, rb = call(self.ours_c, m, a), call(self.ref_c, m, b)
            assert ra[0] == rb[0] and (ra[0] == "ok" or ra[1] == rb[1])
        elif kind == "kv_alloc" and hasattr(self.ours_pool, "allocate"):
            (_, a), _ = self.both("allocate", r.choice([1, 3]), target="pool")
            if a is not None:
                for blk in a:
                    self.both("publish", blk, r.choice(self.hashes), target="pool")
                self.kv.append(a)
        elif kind == "kv_free" and self.kv:
            self.both("free", self.kv.pop(r.randrange(len(self.kv))), target="pool")
        elif kind == "contains":
            self.coord("contains", h)
            self.coord("restore_queued_for", slot)
            self.coord("applies", seq)
        self.check()

    def coord_attach(self, tiers, sink=True):
        if tiers is None:
            self.ours_c.attach_offload(None)
            self.ref_c.attach_offload(None)
        else:
            self.ours_c.attach_offload(tiers[0], sink=sink)
            self.ref_c.attach_offload(tiers[1], sink=sink)


@pytest.mark.parametrize("pools, seed", POOL_RUNS)
def test_coordinator_matches_reference(pools, seed, clock):
    rng = random.Random(1000 + seed)
    run = CoordinatorRun(
        rng,
        clock,
        num_blocks=rng.choice([16, 32, 48]),
        spec=SPECS[seed % len(SPECS)],
        enabled=seed % 8 != 7,
        readable=seed % 3 != 0,
        tier=seed % 2 == 0,
        pools=pools,
    )
    for _ in range(350):
        run.step()
    if pools[0] == "python":
        assert min(run.ours_pool.calls.get(m, 0) for m in ("num_free", "reserve_units", "release_units")) > 0
