"""statecache inside vLLM: ``StateCacheConnector``, a KV connector for hybrid
models (docs/vllm.md). This subpackage imports vLLM; nothing else in
statecache does.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "StateCacheConnector",
        "kv_connector_module_path": "statecache.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_memory": "4GB"}}'
"""

from statecache.vllm.connector import StateCacheConnector

__all__ = ["StateCacheConnector"]
