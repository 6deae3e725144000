"""End to end on real hybrid models: a request resumed from a checkpoint
(fork or PAGE) produces the same greedy tokens and, to float tolerance, the
same logits as the same request recomputed from scratch."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


from statecache.engine import Request  # noqa: E402
from statecache.models import build_engine, build_model  # noqa: E402

torch.set_num_threads(1)
HBS = 16


@pytest.fixture(scope="module", params=["qwen3next", "granite"])
def model(request):
    return build_model(request.param, seed=0)


def run_script(eng, steps):
    """steps: callables building the next prompt from earlier requests."""
    done = []
    for make in steps:
        r = Request(make(done), 4)
        eng.add_request(r)
        eng.run_until_done()
        done.append(r)
    return done


def script(seed=1):
    g = torch.Generator().manual_seed(seed)

    def rand(n):
        return torch.randint(3, 256, (n,), generator=g).tolist()

    p0, tail_b, tail_c, tail_d = rand(75), rand(10), rand(30), rand(20)
    return [
        lambda d: p0,  # A: fresh
        lambda d: d[0].token_ids + tail_b,  # B: A's prompt-end anchor (64)
        lambda d: p0[:48] + tail_c,  # C: KV hit 48, ladder rung 32
        lambda d: d[2].token_ids[:60] + tail_d,  # D: C's demand rung (48)
    ]


def assert_same(got, want):
    for a, b in zip(got, want):
        assert a.output_token_ids == b.output_token_ids
        assert len(a.logits) == len(b.logits) == 4
        for x, y in zip(a.logits, b.logits):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mechanism", ["page", "fork"])
def test_resumed_equals_recomputed(model, mechanism):
    kw = dict(model_and_geom=model, checkpoint_interval_tokens=32, block_size=HBS)
    on = run_script(build_engine(mechanism=mechanism, **kw), script())
    off = run_script(build_engine(mechanism=mechanism, enable_prefix_caching=False, **kw), script())
    src = "PAGE" if mechanism == "page" else "fork"
    assert [(r.num_cached_tokens, r.state_source) for r in on] == [(0, "none"), (64, src), (32, src), (48, src)]
    assert [r.num_cached_tokens for r in off] == [0, 0, 0, 0]
    assert on[1].prefill_computed == on[1].num_prompt_tokens - 64
    assert_same(on, off)


@pytest.mark.parametrize("mechanism", ["page", "fork"])
def test_corrupt_resumed_state_is_detected(model, mechanism):
    """The comparison above can fail: zeroing the state a resumed forward
    reads changes its logits."""
    kw = dict(model_and_geom=model, checkpoint_interval_tokens=32, block_size=HBS)
    eng = build_engine(mechanism=mechanism, **kw)
    runner = eng.runner
    real = runner._forward

    def corrupting(item):
        if item.start > 0 and item.seq.num_cached_tokens == item.start:
            runner.conv[:, item.read_slot].zero_()
            runner.ssm[:, item.read_slot].zero_()
        return real(item)

    runner._forward = corrupting
    on = run_script(eng, script()[:2])
    off = run_script(build_engine(mechanism=mechanism, enable_prefix_caching=False, **kw), script()[:2])
    assert on[1].num_cached_tokens == 64
    assert float((on[1].logits[0] - off[1].logits[0]).abs().max()) > 1e-3


@pytest.mark.parametrize("mechanism", ["page", "fork"])
def test_preemption_during_pending_checkpoint(model, mechanism):
    """A request preempted in the pass after its forward ended on a rung (its
    PAGE store not yet scattered / its fork source not yet read) returns
    everything, is recomputed later, and every output still matches."""
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 256, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(3, 256, (n,), generator=g).tolist() for n in (39, 110)]

    def serve(caching, preempt_at=None):
        eng = build_engine(
            mechanism=mechanism,
            model_and_geom=model,
            block_size=HBS,
            num_blocks=40,
            num_slots=6,
            max_num_batched_tokens=48,
            enable_prefix_caching=caching,
            checkpoint_interval_tokens=16,
        )
        reqs = [Request(p, 6) for p in prompts]
        for r in reqs:
            eng.add_request(r)
        victim, hits = reqs[1], 0
        while eng.has_unfinished():
            eng.step()
            on_rung = any(b.position == victim.num_computed_tokens for b in victim.planned)
            if preempt_at is not None and victim.is_prefill and on_rung:
                hits += 1
                if hits == preempt_at:
                    eng.preempt(victim)
        return eng, reqs

    eng, on = serve(True, preempt_at=3)
    _, off = serve(False)
    f = eng.checkpoint_funnel()
    assert f["preempted_with_pending_checkpoint"] == 1 and on[1].num_preemptions == 1
    # the preempted request resumed from a checkpoint its first attempt kept
    assert on[1].num_cached_tokens > 0
    sp = eng.caches.slot_pool
    eng.step(), eng.step()
    assert sp.num_free() == sp.num_slots  # no slot leaked, no pin left behind
    assert [r.output_token_ids for r in on] == [r.output_token_ids for r in off]


@pytest.mark.parametrize("mechanism", ["page", "fork"])
def test_readable_midstep_keeps_rungs_without_cutting_chunks(model, mechanism):
    """A backend that reads interior states is not cut onto rungs: the rung
    inside a forward is reserved before it and published after it."""
    kw = dict(model_and_geom=model, checkpoint_interval_tokens=32, block_size=HBS)
    eng = build_engine(mechanism=mechanism, readable_midstep=True, **kw)
    on = run_script(eng, script())
    off = run_script(build_engine(mechanism=mechanism, enable_prefix_caching=False, **kw), script())
    src = "PAGE" if mechanism == "page" else "fork"
    assert [(r.num_cached_tokens, r.state_source) for r in on][:3] == [(0, "none"), (64, src), (32, src)]
    # A's whole prompt went in one forward (75 tokens < the budget) ...
    assert on[0].prefill_chunks == 1 and on[0].prefill_computed == 75
    # ... where a backend that cannot read midstep is cut at 32 and 64
    cut = run_script(build_engine(mechanism=mechanism, **kw), script()[:1])
    assert cut[0].prefill_chunks == 3
    assert_same(on, off)


def test_page_checkpoint_at_a_decode_boundary(model):
    """PAGE keeps a block end reached while decoding; the next turn resumes
    inside the previous answer and still matches a full recompute."""
    from statecache.engine import AnchorLadderDemand, Boundary

    class AlsoDecode(AnchorLadderDemand):
        def decode_boundary(self, ctx, position):
            return Boundary(position, "decode", True)

    g = torch.Generator().manual_seed(3)
    p0 = torch.randint(3, 256, (60,), generator=g).tolist()
    tail = torch.randint(3, 256, (9,), generator=g).tolist()

    def serve(caching):
        eng = build_engine(
            mechanism="page",
            model_and_geom=model,
            block_size=HBS,
            enable_prefix_caching=caching,
            placement=AlsoDecode(),
        )
        a = Request(p0, 8)  # decodes through position 64
        eng.add_request(a)
        eng.run_until_done()
        b = Request(a.token_ids + tail, 4)
        eng.add_request(b)
        eng.run_until_done()
        return [a, b]

    on, off = serve(True), serve(False)
    assert on[1].num_cached_tokens == 64 and on[1].state_source == "PAGE"
    assert_same(on[1:], off[1:])
