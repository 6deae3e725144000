"""Real servers on loopback for the tier tests (started and stopped here,
bounded waits) and helpers shared by the tier test modules."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest


def need(binary: str, extra: str) -> None:
    """Skips without ``binary`` on PATH; fails under CI (CI=true), where a
    skip would hide a missing install step of .ci/run."""
    if shutil.which(binary) is None:
        msg = f"{binary} is not installed ({extra}); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}, but not on PATH here")
        pytest.skip(msg)


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


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, read
    from /proc (its fds' socket inodes against /proc/<pid>/net/tcp{,6})."""
    import ipaddress
    import os

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                addr, port = cols[1].split(":")
                raw = bytes.fromhex(addr)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                    ip = ip.ipv4_mapped
                out.append((str(ip), int(port, 16)))
    return out


def non_loopback(sockets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    import ipaddress

    return [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
