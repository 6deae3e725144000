"""statecache.metrics (plain dict and a real Prometheus exporter scraped over
loopback HTTP) and statecache.logs (config once, degradations rate-limited)."""

from __future__ import annotations

import logging
import urllib.request

import pytest

import statecache as sc
from engine_support import engine
from statecache.engine import Request
from statecache.logs import DegradationMonitor, RateLimitedLog
from statecache.metrics import StateCacheMetrics, hit_rates

SYS = list(range(1, 23))  # 22 tokens = 5 full blocks of 4


def req(prompt, n=4):
    return Request(prompt, n, scripted_output=[900 + i for i in range(n)])


def serve(eng, prompts):
    out = []
    for p in prompts:
        r = req(p, 5)
        eng.add_request(r)
        eng.run_until_done()
        out.append(r)
    return out


def causes_workload(mech="page", interval=-1):
    """A KV miss, a hit cut short (KV reaches past the anchor), a full hit."""
    eng = engine(mech, interval=interval)
    (a,) = serve(eng, [SYS + [50, 51, 52]])  # nothing cached: KV miss
    (b,) = serve(eng, [a.token_ids + [60, 61, 62, 63, 64]])  # KV covers a's output, state a's anchor
    (c,) = serve(eng, [SYS[:17] + [70, 71]])  # KV 4 blocks; anchor of a at 24: miss
    return eng, (a, b, c)


def test_admission_causes_add_up():
    eng, (a, b, c) = causes_workload()
    f = eng.checkpoint_funnel()
    assert f["admissions_kv_miss"] == 1  # a
    assert f["admissions_hit_cut_short"] == 1  # b: KV 7 blocks, anchor at 6
    assert f["admissions_state_miss"] == 1  # c: KV hit, no checkpoint inside it
    assert f["admitted"] == 3
    assert (
        sum(
            f.get(k, 0)
            for k in (
                "admissions_kv_miss",
                "admissions_state_miss",
                "admissions_hit_cut_short",
                "admissions_full_hit",
            )
        )
        == 3
    )
    assert f["admitted_tokens"] == sum(r.num_prompt_tokens for r in (a, b, c))
    assert f["cut_short_tokens"] == f["kv_hit_tokens"] - f["resumed_tokens"] - f["state_miss_tokens"]
    r = hit_rates(f)
    assert r["state"] + r["lost_kv_miss"] + r["lost_state_miss"] + r["lost_cut_short"] == pytest.approx(1.0)
    assert 0 < r["state"] < r["kv"] < 1
    assert r["lost_state_miss"] > 0 and r["lost_cut_short"] > 0


def test_a_full_hit_is_counted_as_one():
    eng = engine("page")
    (a,) = serve(eng, [SYS + [50, 51, 52]])  # PAGE anchor at 24 tokens
    (b,) = serve(eng, [a.token_ids[:24] + [70, 71, 72, 73, 74]])  # KV matches exactly 6 blocks
    f = eng.checkpoint_funnel()
    assert b.num_cached_tokens == 24 and f["kv_hit_tokens"] == 24
    assert f["admissions_full_hit"] == 1 and f["admissions_kv_miss"] == 1
    assert hit_rates(f)["lost_cut_short"] == 0 and hit_rates(f)["lost_state_miss"] == 0


def test_hit_rates_before_any_admission():
    assert set(hit_rates({}).values()) == {0.0}


def test_collect_is_a_plain_dict():
    eng, _ = causes_workload()
    tier = sc.StateOffloadIndex(capacity=8)
    tier.note_stored(5)
    m = StateCacheMetrics(eng)
    m.track_tier("host", tier)
    snap = m.collect()
    assert snap["funnel"]["engine"] == eng.checkpoint_funnel()
    assert snap["admissions"]["engine"] == {
        "kv_miss": 1,
        "state_miss": 1,
        "hit_cut_short": 1,
        "full_hit": 0,
    }
    assert snap["checkpoints"]["page"] == eng.caches.coordinator.checkpoint_fates()
    assert snap["checkpoints"]["slots"] == eng.caches.slot_pool.checkpoint_fates()
    assert snap["occupancy"]["slots"] == eng.caches.slot_pool.occupancy()
    assert snap["tiers"]["host"]["hashes"] == 1


def test_track_rejects_what_it_cannot_read():
    m = StateCacheMetrics()
    with pytest.raises(TypeError, match="cache=int"):
        m.track_cache("x", 5)
    with pytest.raises(TypeError, match="tier=object"):
        m.track_tier("x", object())
    with pytest.raises(TypeError, match="engine=str"):
        m.track_engine("nope")
    with pytest.raises(TypeError, match="copy_stats"):
        m.track_executor("x", object())


def test_copy_counters_and_a_refused_batch_logged(caplog, monkeypatch):
    import statecache.logs

    # a fresh limiter: earlier tests' refused batches must not hold this one back
    monkeypatch.setattr(statecache.logs, "_default", RateLimitedLog())
    import torch

    conv = torch.randn(2, 8, 3, 64)
    kv = torch.zeros(2, 64, 16, 2, 16)
    state, page = sc.StateLayout([conv], slot_dim=1), sc.PageLayout([kv], unit_dim=1)
    with caplog.at_level(logging.INFO, logger="statecache"):
        ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    assert any("StateCopyExecutor:" in r.getMessage() for r in caplog.records)
    ex(relocations=[(0, 1), (2, 3)])
    st = ex.copy_stats
    assert st["batches"] == 1 and st["refused"] == 0 and st["bytes"] == 2 * 2 * 3 * 64 * 4
    assert st["spans"] >= 2 and st["seconds"] > 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statecache"), pytest.raises(ValueError):
        ex(relocations=[(0, 99)])
    assert st["refused"] == 1 and st["batches"] == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "copy batch refused, nothing moved" in caplog.records[0].getMessage()
    m = StateCacheMetrics()
    m.track_executor("runner", ex)
    assert m.collect()["copy"]["runner"] == st


