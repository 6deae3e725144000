"""The connector's settings: ``kv_connector_extra_config`` parsed and checked
(docs/vllm.md, "Settings"). Plain Python, no vLLM import."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from statecache.engine.deployment_key import deployment_key

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(value: Any, name: str) -> int:
    """Returns ``value`` in bytes: an int, or a str such as ``"4GB"``,
    ``"512 MiB"``, ``"1.5g"``. Raises TypeError / ValueError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be bytes as an int or a str with a unit, e.g. '4GB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}={value} must be >= 0")
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} must be bytes as an int or a str with a unit, e.g. '4GB'")
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{name}={value!r}: expected a number with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _positive_number(d: Mapping[str, Any], key: str, default: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"kv_connector_extra_config[{key!r}]={v!r} must be a positive number")
    return float(v)


@dataclass(frozen=True)
class SharedTierConfig:
    """A shared tier below the host tier: ``kind`` "mooncake" or "redis" and
    the client's keyword arguments."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)


_KNOWN = {
    "host_memory",
    "entry_bytes",
    "mooncake",
    "redis",
    "secret",
    "model_id",
    "save_decode",
    "shared_timeout_s",
    "lookup_timeout_s",
    "ranking",
}


@dataclass(frozen=True)
class ConnectorConfig:
    """What ``kv_connector_extra_config`` says (docs/vllm.md, "Settings")."""

    host_memory: int
    entry_bytes: int | None
    shared: SharedTierConfig | None
    secret: bytes
    secret_configured: bool
    model_id: str | None
    save_decode: bool
    shared_timeout_s: float
    lookup_timeout_s: float
    ranking: str
    # False for kv_role="kv_consumer": a read-only engine, as vLLM's store
    # connectors take that role (loads what other engines saved, saves nothing)
    saves: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None, kv_role: str | None = "kv_both") -> ConnectorConfig:
        """Parses ``kv_connector_extra_config`` (and vLLM's ``kv_role``);
        returns the config. Raises TypeError / ValueError naming the bad key
        before anything starts."""
        if kv_role not in ("kv_both", "kv_producer", "kv_consumer"):
            raise ValueError(f"kv_role={kv_role!r} must be 'kv_both', 'kv_producer' or 'kv_consumer'")
        d = dict(extra or {})
        unknown = sorted(set(d) - _KNOWN)
        if unknown:
            raise ValueError(
                f"kv_connector_extra_config has unknown keys {unknown}; the StateCacheConnector takes {sorted(_KNOWN)}"
            )
        host = parse_bytes(d.get("host_memory", "4GB"), "kv_connector_extra_config['host_memory']")
        entry = d.get("entry_bytes")
        if entry is not None:
            entry = parse_bytes(entry, "kv_connector_extra_config['entry_bytes']")
            if entry < 512 or entry % 512:
                raise ValueError(f"kv_connector_extra_config['entry_bytes']={entry} must be a multiple of 512 bytes")
        shared = None
        tiers = [k for k in ("mooncake", "redis") if d.get(k) is not None]
        if len(tiers) > 1:
            raise ValueError("kv_connector_extra_config: configure one shared tier, 'mooncake' or 'redis', not both")
        if tiers:
            opts = d[tiers[0]]
            if not isinstance(opts, Mapping):
                raise TypeError(f"kv_connector_extra_config[{tiers[0]!r}] must be a dict of client options")
            opts = dict(opts)
            if tiers[0] == "mooncake":
                for k in ("master_addr", "metadata_server"):
                    if not isinstance(opts.get(k), str) or not opts[k]:
                        raise ValueError(f"kv_connector_extra_config['mooncake'][{k!r}] must be a non-empty str")
            shared = SharedTierConfig(tiers[0], opts)
        if kv_role == "kv_consumer" and shared is None:
            raise ValueError(
                "kv_role='kv_consumer' saves nothing and loads what other engines saved to a shared tier: "
                "configure kv_connector_extra_config['mooncake'] or ['redis'] (or use kv_role='kv_both')"
            )
        raw = d.get("secret", os.environ.get("STATECACHE_SECRET"))
        if raw is not None and (not isinstance(raw, str) or len(raw) < 16):
            raise ValueError(
                "kv_connector_extra_config['secret'] (or STATECACHE_SECRET) must be a str of at least 16 characters"
            )
        if raw is not None and not _utf8(raw):  # e.g. an environment value of bytes that are not UTF-8
            raise ValueError("kv_connector_extra_config['secret'] (or STATECACHE_SECRET) must be valid UTF-8 text")
        if shared is not None and raw is None:
            raise ValueError(
                f"a shared tier ({shared.kind}) needs a deployment secret shared by every engine that uses it: "
                "set kv_connector_extra_config['secret'] or STATECACHE_SECRET (keep it secret: whoever knows it "
                "can name your prefixes)"
            )
        # unset: the process's random key, the one the engine draws (engine/deployment_key.py)
        key = deployment_key(salt=raw)
        salt = key.salt.encode() if isinstance(key.salt, str) else key.salt or b""
        secret = hashlib.blake2b(salt, digest_size=32).digest()
        model_id = d.get("model_id")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise ValueError(f"kv_connector_extra_config['model_id']={model_id!r} must be a non-empty str")
        save_decode = d.get("save_decode", True)
        if not isinstance(save_decode, bool):
            raise TypeError(f"kv_connector_extra_config['save_decode']={save_decode!r} must be a bool")
        ranking = d.get("ranking", "cost")
        if ranking not in ("cost", "lru"):
            raise ValueError(f"kv_connector_extra_config['ranking']={ranking!r} must be 'cost' or 'lru'")
        return cls(
            host_memory=host,
            entry_bytes=entry,
            shared=shared,
            secret=secret,
            secret_configured=key.configured,
            model_id=model_id,
            save_decode=save_decode,
            shared_timeout_s=_positive_number(d, "shared_timeout_s", 5.0),
            lookup_timeout_s=_positive_number(d, "lookup_timeout_s", 1.0),
            ranking=ranking,
            saves=kv_role != "kv_consumer",
        )
