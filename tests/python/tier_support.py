"""Real servers on loopback for the tier tests (started and stopped here,
bounded waits) and helpers shared by the tier test modules."""

from __future__ import annotations

import shutil

import numpy as np
import pytest


def need(binary: str, extra: str) -> None:
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed ({extra}); .ci/run installs it")


def mooncake_servers(segment_bytes: int = 64 << 20):
    need("mooncake_master", "pip install 'statecache[mooncake]'")
    from statecache.tiers.servers import MooncakeServers

    return MooncakeServers(segment_bytes=segment_bytes).start(timeout_s=60)


def redis_server(maxmemory: int = 0):
    need("redis-server", "apt-get install redis-server")
    from statecache.tiers.servers import RedisServer

    return RedisServer(maxmemory=maxmemory).start(timeout_s=30)


def corrupt_one_byte(tier, key: str, offset: int) -> None:
    """Flips one byte of the value stored under ``key`` in the real store
    (read it, remove it, write the altered bytes back)."""
    size = _size(tier, key)
    buf = np.zeros(size, np.uint8)
    assert tier.get_many_into([key], [[buf]]) == [size]
    buf[offset % size] ^= 0x5A
    assert tier.remove_many([key]) == [True]
    assert tier.put_many([key], [[buf]]) == [True]


def _size(tier, key: str) -> int:
    if tier.name == "redis":
        return tier._r.strlen(key)
    return tier._call(lambda: tier._store.get_size(key))
