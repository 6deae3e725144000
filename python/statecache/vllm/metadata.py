"""What the scheduler-side connector tells the workers each step, and what
the workers report back (docs/vllm.md, "How it works"). Plain picklable
values: with tensor parallelism they cross process boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata


def arena_key(kind: str, prefix_key: bytes) -> str:
    """The host index's name of a value (every rank holds its shard under it)."""
    return arena_key_hex(kind, prefix_key.hex())


def arena_key_hex(kind: str, prefix_hex: str) -> str:
    """``arena_key`` of a prefix key already in hex."""
    return f"{kind}/{prefix_hex}"


@dataclass
class Value:
    """One value below vLLM's memory: ``kind`` ("kv" or "state") of the
    prefix ``prefix_key`` (16 bytes), in host ``entries``, moved to or from
    vLLM ``blocks`` (one per group of that kind, in group order)."""

    kind: str
    prefix_key: bytes
    entries: list[int]
    blocks: list[int]

    @property
    def key(self) -> str:
        return arena_key(self.kind, self.prefix_key)


@dataclass
class Load:
    """The values one request resumes from, and each one's trusted headers:
    ``headers[i][rank]`` for a value the host holds, ``None`` for one to fetch
    from the shared tier first. ``fail``: planning found a value gone, so the
    load is reported failed and vLLM recomputes."""

    req_id: str
    values: list[Value]
    headers: list[list[bytes] | None]
    fail: bool = False


@dataclass
class StateCacheMeta(KVConnectorMetadata):
    """One step's work: saves of what this step computes (run after the
    forward) and loads for admitted requests."""

    saves: list[Value] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    shared_writes: bool = False  # write saved values through to the shared tier
    finished_saves: list[str] = field(default_factory=list)  # finished requests whose blocks wait for these saves


@dataclass
class WorkerReport(KVConnectorWorkerMetadata):
    """Per rank, what happened to the step's saves and loads; merged across
    ranks (``aggregate``) before the scheduler reads it."""

    saved: dict[str, dict[int, bytes]] = field(default_factory=dict)  # key -> rank -> header
    save_failed: dict[str, set[int]] = field(default_factory=dict)
    fetched: dict[str, dict[int, bytes]] = field(default_factory=dict)  # staged from the shared tier, verified
    fetch_failed: dict[str, dict[int, str]] = field(default_factory=dict)  # key -> rank -> why
    untrusted: dict[str, set[int]] = field(default_factory=dict)  # host copies that failed their check
    shared_done: dict[str, set[int]] = field(default_factory=dict)
    shared_failed: dict[str, set[int]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> WorkerReport:
        assert isinstance(other, WorkerReport)
        for name in ("saved", "fetched", "fetch_failed"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for k, per_rank in theirs.items():
                mine.setdefault(k, {}).update(per_rank)
        for name in ("save_failed", "untrusted", "shared_done", "shared_failed"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for k, ranks in theirs.items():
                mine.setdefault(k, set()).update(ranks)
        for k, v in other.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v
        return self

    def empty(self) -> bool:
        return not (
            self.saved
            or self.save_failed
            or self.fetched
            or self.fetch_failed
            or self.untrusted
            or self.shared_done
            or self.shared_failed
            or self.counters
        )
