"""Tier interface, host arena, prefix keys and integrity checks (no servers)."""

import threading

import numpy as np
import pytest

import statecache
from statecache import _C
from statecache.tiers import MISSING, TRUNCATED, HostTier, TierKey, integrity

# ------------------------------ prefix keys -------------------------------- #


def test_prefix_keys_chain_and_derive_scheduler_hashes():
    toks = list(range(3, 60))
    hashes, keys = statecache.chain_block_keys(toks, 16)
    assert len(hashes) == 3 and len(keys) == 48
    tail_h, tail_k = statecache.chain_block_keys(toks[16:], 16, keys[:16])
    assert tail_h == hashes[1:] and tail_k == keys[16:]
    for i, h in enumerate(hashes):
        assert statecache.scheduler_hash(keys[16 * i : 16 * i + 16]) == h != -1
    # another deployment seed or salt names every prefix differently
    for kw in ({"seed": 7}, {"salt": b"tenant-a"}, {"salt": "tenant-a"}):
        other_h, other_k = statecache.chain_block_keys(toks, 16, **kw)
        assert all(a != b for a, b in zip(other_h, hashes))
        assert other_k[:16] != keys[:16]
    # one token changed changes its block's key and every later one
    toks2 = list(toks)
    toks2[20] += 1
    _, k2 = statecache.chain_block_keys(toks2, 16)
    assert k2[:16] == keys[:16] and k2[16:32] != keys[16:32] and k2[32:] != keys[32:]


