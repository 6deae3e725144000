# Type stubs for statecache._C, the C++ extension (pybind11).
#
# Kept by hand; tests/python/test_stubs.py compares this file with the built
# module (names, kinds and parameters) and fails on any drift. After changing
# the bindings run `python tests/python/stubcheck.py` for the differences and
# `python tests/python/stubcheck.py --skeleton` for stub lines of new names.
#
# Conventions of the whole API (docs/contract.md, "Errors"): a bad argument
# raises TypeError (wrong type), ValueError (bad value), IndexError (slot,
# group, block or unit out of range) or OverflowError (an int beyond int64),
# naming the argument, before anything changes. "Raises" below lists what a
# method raises beyond that.

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from collections.abc import Sequence as _Seq
from typing import (
    Any,
    ClassVar,
    Final,
    Literal,
    NoReturn,
    Protocol,
    SupportsIndex,
    TypeAlias,
    TypedDict,
    overload,
)

import numpy as np
import numpy.typing as npt

from statecache._operation_id import StateStoreOperationId

# ----------------------------------------------------------------- aliases --

_Int: TypeAlias = SupportsIndex
#: a list / tuple of ints, or a 1-D NumPy integer array (hash lists)
_Ints: TypeAlias = _Seq[SupportsIndex] | npt.NDArray[np.integer[Any]]
_Owner: TypeAlias = Hashable
_CheckpointState: TypeAlias = Literal["COPYING", "READY", "EVICTING"]
_TransferKind: TypeAlias = Literal["none", "fork", "copy", "replay"]
_EvictionKind: TypeAlias = Literal["lru", "cost"]

class _EvictionPolicy(TypedDict):
    kind: _EvictionKind
    flops_per_token: float
    flops_per_context_token: float
    checkpoint_bytes: float
    tokens_per_position: float
    weight: float
    guesses_first: bool

#: a midstep reservation: (slot, position, prefix hash)
_Midstep: TypeAlias = tuple[int, int, int]

class _SequenceLike(Protocol):
    """What the pools read and write on an engine's own request object (the
    generic path; ``Sequence`` is the fast one)."""

    num_tokens: int
    num_prompt_tokens: int
    state_slots: Any
    state_fork_src: int
    checkpoint_end_pos: int

_Seqish: TypeAlias = Sequence | _SequenceLike

# --------------------------------------------------------------- constants --

NONE: Final = "none"
FORK: Final = "fork"
COPY: Final = "copy"
REPLAY: Final = "replay"
COPYING: Final = "COPYING"
READY: Final = "READY"
EVICTING: Final = "EVICTING"

#: whether this build has the CUDA/HIP copy kernels (GpuCopyEngine exists)
has_gpu_kernels: bool

def build_info() -> dict[str, str | bool]:
    """Facts fixed when the extension was compiled: version, build_type,
    gpu_request, gpu_backend ('cuda', 'hip' or 'none'), gpu_archs, gpu_compiler,
    gpu_note (why there are no kernels, or ''), cxx_compiler, pybind11,
    sanitized. Returns a new dict; raises nothing."""

def chain_block_hashes(
    token_ids: _Ints, block_size: _Int, parent_hash: _Int = -1, as_numpy: bool = False
) -> Any:
    """Chained 64-bit content hashes of the full ``block_size``-token blocks of
    ``token_ids``, starting from ``parent_hash`` (-1: none). Returns a list of
    ints (a NumPy int64 array with ``as_numpy=True``); a trailing partial block
    gets no hash. Raises ValueError for ``block_size <= 0``."""

def chain_block_keys(
    token_ids: _Ints,
    block_size: _Int,
    parent_key: bytes | None = None,
    seed: _Int = 0,
    salt: bytes | str | None = None,
) -> tuple[list[int], bytes]:
    """The 128-bit prefix keys of the full blocks of ``token_ids`` (SipHash
    under a deployment key from ``seed`` and ``salt``), chained from
    ``parent_key`` (16 bytes; None: the root). Returns (64-bit scheduler hash
    of each block, the keys packed as ``16 * n`` bytes). Raises ValueError for
    ``block_size <= 0`` or a parent key that is not 16 bytes."""

def scheduler_hash(key: bytes) -> int:
    """Returns the 64-bit scheduler hash (never -1) the 16-byte prefix key
    names. Raises ValueError for a key that is not 16 bytes."""

def checkpoint_copy_ops_per_batch(max_num_seqs: _Int) -> int:
    """The most PAGE store + restore ops one batch of ``max_num_seqs``
    sequences can carry (executor staging size): two per sequence. Returns
    an int. (A negative count is not refused yet.)"""

class IntRangeError(OverflowError, ValueError):
    """An int argument that does not fit in a signed 64-bit int."""

# ------------------------------------------------------------ value types --

