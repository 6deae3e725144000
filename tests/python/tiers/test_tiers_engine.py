"""The engine with tiers below GPU memory, end to end on a tiny Qwen3-Next:
greedy tokens identical to the run without caching, every page unit and host
entry accounted for after every pass, and the faults of issue 10 §8 at the
engine level (host arena full, corrupted entries, a shared tier that loses a
key, times out, restarts, or never reports a store)."""

import signal
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from statecache.engine.conversations import make_workload, serve  # noqa: E402
from statecache.models import build_engine, build_model  # noqa: E402
from statecache.tiers import HostTier  # noqa: E402
from tier_support import mooncake_servers  # noqa: E402

torch.set_num_threads(1)
CONVS, TURNS, NEW = 2, 3, 4
GPU_BLOCKS = 56  # too small for the workload's KV + checkpoints


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3next", seed=0)


def run(model, *, caching=True, tiers=None, tier_options=None, num_blocks=GPU_BLOCKS, during=None):
    """Serves the workload; checks conservation after every pass. ``during``:
    called with (engine, pass number) after each pass (fault injection)."""
    eng = build_engine(
        "qwen3next",
        "page",
        model_and_geom=model,
        enable_prefix_caching=caching,
        num_blocks=num_blocks,
        tiers=tiers,
        tier_options=tier_options,
    )
    step = eng.step

    def checked_step():
        out = step()
        if eng.tiering is not None:
            eng.tiering.check_conservation()
        if during is not None:
            during(eng, eng.num_passes)
        return out

    eng.step = checked_step
    convs, branches, at = make_workload(3, CONVS, TURNS)
    rows = serve(eng, convs, branches, at, NEW)
    return eng, rows


@pytest.fixture(scope="module")
def reference(model):
    return [r.output_token_ids for r in run(model, caching=False, num_blocks=256)[1]]


@pytest.fixture(scope="module")
def unit(model):
    eng = build_engine("qwen3next", "page", model_and_geom=model, num_blocks=8)
    spec = eng.caches.coordinator.store.spec
    return spec.page_unit_bytes, spec.units_per_checkpoint


def assert_identical(rows, reference):
    assert [r.output_token_ids for r in rows] == reference


def resumed(rows):
    return sum(r.num_cached_tokens for r in rows)


def host_tier(unit, images=64, kv_blocks=256):
    ub, upc = unit
    return HostTier((images * upc + kv_blocks) * ub, ub, kv_bytes=kv_blocks * ub)


def test_host_tier_resumes_more_with_identical_tokens(model, reference, unit):
    _, gpu_only = run(model)
    eng, tiered = run(model, tiers=[host_tier(unit)])
    assert_identical(gpu_only, reference)
    assert_identical(tiered, reference)
    st = eng.tiering.stats()
    assert st["state_offloaded"] > 0 and st["kv_offloaded"] > 0
    assert st["state_loaded_host"] + st["kv_loaded_host"] > 0
    assert resumed(tiered) > resumed(gpu_only)
    assert st["loads_untrusted"] == 0
    f = eng.checkpoint_funnel()
    assert f["state_offload_stores_completed"] == st["state_offloaded"]


def test_host_arena_full(model, reference, unit):
    ub, upc = unit
    tiny = HostTier(upc * ub + 2 * ub, ub, kv_bytes=2 * ub)  # one image, two KV blocks
    eng, rows = run(model, tiers=[tiny])
    assert_identical(rows, reference)
    st = eng.tiering.stats()
    assert st["host"]["state_values"] <= 1 and st["host"]["kv_values"] <= 2
    assert st["host"]["state_evictions"] + st["state_offload_failed"] > 0


