"""The connector's scheduler and worker sides on vLLM's own config objects
and CPU tensors laid out as vLLM lays them, without an engine: every byte of
a save and a load, tensor parallelism (one scheduler, several workers), keys,
integrity, the shared tier on a real Mooncake Store."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from statecache.vllm.config import ConnectorConfig, parse_bytes
from statecache.vllm.metadata import arena_key
from vllm_fakes import BS, FakeBlocks, FakeRequest, Rig, block_hashes, colliding_block_hashes, scheduler_output

MAMBA_REAL = 3 * 32 * 2 + 2 * 16 * 16 * 4  # conv bf16 + ssm fp32 of one GDN layer
STATE_GROUPS = (0, 1, 2)


def prefill_a(rig: Rig, tokens: list[int], hashes=None) -> FakeRequest:
    """Request A computes its prompt in two chunks (0 -> 3 blocks -> 5
    blocks), states at both chunk ends, as vLLM's align mode does
    (``hashes``: its block hashes from its tokens, if not sha256's)."""
    a = FakeRequest("A", tokens, len(tokens))
    if hashes is not None:
        a.block_hashes = hashes(tokens)
    assert rig.sched.match(a, 0) == 0
    fa = list(range(1, 7))
    ids = tuple([0, 0, 10 + g] for g in STATE_GROUPS) + (fa,)
    rig.sched.after_alloc(a, FakeBlocks(ids), 0)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(new=[("A", 0, 3 * BS)]))
    ids = tuple([0, 0, 10 + g, 0, 20 + g] for g in STATE_GROUPS) + (fa,)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(cached=[("A", 3 * BS, 2 * BS)]))
    return a


def load_b(rig: Rig, tokens: list[int], expect_tokens: int):
    b = FakeRequest("B", tokens, len(tokens))
    n = rig.sched.match(b, 0)
    assert n == expect_tokens
    k = n // BS
    ids = tuple([0] * (k - 1) + [40 + g] for g in STATE_GROUPS) + (list(range(31, 31 + k + 1)),)
    rig.sched.after_alloc(b, FakeBlocks(ids), n)
    return b, until_received(rig)


def until_received(rig: Rig, timeout_s: float = 10.0):
    """Steps (as vLLM keeps stepping) until a load finished; returns that step's output."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = rig.step(scheduler_output())
        if out.finished_recving or time.monotonic() > deadline:
            return out
        time.sleep(0.01)


def tokens(n: int, seed: int = 1) -> list[int]:
    import random

    r = random.Random(seed)
    return [r.randrange(1000) for _ in range(n)]


def test_a_load_restores_every_byte_of_kv_and_state_and_nothing_else():
    """(The same moves on CUDA tensors: tests/python/copy/test_vllm_moves.py.)"""
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    assert rig.sched.funnel()["host_values"] == 5 + 2  # KV blocks 0-4, states at 3 and 5 blocks
    before = [rig.block(0, 40 + g) for g in STATE_GROUPS]
    _b, out = load_b(rig, t + tokens(20, 2), 5 * BS)
    assert out.finished_recving == {"B"} and not out.failed_recving
    for i in range(5):  # KV block i of A (block i + 1) landed in B's block 31 + i
        assert rig.block(0, 31 + i) == rig.block(0, 1 + i)
    for g in STATE_GROUPS:
        got = rig.block(0, 40 + g)
        assert got[:MAMBA_REAL] == rig.block(0, 20 + g)[:MAMBA_REAL]
        assert got[MAMBA_REAL:] == before[g][MAMBA_REAL:]  # the page's padding is never written
    f = rig.sched.funnel()
    assert f["tokens_resumed_host"] == 5 * BS and f["loads_failed"] == 0


def test_never_a_state_without_its_kv_prefix():
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    # KV block 3 gone: the state at 5 blocks is unreachable, the one at 3 stays
    assert rig.sched.arena.remove(arena_key("kv", rig.sched._reqs["A"].keys[3]))
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert rig.sched.match(b, 0) == 3 * BS
    # and with no state at all past the local hit there is nothing to resume
    for k in (3, 5):
        rig.sched.arena.remove(arena_key("state", rig.sched._reqs["A"].keys[k - 1]))
    assert rig.sched.match(b, 0) == 0
    assert rig.sched.match(b, 2 * BS) == 0


def test_match_starts_past_the_local_hit_and_keeps_one_token_to_compute():
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert rig.sched.match(b, 3 * BS) == 2 * BS
    assert rig.sched.match(b, 5 * BS) == 0
    exact = FakeRequest("C", t[: 5 * BS], 5 * BS)  # a hit may not cover the last token
    assert rig.sched.match(exact, 0) == 3 * BS


def test_tensor_parallel_a_value_counts_only_when_every_rank_holds_its_shard():
    rig = Rig(tp=2)
    t = tokens(5 * BS + 3)
    a = FakeRequest("A", t, len(t))
    rig.sched.match(a, 0)
    fa = list(range(1, 7))
    ids = tuple([0, 0, 10 + g] for g in STATE_GROUPS) + (fa,)
    rig.sched.after_alloc(a, FakeBlocks(ids), 0)
    rig.kvm.ids["A"] = ids
    meta = rig.sched.build_meta(scheduler_output(new=[("A", 0, 3 * BS)]))
    rig.workers[0].save(meta)
    rig.workers[1].save(meta)
    r0 = rig.workers[0].take_report()
    rig.sched.update(type("O", (), {"kv_connector_worker_meta": r0})())
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert rig.sched.match(b, 0) == 0  # rank 1 has not reported: nothing is findable
    r1 = rig.workers[1].take_report()
    rig.sched.update(type("O", (), {"kv_connector_worker_meta": r1})())
    assert rig.sched.match(b, 0) == 3 * BS
    # each rank restores its own shard
    rig.sched.after_alloc(b, FakeBlocks(tuple([0, 0, 40 + g] for g in STATE_GROUPS) + ([31, 32, 33, 34],)), 3 * BS)
    out = rig.step(scheduler_output())
    assert out.finished_recving == {"B"} and not out.failed_recving
    for rank in (0, 1):
        for i in range(3):
            assert rig.block(rank, 31 + i) == rig.block(rank, 1 + i)
        assert rig.block(rank, 40)[:MAMBA_REAL] == rig.block(rank, 10)[:MAMBA_REAL]
    assert rig.block(0, 31) != rig.block(1, 31)  # the shards differ


def test_tensor_parallel_one_rank_failing_its_check_fails_the_load_everywhere():
    rig = Rig(tp=2)
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    s = rig.sched
    key = arena_key("state", s._reqs["A"].keys[4])
    entries = s.arena.lookup(key, False)[0]
    rig.workers[1].rows[entries[0], 11] ^= 0x01  # one bit, on rank 1 only
    _b, out = load_b(rig, t + tokens(20, 2), 5 * BS)
    assert out.failed_recving == {"B"} and out.finished_recving == {"B"}
    f = s.funnel()
    assert f["loads_untrusted"] == 1 and f["loads_failed"] == 1
    assert f["tokens_resumed_host"] == 0
    assert not s.arena.contains(key)  # dropped: the retry resumes less, from trusted values
    b2 = FakeRequest("B2", t + tokens(20, 2), len(t) + 20)
    assert s.match(b2, 0) == 3 * BS


def test_names_chain_the_tokens_where_vllms_block_hashes_can_be_collided():
    """vLLM's sha256 block hashes name a prefix alone; under any other hasher
    (xxhash is fast and not collision resistant, so whoever picks a prompt
    can collide it) the names chain each block's tokens too, and a prompt
    whose block hashes collide with a saved one's is offered nothing."""
    t, u = tokens(6 * BS, seed=1), tokens(6 * BS, seed=2)
    a, b = FakeRequest("A", t, len(t)), FakeRequest("B", u, len(u))
    a.block_hashes = b.block_hashes = colliding_block_hashes(t)
    names = {}
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", None):
        rig = Rig(hash_algo=algo)
        s = rig.sched
        ka, kb = s._keys(s._req(a), 3), s._keys(s._req(b), 3)
        assert s.fold_tokens == (algo not in ("sha256", "sha256_cbor"))  # an unknown hasher is not trusted
        assert (ka == kb) == (not s.fold_tokens)
        names[algo] = ka
    assert names["xxhash"] == names["xxhash_cbor"] == names[None]  # the tokens and vLLM's hash, whichever hasher
    assert names["xxhash"] != names["sha256"]
    # vLLM folds cache_salt into the first block's hash; a tenant picks it
    # freely, so under a weak hasher the names take it too (the salted root)
    for algo, folded in (("xxhash", True), ("sha256", False)):
        s = Rig(hash_algo=algo).sched
        salted = [FakeRequest(f"S{i}", t, len(t)) for i in range(3)]
        for x in salted:
            x.block_hashes = colliding_block_hashes(t)  # as request "A" above
        salted[0].cache_salt, salted[1].cache_salt = "tenant a", "tenant b"
        ka, kb, kn = (s._keys(s._req(x), 3) for x in salted)
        assert (ka != kb and ka != kn) == folded and (ka == kb == kn) == (not folded)
        if folded:
            assert kn == names["xxhash"]  # no salt: the chain from no parent, as before
    # a saved prompt, then another whose hashes collide with it: offered nothing
    rig = Rig(hash_algo="xxhash")
    s = rig.sched
    prefill_a(rig, t, hashes=colliding_block_hashes)
    again = FakeRequest("A2", t[: 5 * BS] + [7], 5 * BS + 1)
    again.block_hashes = colliding_block_hashes(again.tokens)
    assert s.match(again, 0) == 5 * BS  # its own prompt: resumed
    other = FakeRequest("B2", u[: 5 * BS] + [7], 5 * BS + 1)
    other.block_hashes = colliding_block_hashes(other.tokens)
    assert s.match(other, 0) == 0