class StateTransfer:
    """How a backend keeps checkpoints: none, fork(tokens), copy(layout_id)
    or replay. Frozen; equality and hash by value; pickles."""

    NONE: ClassVar[str]
    FORK: ClassVar[str]
    COPY: ClassVar[str]
    REPLAY: ClassVar[str]
    def __init__(
        self,
        kind: _TransferKind,
        fork_tokens: _Int = 0,
        paged_layout_id: str | None = None,
        readable_midstep: bool = False,
    ) -> None:
        """Raises ValueError for an unknown kind, fork without ``fork_tokens > 0``,
        other kinds with ``fork_tokens != 0``, a ``paged_layout_id`` on anything
        but copy, or ``readable_midstep`` on none/replay."""
    @staticmethod
    def none() -> StateTransfer:
        """Returns the transfer that keeps nothing (every hit capped to 0)."""
    @staticmethod
    def fork(tokens: _Int, readable_midstep: bool = False) -> StateTransfer:
        """Returns a fork transfer whose successor forward commits ``tokens``.
        Raises ValueError for ``tokens <= 0``."""
    @staticmethod
    def copy(layout_id: str | None = None, readable_midstep: bool = False) -> StateTransfer:
        """Returns a copy (PAGE) transfer for ``layout_id``."""
    @staticmethod
    def replay() -> StateTransfer:
        """Returns the transfer whose resuming forward rebuilds the state (hits
        never shrink, nothing is kept)."""
    @staticmethod
    def from_config(
        kind: _TransferKind,
        fork_tokens: _Int = 0,
        paged_layout_id: str | None = None,
        readable_midstep: bool = False,
    ) -> StateTransfer:
        """Returns the transfer an engine config names; raises as the constructor."""
    @staticmethod
    def from_wire(wire: Mapping[str, Any]) -> StateTransfer:
        """Returns the transfer ``to_wire`` described. Raises TypeError for a
        non-mapping, ValueError for a wrong key set or bad values."""
    def to_wire(self) -> dict[str, Any]:
        """Returns a dict with exactly kind, fork_tokens, paged_layout_id,
        readable_midstep. Raises nothing."""
    @property
    def kind(self) -> _TransferKind: ...
    @property
    def fork_tokens(self) -> int: ...
    @property
    def paged_layout_id(self) -> str | None: ...
    @property
    def readable_midstep(self) -> bool: ...
    @property
    def copies(self) -> bool: ...
    @property
    def forks(self) -> bool: ...
    @property
    def replays(self) -> bool: ...
    @property
    def successor_room(self) -> float:
        """inf for none and replay, fork_tokens for fork, 0.0 for copy."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[StateTransfer], tuple[str, int, str | None, bool]]: ...

class SlotRetirement:
    """``retire_top`` of a slot pool: copy ``retired`` -> ``relocated_to``
    before the next forward and re-point the owner, unless
    ``held_checkpoint``. Frozen value."""

    def __init__(self, retired: _Int, relocated_to: _Int, held_checkpoint: bool) -> None: ...
    @property
    def retired(self) -> int: ...
    @property
    def relocated_to(self) -> int: ...
    @property
    def held_checkpoint(self) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[int, int, bool]]: ...

class GroupRetirement:
    """``retire_top`` of a group pool; fields as ``SlotRetirement``."""

    def __init__(self, retired: _Int, relocated_to: _Int, held_checkpoint: bool) -> None: ...
    @property
    def retired(self) -> int: ...
    @property
    def relocated_to(self) -> int: ...
    @property
    def held_checkpoint(self) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[int, int, bool]]: ...

class PagedStateCheckpointSpec:
    """A PAGE image's geometry: ``image_bytes`` of a ``slot_bytes`` slot
    scattered over ``units_per_checkpoint`` units of ``page_unit_bytes`` for
    the layout ``layout_id``. Frozen; value equality; pickles."""

    def __init__(
        self, page_unit_bytes: _Int, slot_bytes: _Int, layout_id: str, image_bytes: _Int
    ) -> None:
        """Raises ValueError unless every size is a positive int and
        ``image_bytes <= slot_bytes``; TypeError for a non-str layout_id."""
    @staticmethod
    def from_wire(wire: Mapping[str, Any]) -> PagedStateCheckpointSpec:
        """Returns the spec ``to_wire`` described. Raises TypeError for a
        non-mapping, ValueError for a wrong key set or bad values."""
    def to_wire(self) -> dict[str, Any]:
        """Returns the four fields as a dict. Raises nothing."""
    @property
    def page_unit_bytes(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def image_bytes(self) -> int: ...
    @property
    def layout_id(self) -> str: ...
    @property
    def units_per_checkpoint(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[Any, ...]]: ...

class CheckpointStoreOp:
    """Scatter slot ``src_slot``'s image into ``unit_ids``. Frozen value."""

    def __init__(
        self, src_slot: _Int, unit_ids: _Ints, total_bytes: _Int, layout_id: str
    ) -> None: ...
    @property
    def src_slot(self) -> int: ...
    @property
    def unit_ids(self) -> tuple[int, ...]: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def layout_id(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[Any, ...]]: ...

class CheckpointRestoreOp:
    """Gather the image in ``unit_ids`` into slot ``dst_slot``. Frozen value."""

    def __init__(
        self, dst_slot: _Int, unit_ids: _Ints, total_bytes: _Int, layout_id: str
    ) -> None: ...
    @property
    def dst_slot(self) -> int: ...
    @property
    def unit_ids(self) -> tuple[int, ...]: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def layout_id(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[Any, ...]]: ...

class SuspendedCheckpointRestore:
    """A queued restore taken back out of its batch (``suspend_queued_restore``)."""

    def __init__(self, checkpoint_id: _Int, operation: CheckpointRestoreOp) -> None: ...
    @property
    def checkpoint_id(self) -> int: ...
    @property
    def operation(self) -> CheckpointRestoreOp: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type, tuple[Any, ...]]: ...