def test_exporter_scraped_over_loopback_http():
    # prometheus-client: the [metrics] extra, which .ci/run installs
    from prometheus_client.parser import text_string_to_metric_families

    eng, _ = causes_workload()
    m = StateCacheMetrics(eng)
    tier = sc.StateOffloadIndex()
    tier.note_stored(9)
    m.track_tier("host", tier)
    server = m.serve(0, addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
            text = resp.read().decode()
        samples = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        f = eng.checkpoint_funnel()
        key = lambda name, **lab: (name, tuple(sorted(lab.items())))  # noqa: E731
        assert samples[key("statecache_admissions_total", engine="engine", cause="kv_miss")] == 1
        assert samples[key("statecache_admissions_total", engine="engine", cause="state_miss")] == 1
        assert samples[key("statecache_funnel_total", engine="engine", stage="resumed_tokens")] == f["resumed_tokens"]
        assert samples[key("statecache_hit_rate", engine="engine", kind="state")] == pytest.approx(
            hit_rates(f)["state"]
        )
        fates = eng.caches.coordinator.checkpoint_fates()
        assert samples[key("statecache_checkpoint_fates_total", cache="page", fate="kept")] == fates["checkpoints_kept"]
        assert samples[key("statecache_tier_stat", tier="host", stat="hashes")] == 1
        # live: a later pass shows up in the next scrape
        serve(eng, [SYS + [80, 81]])
        with urllib.request.urlopen(url, timeout=10) as resp:
            again = resp.read().decode()
        assert f'statecache_funnel_total{{engine="engine",stage="admitted"}} {float(f["admitted"] + 1)}' in again
    finally:
        server.shutdown()


def test_engine_logs_its_configuration_once(caplog):
    with caplog.at_level(logging.INFO, logger="statecache"):
        eng = engine("page")
        serve(eng, [SYS])
    msgs = [r.getMessage() for r in caplog.records if r.name == "statecache"]
    assert sum(m.startswith("Engine:") for m in msgs) == 1
    assert "transfer='copy'" in next(m for m in msgs if m.startswith("Engine:"))


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_rate_limited_log_holds_back_repeats(caplog):
    clock = FakeClock()
    log = RateLimitedLog(interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="statecache"):
        assert log("k", logging.WARNING, "thing %d", 1)
        assert not log("k", logging.WARNING, "thing %d", 2)
        assert not log("k", logging.WARNING, "thing %d", 3)
        assert log("other", logging.WARNING, "other")  # keys are independent
        clock.now += 61
        assert log("k", logging.WARNING, "thing %d", 4)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["thing 1", "other", "thing 4 (2 similar messages held back in the last 60 s)"]
    with pytest.raises(ValueError, match="interval_s"):
        RateLimitedLog(interval_s=-1)


def test_reclaimed_offload_pins_are_logged_rate_limited(caplog):
    clock = FakeClock()
    pool = sc.BlockPool(32)
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=100, slot_bytes=400, layout_id="L", image_bytes=400)
    store = sc.PageUnitCheckpointStore(pool, spec, offload_sink=True)
    store.use_clock(clock)
    for h in (1, 2):
        store.begin_store(h, h)
        store.complete_inflight()
    store.complete_inflight()
    mon = DegradationMonitor(log=RateLimitedLog(interval_s=60, clock=clock))
    mon.watch(store, "store")
    assert mon.poll() == 0
    assert len(store.take_offload_stores(4)) == 2
    clock.now += 10
    assert store.reclaim_stale_offload_pins(5.0) == 2
    with caplog.at_level(logging.WARNING, logger="statecache"):
        assert mon.poll() == 1
        assert mon.poll() == 0  # nothing new
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "2 stale offload pins reclaimed (2 in total)" in msgs[0]
    with pytest.raises(TypeError, match="obj=int"):
        mon.watch(5)


def test_offload_backlog_overflow_is_logged(caplog):
    # one unit per image; the store keeps at most 8,192 nominations for the tier
    spec = sc.PagedStateCheckpointSpec(page_unit_bytes=400, slot_bytes=400, layout_id="L", image_bytes=400)
    pool = sc.BlockPool(8300)
    coord = sc.PagedStateCheckpointCoordinator(pool, spec, True)
    coord.attach_offload(sc.StateOffloadIndex())  # a sink: READY images are nominated
    mon = DegradationMonitor(coord, log=RateLimitedLog(interval_s=60))
    store = coord.store
    for h in range(1, 8201):
        assert store.begin_store(h, 0) is not None
    store.complete_inflight()
    store.complete_inflight()
    dropped = store.offload_nominations_dropped
    assert dropped == 8200 - 8192
    with caplog.at_level(logging.WARNING, logger="statecache"):
        assert mon.poll() == 1
    (rec,) = caplog.records
    assert rec.getMessage().startswith(
        f"PagedStateCheckpointCoordinator: offload backlog overflow: {dropped} checkpoint "
        f"nominations for the lower tier dropped ({dropped} in total)"
    )
