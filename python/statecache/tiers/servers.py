"""Starting and stopping the servers the shared tiers talk to, on loopback
only: ``mooncake_master``, Mooncake's HTTP metadata server, a
``mooncake_client`` that contributes the store's memory, and
``redis-server``. Used by the tests, the demo and the benchmarks; production
deployments run their own, bound where they choose (docs/tiers.md,
"Network exposure").

Every listening socket is bound to 127.0.0.1 but the transfer engine's:
Mooncake binds its handshake and TCP-transport listeners to the wildcard
address, with no option to change it; what it advertises to peers (the data
path) is loopback (``MC_TCP_BIND_ADDRESS``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _find(binary: str, extra: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise FileNotFoundError(f"{binary} was not found on PATH; install it with {extra}")
    return path


class ServerProcess:
    """One server process: started with ``start()``, ready once ``port``
    accepts connections, stopped with ``stop()`` (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: str, env: dict[str, str] | None = None):
        self.name, self.argv, self.port = name, argv, port
        self.env = None if env is None else {**os.environ, **env}
        self.log_path = os.path.join(log_dir, f"{name}-{port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> ServerProcess:
        log = open(self.log_path, "ab")
        proc = self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not _listening(self.port):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {proc.returncode} before listening on {self.port}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} did not listen on {self.port} within {timeout_s} s")
            time.sleep(0.05)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


class MooncakeServers:
    """A ``mooncake_master``, an HTTP metadata server and one
    ``mooncake_client`` holding ``segment_bytes`` of store memory, all on
    127.0.0.1 over TCP. ``master_addr`` / ``metadata_url`` are what a
    ``MooncakeTier`` connects to.

    The metadata server is Mooncake's own Python one
    (``mooncake.http_metadata_server``), not the master's embedded one: that
    one binds every interface whatever ``--http_metadata_server_host`` says."""

    def __init__(self, segment_bytes: int = 256 << 20, log_dir: str | None = None, lease_ms: int = 2000):
        master = _find(
            "mooncake_master",
            "pip install 'statecache[mooncake]' (mooncake-transfer-engine, or -non-cuda without a GPU)",
        )
        client = _find("mooncake_client", "pip install 'statecache[mooncake]'")
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="statecache-mooncake-")
        self.rpc_port, self.http_port, self.metrics_port, self.holder_port = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        )
        self.master_addr = f"127.0.0.1:{self.rpc_port}"
        self.metadata_url = f"http://127.0.0.1:{self.http_port}/metadata"
        self.segment_bytes = segment_bytes
        self.metadata = ServerProcess(
            "mooncake_http_metadata",
            [
                sys.executable,
                "-m",
                "mooncake.http_metadata_server",
                "--host=127.0.0.1",
                f"--port={self.http_port}",
                "--log-level=WARNING",
            ],
            self.http_port,
            self.log_dir,
        )
        self.master = ServerProcess(
            "mooncake_master",
            [
                master,
                f"--rpc_port={self.rpc_port}",
                "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=false",
                f"--metrics_port={self.metrics_port}",
                "--metrics_host=127.0.0.1",
                f"--default_kv_lease_ttl={lease_ms}",
            ],
            self.rpc_port,
            self.log_dir,
        )
        self.holder = ServerProcess(
            "mooncake_client",
            [
                client,
                "--host=127.0.0.1",
                f"--port={self.holder_port}",
                f"--global_segment_size={segment_bytes}",
                "--local_buffer_size=0",
                f"--master_server_address={self.master_addr}",
                f"--metadata_server={self.metadata_url}",
                "--protocol=tcp",
            ],
            self.holder_port,
            self.log_dir,
            env={"MC_TCP_BIND_ADDRESS": "127.0.0.1"},  # the address its transfer engine advertises
        )

    def start(self, timeout_s: float = 30.0) -> MooncakeServers:
        try:
            self.metadata.start(timeout_s)
            self.master.start(timeout_s)
            self.holder.start(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.wait_mounted(timeout_s)
        return self

    def wait_mounted(self, timeout_s: float = 30.0) -> None:
        """Waits until the holder's segment is mounted (a put succeeds)."""
        from .mooncake_tier import MooncakeTier

        deadline = time.monotonic() + timeout_s
        probe = MooncakeTier(self.master_addr, self.metadata_url, timeout_s=timeout_s)
        try:
            key = f"statecache/probe/{os.getpid()}/{time.monotonic_ns()}"
            while not probe.put_many([key], [[b"ok"]])[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the mooncake store accepted no put: no segment mounted")
                time.sleep(0.1)
            probe.remove_many([key])
        finally:
            probe.close()

    def restart_master(self, timeout_s: float = 30.0) -> None:
        """Kills the master and starts a fresh one on the same ports (its
        objects are gone); the metadata server and the holder stay, and the
        holder mounts its segment again."""
        self.master.kill()
        self.master.start(timeout_s)

    @property
    def processes(self) -> list[ServerProcess]:
        return [self.metadata, self.master, self.holder]

    def stop(self) -> None:
        self.holder.stop()
        self.master.stop()
        self.metadata.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """``redis-server`` on 127.0.0.1, no persistence, ``maxmemory`` bytes
    (0: unbounded) with no eviction, so a full store refuses writes."""

    def __init__(self, maxmemory: int = 0, log_dir: str | None = None):
        binary = _find("redis-server", "apt-get install redis-server")
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="statecache-redis-")
        self.port = free_port()
        self.server = ServerProcess(
            "redis-server",
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.log_dir,
                "--maxmemory",
                str(maxmemory),
                "--maxmemory-policy",
                "noeviction",
                "--protected-mode",
                "yes",
            ],
            self.port,
            self.log_dir,
        )

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        self.server.start(timeout_s)
        return self

    def stop(self) -> None:
        self.server.stop()

    def pause(self) -> None:
        self.server.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.server.signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