def test_keys_are_keyed_by_the_secret_and_the_model():
    t = tokens(4 * BS)
    req = FakeRequest("X", t, len(t))
    a = Rig(extra={"secret": "s" * 16})
    b = Rig(extra={"secret": "s" * 16}, seed=3)
    c = Rig(extra={"secret": "t" * 16})
    d = Rig(extra={"secret": "s" * 16}, identity="another model")
    ka, kb, kc, kd = (r.sched._keys(r.sched._req(req), 3) for r in (a, b, c, d))
    assert ka == kb and len(ka) == 3 and all(len(k) == 16 for k in ka)
    assert ka != kc and ka != kd
    assert a.sched.tier_keys("state", ka[0]) == b.sched.tier_keys("state", ka[0])
    assert a.sched.layout_ids != d.sched.layout_ids
    # no secret: the process's random key (the engine's, engine/deployment_key.py),
    # so engines in two processes never share names
    unset = ConnectorConfig.from_extra({})
    assert not unset.secret_configured and unset.secret == ConnectorConfig.from_extra({}).secret
    assert Rig().sched._keys(Rig().sched._req(req), 3) != ka
    code = "from statecache.vllm.config import ConnectorConfig; print(ConnectorConfig.from_extra({}).secret.hex())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(other.stdout.strip()) == 64 and other.stdout.strip() != unset.secret.hex()


def test_config_is_checked_before_anything_starts():
    assert parse_bytes("4GB", "x") == 4 * 10**9 and parse_bytes("512 MiB", "x") == 512 << 20
    assert parse_bytes(123, "x") == 123
    for bad, err in (("4 parsecs", ValueError), (True, TypeError), (-1, ValueError), ([1], TypeError)):
        with pytest.raises(err, match="host_memory"):
            ConnectorConfig.from_extra({"host_memory": bad})
    with pytest.raises(ValueError, match="unknown keys"):
        ConnectorConfig.from_extra({"host_memroy": "1GB"})
    with pytest.raises(ValueError, match="secret"):
        ConnectorConfig.from_extra({"mooncake": {"master_addr": "127.0.0.1:1", "metadata_server": "P2PHANDSHAKE"}})
    with pytest.raises(ValueError, match="at least 16"):
        ConnectorConfig.from_extra({"secret": "short"})
    with pytest.raises(ValueError, match="UTF-8"):  # os.environ gives undecodable bytes as lone surrogates
        ConnectorConfig.from_extra({"secret": "a secret, then \udcff"})
    with pytest.raises(ValueError, match="one shared tier"):
        ConnectorConfig.from_extra(
            {"secret": "x" * 16, "redis": {}, "mooncake": {"master_addr": "a", "metadata_server": "b"}}
        )


def prefill_in_one_step(rig: Rig, t: list[int], hashed: bool = True) -> tuple[FakeRequest, tuple[list[int], ...]]:
    """Request A computes its prompt (under 3 blocks) in one step: KV in
    blocks 1-3, each state group's running state in its block at index 2.
    ``hashed=False``: vLLM hashes none of its blocks (prefix caching off)."""
    a = FakeRequest("A", t, len(t))
    if not hashed:
        a.block_hashes = []
    rig.sched.match(a, 0)
    ids = tuple([0, 0, 10 + g] for g in STATE_GROUPS) + ([1, 2, 3],)
    rig.sched.after_alloc(a, FakeBlocks(ids), 0)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(new=[("A", 0, len(t))]))
    return a, ids


def append_token(a: FakeRequest, token: int = 7, hashed: bool = True) -> None:
    """vLLM appends a sampled token and hashes the blocks it fills."""
    a.tokens.append(token)
    a.block_hashes = block_hashes(a.tokens) if hashed else []


def test_decode_boundaries_are_saved_unless_turned_off():
    for save_decode in (True, False):
        rig = Rig(extra={"save_decode": save_decode})
        t = tokens(2 * BS + 10)
        a, _ids = prefill_in_one_step(rig, t)
        # decode: six tokens reach the boundary at 3 blocks
        for pos in range(len(t), 3 * BS):
            append_token(a)
            rig.step(scheduler_output(cached=[("A", pos, 1)]))
        f = rig.sched.funnel()
        assert f["state_saves_decode"] == (1 if save_decode else 0)
        b = FakeRequest("B", a.tokens + tokens(9, 5), len(a.tokens) + 9)
        assert rig.sched.match(b, 0) == (3 * BS if save_decode else 0)


