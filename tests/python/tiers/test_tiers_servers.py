"""MooncakeTier and RedisTier against real servers on loopback: the interface,
and the faults of issue 10 §8 at the tier level (master killed mid-batch and
restarted, a corrupted value, a key removed between contains and get, a
timeout, a full store). Nothing is mocked."""

import threading
import time

import numpy as np
import pytest

from statecache.tiers import MISSING, TIMED_OUT, TRUNCATED, integrity
from tier_support import corrupt_one_byte, mooncake_servers, redis_server


@pytest.fixture(scope="module")
def mooncake():
    servers = mooncake_servers(64 << 20)
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def redis_srv():
    srv = redis_server()
    yield srv
    srv.stop()


def make_tier(kind, mooncake=None, redis_srv=None, timeout_s=2.0):
    if kind == "mooncake":
        from statecache.tiers.mooncake_tier import MooncakeTier

        return MooncakeTier(mooncake.master_addr, mooncake.metadata_url, timeout_s=timeout_s)
    from statecache.tiers.redis_tier import RedisTier

    return RedisTier(port=redis_srv.port, timeout_s=timeout_s)


@pytest.fixture(params=["mooncake", "redis"])
def tier(request):
    if request.param == "mooncake":
        t = make_tier("mooncake", mooncake=request.getfixturevalue("mooncake"))
    else:
        t = make_tier("redis", redis_srv=request.getfixturevalue("redis_srv"))
    yield t
    t.close()


def _key(tag):
    return f"test/{tag}/{time.monotonic_ns()}"


def test_interface_round_trip(tier):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, 200_000, dtype=np.uint8)
    b = rng.integers(0, 256, 1000, dtype=np.uint8)
    k1, k2, k3 = _key("a"), _key("b"), _key("missing")
    assert tier.put_many([k1, k2], [[a, b], [b]]) == [True, True]
    d1, d2 = np.zeros_like(a), np.zeros_like(b)
    assert tier.get_many_into([k1, k3], [[d1, d2], [d2]]) == [a.nbytes + b.nbytes, MISSING]
    assert (d1 == a).all() and (d2 == b).all()
    assert tier.get_many_into([k2], [[d1]]) == [TRUNCATED]
    assert tier.contains_many([k1, k2, k3]) == [True, True, False]
    assert tier.remove_many([k1, k3]) == [True, False]
    assert tier.contains_many([k1]) == [False]
    s = tier.stats()
    assert s["gets"] >= 1 and s["gets_missing"] >= 1 and s["gets_truncated"] >= 1


def test_mooncake_zero_copy_from_registered_memory(mooncake):
    t = make_tier("mooncake", mooncake=mooncake)
    try:
        arena = np.zeros((8, 4096), np.uint8)
        t.register(arena)
        arena[0:3] = np.arange(3 * 4096, dtype=np.uint32).view(np.uint8)[: 3 * 4096].reshape(3, 4096)
        k = _key("zc")
        assert t.put_many([k], [[arena[0], arena[1], arena[2]]]) == [True]
        assert t.get_many_into([k], [[arena[4], arena[5], arena[6]]]) == [3 * 4096]
        assert (arena[4:7] == arena[0:3]).all()
    finally:
        t.close()


def test_key_removed_between_contains_and_get(tier):
    k = _key("gone")
    v = np.ones(5000, np.uint8)
    assert tier.put_many([k], [[v]]) == [True]
    assert tier.contains_many([k]) == [True]
    other = tier  # the same store seen by another client would do the same
    assert other.remove_many([k]) == [True]
    assert tier.get_many_into([k], [[np.zeros(5000, np.uint8)]]) == [MISSING]


def test_corrupted_value_fails_the_integrity_check(tier):
    k = _key("flip")
    payload = np.random.default_rng(2).integers(0, 256, 64 * 1024, dtype=np.uint8)
    header = integrity.make_header(k, payload.nbytes, integrity.checksum([payload]))
    assert tier.put_many([k], [[np.frombuffer(header, np.uint8), payload]]) == [True]
    corrupt_one_byte(tier, k, len(header) + 777)
    hb = np.zeros(len(header), np.uint8)
    got = np.zeros_like(payload)
    assert tier.get_many_into([k], [[hb, got]]) == [len(header) + payload.nbytes]
    assert integrity.check(hb, k, [got], payload.nbytes) == integrity.BAD_CHECKSUM
    # a flipped header byte inside the key is caught as well
    corrupt_one_byte(tier, k, 40)
    tier.get_many_into([k], [[hb, got]])
    assert integrity.check(hb, k, [got], payload.nbytes) != integrity.OK


