"""Side-by-side drivers for the differential PAGE tests.

Each side gets its own statecache.BlockPool; the reference classes run on it
through the loader's shim. Every call goes to both sides; results and public
attributes are normalized to plain data and compared after every step.
"""

from __future__ import annotations

import statecache as sc


def norm(x):
    """Plain, comparable data: type-tagged so list/tuple and bool/int differ."""
    name = type(x).__name__
    if x is None or isinstance(x, (bool, int, str, float)):
        return (name, x)
    if isinstance(x, sc.StateStoreOperationId):
        return ("op", int(x[0]), int(x[1]))
    if name in ("CheckpointStoreOp", "CheckpointRestoreOp"):
        slot = x.src_slot if name == "CheckpointStoreOp" else x.dst_slot
        return (name, slot, norm(x.unit_ids), x.total_bytes, x.layout_id)
    if name == "CheckpointRecord":
        return (name, x.prefix_hash, norm(x.unit_ids), x.state, x.pin_count)
    if name == "SuspendedCheckpointRestore":
        return (name, x.checkpoint_id, norm(x.operation))
    if isinstance(x, (set, frozenset)):
        return ("set", sorted(x))
    if isinstance(x, dict):
        return ("dict", sorted((k, norm(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (name if name in ("list", "tuple") else "tuple", [norm(v) for v in x])
    raise TypeError(f"cannot normalize {name}")


def call(obj, method, *args, **kw):
    """('ok', result) or ('raise', exception type name)."""
    try:
        return ("ok", getattr(obj, method)(*args, **kw))
    except (AssertionError, ValueError, TypeError, IndexError, KeyError) as e:
        return ("raise", type(e).__name__)


def store_state(store) -> dict:
    return {
        "generation": store.generation,
        "evictions": store.evictions,
        "offload_pins_reclaimed": store.offload_pins_reclaimed,
        "offload_nominations_dropped": store.offload_nominations_dropped,
        "units_per_checkpoint": store.units_per_checkpoint,
        "records": norm({k: v for k, v in store.records.items()}),
        "record_order": list(store.records.keys()),
        "hash_to_checkpoint": norm(dict(store.hash_to_checkpoint.items())),
        "hash_order": list(store.hash_to_checkpoint.keys()),
        "store_backlog": list(store.store_backlog),
        "has_offload_pins": store.has_offload_pins(),
        "pool_free": store.pool.num_free,
        "spec": store.spec.to_wire(),
    }


def check_conservation(pool) -> None:
    """docs/contract.md, "Invariants": free + reserved-by-owner (+ KV-held) == num_blocks."""
    assert pool.num_free + pool.num_reserved + pool.num_kv_blocks == pool.num_blocks
    pool.check_consistency()
    owned = sum(1 for u in range(pool.num_blocks) if pool.owner_of(u) is not None)
    assert owned == pool.num_reserved


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeScratch:
    """A scratch slot pool with the three calls the coordinator makes."""

    def __init__(self, n: int) -> None:
        self.free = list(range(n))
        self.n = n

    def has_free(self, count: int = 1) -> bool:
        return len(self.free) >= count

    def pop(self) -> int:
        self.free.sort()
        return self.free.pop(0)

    def release(self, slot: int) -> None:
        assert 0 <= slot < self.n and slot not in self.free, slot
        self.free.append(slot)