def test_decode_steps_that_complete_no_value_skip_the_per_request_pass_and_no_boundary_is_missed():
    """build_meta plans every request only where a step may complete a value:
    while the same requests decode a token each and none reaches a boundary,
    it counts down instead. On random schedules (requests arriving
    mid-prefill, skipped for a step, preempted, finishing), every step that
    ends a block of some request is still planned for it, as the plain
    per-request pass plans it."""
    import random

    rnd = random.Random(5)
    rig = Rig()
    planned: list[tuple[str, int, int, bool]] = []
    rig.sched._plan_saves = lambda req_id, start, end, admitted: planned.append((req_id, start, end, admitted))
    computed: dict[str, int] = {}
    skipped = 0
    steps = 3000
    for step in range(steps):
        new, cached = [], []
        if len(computed) < 6 and rnd.random() < 0.05:
            rid = f"r{step}"
            c = rnd.choice([0, rnd.randrange(4 * BS)])
            n = rnd.randrange(1, 2 * BS)
            new.append((rid, c, n))
            computed[rid] = c + n
        for rid, c in list(computed.items()):
            if new and rid == new[0][0]:
                continue
            r = rnd.random()
            if r < 0.01:
                del computed[rid]  # finished
            elif r < 0.03:
                continue  # not scheduled this step
            else:
                n = 1 if rnd.random() < 0.97 else rnd.randrange(2, BS)  # decode, or a chunk
                cached.append((rid, c, n))
                computed[rid] = c + n
        so = scheduler_output(new=new, cached=cached)
        if cached and rnd.random() < 0.01:
            so.scheduled_cached_reqs.resumed_req_ids = {cached[0][0]}  # preempted and admitted again
        planned.clear()
        before = rig.sched._quiet_steps
        rig.sched.build_meta(so)
        want = [(rid, c, c + n, True) for rid, c, n in new]
        want += [(rid, c, c + n, False) for rid, c, n in cached if (c + n) // BS != c // BS]
        assert planned == want, (step, so)
        skipped += before > 0 and rig.sched._quiet_steps == before - 1
    assert skipped > steps // 2  # most steps are quiet decode steps, and they were skipped


def test_under_async_scheduling_a_decode_boundary_is_saved_once_vllm_names_it():
    """vLLM's async scheduling appends the token a step computes only after
    it has scheduled the next step, so the step that fills block 3 runs
    before vLLM has hashed it: its KV block and the state at 3 blocks are
    saved a step later, from the same blocks; from blocks that changed
    meanwhile, nothing is saved (counted)."""
    for kept in (True, False):
        rig = Rig()
        t = tokens(2 * BS + 10)
        a, _ids = prefill_in_one_step(rig, t)
        for pos in range(len(t), 3 * BS):
            rig.step(scheduler_output(cached=[("A", pos, 1)]))  # vLLM's hashes lack this step's token
            append_token(a)
        f = rig.sched.funnel()
        assert f["state_saves_decode"] == 1 and f["saves_deferred"] == 0
        if not kept:  # the state's block changed before it was named (vLLM never does this while it runs)
            rig.kvm.ids["A"] = tuple([0, 0, 50 + g] for g in STATE_GROUPS) + ([1, 2, 3, 4],)
        rig.step(scheduler_output(cached=[("A", 3 * BS, 1)]))
        f = rig.sched.funnel()
        state = arena_key("state", rig.sched._reqs["A"].keys[2])
        kv = arena_key("kv", rig.sched._reqs["A"].keys[2])
        assert rig.sched.arena.contains(kv)  # KV block 2 sits in block 3 either way
        assert rig.sched.arena.contains(state) == kept
        assert f["saves_deferred"] == (2 if kept else 1)
        assert f["saves_skipped_unnamed"] == (0 if kept else 1)
        b = FakeRequest("B", a.tokens + tokens(9, 5), len(a.tokens) + 9)
        assert rig.sched.match(b, 0) == (3 * BS if kept else 0)


def test_values_vllm_never_hashes_are_dropped_at_once():
    """With vLLM's prefix caching off it hashes no block: nothing can be
    named, nothing waits for a name (no per-step cost), every value counted."""
    rig = Rig()
    a, _ids = prefill_in_one_step(rig, tokens(2 * BS + 10), hashed=False)
    for pos in range(len(a.tokens), 3 * BS):
        append_token(a, hashed=False)
        rig.step(scheduler_output(cached=[("A", pos, 1)]))
    f = rig.sched.funnel()
    assert f["saves_skipped_unnamed"] == 4  # KV blocks 0-2 and the state at 3 blocks
    assert f["saves_deferred"] == 0 and f["values_saved"] == 0
    assert not rig.sched._late and not rig.sched._reqs["A"].late


def test_under_async_scheduling_a_request_finished_before_its_boundary_was_named_saves_it():
    """The request ends in the step after the one that filled block 3: at
    its end vLLM has appended every token, so the values are named then and
    saved before vLLM frees its blocks."""
    rig = Rig()
    t = tokens(3 * BS - 1)
    a, ids = prefill_in_one_step(rig, t)
    rig.step(scheduler_output(cached=[("A", len(t), 1)]))  # fills block 3; its token is not appended yet
    append_token(a)
    a.num_computed_tokens = 3 * BS
    assert rig.sched.finished(a, ids) is True  # vLLM keeps the blocks for the save
    rig.step(scheduler_output())
    f = rig.sched.funnel()
    assert f["saves_deferred"] == 2 and f["saves_skipped_unnamed"] == 0
    b = FakeRequest("B", a.tokens + tokens(9, 5), len(a.tokens) + 9)
    assert rig.sched.match(b, 0) == 3 * BS


@pytest.fixture(scope="module")
def mooncake():
    from statecache.tiers.servers import MooncakeServers

    with MooncakeServers(segment_bytes=64 << 20) as s:
        yield s


def shared_extra(s) -> dict:
    return {
        "secret": "a deployment secret",
        "mooncake": {"master_addr": s.master_addr, "metadata_server": s.metadata_url},
    }


def settle(rig: Rig, timeout_s: float = 10.0) -> None:
    """Until every shared write of the rig is done."""
    deadline = time.monotonic() + timeout_s
    while rig.sched._shared_pending and time.monotonic() < deadline:
        time.sleep(0.02)
        rig.step(scheduler_output())
    assert not rig.sched._shared_pending


def resume_a_prompt_from_the_shared_tier(extra: dict, kv_role: str = "kv_both") -> dict:
    """Request A's prompt prefilled on one engine, written through to the
    shared tier `extra` configures; a fresh engine (other tensors, empty host
    tier, ``kv_role``) resumes its 5 blocks and state byte for byte. Returns
    the fresh engine's funnel."""
    t = tokens(5 * BS + 3, seed=11)
    first = Rig(extra=extra, seed=1)
    prefill_a(first, t)
    settle(first)
    assert first.sched.funnel()["shared_writes"] == 7
    fresh = Rig(extra=extra, seed=2, kv_role=kv_role)
    _b, out = load_b(fresh, t + tokens(20, 2), 5 * BS)
    assert out.finished_recving == {"B"} and not out.failed_recving
    for i in range(5):
        assert fresh.block(0, 31 + i) == first.block(0, 1 + i)
    for g in STATE_GROUPS:
        assert fresh.block(0, 40 + g)[:MAMBA_REAL] == first.block(0, 20 + g)[:MAMBA_REAL]
    return fresh.sched.funnel()


def resume_a_short_turn(src: Rig, dst: Rig, a: FakeRequest, t: list[int], req_id: str) -> dict:
    """The next turn of ``finish_a_short_turn``'s request ``a`` (prompt ``t``)
    on ``dst``: resumed to where ``a`` ended, the partial block and the state
    byte for byte as ``src`` computed them. Returns ``dst``'s funnel."""
    nxt = FakeRequest(req_id, a.tokens + tokens(20, 3), len(a.tokens) + 20)
    assert dst.sched.match(nxt, 0) == len(t)
    ids = tuple([40 + g] for g in STATE_GROUPS) + ([31],)
    dst.sched.after_alloc(nxt, FakeBlocks(ids), len(t))
    out = until_received(dst)
    assert out.finished_recving == {req_id} and not out.failed_recving
    assert dst.block(0, 31) == src.block(0, 1)  # the partial block
    for g in STATE_GROUPS:
        assert dst.block(0, 40 + g)[:MAMBA_REAL] == src.block(0, 10 + g)[:MAMBA_REAL]
    return dst.sched.funnel()


def test_a_fresh_engine_resumes_from_the_shared_tier(mooncake):
    f = resume_a_prompt_from_the_shared_tier(shared_extra(mooncake))
    assert f["tokens_resumed_shared"] == 5 * BS and f["values_fetched"] == 6
    assert f["host_values"] == 6  # what was fetched now sits in the host tier too


def test_a_kv_consumer_resumes_what_others_saved_and_saves_nothing(mooncake):
    """kv_role='kv_consumer' is a read-only engine, as vLLM's store
    connectors take that role: it resumes what a kv_both engine wrote to the
    shared tier, byte for byte, and what it computes itself (boundaries, the
    state it ends with) reaches neither its host tier nor the shared tier.
    Without a shared tier it could read nothing: refused at start."""
    extra = {**shared_extra(mooncake), "secret": "this test's own deployment"}  # the store outlives a test
    f = resume_a_prompt_from_the_shared_tier(extra, kv_role="kv_consumer")
    assert f["tokens_resumed_shared"] == 5 * BS and f["host_values"] == 6  # fetched: its host caches the shared tier
    reader = Rig(extra=extra, seed=4, kv_role="kv_consumer")
    t = tokens(2 * BS + 10, seed=23)
    a, _ids = prefill_in_one_step(reader, t)
    ids = reader.kvm.ids["A"] = tuple([0, 0, 10 + g, 30 + g] for g in STATE_GROUPS) + ([1, 2, 3, 4],)
    for pos in range(len(t), 3 * BS + 5):  # decode past a boundary, then finish off one
        append_token(a)
        reader.step(scheduler_output(cached=[("A", pos, 1)]))
    a.num_computed_tokens = 3 * BS + 5
    assert reader.sched.finished(a, ids) is False  # no tail to save: vLLM frees its blocks at once
    settle(reader)
    g = reader.sched.funnel()
    assert g["values_saved"] == 0 and g["tail_saves"] == 0 and g["shared_writes"] == 0 and g["host_values"] == 0
    nxt = FakeRequest("C", a.tokens + tokens(20, 3), len(a.tokens) + 20)
    assert Rig(extra=extra, seed=5).sched.match(nxt, 0) == 0  # a kv_both engine finds nothing of it
    with pytest.raises(ValueError, match="kv_consumer"):
        Rig(kv_role="kv_consumer")
    with pytest.raises(ValueError, match="kv_role"):
        Rig(extra=extra, kv_role="kv_reader")


def resume_off_a_boundary(src: Rig, dst: Rig, a: FakeRequest, req_id: str, seed: int, kv: int, state: int) -> None:
    """The next turn of ``finish_a_off_a_boundary``'s request ``a`` on
    ``dst`` (KV into blocks ``kv ..``, states into ``state + g``): resumed to
    where ``a`` ended, 5 blocks and the partial one, byte for byte as
    ``src`` computed them."""
    nxt = FakeRequest(req_id, a.tokens + tokens(30, seed), len(a.tokens) + 30)
    assert dst.sched.match(nxt, 0) == 5 * BS + 3
    ids = tuple([0] * 5 + [state + g] for g in STATE_GROUPS) + (list(range(kv, kv + 7)),)
    dst.sched.after_alloc(nxt, FakeBlocks(ids), 5 * BS + 3)
    out = until_received(dst)
    assert out.finished_recving == {req_id} and not out.failed_recving
    for i in range(5):
        assert dst.block(0, kv + i) == src.block(0, 1 + i)
    assert dst.block(0, kv + 5) == src.block(0, 6)  # the partial block
    for g in STATE_GROUPS:
        assert dst.block(0, state + g)[:MAMBA_REAL] == src.block(0, 20 + g)[:MAMBA_REAL]


def test_a_fresh_engine_resumes_a_finished_turn_from_a_tail_in_the_shared_tier(mooncake):
    """The next turn lands on another engine: it cannot know the tail's
    length, so it looks up every length at the boundary its KV reaches, and
    resumes to where the turn ended, the partial block and state from the
    shared tier, byte for byte."""
    first = Rig(extra=shared_extra(mooncake), seed=1)
    t, a = finish_a_off_a_boundary(first)
    settle(first)
    fresh = Rig(extra=shared_extra(mooncake), seed=2)  # other tensors, empty host tier
    resume_off_a_boundary(first, fresh, a, "B", seed=3, kv=31, state=40)
    f = fresh.sched.funnel()
    assert f["tokens_resumed_shared"] == 5 * BS + 3 and f["tokens_resumed_tail"] == 3
    # what was fetched is in this host now, the tail findable there too: the same turn again resumes
    # from the host, byte for byte, counted so
    resume_off_a_boundary(first, fresh, a, "D", seed=5, kv=41, state=50)
    g = fresh.sched.funnel()
    assert g["tokens_resumed_shared"] == f["tokens_resumed_shared"]
    assert g["tokens_resumed_host"] - f["tokens_resumed_host"] == 5 * BS + 3 and g["tokens_resumed_tail"] == 6
    # the same boundary continued otherwise finds no tail
    other = FakeRequest("C", t[: 5 * BS] + [1, 2, 3, 4] + tokens(30, 4), 5 * BS + 34)
    assert Rig(extra=shared_extra(mooncake), seed=3).sched.match(other, 0) == 5 * BS


def test_a_fresh_engine_resumes_a_conversation_shorter_than_a_block_from_the_shared_tier(mooncake):
    """The tail from boundary 0 is written to the shared tier like any value:
    the next turn, on another engine, finds it by looking up every length
    from the deployment's root key, and resumes the partial block and state
    byte for byte; a conversation that differs in one token finds nothing."""
    first = Rig(extra=shared_extra(mooncake), seed=1)
    t, a = finish_a_short_turn(first)
    settle(first)
    fresh = Rig(extra=shared_extra(mooncake), seed=2)  # other tensors, empty host tier
    f = resume_a_short_turn(first, fresh, a, t, "B")
    assert f["tokens_resumed_shared"] == len(t) and f["tokens_resumed_tail"] == len(t)
    other = FakeRequest("C", t[:5] + [t[5] + 1] + t[6:] + tokens(20, 4), len(t) + 20)
    assert Rig(extra=shared_extra(mooncake), seed=3).sched.match(other, 0) == 0


@pytest.fixture(scope="module")
def redis_port():
    from tier_support import redis_server

    server = redis_server()
    try:
        yield server.port
    finally:
        server.stop()


def test_redis_as_the_shared_tier_resumes_blocks_states_and_tails_in_a_fresh_engine(redis_port):
    """The same as with Mooncake Store, with Redis configured instead: a
    fresh engine resumes a prompt's blocks and state, and a short
    conversation's tail, byte for byte from a real redis-server."""
    extra = {"secret": "a deployment secret", "redis": {"host": "127.0.0.1", "port": redis_port}}
    assert resume_a_prompt_from_the_shared_tier(extra)["tokens_resumed_shared"] == 5 * BS
    short = Rig(extra=extra, seed=3)
    ts, a = finish_a_short_turn(short)
    settle(short)
    assert resume_a_short_turn(short, Rig(extra=extra, seed=4), a, ts, "C")["tokens_resumed_tail"] == len(ts)


def test_every_prometheus_series_reads_a_counter_the_scheduler_keeps():
    from statecache.vllm.scheduler import COUNTERS
    from statecache.vllm.stats import PROM_COUNTERS

    read = {c for _doc, _label, series in PROM_COUNTERS.values() for c in series.values()}
    assert read <= set(COUNTERS), read - set(COUNTERS)
    assert {"shared_lookups", "shared_lookup_failures", "loads_untrusted"} <= read


def test_a_shared_tier_that_is_down_is_one_counted_failure_then_skipped():
    """The tiers answer a failed lookup with misses (their per-key form), so
    the connector tells a failure from a miss by the tier's failed calls: a
    Redis nothing listens on is counted as a lookup failure, logged, and
    skipped for 5 s (a server that is down costs one timeout, not one per
    admission); the request is matched on what the host holds."""
    import socket

    with socket.socket() as sock:  # a loopback port nothing listens on: every connect is refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rig = Rig(extra={"secret": "a deployment secret", "redis": {"host": "127.0.0.1", "port": port}}, seed=1)
    t = tokens(5 * BS + 40)
    assert rig.sched.match(FakeRequest("A", t, len(t)), 0) == 0
    f = rig.sched.funnel()
    assert f["shared_lookups"] == 1 and f["shared_lookup_failures"] == 1
    assert rig.sched.shared.failed_calls() == 1
    u = tokens(3 * BS + 7, seed=2)
    assert rig.sched.match(FakeRequest("B", u, len(u)), 0) == 0
    g = rig.sched.funnel()
    assert g["shared_lookups"] == 1 and rig.sched.shared.failed_calls() == 1  # not asked again


def test_an_untrusted_shared_value_is_never_adopted_and_is_removed(mooncake):
    import numpy as np

    from statecache.tiers.mooncake_tier import MooncakeTier

    t = tokens(5 * BS + 3, seed=12)
    first = Rig(extra=shared_extra(mooncake), seed=1)
    prefill_a(first, t)
    settle(first)
    key = first.sched.tier_keys("state", first.sched._reqs["A"].keys[4])[0]
    client = MooncakeTier(mooncake.master_addr, mooncake.metadata_url)
    try:
        size = 8192 + 3 * 4096
        buf = np.zeros(size, dtype=np.uint8)
        n = client.get_many_into([key], [[buf]])[0]
        assert n < 0  # the stored size differs from the buffer: learn it from a second read
        from statecache.tiers import integrity

        whole = integrity.header_nbytes(key) + 3 * MAMBA_REAL
        buf = np.zeros(whole, dtype=np.uint8)
        assert client.get_many_into([key], [[buf]])[0] == whole
        buf[-5] ^= 0x10  # one flipped bit in the stored state
        assert client.remove_many([key]) == [True]
        assert client.put_many([key], [[buf]]) == [True]
        fresh = Rig(extra=shared_extra(mooncake), seed=2)
        b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
        n = fresh.sched.match(b, 0)
        assert n == 5 * BS  # it exists; only its bytes are wrong
        fresh.sched.after_alloc(
            b, FakeBlocks(tuple([0] * 4 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 37)),)), n
        )
        out = until_received(fresh)
        assert out.failed_recving == {"B"}
        f = fresh.sched.funnel()
        assert f["loads_untrusted"] == 1 and f["tokens_resumed_shared"] == 0
        deadline = time.monotonic() + 5
        while client.contains_many([key])[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.contains_many([key]) == [False]  # removed where it was found
        assert fresh.sched.match(FakeRequest("B3", b.tokens, len(b.tokens)), 0) == 3 * BS
    finally:
        client.close()


def test_a_value_evicted_between_match_and_allocation_fails_the_load_and_leaks_nothing():
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    s = rig.sched
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert s.match(b, 0) == 5 * BS
    assert s.arena.remove(arena_key("kv", s._reqs["A"].keys[2]))  # gone before vLLM allocated
    ids = tuple([0] * 4 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 37)),)
    s.after_alloc(b, FakeBlocks(ids), 5 * BS)
    out = until_received(rig)
    assert out.failed_recving == {"B"}
    assert s.funnel()["loads_failed"] == 1
    assert all(s.arena.pins(k) == 0 for k in s.arena.keys())
    s.arena.check_consistency()