def test_prefix_keys_are_the_same_either_side_of_the_gil_threshold():
    """Token lists of 4096 or more hash with the GIL released, shorter ones
    under it: one chain, whichever way each piece was hashed."""
    toks = [(i * 2654435761) % 50021 for i in range(3 * 4096 + 32)]
    for bs in (16, 4096):
        whole_h, whole_k = statecache.chain_block_keys(toks, bs, None, 3, b"salt")
        whole = statecache.chain_block_hashes(toks, bs)
        assert len(whole) == len(toks) // bs
        for cut in sorted({4095 // bs * bs, 4096, 4097 // bs * bs} - {0}):
            head_h, head_k = statecache.chain_block_keys(toks[:cut], bs, None, 3, b"salt")
            tail_h, tail_k = statecache.chain_block_keys(toks[cut:], bs, head_k[-16:], 3, b"salt")
            assert (head_h + tail_h, head_k + tail_k) == (whole_h, whole_k)
            head = statecache.chain_block_hashes(toks[:cut], bs)
            assert head + statecache.chain_block_hashes(toks[cut:], bs, head[-1]) == whole


def test_prefix_keys_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        statecache.chain_block_keys([1, 2], 0)
    with pytest.raises(ValueError, match="parent_key"):
        statecache.chain_block_keys([1, 2], 1, b"short")
    with pytest.raises(TypeError, match="salt"):
        statecache.chain_block_keys([1, 2], 1, salt=3)
    with pytest.raises(TypeError, match="key"):
        statecache.scheduler_hash("x" * 16)
    assert statecache.chain_block_keys([1, 2, 3], 4) == ([], b"")


def test_tier_key_fields_are_checked_and_encoded():
    k = TierKey("state", "lay", 1, 4, bytes(range(16)))
    assert k.encode() == "statecache/v1/state/lay/tp1-4/" + bytes(range(16)).hex()
    with pytest.raises(ValueError, match="kind"):
        TierKey("x", "lay", 0, 1, bytes(16))
    with pytest.raises(ValueError, match="tp_rank"):
        TierKey("kv", "lay", 4, 4, bytes(16))
    with pytest.raises(ValueError, match="prefix_key"):
        TierKey("kv", "lay", 0, 1, bytes(8))
    assert TierKey("kv", "lay", 0, 2, bytes(16)) != TierKey("kv", "lay", 1, 2, bytes(16))


# ------------------------------- integrity --------------------------------- #


def test_integrity_detects_flip_truncation_and_wrong_key():
    rng = np.random.default_rng(0)
    payload = [rng.integers(0, 256, 5000, dtype=np.uint8), rng.integers(0, 256, 3000, dtype=np.uint8)]
    key = "statecache/v1/state/l/tp0-1/" + "ab" * 16
    header = integrity.make_header(key, 8000, integrity.checksum(payload))
    assert len(header) == integrity.header_nbytes(key) and len(header) % 8 == 0
    assert integrity.check(header, key, payload, 8000) == integrity.OK
    flipped = [p.copy() for p in payload]
    flipped[1][1234] ^= 0x01
    assert integrity.check(header, key, flipped) == integrity.BAD_CHECKSUM
    assert integrity.check(header, key, [payload[0], payload[1][:-1]]) == integrity.WRONG_SIZE
    assert integrity.check(header, key.replace("ab", "cd", 1), payload) == integrity.WRONG_KEY
    bad = bytearray(header)
    bad[0] ^= 0xFF
    assert integrity.check(bytes(bad), key, payload) == integrity.BAD_HEADER
    assert integrity.check(header[:10], key, payload) == integrity.BAD_HEADER


# ------------------------------- host arena -------------------------------- #


def test_host_arena_bad_arguments_raise_before_change():
    with pytest.raises(ValueError, match="entry_bytes"):
        _C.HostArena(0, 100, [100])
    with pytest.raises(ValueError, match="class_budget_bytes"):
        _C.HostArena(10, 100, [60, 60])
    with pytest.raises(ValueError, match="ranking"):
        _C.HostArena(10, 100, [100], "fifo")
    a = _C.HostArena(10, 100, [100])
    with pytest.raises(IndexError, match="klass"):
        a.allocate(b"k", 1, 1, 10, 0)
    with pytest.raises(ValueError, match="nbytes"):
        a.allocate(b"k", 0, 1, 11, 0)
    with pytest.raises(ValueError, match="count"):
        a.allocate(b"k", 0, 0, 0, 0)
    with pytest.raises(ValueError, match="position"):
        a.allocate(b"k", 0, 1, 10, -1)
    with pytest.raises(ValueError, match="weight"):
        a.set_eviction_policy("cost", weight=-1.0)
    assert a.eviction_policy["weight"] == 1.0
    with pytest.raises(ValueError, match="unpin|pinned"):
        a.unpin(b"k")
    assert a.num_free == 10 and len(a) == 0
    a.check_consistency()


def test_host_arena_ranks_by_the_cost_model_and_recency():
    a = _C.HostArena(10, 40, [40], "cost")
    a.set_eviction_policy("cost", weight=2.0)  # value outweighs recency
    for key, position in ((b"dear", 50), (b"cheap", 1)):  # the valuable one is older
        a.allocate(key, 0, 2, 20, position)
        a.seal(key, b"")
    assert a.victims(0, 2) == [b"cheap"]
    entries, evicted = a.allocate(b"new", 0, 2, 20, 5)
    assert evicted == [b"cheap"] and len(entries) == 2
    a.seal(b"new", b"")
    a.set_eviction_policy("lru")  # recency alone: the oldest goes
    assert a.ranking == "lru" and a.victims(0, 2) == [b"dear"]
    lru = _C.HostArena(10, 40, [40], "lru")
    for key in (b"a", b"b"):
        lru.allocate(key, 0, 2, 20, 0)
        lru.seal(key, b"")
    lru.lookup(b"a")
    assert lru.victims(0, 2) == [b"b"]
    a.check_consistency()
    lru.check_consistency()


# -------------------------------- HostTier --------------------------------- #


def test_host_tier_interface_round_trip_and_errors():
    t = HostTier(64 * 1024, 4096)
    a = np.arange(10000, dtype=np.uint8)
    b = np.full(300, 7, dtype=np.uint8)
    assert t.put_many(["k1", "k2"], [[a, b], [b]]) == [True, True]
    assert t.put_many(["k1"], [[b]]) == [True]  # held: keeps its first value
    d1, d2 = np.zeros(10000, np.uint8), np.zeros(300, np.uint8)
    assert t.get_many_into(["k1", "nope"], [[d1, d2], [d2]]) == [10300, MISSING]
    assert (d1 == a).all() and (d2 == b).all()
    assert t.get_many_into(["k2"], [[d1]]) == [TRUNCATED]
    assert t.contains_many(["k1", "k2", "x"]) == [True, True, False]
    assert t.remove_many(["k1", "x"]) == [True, False]
    assert t.contains_many(["k1"]) == [False]
    s = t.stats()
    assert s["gets"] == 1 and s["gets_missing"] == 1 and s["gets_truncated"] == 1
    with pytest.raises(TypeError, match="keys"):
        t.put_many("k", [[a]])
    with pytest.raises(ValueError, match="values"):
        t.put_many(["a", "b"], [[a]])
    with pytest.raises(ValueError, match="state_bytes"):
        HostTier(100, 10, state_bytes=80, kv_bytes=40)
    t.arena.check_consistency()


def test_host_tier_full_refuses_and_evicts_unpinned_only():
    t = HostTier(4 * 1024, 1024)  # 4 entries
    big = np.ones(3000, np.uint8)
    assert t.put_many(["a"], [[big]]) == [True]  # 3 entries
    rows, n, _ = t.read("a")  # pinned by a reader
    assert n == 3000
    assert t.put_many(["b"], [[big]]) == [False]  # only 1 free, "a" pinned
    t.unpin("a")
    assert t.put_many(["b"], [[big]]) == [True]  # "a" evicted now
    assert t.contains_many(["a", "b"]) == [False, True]
    assert t.put_many(["huge"], [[np.ones(5000, np.uint8)]]) == [False]
    assert t.stats()["puts_failed"] == 2
    t.arena.check_consistency()


def test_host_tier_is_thread_safe():
    t = HostTier(256 * 1024, 1024)
    errors = []

    def worker(w):
        try:
            for i in range(200):
                key = f"w{w}-{i % 20}"
                val = np.full(1500, (w * 31 + i) % 251, np.uint8)
                t.put_many([key], [[val]])
                out = np.zeros(1500, np.uint8)
                r = t.get_many_into([key], [[out]])[0]
                if r >= 0 and len(set(out.tolist())) != 1:
                    errors.append("torn value")
                if i % 7 == 0:
                    t.remove_many([key])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    t.arena.check_consistency()


def test_lazy_backends_name_their_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name in ("mooncake.store", "redis"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    from statecache.tiers import mooncake_tier, redis_tier

    with pytest.raises(ImportError, match=r"statecache\[mooncake\]"):
        mooncake_tier._import_store()
    with pytest.raises(ImportError, match=r"statecache\[redis\]"):
        redis_tier._import_redis()


def test_unit_mover_round_trips_whole_units():
    torch = pytest.importorskip("torch")
    from statecache.engine.tiering import UnitMover, _consecutive
    from statecache.layout import PageLayout

    k = torch.arange(2 * 10 * 3 * 8, dtype=torch.float32).reshape(2, 10, 3, 8)
    v = torch.arange(10 * 5, dtype=torch.int16).reshape(10, 5) * 3
    lay = PageLayout([k, v], unit_dim=[1, 0])
    m = UnitMover(lay)
    assert m.unit_bytes == 2 * 3 * 8 * 4 + 5 * 2
    host = HostTier(16 * m.unit_bytes, m.unit_bytes)
    rows = host.reserve("x", 3 * m.unit_bytes)
    assert _consecutive(rows, m.unit_bytes) is not None  # fast path
    scattered = [host.rows[9], host.rows[4], host.rows[12]]
    assert _consecutive(scattered, m.unit_bytes) is None  # row by row
    for dst in (rows, scattered):
        m.to_rows([7, 2, 5], dst)
        k2, v2 = k.clone(), v.clone()
        k[:, [1, 3, 6]] = -1
        v[[1, 3, 6]] = -1
        m.from_rows(dst, [1, 3, 6])
        assert torch.equal(k[:, [1, 3, 6]], k2[:, [7, 2, 5]])
        assert torch.equal(v[[1, 3, 6]], v2[[7, 2, 5]])


def test_engine_config_checks_the_deployment_key():
    from statecache.engine import EngineConfig

    assert EngineConfig(hash_seed=5, hash_salt=b"fleet-a").hash_seed == 5
    with pytest.raises(ValueError, match="hash_seed"):
        EngineConfig(hash_seed="5")
    with pytest.raises(ValueError, match="hash_salt"):
        EngineConfig(hash_salt=7)


def test_a_raising_backend_client_is_counted_and_logged(caplog):
    pytest.importorskip("redis")
    import socket

    from statecache.tiers.redis_tier import RedisTier

    with socket.socket() as s:  # a loopback port nothing listens on: every call's connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tier = RedisTier(port=port, timeout_s=1.0)
    assert tier.failed_calls() == 0
    with caplog.at_level("WARNING", logger="statecache"):
        assert tier.put_many(["k"], [[b"v"]]) == [False]
        assert tier.failed_calls() >= 1
        before = tier.failed_calls()
        assert tier.contains_many(["k"]) == [False]  # a miss in form: failed_calls tells it failed
        assert tier.failed_calls() > before
    st = tier.stats()
    assert st["errors"] >= 2 and st["puts_failed"] == 1
    assert tier.failed_calls() == st["errors"] + st["timeouts"]
    assert "ConnectionError" in tier.last_error
    assert any("redis put_many failed" in r.getMessage() for r in caplog.records)
    tier.close()
