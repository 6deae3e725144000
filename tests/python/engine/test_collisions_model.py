"""The collision pair of test_collisions.py on the demo's tiny Qwen3-Next
(issue 18, item 1): with seed 0 configured explicitly, a prompt served after
its colliding twin, or after the twin computed a state under its KV, gets
the greedy tokens and logits of the same prompt served without caching."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collision_pair import A, B, greedy  # noqa: E402
from statecache.models import build_engine, build_model  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3next", seed=0)


def _assert_uncached(model, mech, r, midstep=False):
    ref = greedy(
        build_engine(
            "qwen3next",
            mech,
            model_and_geom=model,
            enable_prefix_caching=False,
            hash_seed=0,
            readable_midstep=midstep,
        ),
        r.token_ids[: r.num_prompt_tokens],
        len(r.output_token_ids),
    )
    assert r.output_token_ids == ref.output_token_ids
    for x, y in zip(r.logits, ref.logits):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mech", ["page", "fork"])
def test_served_after_its_colliding_twin_b_gets_its_uncached_tokens(model, mech):
    eng = build_engine("qwen3next", mech, model_and_geom=model, hash_seed=0)
    tail = [7, 9, 11, 5, 3, 100, 42, 17]
    a = greedy(eng, A + tail)
    b = greedy(eng, B + tail)
    assert a.hashes[0] == b.hashes[0]
    _assert_uncached(model, mech, b)
    assert b.num_cached_tokens == 0


@pytest.mark.parametrize(("mech", "midstep"), [("page", False), ("fork", False), ("page", True)])
def test_a_state_computed_under_foreign_kv_is_never_resumed(model, mech, midstep):
    eng = build_engine("qwen3next", mech, model_and_geom=model, hash_seed=0, readable_midstep=midstep)
    a = greedy(eng, A + [7, 9, 11, 5, 3, 100, 42, 17], new=2)
    eng.block_manager.drop_checkpoint(a.hashes[0])
    greedy(eng, B + [8, 6, 4, 2, 90, 80, 70, 60], new=2)  # computes block 0 while A's KV holds its hash
    again = greedy(eng, A + [20, 21, 22, 23, 24, 25, 26, 27])
    _assert_uncached(model, mech, again, midstep)
    assert again.num_cached_tokens == 0