class CountingArena:
    """The host arena, counting the batched lookups a match makes."""

    def __init__(self, arena):
        self.arena, self.lookups = arena, 0

    def contains_many(self, *args, **kwargs):
        self.lookups += 1
        return self.arena.contains_many(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.arena, name)


def test_a_request_matched_again_is_answered_from_what_the_host_holds_now():
    """vLLM matches a request it cannot admit yet again every step. The
    answer of the last match is given again only while the host tier is
    unchanged; it never claims a value the host no longer holds (removed,
    evicted), and a value sealed since is found."""
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    s = rig.sched
    a_keys = list(s._reqs["A"].keys)
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert s.match(b, 0) == 5 * BS
    plan = s._reqs["B"].plan
    s.arena = counting = CountingArena(s.arena)
    assert s.match(b, 0) == 5 * BS and s._reqs["B"].plan is plan
    assert counting.lookups == 0  # unchanged: answered at once
    gen = s.arena.generation
    assert s.arena.allocate("elsewhere", 0, 1, 0, 0) is not None
    s.arena.seal("elsewhere", b"")
    assert s.arena.generation != gen  # a change, but not in what B's match reads
    assert s.match(b, 0) == 5 * BS and s._reqs["B"].plan is plan and counting.lookups == 1
    assert s.match(b, 0) == 5 * BS and counting.lookups == 1
    assert s.arena.remove("elsewhere")
    counting.lookups = 0
    assert s.arena.remove(arena_key("state", a_keys[4]))
    assert s.match(b, 0) == 3 * BS and counting.lookups == 1
    assert s.match(b, 0) == 3 * BS and counting.lookups == 1
    assert s._reqs["B"].plan is not plan  # planned again
    assert s.arena.remove(arena_key("kv", a_keys[1]))  # the chain breaks below the state at 3
    assert s.match(b, 0) == 0
    assert s.match(b, 2 * BS) == BS  # another local hit, past the break: matched afresh
    for k in s.arena.keys():  # everything gone, then saved again: found again
        s.arena.remove(k)
    assert s.match(b, 0) == 0
    prefill_a(rig, t)
    assert s.match(b, 0) == 5 * BS
    # an eviction (room taken for another value) is a change too
    assert s.arena.allocate("room", 0, s.arena.num_entries, 0, 0) is not None
    assert s.match(b, 0) == 0
    s.arena.remove("room")
    # and whatever happens, a kept answer equals a fresh match
    rng = random.Random(5)
    for _ in range(40):
        held = s.arena.keys()
        if rng.random() < 0.3:  # a change elsewhere in the host tier
            if b"elsewhere" in held:
                s.arena.remove("elsewhere")
            elif s.arena.allocate("elsewhere", 0, 1, 0, 0) is not None:
                s.arena.seal("elsewhere", b"")
        elif held and rng.random() < 0.7:
            s.arena.remove(rng.choice(held))
        elif not held:
            prefill_a(rig, t)
        got = s.match(b, rng.choice((0, 0, 2 * BS)))
        local = s._reqs["B"].plan.local
        s._reqs["B"].matched = None
        assert s.match(b, local) == got