class CheckpointRecord:
    """One PAGE checkpoint: hash, unit ids, state and pin count. Records from
    ``store.records`` are live, read-only views."""

    def __init__(
        self,
        prefix_hash: _Int,
        unit_ids: _Ints,
        state: _CheckpointState = "COPYING",
        pin_count: _Int = 0,
    ) -> None: ...
    @property
    def prefix_hash(self) -> int: ...
    @property
    def unit_ids(self) -> tuple[int, ...]: ...
    @property
    def state(self) -> _CheckpointState: ...
    @property
    def pin_count(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __reduce__(self) -> tuple[type, tuple[Any, ...]]: ...

# ------------------------------------------------------------------ views --

class IntListView:
    """A live list view over one of a Sequence's int-list fields."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: SupportsIndex, /) -> int: ...
    @overload
    def __getitem__(self, index: slice, /) -> list[int]: ...
    def __setitem__(self, index: SupportsIndex, value: _Int, /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, value: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def append(self, value: _Int, /) -> None:
        """Raises TypeError/OverflowError for a non-int."""
    def extend(self, values: Iterable[_Int], /) -> None:
        """Raises TypeError/OverflowError for a non-int element (nothing added)."""
    def pop(self, index: SupportsIndex = -1) -> int:
        """Returns the removed element. Raises IndexError when empty or out of range."""
    def clear(self) -> None:
        """Empties the list."""
    def copy(self) -> list[int]:
        """Returns a plain list snapshot."""

class UnitHashView:
    """``slot_hash`` / ``group_hash``: the hash filed at each index (-1 if none)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, value: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def count(self, value: object, /) -> int:
        """Returns how many indices carry ``value``."""
    def index(self, value: object, /) -> int:
        """Raises ValueError when absent."""
    def copy(self) -> list[int]:
        """Returns a plain list snapshot."""
    def tolist(self) -> list[int]:
        """Returns a plain list snapshot."""

class CheckpointIndexView:
    """``hash_to_slot`` / ``hash_to_group``: a live read-only mapping hash -> index."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: _Int, /) -> int:
        """Raises KeyError for a hash with no checkpoint."""
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def get(self, key: object, default: Any = None) -> Any:
        """Returns the value under ``key``, or ``default``."""
    def keys(self) -> Any:
        """Returns a snapshot of the keys."""
    def values(self) -> Any:
        """Returns a snapshot of the values."""
    def items(self) -> Any:
        """Returns a snapshot of the items."""
    def copy(self) -> dict[int, int]:
        """Returns a plain dict snapshot."""

class CheckpointRecordsView:
    """``store.records``: a live read-only mapping checkpoint id -> record."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: _Int, /) -> CheckpointRecord:
        """Raises KeyError for an unknown id."""
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def get(self, key: object, default: Any = None) -> Any:
        """Returns the value under ``key``, or ``default``."""
    def keys(self) -> list[int]:
        """Returns a snapshot of the keys."""
    def values(self) -> list[CheckpointRecord]:
        """Returns a snapshot of the values."""
    def items(self) -> list[tuple[int, CheckpointRecord]]:
        """Returns a snapshot of the items."""
    def copy(self) -> dict[int, CheckpointRecord]:
        """Returns a plain dict snapshot."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

class CheckpointHashIndexView:
    """``store.hash_to_checkpoint``: a live read-only mapping hash -> checkpoint id."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: _Int, /) -> int:
        """Raises KeyError for a hash with no READY checkpoint."""
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def get(self, key: object, default: Any = None) -> Any:
        """Returns the value under ``key``, or ``default``."""
    def keys(self) -> list[int]:
        """Returns a snapshot of the keys."""
    def values(self) -> list[int]:
        """Returns a snapshot of the values."""
    def items(self) -> list[tuple[int, int]]:
        """Returns a snapshot of the items."""
    def copy(self) -> dict[int, int]:
        """Returns a plain dict snapshot."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

class OffloadBacklogView:
    """Checkpoint ids nominated for the offload tier, oldest first."""

    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __getitem__(self, index: SupportsIndex, /) -> int: ...
    def __iter__(self) -> Iterator[int]: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

class OffloadHashesView:
    """The hashes a tier holds (``StateOffloadIndex.hashes``), LRU order."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, h: object, /) -> bool: ...
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

# --------------------------------------------------------------- sequence --

class Sequence:
    """The per-request fields the pools read and write; subclass it in the
    engine (call ``super().__init__``); extra attributes are allowed."""

    def __init__(
        self,
        seq_id: Any = None,
        num_tokens: _Int = 0,
        num_prompt_tokens: _Int = 0,
        has_per_req_cache: bool = True,
    ) -> None:
        """Raises TypeError/OverflowError for non-int counts."""
    seq_id: Any
    num_tokens: int
    num_prompt_tokens: int
    has_per_req_cache: bool
    state_fork_src: int
    per_req_cache_group: int
    pending_checkpoint: int
    checkpoint_end_pos: int
    midstep_anchor_pos: int
    @property
    def state_slots(self) -> IntListView:
        """Element 0 is the committed slot, the rest speculative rollback slots;
        assigning replaces the whole list (TypeError for a non-int element)."""
    @state_slots.setter
    def state_slots(self, value: Iterable[_Int]) -> None: ...
    @property
    def state_slot(self) -> int:
        """``state_slots[0]``, or -1 when empty; assigning replaces element 0."""
    @state_slot.setter
    def state_slot(self, value: _Int) -> None: ...
    @property
    def block_hashes(self) -> IntListView: ...
    @block_hashes.setter
    def block_hashes(self, value: Iterable[_Int]) -> None: ...

# ------------------------------------------------------------------ pools --

class StateSlotPool:
    """Per-need state slots with fork checkpoints (docs/contract.md, "Objects"): vacant slots lowest first, checkpointed ones spent LRU (guesses
    first); speculative-decode rollback slots, midstep reserve/publish,
    relocations. A copy transfer raises ValueError (use the PAGE coordinator)."""

    def __init__(
        self,
        num_slots: _Int,
        transfer: StateTransfer | None = None,
        hash_block_size: _Int = 1,
        enabled: bool = True,
    ) -> None:
        """``transfer`` None means none(). Raises ValueError for a copy
        transfer, ``num_slots < 0`` or ``hash_block_size <= 0``."""
    num_slots: int
    hash_block_size: int
    enabled: bool
    min_fork_tokens: int
    readable_midstep: bool
    successor_room: float
    checkpoints_kept: int
    checkpoints_dropped: int
    checkpoints_evicted: int
    checkpoints_orphaned: int
    @property
    def transfer(self) -> StateTransfer: ...
    @property
    def hash_to_slot(self) -> CheckpointIndexView: ...
    @property
    def slot_hash(self) -> UnitHashView: ...
    def has_free(self, count: _Int = 1) -> bool:
        """Returns whether ``count`` slots can be handed out now (checkpointed
        slots count: pop spends them). Raises ValueError for ``count < 0``."""
    def num_free(self) -> int:
        """Returns how many slots are free (vacant or checkpointed)."""
    def pop(self) -> int:
        """Returns a slot now owned by the caller: vacant lowest first, else the
        LRU checkpoint (counted evicted). Raises IndexError when nothing is free."""
    def pop_many(self, count: _Int) -> list[int]:
        """Returns ``count`` slots for one request, element 0 first. Raises
        IndexError when fewer are free (nothing taken), ValueError for count < 0."""
    def release(self, slot: _Int) -> None:
        """Hands an owned slot back (to the LRU tail, or the head if speculative,
        when it carries a checkpoint). Raises ValueError if it is already free."""
    def release_many(self, slots: Iterable[_Int] | None) -> None:
        """Hands back a request's set; -1 entries, None and an empty list are
        skipped. Raises as ``release`` for any bad entry, before releasing any."""
    def claim(self, slot: _Int) -> None:
        """Takes one specific free slot off the free list, checkpoint and all."""
    def promote(self, slot: _Int) -> None:
        """A guess paid off: the slot's checkpoint is no longer spent first."""
    def mark_speculative(self, slot: _Int) -> None:
        """Files this slot's checkpoint at the LRU head when it is released."""
    def pin(self, slot: _Int, *, reader_is_next_batch: bool = False) -> None:
        """Keeps an owned slot out of circulation until its reader was issued.
        Raises ValueError for a free slot (claim it first)."""
    def unpin(self, slot: _Int) -> None:
        """Drops one pin without freeing (the caller took the slot over); a
        no-op when the slot holds no pin."""
    def drop_reader(self, slot: _Int) -> None:
        """A reader left before reading: unpins, frees the slot on the last pin."""
    def release_pins(self) -> None:
        """Top of pass: returns every pinned slot whose reading forward was issued."""
    def is_free(self, slot: _Int) -> bool:
        """Returns whether the slot is on the free list."""
    def is_pinned(self, slot: _Int) -> bool:
        """Returns whether a forward still has to read the slot."""
    def pin_count(self, slot: _Int) -> int:
        """Returns how many readers hold the slot pinned."""
    def holds_checkpoint(self, slot: _Int) -> bool:
        """Returns whether the slot is free and still carries a checkpoint."""
    def lookup(self, h: _Int) -> int:
        """Returns the slot holding the checkpoint filed under ``h``, or -1."""
    def resumable_hit(
        self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False
    ) -> int:
        """Returns the largest L <= hit whose boundary is checkpointed here and
        leaves the resuming forward ``min_fork_tokens``; 0 is always valid.
        Raises ValueError for hit < 0, IndexError for hit > len(block_hashes)."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """Fork checkpoint: ``seq`` moves to a fresh slot, its old slot is filed
        under ``h`` and pinned through the next pass. Under none/replay, or
        with nothing free, nothing is kept (counted dropped)."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this pool gates or checkpoints anything for ``seq``."""
    def invalidate(self, slot: _Int) -> None:
        """Drops the slot's checkpoint (no-op without one or when disabled)."""
    def unindex(self, h: _Int) -> None:
        """Drops the checkpoint filed under ``h`` (its KV block left the
        index; counted orphaned). Returns None."""
    def clear_index(self) -> None:
        """Drops every checkpoint (slots stay where they are)."""
    def extend(self, count: _Int) -> None:
        """Adds ``count`` slots at the top. Raises ValueError for count < 0."""
    def retire_top(self) -> SlotRetirement | None:
        """Removes the top slot; returns what the runner must relocate (an
        owned top moves to a free slot), or None when the pool is empty."""
    def record_relocation(self, src: _Int, dst: _Int) -> None:
        """Schedules a slot-to-slot copy for the next batch."""
    def take_relocations(self) -> tuple[tuple[int, int], ...]:
        """Returns and clears the (src, dst) copies the next batch must run first."""
    def reserve_midstep(
        self, seq: _Seqish, positions: Iterable[tuple[_Int, _Int]]
    ) -> list[_Midstep]:
        """Reserves scratch slots for interior (position, hash) boundaries of the
        next forward (readable_midstep backends). Returns (slot, position, hash)
        reservations; an empty list when the backend cannot read midstep."""
    def publish_midstep(
        self, reservations: Iterable[_Midstep], seq: _Seqish | None = None
    ) -> None:
        """Files the reserved midstep states after the forward wrote them."""
    def cancel_midstep(self, reservations: Iterable[_Midstep]) -> None:
        """Returns reserved midstep slots unused (preemption)."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns checkpoints_kept / dropped / evicted / orphaned."""
    def occupancy(self) -> dict[str, int]:
        """Returns slots_total, slots_used, slots_held, slots_vacant."""
    def set_eviction_policy(
        self,
        kind: _EvictionKind = "lru",
        *,
        flops_per_token: float = 1.0,
        flops_per_context_token: float = 0.0,
        checkpoint_bytes: float = 1.0,
        tokens_per_position: float = 1.0,
        weight: float = 1.0,
        guesses_first: bool = True,
    ) -> None:
        """Chooses which checkpoint to spend first ('lru' or 'cost'); returns
        None. Raises ValueError naming the argument (nothing changed) for a bad value."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

class StateGroupPool:
    """Per-request groups of ``entries_per_req`` entries with fork and copy
    checkpoints (copies are filed by ``take_copies`` as the next batch is
    built). Same free-list rules as ``StateSlotPool``."""

    def __init__(
        self,
        num_groups: _Int,
        transfer: StateTransfer | None = None,
        hash_block_size: _Int = 1,
        enabled: bool = True,
    ) -> None:
        """Raises ValueError for ``num_groups < 0`` or ``hash_block_size <= 0``."""
    num_groups: int
    hash_block_size: int
    enabled: bool
    min_fork_tokens: int
    readable_midstep: bool
    successor_room: float
    checkpoints_kept: int
    checkpoints_dropped: int
    checkpoints_evicted: int
    checkpoints_orphaned: int
    @property
    def transfer(self) -> StateTransfer: ...
    @property
    def hash_to_group(self) -> CheckpointIndexView: ...
    @property
    def group_hash(self) -> UnitHashView: ...
    def has_free(self) -> bool:
        """Returns whether a group can be handed out."""
    def num_free(self) -> int:
        """Returns how many groups are free (vacant or checkpointed)."""
    def pop(self) -> int:
        """Returns a group now owned by the caller. Raises IndexError when none is free."""
    def release(self, group: _Int) -> None:
        """Hands an owned group back; its pending copy intents die with it.
        Raises ValueError if it is already free."""
    def claim(self, group: _Int) -> None:
        """Takes one specific free group off the free list, checkpoint and all."""
    def pin(self, group: _Int, *, reader_is_next_batch: bool = False) -> None:
        """Keeps an owned group out of circulation until its reader was issued."""
    def unpin(self, group: _Int) -> None:
        """Drops one pin without freeing."""
    def drop_reader(self, group: _Int) -> None:
        """A reader left before reading: unpins, frees the group on the last pin."""
    def release_pins(self) -> None:
        """Top of pass: returns every pinned group whose reading forward was issued."""
    def is_free(self, group: _Int) -> bool:
        """Returns whether the group is on the free list."""
    def is_pinned(self, group: _Int) -> bool:
        """Returns whether a forward still has to read the group."""
    def pin_count(self, group: _Int) -> int:
        """Returns how many readers hold the group pinned."""
    def holds_checkpoint(self, group: _Int) -> bool:
        """Returns whether the group is free and still carries a checkpoint."""
    def lookup(self, h: _Int) -> int:
        """Returns the group holding the checkpoint filed under ``h``, or -1."""
    def resumable_hit(
        self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False
    ) -> int:
        """Returns the largest L <= hit resumable from a checkpoint here; 0 is
        always valid. Raises ValueError for hit < 0, IndexError past the hashes."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """fork: ``seq`` moves to a fresh group, the old one is filed and
        pinned; copy: the intent is recorded for ``take_copies``; none and
        replay: nothing changes at all."""
    def forget_pending(self, seq: _Seqish) -> None:
        """Drops ``seq``'s uncommitted copy checkpoint (its group is released)."""
    def record_copy(self, src: _Int, dst: _Int) -> None:
        """Schedules a group copy for the next batch."""
    def take_copies(self) -> list[tuple[int, int]]:
        """Files the recorded copy checkpoints and returns this batch's (src, dst) copies."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this pool gates or checkpoints anything for ``seq``."""
    def invalidate(self, group: _Int) -> None:
        """Drops the group's checkpoint (no-op without one or when disabled)."""
    def unindex(self, h: _Int) -> int:
        """Drops the checkpoint filed under ``h``; returns the group freed, or -1."""
    def extend(self, count: _Int) -> None:
        """Adds ``count`` groups at the top. Raises ValueError for count < 0."""
    def retire_top(self) -> GroupRetirement | None:
        """Removes the top group; returns what the runner must relocate, or
        None when the pool is empty."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns checkpoints_kept / dropped / evicted / orphaned."""
    def set_eviction_policy(
        self,
        kind: _EvictionKind = "lru",
        *,
        flops_per_token: float = 1.0,
        flops_per_context_token: float = 0.0,
        checkpoint_bytes: float = 1.0,
        tokens_per_position: float = 1.0,
        weight: float = 1.0,
        guesses_first: bool = True,
    ) -> None:
        """Chooses which checkpoint to spend first ('lru' or 'cost'); returns
        None. Raises ValueError naming the argument (nothing changed) for a bad value."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

# ------------------------------------------------------------- block pool --

class BlockPool:
    """One pool of blocks for the KV prefix cache and PAGE checkpoint units."""

    def __init__(
        self, num_blocks: _Int, on_evict: Callable[[int], object] | None = None
    ) -> None:
        """Raises ValueError for ``num_blocks < 0``; TypeError for a
        non-callable ``on_evict``."""
    on_evict: Callable[[int], object] | None
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free(self) -> int:
        """Blocks a reservation or allocation could take now (never-hashed + cached)."""
    @property
    def num_cached(self) -> int:
        """Free blocks still findable by hash."""
    @property
    def num_kv_blocks(self) -> int:
        """Blocks held by the KV cache."""
    @property
    def num_reserved(self) -> int:
        """Blocks held as units by an owner."""
    def reserve_units(self, count: _Int, owner: _Owner) -> list[int] | None:
        """Returns ``count`` free blocks now held by ``owner``, or None (nothing
        taken) when short. Raises ValueError for count < 0, TypeError for an
        unhashable owner."""
    def release_units(self, unit_ids: _Ints, owner: _Owner) -> None:
        """Frees units ``owner`` holds. Raises ValueError, changing nothing,
        if any unit is not held by ``owner``."""
    def rekey_units(self, unit_ids: _Ints, old_owner: _Owner, new_owner: _Owner) -> None:
        """Moves units from ``old_owner`` to ``new_owner``. Raises ValueError,
        changing nothing, if any unit is not held by ``old_owner``."""
    def owner_of(self, unit: _Int) -> Any:
        """Returns the owner holding ``unit`` (equal to the one given), or None."""
    def allocate(self, count: _Int) -> list[int] | None:
        """Returns ``count`` blocks for the KV cache (ref count 1), never-hashed
        first, then least recently freed; None when short (nothing taken)."""
    def free(self, block_ids: _Ints) -> None:
        """Drops one reference per block; at zero a hashed block stays findable
        until reused. Raises ValueError for a block the KV cache does not hold."""
    def incref(self, block_ids: _Ints) -> None:
        """Adds a reference per block (a cached free block is taken back).
        Raises ValueError for a block neither held nor cached."""
    def lookup(self, hash: _Int) -> int:
        """Returns the block indexed under ``hash``, or -1."""
    def publish(self, block: _Int, hash: _Int) -> bool:
        """Indexes a held block under ``hash``; returns False when another block
        already holds it. Raises ValueError for a block the KV cache does not hold."""
    def block_hash(self, block: _Int) -> int:
        """Returns the hash the block is indexed under, or -1."""
    def ref_count(self, block: _Int) -> int:
        """Returns the block's KV reference count."""
    def reset_prefix_cache(self) -> int:
        """Drops every cached free block from the index (calling on_evict);
        returns how many."""
    def check_consistency(self) -> None:
        """Raises AssertionError if an internal invariant is broken (tests)."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

# ------------------------------------------------------- PAGE checkpoints --

class PageUnitCheckpointStore:
    """PAGE images in units of a ``BlockPool``: COPYING -> READY one batch
    later -> EVICTING; unpinned READY images are spent LRU."""

    def __init__(
        self, pool: BlockPool, spec: PagedStateCheckpointSpec, offload_sink: bool = False
    ) -> None:
        """Raises TypeError for a pool or spec of the wrong type."""
    @property
    def pool(self) -> BlockPool: ...
    @property
    def spec(self) -> PagedStateCheckpointSpec: ...
    @property
    def units_per_checkpoint(self) -> int: ...
    @property
    def records(self) -> CheckpointRecordsView: ...
    @property
    def hash_to_checkpoint(self) -> CheckpointHashIndexView: ...
    @property
    def generation(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def offload_pins_reclaimed(self) -> int: ...
    @property
    def offload_nominations_dropped(self) -> int: ...
    @property
    def store_backlog(self) -> Any:
        """Checkpoint ids nominated for the offload tier, oldest first."""
    def begin_store(
        self, prefix_hash: _Int, src_slot: _Int, position: _Int = 0
    ) -> CheckpointStoreOp | None:
        """Returns the op filing a COPYING image of ``src_slot`` at ``position``
        (evicting images if needed), or None when units cannot be had or it is
        already kept. Raises ValueError for ``position < 0``."""
    def begin_restore(self, prefix_hash: _Int, dst_slot: _Int) -> CheckpointRestoreOp | None:
        """Returns an op reading the READY image into ``dst_slot`` (pinned until
        the batch completes), or None when no READY image is filed under the hash."""
    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]:
        """Returns and clears the queued restores of this batch."""
    def complete_inflight(self) -> None:
        """Top of pass: last batch's stores become READY, its restores unpin."""
    def lookup(self, prefix_hash: _Int) -> int:
        """Returns the READY checkpoint id filed under the hash, or -1."""
    def contains(self, prefix_hash: _Int) -> bool:
        """Returns whether a READY image is filed under the hash."""
    def contains_or_pending(self, prefix_hash: _Int) -> bool:
        """Returns whether it is READY or a store of it is on its way."""
    def has_available_units(self, count: _Int, protected_hash: _Int | None = None) -> bool:
        """Returns whether ``count`` units could be had, evicting unpinned READY
        images (never the one under ``protected_hash``). Raises ValueError for count < 0."""
    def ensure_free_units(self, count: _Int) -> bool:
        """Evicts until ``count`` units are free; returns whether they are."""
    def unindex(self, prefix_hash: _Int) -> bool:
        """Drops the image filed under the hash; returns whether one was."""
    def clear(self) -> None:
        """Drops every unpinned image and returns its units."""
    def changed_since(self, generation: _Int) -> set[int] | None:
        """Returns the hashes whose fate changed since ``generation``, or None
        when that generation is too old to answer (at least 4,000 bumps kept)."""
    def restore_queued_for(self, dst_slot: _Int) -> bool:
        """Returns whether a restore into ``dst_slot`` is queued."""
    def cancel_queued_restore(self, dst_slot: _Int) -> None:
        """Drops the restore queued into ``dst_slot`` and its pin."""
    def suspend_queued_restore(self, dst_slot: _Int) -> SuspendedCheckpointRestore | None:
        """Takes the queued restore into ``dst_slot`` out of the batch, keeping
        its pin; None if none. Raises AssertionError (changing nothing) when
        two restores are queued for the slot."""
    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Queues a suspended restore again."""
    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drops a suspended restore and its pin."""
    def acquire_checkpoint_source(
        self, prefix_hash: _Int, *, max_inflight: _Int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Pins a READY image for an external transfer; returns (operation id,
        unit ids), or None if there is none or ``max_inflight`` are out."""
    def adopt_units(self, unit_ids: tuple[int, ...], owner: _Owner, prefix_hash: _Int) -> bool:
        """Files units ``owner`` holds as a READY image under the hash; returns
        False (units left with the owner) when the hash is already kept.
        Raises ValueError for a wrong unit count or units the owner does not hold."""
    def take_offload_stores(self, max_inflight: _Int) -> list[Any]:
        """Returns up to ``max_inflight`` offload store operations, pinning their sources."""
    def release_offload_store_source(self, op: Any) -> None:
        """The worker copied the units out: unpins the source."""
    def settle_offload_store(self, op: Any) -> None:
        """The tier write completed: ends the operation's bookkeeping."""
    def was_reclaimed(self, op: Any) -> bool:
        """Returns whether a stale-pin reclamation took the operation's pin."""
    def has_offload_pins(self) -> bool:
        """Returns whether any offload pin is held."""
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Drops offload pins older than ``timeout_s`` seconds (monotonic);
        returns how many. ``timeout_s <= 0`` reclaims nothing."""
    def use_clock(self, clock: Callable[[], float] | None) -> None:
        """Replaces the monotonic clock for pin ages (tests); None restores it."""
    def check_consistency(self) -> None:
        """Raises AssertionError if an internal invariant is broken (tests)."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
    def set_eviction_policy(
        self,
        kind: _EvictionKind = "lru",
        *,
        flops_per_token: float = 1.0,
        flops_per_context_token: float = 0.0,
        checkpoint_bytes: float = 1.0,
        tokens_per_position: float = 1.0,
        weight: float = 1.0,
        guesses_first: bool = True,
    ) -> None:
        """Chooses which checkpoint to spend first ('lru' or 'cost'); returns
        None. Raises ValueError naming the argument (nothing changed) for a bad value."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

class PagedStateCheckpointCoordinator:
    """The scheduler-side PAGE API: files boundaries, hands out the batch's
    store and restore ops, votes on hits, drives an offload tier."""

    def __init__(
        self,
        pool: BlockPool,
        spec: PagedStateCheckpointSpec,
        enabled: bool,
        offload: StateOffloadIndex | None = None,
        readable_midstep: bool = False,
    ) -> None:
        """Raises TypeError for a pool or spec of the wrong type."""
    successor_room: ClassVar[float]
    @property
    def store(self) -> PageUnitCheckpointStore: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def readable_midstep(self) -> bool: ...
    @property
    def offload(self) -> StateOffloadIndex | None: ...
    @property
    def checkpoints_kept(self) -> int: ...
    @property
    def checkpoints_dropped(self) -> int: ...
    @property
    def checkpoints_orphaned(self) -> int: ...
    def complete_previous_batch(self) -> None:
        """Top of pass: last batch's stores become READY, restores unpin."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """Files the boundary for the next ``take_checkpoint_ops``; a newer one
        of the same sequence supersedes it."""
    def take_checkpoint_ops(
        self,
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """Begins the filed stores; returns this batch's (stores, restores)."""
    def begin_restore(self, h: _Int, dst_slot: _Int) -> bool:
        """Queues a restore of the READY image into ``dst_slot``; returns False
        when there is none."""
    def resumable_hit(
        self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False
    ) -> int:
        """Returns the longest prefix <= hit whose boundary is READY here or
        servable by the tier; 0 is always valid."""
    def contains(self, prefix_hash: _Int) -> bool:
        """Returns whether a READY image is filed under the hash."""
    def has_available_units(self, count: _Int, protected_hash: _Int | None = None) -> bool:
        """Returns whether ``count`` units could be had, evicting unpinned READY
        images (never the one under ``protected_hash``)."""
    def ensure_free_units(self, count: _Int) -> bool:
        """Evicts until ``count`` units are free; returns whether they are.
        Raises ValueError for count < 0."""
    def unindex(self, h: _Int) -> None:
        """Drops the checkpoint filed under ``h`` (its KV block left). Returns None."""
    def clear_index(self) -> None:
        """Drops every unpinned checkpoint."""
    def forget_pending(self, seq: _Seqish) -> None:
        """Drops ``seq``'s filed, not yet begun boundary."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this coordinator checkpoints anything for ``seq``."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns the fates (kept, dropped, evicted, orphaned, reclaimed pins)
        and, with a tier, its stats under ``state_offload_*``."""
    def reserve_midstep(
        self, seq: _Seqish, positions: Iterable[tuple[_Int, _Int]]
    ) -> list[_Midstep]:
        """Reserves scratch slots for interior (position, hash) boundaries;
        returns (slot, position, hash) reservations (empty without scratch)."""
    def publish_midstep(
        self, reservations: Iterable[_Midstep], seq: _Seqish | None = None
    ) -> None:
        """Files the reserved midstep states for the next ``take_checkpoint_ops``."""
    def cancel_midstep(self, reservations: Iterable[_Midstep]) -> None:
        """Returns reserved scratch slots unused."""
    def attach_midstep_scratch(self, slot_pool: StateSlotPool, max_ops_per_batch: _Int) -> None:
        """Borrows midstep scratch slots from ``slot_pool`` (a StateSlotPool),
        at most ``max_ops_per_batch`` a batch."""
    def attach_offload(self, index: StateOffloadIndex | None, *, sink: bool = True) -> None:
        """Attaches (or with None detaches) the tier that votes in
        ``resumable_hit`` and receives offload nominations."""
    def restore_queued_for(self, dst_slot: _Int) -> bool:
        """Returns whether a restore into ``dst_slot`` is queued."""
    def suspend_queued_restore(self, dst_slot: _Int) -> SuspendedCheckpointRestore | None:
        """As the store's; raises AssertionError for two queued restores."""
    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Queues a suspended restore again."""
    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drops a suspended restore and its pin."""
    def acquire_checkpoint_source(
        self, prefix_hash: _Int, *, max_inflight: _Int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Pins a READY image for an external transfer; returns (operation id,
        unit ids) or None."""
    def reserve_transfer_units(self, owner: _Owner) -> tuple[int, ...] | None:
        """Reserves one image's units under ("state-transfer", owner) for a
        load; returns their ids, or None when short. Raises ValueError for
        owner None."""
    def adopt_transfer_units(self, owner: _Owner, prefix_hash: _Int) -> bool:
        """Files the loaded units as a READY image; returns False if ``owner``
        holds no reservation or the hash is already kept."""
    def release_transfer_units(self, owner: _Owner) -> None:
        """Returns a transfer reservation's units (no-op without one)."""
    def take_offload_stores(self, max_inflight: _Int) -> list[Any]:
        """Returns up to ``max_inflight`` offload store operations."""
    def release_offload_store_source(self, op: Any) -> None:
        """The worker copied the units out: unpins the source."""
    def settle_offload_store(self, op: Any) -> None:
        """The tier write completed: ends the operation's bookkeeping."""
    def was_reclaimed(self, op: Any) -> bool:
        """Returns whether a stale-pin reclamation took the operation's pin."""
    def has_offload_pins(self) -> bool:
        """Returns whether any offload pin is held."""
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Drops offload pins older than ``timeout_s`` seconds; returns how many."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
    def set_eviction_policy(
        self,
        kind: _EvictionKind = "lru",
        *,
        flops_per_token: float = 1.0,
        flops_per_context_token: float = 0.0,
        checkpoint_bytes: float = 1.0,
        tokens_per_position: float = 1.0,
        weight: float = 1.0,
        guesses_first: bool = True,
    ) -> None:
        """Chooses which checkpoint to spend first ('lru' or 'cost'); returns
        None. Raises ValueError naming the argument (nothing changed) for a bad value."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""
    def check_consistency(self) -> None:
        """Raises AssertionError when an invariant of the coordinator, its store
        or its pool is broken (tests)."""

class StateOffloadIndex:
    """A lower tier's membership (capped LRU) and load bookkeeping."""

    def __init__(
        self, can_store: bool = True, can_load: bool = True, capacity: _Int | None = None
    ) -> None:
        """Raises ValueError for ``capacity < 0``."""
    @property
    def can_store(self) -> bool: ...
    @property
    def can_load(self) -> bool: ...
    @property
    def capacity(self) -> int | None: ...
    @property
    def hashes(self) -> OffloadHashesView: ...
    @property
    def loads_in_flight(self) -> int: ...
    def note_store_started(self, h: _Int) -> None:
        """Counts a store attempt."""
    def note_stored(self, h: _Int) -> None:
        """The tier now holds ``h`` (the LRU entry is dropped past capacity)."""
    def note_store_failed(self, h: _Int, untrusted: bool = False) -> None:
        """Counts a failed (or untrusted) store."""
    def forget(self, h: _Int) -> bool:
        """Drops ``h``; returns whether it was held."""
    def could_serve(self, h: _Int) -> bool:
        """Returns ``can_load and h in hashes``."""
    def request_load(self, h: _Int) -> bool:
        """Starts a load of ``h``; returns False when it cannot be served."""
    def complete_load(self, h: _Int) -> None:
        """Ends a load. Raises ValueError when none is in flight for ``h``."""
    def fail_load(self, h: _Int, *, missing: bool = False, untrusted: bool = False) -> None:
        """Ends a failed load, forgetting ``h`` when it is missing or untrusted.
        Raises ValueError when none is in flight for ``h``."""
    def abandon_load(self, h: _Int) -> None:
        """Ends a load nobody waits for any more."""
    def stats(self) -> dict[str, int]:
        """Returns stores/loads attempted, completed, failed, untrusted,
        missing, abandoned, hashes held and evicted."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

# ------------------------------------------------------------- host tier --

class HostArena:
    """Which entries of the host tier's arena hold what: ``capacity_bytes //
    entry_bytes`` entries of one buffer the caller owns; values are filed under
    a key (bytes or str) in a budget class. ``ranking``: "lru" or "cost"."""

    def __init__(
        self,
        entry_bytes: _Int,
        capacity_bytes: _Int,
        class_budget_bytes: _Ints,
        ranking: Literal["lru", "cost"] = "cost",
    ) -> None:
        """Raises ValueError for a bad size, budget or ranking."""
    @property
    def entry_bytes(self) -> int: ...
    @property
    def num_entries(self) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def ranking(self) -> Literal["lru", "cost"]: ...
    def class_stats(self, klass: _Int) -> dict[str, int]:
        """Returns budget_entries, used_entries, values, evictions, refused of
        class ``klass``. Raises IndexError for an unknown class."""
    def victims(self, klass: _Int, count: _Int) -> list[bytes] | None:
        """Returns the keys ``allocate`` would evict to fit ``count`` entries, in
        order; None when it cannot. Raises IndexError for an unknown class."""
    def allocate(
        self, key: bytes | str, klass: _Int, count: _Int, nbytes: _Int, cost: float
    ) -> tuple[list[int], list[bytes]] | None:
        """Reserves entries for ``key``; returns (entry ids, evicted keys), or
        None (nothing changed). Raises IndexError for an unknown class."""
    def seal(self, key: bytes | str, meta: bytes) -> None:
        """Makes the value under ``key`` findable with ``meta``; returns None."""
    def remove(self, key: bytes | str) -> bool:
        """Drops the value under ``key``; returns whether one was there."""
    def contains(self, key: bytes | str) -> bool:
        """Returns whether a value is filed under ``key``."""
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def lookup(self, key: bytes | str, touch: bool = True) -> tuple[list[int], int, bytes, int] | None:
        """Returns (entry ids, nbytes, meta, klass) of a sealed value, or None."""
    def pin(self, key: bytes | str) -> None:
        """Pins the value under ``key`` (never evicted while pinned); returns None."""
    def unpin(self, key: bytes | str) -> None:
        """Drops one pin of the value under ``key``; returns None."""
    def pins(self, key: bytes | str) -> int:
        """Returns the pin count of the value under ``key``."""
    def keys(self) -> list[bytes]:
        """Returns the keys filed, as bytes."""
    def check_consistency(self) -> None:
        """Raises AssertionError if an internal invariant is broken (tests)."""

# ---------------------------------------------------------------- copying --

class _CopyBatch:
    """A validated, compiled batch: one descriptor per op plus its unit ids."""

    @property
    def num_ops(self) -> int: ...
    @property
    def num_slot_copies(self) -> int: ...
    @property
    def num_paged_ops(self) -> int: ...
    @property
    def bytes(self) -> int: ...

_Pairs: TypeAlias = Iterable[tuple[_Int, _Int]]

class _SpanPlanner:
    """Validates and compiles maintenance batches over one state and one page
    layout. Segment tables are flat ``[base, stride, bytes, ...]`` int lists.
    Private to the executor: it takes raw addresses (use ``StateCopyExecutor``)."""

    def __init__(
        self,
        image_segments: _Ints,
        slot_segments: _Ints,
        unit_segments: _Ints,
        num_slots: _Int,
        num_units: _Int,
        layout_id: str,
    ) -> None:
        """Raises ValueError for overlapping or malformed segments, TypeError
        for a non-str layout_id."""
    @property
    def num_slots(self) -> int: ...
    @property
    def num_units(self) -> int: ...
    @property
    def image_bytes(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def unit_bytes(self) -> int: ...
    @property
    def units_per_image(self) -> int: ...
    @property
    def layout_id(self) -> str: ...
    @property
    def pieces_per_paged_op(self) -> int: ...
    @property
    def pieces_per_slot_copy(self) -> int: ...
    def compile(
        self,
        relocations: _Pairs = (),
        copies: _Pairs = (),
        stores: Iterable[CheckpointStoreOp] = (),
        restores: Iterable[CheckpointRestoreOp] = (),
    ) -> _CopyBatch:
        """Returns the compiled batch. Raises ValueError naming the first bad op
        (layout id, total_bytes, unit count, ranges, two writers, a read of
        what another op writes) before anything is compiled."""
    def validate(
        self,
        relocations: _Pairs = (),
        copies: _Pairs = (),
        stores: Iterable[CheckpointStoreOp] = (),
        restores: Iterable[CheckpointRestoreOp] = (),
    ) -> None:
        """Raises as ``compile`` does; returns None for a valid batch."""
    def run_on_cpu(self, batch: _CopyBatch) -> None:
        """memcpy every span of ``batch`` (host memory only; holds the GIL). Returns None."""
    def spans(self, batch: _CopyBatch) -> list[tuple[int, int, int]]:
        """Returns the batch's spans as (src address, dst address, bytes)."""

class _GpuCopyEngine:
    """Device copy of a planner's templates, pinned descriptor staging and the
    one-launch copy kernel for one device. Only in builds with GPU kernels
    (``has_gpu_kernels``)."""

    item_bytes: ClassVar[int]
    num_variants: ClassVar[int]
    def __init__(
        self,
        device: _Int,
        planner: _SpanPlanner,
        max_pair_ops: _Int,
        max_paged_ops: _Int,
        buffers: _Int = 2,
        variant: _Int = 0,
    ) -> None:
        """Raises ValueError for a negative device or op count, or a bad buffers/variant."""
    @property
    def device(self) -> int: ...
    @property
    def num_sms(self) -> int: ...
    @property
    def grid_blocks(self) -> int: ...
    @property
    def staging_bytes(self) -> int: ...
    @property
    def items_per_paged_op(self) -> int: ...
    @property
    def items_per_slot_copy(self) -> int: ...
    def submit(self, batch: _CopyBatch, stream: _Int) -> None:
        """Stages ``batch`` and launches it on the raw stream handle. Returns None."""
    def stage(self, batch: _CopyBatch) -> None:
        """Fills the next staging buffer (waits until the device read it). Returns None."""
    def launch(
        self, stream: _Int, full_transfer: bool = False, copy_descriptors: bool = True
    ) -> None:
        """Enqueues the descriptor copy and the kernel (capturable in a graph). Returns None."""
    def record_consumed(self, stream: _Int) -> None:
        """Marks the staging as read once ``stream`` reaches this point. Returns None."""