def test_warm_host_cold_gpu_and_corrupted_entries(model, reference, unit):
    host = host_tier(unit)
    eng, rows = run(model, tiers=[host])
    eng.close()
    assert_identical(rows, reference)
    # A second engine (empty GPU) on the same host tier resumes from it ...
    eng2, rows2 = run(model, tiers=[host])
    assert_identical(rows2, reference)
    st2 = eng2.tiering.stats()
    assert st2["state_loaded_host"] > 0 and st2["kv_loaded_host"] > 0
    eng2.close()
    # ... and a third one, after one byte of every host value was flipped,
    # adopts none of them, recomputes, and still generates the same tokens.
    corrupted = host.arena.keys()
    for k in corrupted:
        entries, nbytes, _meta, _klass = host.arena.lookup(k, False)
        host.rows[entries[len(entries) // 2], 123] ^= 0x01
    eng3, rows3 = run(model, tiers=[host])
    assert_identical(rows3, reference)
    st3 = eng3.tiering.stats()
    assert st3["loads_untrusted"] > 0
    assert st3["index_loads_untrusted"] > 0  # StateOffloadIndex counts them too (docs/contract.md, "Tiers")
    # every corrupted value that was asked for was dropped; what the host
    # holds now (values written again by this run, or never asked for) is
    # either sound or one of the flipped ones nobody read
    from statecache.tiers import integrity

    bad = 0
    for k in host.arena.keys():
        entries, nbytes, meta, _ = host.arena.lookup(k, False)
        bad += integrity.check(meta, k.decode(), host.views(entries, nbytes)) != integrity.OK
    assert bad + st3["loads_untrusted"] == len(corrupted)


# ------------------------------ shared tier -------------------------------- #


@pytest.fixture(scope="module")
def mooncake():
    servers = mooncake_servers(64 << 20)
    yield servers
    servers.stop()


def mooncake_tier(servers, timeout_s=2.0):
    from statecache.tiers.mooncake_tier import MooncakeTier

    return MooncakeTier(servers.master_addr, servers.metadata_url, timeout_s=timeout_s)


def test_fresh_engine_resumes_from_mooncake(model, reference, unit, mooncake):
    shared = mooncake_tier(mooncake)
    eng, rows = run(model, tiers=[host_tier(unit), shared], tier_options={"shared_writes": "through"})
    eng.close()
    assert_identical(rows, reference)
    # Empty GPU and empty host: everything resumed comes from Mooncake Store.
    shared2 = mooncake_tier(mooncake)
    eng2, rows2 = run(model, tiers=[host_tier(unit), shared2])
    assert_identical(rows2, reference)
    st = eng2.tiering.stats()
    assert st["state_loaded_shared"] > 0 and st["kv_loaded_shared"] > 0
    assert st["loads_untrusted"] == 0
    eng2.close()
    shared.close()
    shared2.close()


def test_shared_key_removed_between_contains_and_get(model, reference, unit, mooncake):
    from statecache.tiers.mooncake_tier import MooncakeTier

    class RemovingTier(MooncakeTier):
        """Removes each state key from the real store right before reading it."""

        def get_many_into(self, keys, dests):
            self.remove_many([k for k in keys if "/state/" in k])
            return super().get_many_into(keys, dests)

    writer = mooncake_tier(mooncake)
    eng, rows = run(model, tiers=[host_tier(unit), writer], tier_options={"shared_writes": "through"})
    eng.close()
    reader = RemovingTier(mooncake.master_addr, mooncake.metadata_url, timeout_s=2.0)
    eng2, rows2 = run(model, tiers=[host_tier(unit), reader])
    assert_identical(rows2, reference)
    st = eng2.tiering.stats()
    assert st["state_loaded_shared"] == 0 and st["loads_missing"] > 0
    assert st["index_loads_missing"] > 0
    eng2.close()
    writer.close()
    reader.close()


def test_master_killed_and_timeouts_during_a_run(model, reference, unit):
    servers = mooncake_servers(32 << 20)
    try:
        shared = mooncake_tier(servers, timeout_s=0.5)

        def fault(eng, n):
            if n == 6:
                servers.master.kill()  # mid-run: every call fails
            elif n == 12:
                servers.master.start(30)  # back, empty
            elif n == 18:
                servers.master.signal(signal.SIGSTOP)  # calls time out
            elif n == 24:
                servers.master.signal(signal.SIGCONT)

        eng, rows = run(model, tiers=[host_tier(unit, images=4, kv_blocks=16), shared], during=fault)
        assert_identical(rows, reference)
        st = eng.tiering.stats()
        assert st["mooncake"]["timeouts"] + st["shared_writes_failed"] > 0
        eng.close()
        shared.close()
    finally:
        servers.master.signal(signal.SIGCONT)
        servers.stop()


def test_store_report_that_never_arrives_is_reclaimed(model, reference, mooncake):
    """Shared tier only (the host arena just stages): copies and writes run on
    the I/O thread. With the master stopped the thread blocks, later copies
    never report, their pins are reclaimed, and what they wrote is never
    indexed (``was_reclaimed``)."""
    shared = mooncake_tier(mooncake, timeout_s=5.0)

    def fault(eng, n):
        if n == 3:
            mooncake.master.signal(signal.SIGSTOP)  # the next write blocks the I/O thread
        elif n == 12:
            time.sleep(1.0)  # later copies wait behind it; their pins age past 0.5 s
        elif n == 20:
            mooncake.master.signal(signal.SIGCONT)

    try:
        eng, rows = run(
            model, tiers=[shared], tier_options={"offload_timeout_s": 0.5, "max_inflight": 4, "kv": False}, during=fault
        )
    finally:
        mooncake.master.signal(signal.SIGCONT)
    assert_identical(rows, reference)
    eng.tiering.wait_writes(10)
    eng.tiering.check_conservation()
    store = eng.caches.coordinator.store
    idx = eng.tiering.index.stats()
    assert store.offload_pins_reclaimed > 0
    assert idx["stores_untrusted"] > 0
    # nothing a reclaimed store wrote is findable
    assert idx["stores_completed"] + idx["stores_failed"] + idx["stores_untrusted"] <= idx["stores_attempted"]
    eng.close()
    shared.close()


def test_bad_tier_configurations_raise_before_anything_runs(model, unit):
    ub, _ = unit
    with pytest.raises(ValueError, match="PAGE"):
        build_engine("qwen3next", "fork", model_and_geom=model, tiers=[HostTier(64 * ub, ub)])
    with pytest.raises(ValueError, match="entry_bytes"):
        build_engine("qwen3next", "page", model_and_geom=model, tiers=[HostTier(64 * ub, ub // 2)])
    with pytest.raises(ValueError, match="at most one HostTier"):
        build_engine("qwen3next", "page", model_and_geom=model, tiers=[HostTier(64 * ub, ub), HostTier(64 * ub, ub)])
    with pytest.raises(ValueError, match="shared_writes"):
        build_engine(
            "qwen3next",
            "page",
            model_and_geom=model,
            tiers=[HostTier(64 * ub, ub)],
            tier_options={"shared_writes": "sometimes"},
        )
    with pytest.raises(ValueError, match="max_inflight"):
        build_engine(
            "qwen3next", "page", model_and_geom=model, tiers=[HostTier(64 * ub, ub)], tier_options={"max_inflight": 0}
        )


def test_fresh_engine_resumes_from_redis(model, reference, unit):
    from statecache.tiers.redis_tier import RedisTier
    from tier_support import redis_server

    srv = redis_server()
    try:
        eng, rows = run(
            model, tiers=[host_tier(unit), RedisTier(port=srv.port)], tier_options={"shared_writes": "through"}
        )
        eng.close()
        assert_identical(rows, reference)
        # shared tier only: the host arena just stages
        eng2, rows2 = run(model, tiers=[RedisTier(port=srv.port)])
        assert_identical(rows2, reference)
        st = eng2.tiering.stats()
        assert st["state_loaded_shared"] > 0 and st["kv_loaded_shared"] > 0
        assert st["loads_untrusted"] == 0
        eng2.close()
    finally:
        srv.stop()


class FailingTier:
    """A shared tier every call of which raises ``exc``."""

    name = "failing"

    def __init__(self, exc):
        self.exc = exc

    def _fail(self, *a):
        raise self.exc

    put_many = get_many_into = contains_many = remove_many = _fail

    def stats(self):
        return {}

    def close(self):
        pass


def test_a_failing_shared_tier_is_counted_and_logged(model, reference, unit, caplog):
    from statecache.tiers import TierError

    caplog.set_level("WARNING", logger="statecache")
    eng, rows = run(
        model, tiers=[host_tier(unit), FailingTier(TierError("down"))], tier_options={"shared_writes": "through"}
    )
    assert_identical(rows, reference)
    st = eng.tiering.stats()
    assert st["tier_errors"] > 0 and st["shared_writes_failed"] > 0
    assert any("tier failing" in r.getMessage() and "down" in r.getMessage() for r in caplog.records)
    eng.close()


def test_a_tier_that_raises_outside_the_interface_is_a_bug_that_propagates(model, unit):
    with pytest.raises(KeyError, match="not a tier failure"):
        run(model, tiers=[host_tier(unit), FailingTier(KeyError("not a tier failure"))])


# --------------------- slow shared tiers racing reclaim --------------------- #

MARK = 0xAB  # what a reclaimed unit holds once reused, in the race test


class MemoryTier:
    """A shared tier in a dict: ``slow_puts`` puts sleep ``delay_s`` each
    (a slow server), and removals fail (best effort that does not happen).
    ``gate``: a slow put waits for it instead (``delay_s`` at most), so a
    test decides when the server answers; ``held`` is set while one waits."""

    name = "memory"

    def __init__(self, slow_puts=0, delay_s=0.0, gate=None):
        self.values, self.slow_puts, self.delay_s, self.gate = {}, slow_puts, delay_s, gate
        self.held = threading.Event()

    def put_many(self, keys, values):
        out = []
        for k, segs in zip(keys, values):
            if self.slow_puts > 0:
                self.slow_puts -= 1
                if self.gate is None:
                    time.sleep(self.delay_s)
                else:
                    self.held.set()
                    self.gate.wait(self.delay_s)
                    self.held.clear()
            self.values.setdefault(k, b"".join(bytes(memoryview(s).cast("B")) for s in segs))
            out.append(True)
        return out

    def get_many_into(self, keys, dests):
        from statecache.tiers.host import copy_stream

        out = []
        for k, d in zip(keys, dests):
            v = self.values.get(k)
            want = sum(memoryview(s).nbytes for s in d)
            out.append(-1 if v is None else (-2 if len(v) != want else copy_stream([v], d)))
        return out

    def contains_many(self, keys):
        return [k in self.values for k in keys]

    def remove_many(self, keys):
        return [False] * len(keys)

    def stats(self):
        return {"values": len(self.values)}

    def close(self):
        pass


class ReusingCoordinator:
    """The engine's coordinator, except that units taken back from a stale
    offload are overwritten with MARK before anything else in the pass (as
    their reuse would, later in it)."""

    def __init__(self, tiering):
        self._coord, self._tiering, self._units, self._reused = tiering.coord, tiering, {}, []
        self.reclaimed_ops = 0

    def __getattr__(self, name):
        return getattr(self._coord, name)

    def reclaim_stale_offload_pins(self, timeout_s):
        n = self._coord.reclaim_stale_offload_pins(timeout_s)
        for key, (op, units) in list(self._units.items()):
            if self._coord.was_reclaimed(op):
                self._reused.append(units)
                del self._units[key]
                self.reclaimed_ops += 1
        return n

    def take_offload_stores(self, n):  # the next call in the pass
        mover = self._tiering.mover
        for units in self._reused:
            mover.from_rows([np.full(mover.unit_bytes, MARK, np.uint8) for _ in units], units)
        self._reused.clear()
        got = self._coord.take_offload_stores(n)
        for op, units in got:
            self._units[id(op)] = (op, list(units))
        return got


def test_a_reclaimed_offload_is_never_written(model, reference):
    """Shared tier only: the first state write takes longer than
    offload_timeout_s, so later offloads' copies wait behind it on the I/O
    thread, their pins are reclaimed and their units reused. A copy that ran
    after the reclaim would checksum reused bytes and put them under the
    prefix's key (and the removal afterwards fails here): a fresh engine
    would adopt that value."""
    # The server answers the first write only once the race happened (60 s
    # at most): no timing of this machine decides whether it does.
    answer = threading.Event()
    shared = MemoryTier(slow_puts=1, delay_s=60.0, gate=answer)
    proxy = []

    def install(eng, n):
        if n == 1:
            t = eng.tiering
            proxy.append(ReusingCoordinator(t))
            t.coord = t.stores.coord = proxy[0]
        elif proxy and not answer.is_set():
            if proxy[0].reclaimed_ops:
                answer.set()
            elif proxy[0]._units and shared.held.is_set():
                time.sleep(0.4)  # copies queued behind the held write: their pins age past 0.3 s

    try:
        eng, rows = run(
            model,
            tiers=[shared],
            tier_options={"offload_timeout_s": 0.3, "max_inflight": 4, "kv": False},
            during=install,
        )
    finally:
        answer.set()
    eng.tiering.wait_writes(10)
    assert_identical(rows, reference)
    assert proxy[0].reclaimed_ops > 0  # the race happened
    from statecache.tiers import integrity

    marked = []
    for k, v in shared.values.items():
        payload = np.frombuffer(v[integrity.header_nbytes(k) :], dtype=np.uint8)
        if payload.size and (payload == MARK).mean() > 0.5:
            marked.append(k)
    assert not marked, f"{len(marked)} values hold reused units under a valid checksum"
    eng.close()
    # and a fresh engine over that tier resumes nothing wrong
    eng2, rows2 = run(model, tiers=[shared], tier_options={"kv": False})
    assert_identical(rows2, reference)
    eng2.close()


def test_tensor_parallel_ranks_are_named_and_resume_all_or_nothing(model, reference):
    """tp_size > 1 without a tp_rank is refused; a fresh rank 0 resumes from
    a shared tier only once rank 1's shards are there too."""
    with pytest.raises(ValueError, match="tp_rank is required"):
        build_engine("qwen3next", "page", model_and_geom=model, tiers=[MemoryTier()], tier_options={"tp_size": 2})
    shared = MemoryTier()
    opts = {"tp_rank": 0, "tp_size": 2}
    eng, rows = run(model, tiers=[shared], tier_options=dict(opts, shared_writes="through"))
    eng.close()
    assert_identical(rows, reference)
    assert any("/tp0-2/" in k for k in shared.values) and not any("/tp1-2/" in k for k in shared.values)
    alone, rows_alone = run(model, tiers=[shared], tier_options=opts)
    assert_identical(rows_alone, reference)
    st = alone.tiering.stats()
    assert st["state_loaded_shared"] == 0 and st["kv_loaded_shared"] == 0  # rank 1 has nothing: nobody loads
    alone.close()
    for k, v in list(shared.values.items()):  # rank 1 wrote its shards (same bytes here, its own key)
        k1 = k.replace("/tp0-2/", "/tp1-2/")
        from statecache.tiers import integrity

        hl = integrity.header_nbytes(k)
        payload = np.frombuffer(v[hl:], dtype=np.uint8)
        shared.values[k1] = integrity.make_header(k1, payload.size, integrity.checksum([payload])) + v[hl:]
    both, rows_both = run(model, tiers=[shared], tier_options=opts)
    assert_identical(rows_both, reference)
    st = both.tiering.stats()
    assert st["state_loaded_shared"] > 0 and st["kv_loaded_shared"] > 0
    both.close()
