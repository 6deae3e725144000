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


class PoolThroughPython:
    """A statecache.BlockPool behind the reference's pool protocol in Python:
    a store or coordinator on it takes every unit call (num_free,
    reserve_units, release_units, rekey_units) through the generic path
    (docs/paged.md, "Pool protocol"); the KV side and checks go straight to
    the BlockPool. `calls` counts the protocol calls."""

    def __init__(self, inner: sc.BlockPool) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "calls", {})

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def num_free(self) -> int:
        self._count("num_free")
        return self._inner.num_free

    def reserve_units(self, count, owner):
        self._count("reserve_units")
        return self._inner.reserve_units(count, owner)

    def release_units(self, unit_ids, owner):
        self._count("release_units")
        self._inner.release_units(unit_ids, owner)

    def rekey_units(self, unit_ids, old_owner, new_owner):
        self._count("rekey_units")
        self._inner.rekey_units(unit_ids, old_owner, new_owner)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


_NO_OWNER = object()


class ListPool:
    """Page units in plain Python: the reference's pool protocol and nothing
    of statecache. Free units are handed out lowest id first; a release or
    rekey by an owner that does not hold every listed unit raises ValueError,
    changing nothing."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack, lowest id on top
        self._owner: dict = {}
        self.on_evict = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_reserved(self) -> int:
        return len(self._owner)

    num_kv_blocks = 0

    def reserve_units(self, count, owner):
        if count < 0:
            raise ValueError(f"count={count} must be >= 0")
        hash(owner)
        if count > len(self._free):
            return None
        units = [self._free.pop() for _ in range(count)]
        for u in units:
            self._owner[u] = owner
        return units

    def _check(self, unit_ids, owner) -> list:
        ids = list(unit_ids)
        if len(set(ids)) != len(ids) or any(self._owner.get(u, _NO_OWNER) != owner for u in ids):
            raise ValueError(f"unit_ids {ids} are not all held by {owner!r}")
        return ids

    def release_units(self, unit_ids, owner):
        for u in self._check(unit_ids, owner):
            del self._owner[u]
            self._free.append(u)

    def rekey_units(self, unit_ids, old_owner, new_owner):
        for u in self._check(unit_ids, old_owner):
            self._owner[u] = new_owner

    def owner_of(self, unit):
        return self._owner.get(unit)

    def check_consistency(self) -> None:
        assert len(set(self._free)) == len(self._free)
        assert not set(self._free) & set(self._owner)
        assert len(self._free) + len(self._owner) == self.num_blocks


def make_pool(kind: str, num_blocks: int):
    """'block': a statecache.BlockPool; 'python': one behind PoolThroughPython;
    'list': a ListPool."""
    if kind == "block":
        return sc.BlockPool(num_blocks)
    if kind == "python":
        return PoolThroughPython(sc.BlockPool(num_blocks))
    return ListPool(num_blocks)