def test_timeout_is_bounded_and_the_tier_recovers(request):
    for kind in ("mooncake", "redis"):
        if kind == "mooncake":
            srv = request.getfixturevalue("mooncake")
            t = make_tier(kind, mooncake=srv, timeout_s=1.0)
            proc = srv.master
        else:
            srv = request.getfixturevalue("redis_srv")
            t = make_tier(kind, redis_srv=srv, timeout_s=1.0)
            proc = srv.server
        import signal

        k = _key("slow")
        proc.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            ok = t.put_many([k], [[np.ones(1000, np.uint8)]])
            got = t.get_many_into([k], [[np.zeros(1000, np.uint8)]])
            took = time.monotonic() - t0
        finally:
            proc.signal(signal.SIGCONT)
        assert ok == [False]
        assert got[0] in (TIMED_OUT, MISSING, -3)
        assert took < 5.0, f"{kind}: two calls took {took:.1f} s with timeout_s=1"
        assert t.stats()["timeouts"] >= 1 and t.failed_calls() >= 1
        deadline = time.monotonic() + 20
        while not t.put_many([k], [[np.ones(1000, np.uint8)]])[0]:
            assert time.monotonic() < deadline, f"{kind} did not recover after the pause"
            time.sleep(0.2)
        t.close()


def test_full_store_refuses_puts(mooncake):
    srv = redis_server(maxmemory=4 << 20)
    try:
        r = make_tier("redis", redis_srv=srv)
        v = np.ones(512 * 1024, np.uint8)
        results = [r.put_many([f"full/{i}"], [[v]])[0] for i in range(16)]
        assert results[0] and not all(results)
        assert r.get_many_into(["full/0"], [[np.zeros_like(v)]]) == [v.nbytes]
        r.close()
    finally:
        srv.stop()
    m = make_tier("mooncake", mooncake=mooncake)
    try:
        big = np.ones(80 << 20, np.uint8)  # more than the 64 MB segment
        m.register(big)
        assert m.put_many([_key("too-big")], [[big]]) == [False]
        assert m.put_many([_key("small")], [[big[:4096]]]) == [True]
    finally:
        m.close()


def test_master_killed_mid_batch_and_restarted():
    srv = mooncake_servers(32 << 20)
    try:
        t = make_tier("mooncake", mooncake=srv, timeout_s=2.0)
        v = np.ones(256 * 1024, np.uint8)
        results, errors = [], []

        def writer():
            try:
                for i in range(60):
                    results.append(t.put_many([f"batch/{i}/{j}" for j in range(4)], [[v]] * 4))
                    time.sleep(0.02)
            except Exception as e:  # must not happen: failures are per key
                errors.append(repr(e))

        th = threading.Thread(target=writer)
        th.start()
        time.sleep(0.3)
        srv.master.kill()
        time.sleep(0.3)
        srv.master.start(30)
        th.join(120)
        assert not th.is_alive() and errors == []
        flat = [ok for batch in results for ok in batch]
        assert any(flat) and len(flat) == 240
        deadline = time.monotonic() + 30
        while not t.put_many(["after-restart"], [[v]])[0]:
            assert time.monotonic() < deadline, "no put succeeded after the master restarted"
            time.sleep(0.3)
        assert t.get_many_into(["after-restart"], [[np.zeros_like(v)]]) == [v.nbytes]
        t.close()
    finally:
        srv.stop()


@pytest.fixture(params=["host", "mooncake", "redis"])
def any_tier(request):
    if request.param == "host":
        from statecache.tiers import HostTier

        t = HostTier(64 * 4096, 4096)
    elif request.param == "mooncake":
        t = make_tier("mooncake", mooncake=request.getfixturevalue("mooncake"))
    else:
        t = make_tier("redis", redis_srv=request.getfixturevalue("redis_srv"))
    yield t
    t.close()


def test_batches_answer_per_destination_with_duplicate_keys(any_tier):
    """One key twice in a batch: each destination gets its own answer, and
    a destination reported as read holds the value (issue 18 §3: one
    registered destination and one not, one of the wrong size)."""
    t = any_tier
    rng = np.random.default_rng(7)
    value = rng.integers(0, 256, 3000, dtype=np.uint8)
    k, other = _key("dup"), _key("dup-missing")
    assert t.put_many([k, k], [[value], [value]]) == [True, True]
    registered = np.zeros((2, 4096), np.uint8)
    if hasattr(t, "register"):
        t.register(registered)
    plain = np.zeros(3000, np.uint8)
    wrong = np.zeros(100, np.uint8)
    got = t.get_many_into([k, other, k, k], [[registered[0, :3000]], [plain[:10]], [plain], [wrong]])
    assert got == [3000, MISSING, 3000, TRUNCATED]
    assert (registered[0, :3000] == value).all() and (plain == value).all()
    plain[:] = 0
    got = t.get_many_into([k, k], [[plain], [registered[1, :3000]]])
    assert got == [3000, 3000] and (plain == value).all() and (registered[1, :3000] == value).all()
    assert t.contains_many([k, other, k]) == [True, False, True]
    assert t.remove_many([k, k]) in ([True, False], [True, True])  # the second finds nothing (or the same removal)
    assert t.contains_many([k]) == [False]