def finish_a_off_a_boundary(rig: Rig) -> tuple[list[int], FakeRequest]:
    """Request A computes 5 blocks and 3 tokens, answers one token and
    finishes: the state it ends with is saved as a tail (vLLM holds its
    blocks until the worker reports the save)."""
    t = tokens(5 * BS + 3)
    a = prefill_a(rig, t)
    ids = tuple([0, 0, 0, 0, 0, 20 + g] for g in STATE_GROUPS) + (list(range(1, 7)),)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(cached=[("A", 5 * BS, 3)]))  # the prompt's last 3 tokens
    a.tokens.append(99)  # the answer's one token, never computed
    a.num_computed_tokens = 5 * BS + 3
    assert rig.sched.finished(a, ids) is True  # hold the blocks
    out = rig.step(scheduler_output())
    assert out.finished_sending == {"A"}  # saved: vLLM may free them now
    return t, a


def test_the_state_a_finished_request_ends_with_resumes_the_next_turn():
    """A request ending off a boundary: its final state and partly filled
    attention block are saved from its blocks (vLLM holds them until the
    worker is done), and the next turn resumes up to where it ended."""
    rig = Rig()
    t, a = finish_a_off_a_boundary(rig)
    nxt = FakeRequest("B", a.tokens + tokens(30, 3), len(a.tokens) + 30)
    assert rig.sched.match(nxt, 0) == 5 * BS + 3
    assert rig.sched.match(nxt, 5 * BS) == 3  # vLLM's attention hit at the boundary: only the tail
    dst = tuple([0] * 5 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 38)),)
    rig.sched.after_alloc(nxt, FakeBlocks(dst), 3)
    out = until_received(rig)
    assert out.finished_recving == {"B"} and not out.failed_recving
    assert rig.block(0, 36) == rig.block(0, 6)  # the partial block, whole page image
    for g in STATE_GROUPS:
        assert rig.block(0, 40 + g)[:MAMBA_REAL] == rig.block(0, 20 + g)[:MAMBA_REAL]
    f = rig.sched.funnel()
    assert f["tail_saves"] == 1 and f["tokens_resumed_tail"] == 3
    # a short follow-up that stays in the tail's block, vLLM's attention hit
    # at the boundary: the tail still resumes (no whole block past the hit)
    short = FakeRequest("D", a.tokens + [7, 8], len(a.tokens) + 2)
    assert (len(short.tokens) - 1) // BS == 5
    assert rig.sched.match(short, 5 * BS) == 3
    assert rig.sched.match(short, 0) == 5 * BS + 3
    # another continuation of the same boundary is not fooled by the tail
    other = FakeRequest("C", t[: 5 * BS] + [1, 2, 3, 4] + tokens(30, 4), 5 * BS + 34)
    assert rig.sched.match(other, 0) == 5 * BS
    # matched again after the tail left the host tier: never offered again
    assert rig.sched.match(short, 0) == 5 * BS + 3
    tail = [k for k in rig.sched.arena.keys() if k.startswith(b"tail")]
    assert len(tail) == 1 and rig.sched.arena.remove(tail[0])
    assert rig.sched.match(short, 0) == 5 * BS


def test_a_request_aborted_while_its_load_is_in_flight_saves_nothing_from_its_blocks():
    """vLLM sets an async load's ``num_computed_tokens`` before the bytes
    land, and a request aborted while it waits is finished with the blocks
    the load is still writing. The state it "ends with" is then not in its
    blocks: nothing may be saved from them, even where the host no longer
    holds the value being loaded (an untrusted copy is removed while the
    load holds its pin)."""
    rig = Rig()
    _t, a = finish_a_off_a_boundary(rig)
    s = rig.sched
    nxt = FakeRequest("B", a.tokens + tokens(30, 3), len(a.tokens) + 30)
    assert s.match(nxt, 0) == 5 * BS + 3  # KV to the boundary and A's tail
    dst = tuple([0] * 5 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 38)),)
    s.after_alloc(nxt, FakeBlocks(dst), 5 * BS + 3)
    tail = [k for k in s.arena.keys() if k.decode().startswith("tail/")]
    assert len(tail) == 1 and s.arena.remove(tail[0].decode())  # hidden; the load's pin keeps it
    before = s.funnel()
    nxt.num_computed_tokens = 5 * BS + 3  # as vLLM sets it when the load is planned
    assert s.finished(nxt, dst) is False  # aborted before the load landed
    f = s.funnel()
    assert f["tail_saves"] == before["tail_saves"] and f["saves_dropped_host_full"] == before["saves_dropped_host_full"]
    rig.step(scheduler_output())
    assert not [k for k in s.arena.keys() if k.decode().startswith("tail/")]
    assert s.funnel()["values_saved"] == before["values_saved"]


def test_a_failed_shared_load_is_looked_up_again_and_a_request_failing_repeatedly_is_recomputed(mooncake):
    t = tokens(5 * BS + 3, seed=13)
    first = Rig(extra=shared_extra(mooncake), seed=1)
    prefill_a(first, t)
    settle(first)
    fresh = Rig(extra=shared_extra(mooncake), seed=2)
    s = fresh.sched
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    ids = tuple([0] * 4 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 37)),)
    # the deepest state vanishes from the store after the lookup found it
    assert s.match(b, 0) == 5 * BS
    s.shared.remove_many(s.tier_keys("state", first.sched._reqs["A"].keys[4]))
    s.after_alloc(b, FakeBlocks(ids), 5 * BS)
    out = until_received(fresh)
    assert out.failed_recving == {"B"} and s.funnel()["loads_missing"] >= 1
    # the retry asks the store again instead of trusting the first answer
    assert s.match(b, 0) == 3 * BS
    for _ in range(2):  # two more failures: the request is then left to vLLM
        s.after_alloc(b, FakeBlocks(ids), 3 * BS)
        s.arena.remove(arena_key("kv", s._reqs["B"].keys[0]))  # and make each load fail
        until_received(fresh)
        s.match(b, 0)
    assert s._reqs["B"].failures == 3 and s.match(b, 0) == 0


def test_a_failed_request_whose_async_retry_vllm_refuses_retries_without_the_connector():
    """vLLM 0.32 keeps a request whose async load failed in its in-flight
    reservation while it waits, so several failed requests can make every
    async retry's allocation fail, forever (seen: 4 requests, 48 blocks). A
    retry that vLLM did not allocate (matched again, no allocation between)
    is offered nothing, so vLLM schedules it as a plain prefill."""
    rig = Rig()
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    s = rig.sched
    b = FakeRequest("B", t + tokens(20, 2), len(t) + 20)
    assert s.match(b, 0) == 5 * BS
    s.arena.remove(arena_key("state", s._reqs["A"].keys[4]))  # the load will fail
    ids = tuple([0] * 4 + [40 + g] for g in STATE_GROUPS) + (list(range(31, 37)),)
    s.after_alloc(b, FakeBlocks(ids), 5 * BS)
    assert until_received(rig).failed_recving == {"B"}
    assert s.match(b, 0) == 3 * BS  # the retry is offered what is left ...
    assert s.match(b, 0) == 0  # ... and, refused by vLLM, nothing
    assert s.funnel()["retries_recomputed"] == 1
    before = s.funnel()["admissions"]
    s.after_alloc(b, FakeBlocks(ids), 0)  # scheduled as a plain prefill
    rig.kvm.ids["B"] = ids
    rig.step(scheduler_output(new=[("B", 0, BS - 1)]))
    assert s.funnel()["admissions"] == before + 1
    # a request that never failed keeps its offer while vLLM has no room for it
    c = FakeRequest("C", t + tokens(20, 3), len(t) + 20)
    assert s.match(c, 0) == 3 * BS and s.match(c, 0) == 3 * BS


