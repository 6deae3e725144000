"""Servers the project starts listen on loopback only (issue 18, item 10):
``mooncake_master``, Mooncake's HTTP metadata server, the store's
``mooncake_client``, ``redis-server`` and the Prometheus exporter. Sockets are
read from /proc for the servers' own pids; nothing is mocked. The Mooncake
transfer engine is the exception this project cannot close: its listeners
bind the wildcard address with no option (the last test, expected to fail
until Mooncake has one); what it advertises to its peers is loopback."""

import os
import re

import pytest

from tier_support import listening_sockets, mooncake_servers, non_loopback, redis_server

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="reads sockets from Linux /proc")

# The transfer engine's listeners in Mooncake 0.3.x: the handshake / RPC port
# (bound to INADDR_ANY in transfer_metadata_plugin.cpp) and the TCP transport
# (an IPv6 dual-stack wildcard acceptor in tcp_transport_session_impl.h).
TE_LISTENERS = 2


@pytest.fixture(scope="module")
def mooncake():
    servers = mooncake_servers(64 << 20)
    yield servers
    servers.stop()


def test_mooncake_master_and_metadata_server_listen_on_loopback_only(mooncake):
    for proc in (mooncake.master, mooncake.metadata):
        socks = listening_sockets(proc.proc.pid)
        assert socks, f"{proc.name} listens nowhere?"
        assert non_loopback(socks) == [], f"{proc.name} listens on {non_loopback(socks)}"
    master_ports = {p for _, p in listening_sockets(mooncake.master.proc.pid)}
    assert {mooncake.rpc_port, mooncake.metrics_port} <= master_ports


def test_the_store_client_listens_on_loopback_but_for_its_transfer_engine(mooncake):
    socks = listening_sockets(mooncake.holder.proc.pid)
    assert ("127.0.0.1", mooncake.holder_port) in socks
    assert len(non_loopback(socks)) <= TE_LISTENERS
    # what its transfer engine advertises to peers (the data path) is loopback
    with open(mooncake.holder.log_path) as f:
        advertised = re.findall(r"Transfer Engine RPC .* listening on ([^:\s]+):\d+", f.read())
    assert advertised and set(advertised) == {"127.0.0.1"}


def test_the_clients_transfer_engine_advertises_loopback(mooncake, capfd):
    from statecache.tiers.mooncake_tier import MooncakeTier

    before = set(listening_sockets(os.getpid()))
    tier = MooncakeTier(mooncake.master_addr, mooncake.metadata_url, timeout_s=10.0)
    try:
        assert tier.put_many(["statecache/loopback"], [[b"x" * 64]]) == [True]
        added = set(listening_sockets(os.getpid())) - before
        assert len(non_loopback(sorted(added))) <= TE_LISTENERS
        assert "MC_TCP_BIND_ADDRESS" not in os.environ  # set for the setup call only
    finally:
        tier.close()
    advertised = re.findall(r"Transfer Engine RPC .* listening on ([^:\s]+):\d+", capfd.readouterr().err)
    assert advertised and set(advertised) == {"127.0.0.1"}


def test_redis_listens_on_loopback_only():
    srv = redis_server()
    try:
        socks = listening_sockets(srv.server.proc.pid)
        assert ("127.0.0.1", srv.port) in socks and non_loopback(socks) == []
    finally:
        srv.stop()


def test_the_prometheus_exporter_listens_on_loopback_only():
    pytest.importorskip("prometheus_client")
    from statecache.metrics import StateCacheMetrics

    before = set(listening_sockets(os.getpid()))
    server = StateCacheMetrics().serve(0)
    try:
        added = set(listening_sockets(os.getpid())) - before
        assert added and non_loopback(sorted(added)) == []
    finally:
        server.shutdown()


@pytest.mark.xfail(
    strict=True,
    reason="Mooncake binds the transfer engine's listeners to the wildcard address and has no option "
    "to change it (kvcache-ai/Mooncake#1938); passes once it does",
)
def test_the_transfer_engines_listen_on_loopback_only(mooncake):
    from statecache.tiers.mooncake_tier import MooncakeTier

    tier = MooncakeTier(mooncake.master_addr, mooncake.metadata_url, timeout_s=10.0)
    try:
        assert non_loopback(listening_sockets(mooncake.holder.proc.pid)) == []
        assert non_loopback(listening_sockets(os.getpid())) == []
    finally:
        tier.close()
