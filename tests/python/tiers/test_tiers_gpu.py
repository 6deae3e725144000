"""The engine's host tier on a GPU, end to end on a tiny Qwen3-Next: the
unit mover goes through the copy engine's host path (side streams, events:
a load orders the current stream before the forward that reads it), greedy
tokens identical to the run without caching, states and KV blocks resumed
from pinned host memory, a warm host tier serving a cold GPU. Skipped
without a CUDA device and GPU kernels."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.24")  # what statecache.models needs

import statecache as sc  # noqa: E402
from statecache.engine.conversations import make_workload, serve  # noqa: E402
from statecache.models import build_engine, build_model  # noqa: E402
from statecache.tiers import HostTier  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and sc.has_gpu_kernels),
        reason="needs a CUDA/HIP device and statecache built with GPU kernels",
    ),
]


def run(model, *, caching=True, tiers=None, num_blocks=56):
    eng = build_engine(
        "qwen3next",
        "page",
        device="cuda",
        model_and_geom=model,
        enable_prefix_caching=caching,
        num_blocks=num_blocks,
        tiers=tiers,
    )
    step = eng.step

    def checked_step():
        out = step()
        if eng.tiering is not None:
            eng.tiering.check_conservation()
        return out

    eng.step = checked_step
    convs, branches, at = make_workload(3, 2, 3)
    return eng, serve(eng, convs, branches, at, 4)


def test_host_tier_on_a_gpu_resumes_with_identical_tokens():
    model = build_model("qwen3next", seed=0, device="cuda")
    reference = [r.output_token_ids for r in run(model, caching=False, num_blocks=256)[1]]
    probe = build_engine("qwen3next", "page", device="cuda", model_and_geom=model, num_blocks=8)
    spec = probe.caches.coordinator.store.spec
    ub, upc = spec.page_unit_bytes, spec.units_per_checkpoint
    host = HostTier((64 * upc + 256) * ub, ub, kv_bytes=256 * ub)
    assert host.pinned
    eng, rows = run(model, tiers=[host])
    assert [r.output_token_ids for r in rows] == reference
    assert eng.tiering.mover._arena is not None  # moves go through the host path, not a bounce
    st = eng.tiering.stats()
    assert st["state_offloaded"] > 0 and st["kv_offloaded"] > 0
    assert st["state_loaded_host"] + st["kv_loaded_host"] > 0 and st["loads_untrusted"] == 0
    eng.close()
    # A cold GPU on the warm host tier: what it resumes came over the link.
    eng2, rows2 = run(model, tiers=[host])
    assert [r.output_token_ids for r in rows2] == reference
    st2 = eng2.tiering.stats()
    assert st2["state_loaded_host"] > 0 and st2["kv_loaded_host"] > 0 and st2["loads_untrusted"] == 0
    eng2.close()