def test_host_placement_is_the_tiers_one_kv_blocks_rank_with_the_deepest_state_they_lead_to():
    from statecache.tiers.placement import TierPlacement
    from statecache.vllm.scheduler import _h

    rig = Rig()
    prefill_a(rig, tokens(5 * BS + 3))
    s = rig.sched
    assert isinstance(s.placement.tier, TierPlacement)
    keys = s._reqs["A"].keys
    # states sealed at boundaries 3 and 5: every KV block of the chain leads to 5
    assert [s.placement.tier.position("kv", _h(k)) for k in keys[:5]] == [5] * 5
    assert s.placement.tier.position("state", _h(keys[2])) == 3
    assert not s.placement._filing  # nothing allocated is left unsealed


def test_stats_are_reported_at_most_each_interval_and_at_once_when_no_request_is_left():
    """vLLM asks for the connector's stats every step: while requests run,
    counters and hook times are reported at most every STATS_EVERY_S (a
    quiet step builds nothing); in the step the last request finishes, and
    in a later one that lands what it left (its tail), at once. No count is
    lost."""
    rig = Rig()
    s = rig.sched
    ms = 1e-3  # build_meta, which the rig calls, times itself (microseconds a step)
    s.hook_seconds[0] += 0.5
    first = s.take_interval()  # the first ask: at once
    assert first["scheduler_seconds"] == 0.5
    s.hook_seconds[0] += 0.25  # time spent, nothing counted
    assert s.take_interval() == {}
    a = prefill_a(rig, tokens(5 * BS + 3, seed=11))  # saves: events, while A runs
    assert s._reqs and s.take_interval() == {}  # within the interval: later
    s.stats_due = 0.0  # the interval passed
    got = s.take_interval()
    assert got["values_saved"] > 0 and got["scheduler_seconds"] == pytest.approx(0.25, abs=ms)
    s.hook_seconds[0] += 0.125
    assert s.take_interval() == {}
    ids = tuple([0, 0, 0, 0, 0, 20 + g] for g in STATE_GROUPS) + (list(range(1, 7)),)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(cached=[("A", 5 * BS, 3)]))  # the prompt's last 3 tokens
    a.tokens.append(99)
    a.num_computed_tokens = 5 * BS + 3
    assert s.take_interval() == {}  # A still runs
    assert s.finished(a, ids) is True  # off a boundary: its tail is saved next step
    last = s.take_interval()  # no request left: at once
    assert last["tail_saves"] == 1 and last["scheduler_seconds"] == pytest.approx(0.125, abs=ms)
    saved = s.funnel()["values_saved"]
    rig.step(scheduler_output())  # the tail lands in the host tier
    assert s.funnel()["values_saved"] == saved + 1
    assert s.take_interval()["values_saved"] == 1  # at once too: still no request
    total = s.funnel()
    assert total["scheduler_seconds"] == pytest.approx(0.875, abs=ms)
    assert total["values_saved"] == got["values_saved"] + 1


def test_an_admission_without_a_load_counts_the_local_hit_vllm_scheduled():
    """vLLM hashes the blocks a step will fill when it allocates them, and
    cuts a diverged hybrid hit back after asking the connector: the tokens
    it resumed itself are counted from the step it schedules, not guessed
    from the blocks (which made every such admission a full hit)."""
    rig = Rig()
    s = rig.sched
    t = tokens(5 * BS + 3)
    prefill_a(rig, t)
    before = s.funnel()
    b = FakeRequest("B", t[: 3 * BS] + tokens(2 * BS, 4), 5 * BS)
    assert s.match(b, 3 * BS) == 0  # shown a 3-block hit; nothing past it here
    full = tuple([0, 0, 10 + g, 0, 0] for g in STATE_GROUPS) + (list(range(1, 4)) + [50, 51],)
    s.after_alloc(b, FakeBlocks(full), 0)
    rig.kvm.ids["B"] = full
    assert s.funnel()["admissions"] == before["admissions"]  # not known yet
    rig.step(scheduler_output(new=[("B", 2 * BS, 3 * BS)]))  # vLLM cut the hit back to 2 blocks
    f = s.funnel()
    assert f["admissions"] == before["admissions"] + 1
    assert f["tokens_resumed_local"] - before["tokens_resumed_local"] == 2 * BS
    assert f["admissions_full_hit"] == before["admissions_full_hit"]
    assert (
        f["admissions_kv_miss"] + f["admissions_state_miss"] + f["admissions_hit_cut_short"] + f["admissions_full_hit"]
        == f["admissions"]
    )
    # an admission vLLM never schedules is not counted
    c = FakeRequest("C", tokens(4 * BS, 9), 4 * BS)
    assert s.match(c, 0) == 0
    s.after_alloc(c, FakeBlocks(full), 0)
    rig.step(scheduler_output())
    assert s.funnel()["admissions"] == f["admissions"]


