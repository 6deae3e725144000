"""The collision pair (engine/test_collisions.py) below GPU memory: a value
goes down under the 128-bit prefix key its GPU entry was filed under, not
under whichever prompt last named that 64-bit hash, and comes up only under
the admitted prompt's own key (issue 18, item 1), in the real tiers and in
the simulator's."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collision_pair import A, B, greedy  # noqa: E402
from statecache.engine import Request  # noqa: E402
from statecache.models import build_engine, build_model  # noqa: E402
from statecache.tiers import HostTier  # noqa: E402

torch.set_num_threads(1)
TAIL = [7, 9, 11, 5, 3, 100, 42, 17]


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3next", seed=0)


def _a_below_gpu_memory(model):
    """An engine that served A, whose image and KV block then went down to
    the host tier while B waited (so the engine had hashed B's prompt, whose
    first block has A's scheduler hash), and left GPU memory."""
    probe = build_engine("qwen3next", "page", model_and_geom=model, num_blocks=64)
    spec = probe.caches.coordinator.store.spec
    ub, upc = spec.page_unit_bytes, spec.units_per_checkpoint
    host = HostTier((16 * upc + 64) * ub, ub, kv_bytes=64 * ub)
    eng = build_engine("qwen3next", "page", model_and_geom=model, hash_seed=0, num_blocks=64, tiers=[host])
    a = Request(A + TAIL, 4)
    eng.add_request(a)
    eng.step()  # A's prefill: its checkpoint at 16 goes into the PAGE store
    waiting = Request(B + TAIL, 4)
    eng.block_manager.update_hashes(waiting)
    assert waiting.hashes[0] == a.hashes[0]
    eng.run_until_done()
    for _ in range(6):  # empty passes until A's image went down
        eng.step()
        if eng.tiering.stats()["state_offloaded"]:
            break
    assert eng.tiering.stats()["state_offloaded"] == 1
    eng.block_manager.pool.reset_prefix_cache()  # A's KV block goes down, A's image leaves the GPU
    assert not eng.caches.coordinator.contains(a.hashes[0])
    return eng


@pytest.mark.parametrize("prompt", ["B", "A again"])
def test_offloads_are_named_by_the_prefix_they_hold(model, prompt):
    eng = _a_below_gpu_memory(model)
    tokens = B + TAIL if prompt == "B" else A + [20, 21, 22, 23, 24, 25, 26, 27]
    r = greedy(eng, tokens)
    plain = build_engine("qwen3next", "page", model_and_geom=model, enable_prefix_caching=False, hash_seed=0)
    ref = greedy(plain, tokens)
    assert r.output_token_ids == ref.output_token_ids
    for x, y in zip(r.logits, ref.logits):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    st = eng.tiering.stats()
    if prompt == "B":  # nothing of A's comes up for B
        assert r.num_cached_tokens == 0 and st["kv_loaded_host"] == st["state_loaded_host"] == 0
    else:  # A's own prompt resumes both from the host tier
        assert r.num_cached_tokens == 16 and st["kv_loaded_host"] == st["state_loaded_host"] == 1
    eng.close()


@pytest.mark.parametrize("prompt", ["B", "A again"])
def test_the_simulators_tiers_resume_only_the_prompts_own_prefix(prompt):
    from statecache.sim.simulator import SimConfig, build_engine

    cfg = SimConfig(
        geometry="hybrid-7b",
        memory=256 << 20,
        kv_memory=None,
        state_memory=None,
        host_memory=512 << 20,
        hash_block_size=16,
        concurrency=2,
        hash_seed=0,
    )
    eng, _sizes, _runner = build_engine(cfg)

    def serve(prompt):
        r = Request(prompt, 1, scripted_output=[1])
        eng.add_request(r)
        eng.run_until_done()
        return r

    eng.add_request(Request(A + TAIL, 1, scripted_output=[1]))
    eng.step()  # A's prefill: its checkpoint at 16 goes into the PAGE store
    eng.block_manager.update_hashes(Request(B + TAIL, 1))  # B waits meanwhile
    eng.run_until_done()
    for _ in range(4):
        eng.step()  # A's image goes down to the host tier
    assert eng.tiering.stats()["state_offloaded"] == 1
    eng.block_manager.pool.reset_prefix_cache()  # and A's KV block; the GPU forgets both
    if prompt == "B":
        assert serve(B + TAIL).num_cached_tokens == 0
        assert eng.tiering.stats()["state_loaded_host"] == 0
    else:
        assert serve(A + [20, 21, 22, 23, 24, 25, 26, 27]).num_cached_tokens == 16
        assert eng.tiering.stats()["state_loaded_host"] == 1


class EmptyTier:
    """A shared tier that holds nothing and refuses every write."""

    name = "empty"

    def put_many(self, keys, values):
        return [False] * len(keys)

    def get_many_into(self, keys, dests):
        return [-1] * len(keys)

    def contains_many(self, keys):
        return [False] * len(keys)

    def remove_many(self, keys):
        return [False] * len(keys)

    def stats(self):
        return {}

    def close(self):
        pass


def test_shared_tiers_under_the_per_process_key_are_warned_about(model, caplog):
    caplog.set_level("WARNING", logger="statecache")
    probe = build_engine("qwen3next", "page", model_and_geom=model, num_blocks=16)
    ub = probe.caches.coordinator.store.spec.page_unit_bytes

    def warned(**kw):
        caplog.clear()
        eng = build_engine("qwen3next", "page", model_and_geom=model, tiers=[HostTier(64 * ub, ub), EmptyTier()], **kw)
        eng.close()
        return any("random for this process" in r.getMessage() for r in caplog.records)

    assert warned()
    assert not warned(hash_salt=b"the fleet's secret")
