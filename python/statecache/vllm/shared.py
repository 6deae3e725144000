"""Opening the configured shared tier (Mooncake Store or Redis) for the
connector (docs/vllm.md, "How it works")."""

from __future__ import annotations

from statecache.tiers.base import Tier
from statecache.vllm.config import SharedTierConfig

_MOONCAKE = {
    "master_addr",
    "metadata_server",
    "local_host",
    "protocol",
    "device_names",
    "segment_bytes",
    "staging_bytes",
}
_REDIS = {"host", "port", "db", "password"}


def open_shared_tier(cfg: SharedTierConfig, timeout_s: float, *, staging_bytes: int | None = None) -> Tier:
    """Returns a client of the shared tier ``cfg`` names. Raises ValueError
    for unknown options, ImportError without the client library, TierError
    when the tier cannot be reached."""
    opts = dict(cfg.options)
    if cfg.kind == "mooncake":
        bad = sorted(set(opts) - _MOONCAKE)
        if bad:
            raise ValueError(
                f"kv_connector_extra_config['mooncake'] has unknown options {bad}; known: {sorted(_MOONCAKE)}"
            )
        from statecache.tiers.mooncake_tier import MooncakeTier

        if staging_bytes is not None:
            opts.setdefault("staging_bytes", staging_bytes)
        master, meta = opts.pop("master_addr"), opts.pop("metadata_server")
        return MooncakeTier(master, meta, timeout_s=timeout_s, **opts)
    if cfg.kind == "redis":
        bad = sorted(set(opts) - _REDIS)
        if bad:
            raise ValueError(f"kv_connector_extra_config['redis'] has unknown options {bad}; known: {sorted(_REDIS)}")
        from statecache.tiers.redis_tier import RedisTier

        return RedisTier(timeout_s=timeout_s, **opts)
    raise ValueError(f"shared tier kind {cfg.kind!r}: use 'mooncake' or 'redis'")
