"""statecache inside vLLM: ``StateCacheConnector``, a KV connector for hybrid
models (docs/vllm.md). Only this subpackage imports vLLM, and only when the
connector is asked for (``statecache.vllm.moves``, the byte moves, needs
torch alone).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "StateCacheConnector",
        "kv_connector_module_path": "statecache.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_memory": "4GB"}}'
"""

from __future__ import annotations

from typing import Any

__all__ = ["StateCacheConnector"]


def __getattr__(name: str) -> Any:
    # vLLM's connector factory does getattr(import_module(path), name)
    if name == "StateCacheConnector":
        from statecache.vllm.connector import StateCacheConnector

        return StateCacheConnector
    raise AttributeError(f"module 'statecache.vllm' has no attribute {name!r}")