def finish_a_short_turn(rig: Rig) -> tuple[list[int], FakeRequest]:
    """Request A, half a block long, computes its prompt, answers one token
    and finishes: no boundary, so its state is saved as a tail from
    boundary 0 (block 1, state blocks 10 + g)."""
    t = tokens(BS // 2, seed=21)
    return t, finish_short(rig, t, "A")


def finish_short(rig: Rig, t: list[int], req_id: str, saved: bool = True, **attrs) -> FakeRequest:
    """``finish_a_short_turn`` of prompt ``t`` (under a block) as ``req_id``
    (``attrs``: vLLM request attributes such as ``cache_salt``; ``saved``:
    whether its tail is saved)."""
    a = FakeRequest(req_id, t, len(t))
    for name, value in attrs.items():
        setattr(a, name, value)
    assert rig.sched.match(a, 0) == 0
    ids = tuple([10 + g] for g in STATE_GROUPS) + ([1],)
    rig.sched.after_alloc(a, FakeBlocks(ids), 0)
    rig.kvm.ids[req_id] = ids
    rig.step(scheduler_output(new=[(req_id, 0, len(t))]))
    a.tokens.append(99)  # the answer's one token, never computed
    a.num_computed_tokens = len(t)
    assert rig.sched.finished(a, ids) is saved
    if saved:
        assert rig.step(scheduler_output()).finished_sending == {req_id}
    return a


def test_a_tail_is_resumed_only_by_the_same_salt_and_by_requests_whose_tokens_name_it():
    """Before its first block a conversation is resumed from its tail alone,
    named by its tokens: vLLM folds ``cache_salt`` into the first block's
    hash, so a tail from boundary 0 is named under the salt too (tenants with
    different salts never resume each other's); a LoRA, multimodal or
    prompt-embeds request, whose hash folds in more than its token ids, is
    offered no tail (another request's state under the same ids) and saves
    none."""
    rig = Rig()
    s = rig.sched
    t = tokens(BS // 2, seed=31)
    a = finish_short(rig, t, "A", cache_salt="tenant a")

    def offered(req_id: str, **attrs) -> int:
        nxt = FakeRequest(req_id, a.tokens + tokens(20, 3), len(a.tokens) + 20)
        for name, value in attrs.items():
            setattr(nxt, name, value)
        return s.match(nxt, 0)

    assert offered("B", cache_salt="tenant a") == len(t)
    assert offered("C", cache_salt="tenant b") == 0
    assert offered("C2", cache_salt="tenant \ud800") == 0  # a lone surrogate (a valid JSON escape) names a salt too
    assert offered("D") == 0 and offered("E", cache_salt="") == 0
    finish_short(rig, t, "F")  # the same conversation with no salt
    assert offered("G") == len(t)
    lora = SimpleNamespace(lora_name="adapter", lora_path="/adapters/a")
    assert offered("H", lora_request=lora) == 0
    assert offered("I", mm_features=[SimpleNamespace(identifier="image")]) == 0
    assert offered("J", prompt_embeds=object()) == 0
    for i, attrs in enumerate(({"lora_request": lora}, {"prompt_embeds": object()})):
        finish_short(rig, tokens(BS // 2, seed=40 + i), f"K{i}", saved=False, **attrs)
    assert s.funnel()["tail_saves"] == 2


def test_tails_filed_under_one_boundary_cost_one_arena_key_the_one_this_request_names():
    """Conversations that share a system prompt and end inside their first
    block all file their tails under boundary 0 and the same first token (up
    to a block's worth of lengths). A next turn hashes its tokens once and
    asks the arena only for the tail they name (one key, not one per length
    filed), and resumes it."""
    rig = Rig()
    system = tokens(3, seed=5)
    # prompts of 4 .. BS - 2 tokens: with the answer's token, each ends inside the first block
    ended = [finish_short(rig, system + tokens(1 + i, seed=100 + i), f"A{i}") for i in range(BS - 5)]
    a = ended[5]
    nxt = FakeRequest("B", a.tokens + tokens(20, 3), len(a.tokens) + 20)
    arena, asked = rig.sched.arena, []

    class Counting:
        def contains_many(self, keys, *args, **kwargs):
            asked.append(len(keys))
            return arena.contains_many(keys, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(arena, name)

    rig.sched.arena = Counting()
    try:
        assert rig.sched.match(nxt, 0) == len(a.tokens)  # its tail: as the fake computed it
    finally:
        rig.sched.arena = arena
    assert asked == [2, 1]  # boundary 1's block and state (not held), then the one tail (11 before)
    other = FakeRequest("C", system + tokens(BS, seed=7), BS + 3)  # the system prompt, then other words
    assert rig.sched.match(other, 0) == 0


def test_a_conversation_shorter_than_a_block_resumes_where_its_last_turn_ended():
    """No boundary, so nothing vLLM or a boundary value can resume: the state
    the turn ended with is saved as a tail from boundary 0, and the next
    turn resumes to where it ended, byte for byte; another conversation with
    the same first tokens is not fooled."""
    rig = Rig()
    t, a = finish_a_short_turn(rig)
    f = resume_a_short_turn(rig, rig, a, t, "B")
    assert f["tail_saves"] == 1 and f["tokens_resumed_tail"] == len(t) and f["tokens_resumed_host"] == len(t)
    other = FakeRequest("C", t[:5] + [t[5] + 1] + t[6:] + tokens(20, 4), len(t) + 20)
    assert rig.sched.match(other, 0) == 0
    shorter = FakeRequest("D", t[:10], 10)  # a prefix of the tail leaves nothing it holds to resume
    assert rig.sched.match(shorter, 0) == 0


def test_a_next_turn_matched_before_the_tail_is_saved_waits_for_it_a_few_steps_at_most():
    """A finished request's tail reaches the host tier a step later (an idle
    engine may take that step only when the next turn arrives): the next
    turn is asked for again (None) while that save is in flight, and takes
    the tail once it landed; it never waits more than MAX_TAIL_WAITS steps."""
    from statecache.vllm.scheduler import MAX_TAIL_WAITS

    rig = Rig()
    t = tokens(5 * BS + 3)
    a = prefill_a(rig, t)
    ids = tuple([0, 0, 0, 0, 0, 20 + g] for g in STATE_GROUPS) + (list(range(1, 7)),)
    rig.kvm.ids["A"] = ids
    rig.step(scheduler_output(cached=[("A", 5 * BS, 3)]))
    a.tokens.append(99)
    a.num_computed_tokens = 5 * BS + 3
    assert rig.sched.finished(a, ids) is True
    nxt = FakeRequest("B", a.tokens + tokens(30, 3), len(a.tokens) + 30)
    assert rig.sched.match(nxt, 0) is None  # its tail is being saved: ask again next step
    assert rig.step(scheduler_output()).finished_sending == {"A"}
    assert rig.sched.match(nxt, 0) == 5 * BS + 3
    assert rig.sched.funnel()["tail_waits"] == 1
    # a save that never lands is waited for MAX_TAIL_WAITS steps, then resumed without
    other = Rig()
    a2 = prefill_a(other, t)
    other.kvm.ids["A"] = ids
    other.step(scheduler_output(cached=[("A", 5 * BS, 3)]))
    a2.tokens.append(99)
    a2.num_computed_tokens = 5 * BS + 3
    assert other.sched.finished(a2, ids) is True  # and no step follows
    nxt2 = FakeRequest("B", a2.tokens + tokens(30, 3), len(a2.tokens) + 30)
    assert [other.sched.match(nxt2, 0) for _ in range(MAX_TAIL_WAITS)] == [None] * MAX_TAIL_WAITS
    assert other.sched.match(nxt2, 0) == 5 * BS


def _truth(prefix: list[int], what: str) -> bytes:
    """The bytes a block holds after computing ``prefix``: the KV block it
    ends (``"kv"``), the partly filled block of a prefix off a boundary
    (``"part"``), or state group g's image (``"state<g>"``). A function of
    the tokens alone, as the model's outputs are."""
    return hashlib.shake_128(f"{what}:{prefix!r}".encode()).digest(4096)


class _Stream:
    """Random requests through the two sides, one at a time: savers compute
    prompts in chunks, decode (preempted at times) and finish off a boundary
    (a tail); loaders resume whatever the connector offers past a random
    local hit; between them values are removed (evicted) or corrupted in the
    host tier (on one rank, under tensor parallelism, where every rank holds
    its own bytes) or in the shared tier."""

    KV_SAVE, KV_LOAD, STATE_LOAD = 1, 37, 50  # block ids: all groups alias one allocation

    def __init__(
        self,
        seed: int,
        tp: int = 1,
        shared: dict | None = None,
        engines: int = 1,
        asynchronous: bool = False,
        colliding: str | None = None,
    ):
        self.rng = random.Random(seed)
        self.tp = tp
        self.asynchronous = asynchronous
        # ``colliding``: vLLM's hasher is declared to be this, and every prompt's
        # block hashes collide with every other's (colliding_block_hashes)
        self.hashes = colliding_block_hashes if colliding else block_hashes
        # a small host tier: evictions happen too; engines share the tier ``shared`` configures
        extra = {"host_memory": 240 * 4096, **(shared or {})}
        self.rigs = [
            Rig(tp=tp, extra=extra, seed=seed * 10 + e, hash_algo=colliding or "sha256") for e in range(engines)
        ]
        self.rig = self.rigs[0]
        self.s = self.rig.sched
        self.redis = None
        if shared is not None and "redis" in shared:
            import redis

            self.redis = redis.Redis(host="127.0.0.1", port=shared["redis"]["port"])
        self.bases = [tokens(6 * BS + 5, seed=seed * 10 + i) for i in range(3)]
        self.finished: list[list[int]] = []
        self.n = 0
        self.resumed = self.failed = self.faults = self.preemptions = 0

    def _prompt(self, next_turn: bool = False) -> list[int]:
        rng = self.rng
        if next_turn and self.finished:  # a finished prompt, its answer and more: a next turn
            turn = rng.choice(self.finished)
            return turn + [rng.randrange(1000, 2000) for _ in range(rng.randrange(1, BS))]
        base = rng.choice(self.bases)
        cut = rng.randrange(len(base) + 1)
        extra = rng.randrange(0, 2 * BS)
        return base[:cut] + [rng.randrange(1000, 2000) for _ in range(extra)] or [rng.randrange(1000)]

    def _write(self, block: int, prefix: list[int] | None, what: str) -> None:
        """Each rank's block computed from ``prefix`` (None: noise, never a truth)."""
        for rank in range(self.tp):
            if prefix is None:
                data = bytes(self.rng.randrange(256) for _ in range(16)) * 256
            else:
                data = _truth(prefix, f"{what}@{rank}")
            self.rig.raw[rank][block * 4096 : (block + 1) * 4096] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _holds(self, block: int, prefix: list[int], what: str, nbytes: int = 4096) -> bool:
        return all(
            self.rig.block(rank, block)[:nbytes] == _truth(prefix, f"{what}@{rank}")[:nbytes] for rank in range(self.tp)
        )

    def _engine(self) -> None:
        self.rig = self.rng.choice(self.rigs)
        self.s = self.rig.sched

    def _fault(self, pick: bool = True) -> None:
        if pick:  # else the engine of the load under way
            self._engine()
        if self.redis is not None and self.rng.random() < 0.5:
            return self._shared_fault()
        held = self.s.arena.keys()
        if not held:
            return
        key = self.rng.choice(held)
        self.faults += 1
        if self.rng.random() < 0.5:
            self.s.arena.remove(key)  # evicted, or dropped by the tier
        else:
            got = self.s.arena.lookup(key, False)
            if got is not None:  # one bit of one rank's stored copy flipped
                rank = self.rng.randrange(self.tp)
                self.rig.workers[rank].rows[got[0][0], self.rng.randrange(64)] ^= 0x10

    def _shared_fault(self) -> None:
        """A value of the shared tier deleted, or one bit of it flipped."""
        assert self.redis is not None
        keys = self.redis.keys("*")
        if not keys:
            return
        key = self.rng.choice(keys)
        self.faults += 1
        if self.rng.random() < 0.5:
            self.redis.delete(key)
        else:
            value = bytearray(self.redis.get(key) or b"")
            if value:
                value[self.rng.randrange(len(value))] ^= 0x04
                self.redis.set(key, bytes(value))

    def _state_id(self, j: int, g: int) -> int:
        return 13 + 3 * (j % 8) + g  # a state block per boundary, 8 in flight at most

    def save(self) -> None:
        """A request computes its prompt in random chunks ending on
        boundaries, decodes a random number of tokens (one a step, crossing
        boundaries as they come) and finishes. Under ``asynchronous``
        scheduling a step's sampled token is appended (and its block hashed)
        only after the next step is scheduled, as vLLM's async scheduler
        does."""
        self._engine()
        rig, s, rng = self.rig, self.s, self.rng
        t = self._prompt(next_turn=rng.random() < 0.3)[: 9 * BS]
        full = t + [rng.randrange(2000, 3000) for _ in range(rng.randrange(0, 2 * BS) + 1)]
        decode = len(full) - len(t) - 1  # positions computed after the prompt (the last sampled never is)
        self.n += 1
        rid = f"S{self.n}"
        a = FakeRequest(rid, t, len(t))
        a.block_hashes = self.hashes(t)
        s.match(a, 0)
        blocks = len(full) // BS + 1
        kv = [self.KV_SAVE + i for i in range(blocks)]
        states = [[0] * blocks for _ in STATE_GROUPS]
        s.after_alloc(a, FakeBlocks((*states, kv)), 0)

        def show(tokens: list[int]) -> None:  # what vLLM has appended and hashed
            a.tokens = list(tokens)
            a.block_hashes = self.hashes(a.tokens)

        def compute(start: int, end: int, resumed: bool = False) -> None:  # one step computing [start, end)
            for i in range(start // BS, end // BS):  # KV blocks this step fills
                self._write(kv[i], full[: (i + 1) * BS], "kv")
            j = end // BS - 1 if end % BS == 0 else end // BS  # where the state at `end` lives
            for g in STATE_GROUPS:
                states[g][j] = self._state_id(j, g)
                self._write(states[g][j], full[:end], f"state{g}")
            if end % BS:
                self._write(kv[end // BS], full[:end], "part")
            rig.kvm.ids[rid] = (*[list(x) for x in states], kv)
            new = [(rid, 0, end)] if start == 0 and not resumed else []
            cached = [(rid, start, end - start)] if start or resumed else []
            so = scheduler_output(new=new, cached=cached)
            if resumed:
                so.scheduled_cached_reqs.resumed_req_ids = {rid}
            rig.step(so)
            a.num_computed_tokens = end

        m = len(t) // BS
        ends = sorted(set(rng.sample(range(1, m + 1), k=min(m, rng.randint(0, 2))) if m else []) | {len(t)})
        start = 0
        for end in [e * BS if e != len(t) else e for e in ends]:
            compute(start, end)
            start = end
        for q in range(len(t), len(t) + decode):  # the step computing position q
            if q > len(t) and rng.random() < 0.04:
                # preempted: vLLM frees its blocks, which others overwrite (a step of
                # theirs runs), and admits it again later from nothing: matched
                # again, recomputed into blocks of the same ids
                rig.kvm.ids.pop(rid)
                a.num_computed_tokens = 0
                for blk in kv + [x for group in states for x in group if x]:
                    self._write(blk, None, "")
                rig.step(scheduler_output())
                self.preemptions += 1
                show(full[:q])
                s.match(a, 0)
                states = [[0] * blocks for _ in STATE_GROUPS]
                s.after_alloc(a, FakeBlocks((*states, kv)), 0)
                cut = BS * rng.randrange(q // BS + 1)  # recomputed in one or two chunks
                for start, end in ((0, cut), (cut, q)) if 0 < cut < q else ((0, q),):
                    compute(start, end, resumed=start == 0)
            show(full[:q] if self.asynchronous else full[: q + 1])
            compute(q, q + 1)
        show(full[: len(t) + decode + 1])  # finished: every token appended, the last never computed
        self.finished.append(list(a.tokens))
        if s.finished(a, rig.kvm.ids.pop(rid)):
            rig.step(scheduler_output())  # what it held is saved; vLLM frees the blocks after

    def load(self) -> None:
        self._engine()
        rig, s, rng = self.rig, self.s, self.rng
        t = self._prompt(next_turn=rng.random() < 0.5)
        self.n += 1
        b = FakeRequest(f"L{self.n}", t, len(t))
        b.block_hashes = self.hashes(t)
        local = BS * rng.randrange((len(t) - 1) // BS + 1)
        got = s.match(b, local)
        if got is None:  # the tail it wants is being saved: vLLM asks again next step
            rig.step(scheduler_output())
            got = s.match(b, local)
        if not got:
            s.finished(b, None)
            return
        m = len(t) // BS
        for blk in [self.KV_LOAD + i for i in range(m + 1)] + [self.STATE_LOAD + g for g in STATE_GROUPS]:
            self._write(blk, None, "")
        if rng.random() < 0.2:
            self._fault(pick=False)  # between match and vLLM's allocation
        ids = tuple([self.STATE_LOAD + g] * (m + 1) for g in STATE_GROUPS) + ([self.KV_LOAD + i for i in range(m + 1)],)
        s.after_alloc(b, FakeBlocks(ids), got)
        out = until_received(rig)
        assert b.request_id in out.finished_recving
        s.finished(b, None)
        if b.request_id in out.failed_recving:
            self.failed += 1
            return
        # what landed is what computing the prompt up to there leaves, to the byte
        end = local + got
        for i in range(local // BS, end // BS):
            assert self._holds(self.KV_LOAD + i, t[: (i + 1) * BS], "kv"), (b.request_id, i)
        if end % BS:
            assert self._holds(self.KV_LOAD + end // BS, t[:end], "part"), b.request_id
        for g in STATE_GROUPS:
            assert self._holds(self.STATE_LOAD + g, t[:end], f"state{g}", MAMBA_REAL), (b.request_id, g)
        self.resumed += 1


@pytest.mark.parametrize(
    "seed, tp, asynchronous", [(0, 1, False), (1, 1, False), (2, 1, True), (3, 1, True), (4, 2, False), (5, 2, True)]
)
def test_random_streams_resume_exactly_what_computing_the_prompt_leaves_or_fail_the_load(seed, tp, asynchronous):
    """The wrong-state property on random streams: requests sharing random
    prefixes compute in random chunks, decode across boundaries (under async
    scheduling too), are preempted and recomputed, and finish off a boundary;
    others resume past random local hits; values are evicted or have a bit
    flipped at any point, between a match and vLLM's allocation too. Every load either lands
    exactly the bytes computing its prompt up to there leaves (KV blocks, the
    state, a tail's partial block) or is reported failed; nothing stays
    pinned and the host index stays consistent."""
    run_stream(_Stream(seed, tp, asynchronous=asynchronous))


@pytest.mark.parametrize("seed, asynchronous", [(6, False), (7, True)])
def test_random_streams_resume_exactly_where_vllms_block_hashes_collide(seed, asynchronous):
    """The same streams where every prompt's block hashes collide with every
    other's, as an attacker who broke vLLM's hasher would make them, under
    ``prefix_caching_hash_algo="xxhash"`` (fast, not collision resistant):
    the names chain each block's tokens too, so every load still lands what
    its own prompt computes. (Declared "sha256", which the names trust
    alone, the same streams load other prompts' values.)"""
    run_stream(_Stream(seed, asynchronous=asynchronous, colliding="xxhash"))


def run_stream(st: _Stream, ops: int = 250) -> list[dict]:
    """``ops`` random operations, then the checks every engine must pass;
    returns each engine's funnel."""
    for _ in range(ops):
        r = st.rng.random()
        if r < 0.45:
            st.save()
        elif r < 0.9:
            st.load()
        else:
            st._fault()
    assert st.resumed >= 20 and st.faults >= 8  # the stream exercised both
    funnels = []
    for rig in st.rigs:
        s = rig.sched
        if s.shared is not None:
            settle(rig)  # a value is pinned until its shared write is done
        assert all(s.arena.pins(k) == 0 for k in s.arena.keys())
        s.arena.check_consistency()
        f = s.funnel()
        # every admission has one cause, and no cause loses a negative number of tokens
        causes = ("admissions_kv_miss", "admissions_state_miss", "admissions_hit_cut_short", "admissions_full_hit")
        assert sum(f[c] for c in causes) == f["admissions"]
        assert f["cut_short_tokens"] >= 0 and f["state_miss_tokens"] >= 0
        funnels.append(f)
    assert sum(f["loads_failed"] for f in funnels) == st.failed
    return funnels


@pytest.mark.parametrize("seed", range(2))
def test_random_streams_through_a_shared_tier_resume_exactly_what_was_computed_or_fail_the_load(redis_port, seed):
    """The same streams over two engines sharing a real redis-server: a
    request saved on one engine is resumed on the other from the shared tier;
    values are also deleted from it, or have a bit flipped there."""
    shared = {"secret": "a deployment secret", "redis": {"host": "127.0.0.1", "port": redis_port}}
    st = _Stream(seed + 10, shared=shared, engines=2)
    st.redis.flushall()  # streams of other seeds left theirs
    funnels = run_stream(st)
    assert sum(f["tokens_resumed_shared"] for f in funnels) > 0  # some resumed from the other engine's saves
