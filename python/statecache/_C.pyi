# Type stubs for statecache._C, the C++ extension (pybind11).
#
# Kept by hand; tests/python/api/test_stubs.py compares this file with the built
# module (names, kinds, parameters and the methods' docstrings) and fails on
# any drift. After changing the bindings run `python tests/python/stubcheck.py`
# for the differences, `--skeleton` for stub lines of new names and
# `--sync-docs` to copy the C++ docstrings of methods here.
#
# Conventions of the whole API (docs/contract.md, "Errors"): a bad argument
# raises TypeError (wrong type), ValueError (bad value), IndexError (slot,
# group, block or unit out of range) or OverflowError (an int beyond int64),
# naming the argument, before anything changes. A docstring's "Raises only for
# a bad argument" means exactly that; otherwise it names what else it raises.

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
#: a batch's sequences (list or tuple), one entry per sequence
_Seqs: TypeAlias = _Seq[_Seqish]
#: a batch's hash lists, one per sequence (or a 2-D int64 array, a row per
#: sequence); None: each sequence's own block_hashes
_HashLists: TypeAlias = _Seq[_Ints] | npt.NDArray[np.integer[Any]] | None

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
    """Facts fixed when the extension was compiled: version, build_type, gpu_request (the
    STATECACHE_CUDA setting), gpu_backend ('cuda', 'hip' or 'none'), gpu_archs
    (comma-separated), gpu_compiler, gpu_note (why there are no kernels, or ''),
    cxx_compiler, pybind11, sanitized. Returns a new dict; raises nothing."""

def chain_block_hashes(token_ids: _Ints, block_size: _Int, parent_hash: _Int = -1, as_numpy: bool = False) -> Any:
    """Chained content hashes of every full block of ``token_ids``. Block ``i`` covers
    tokens ``[i*block_size, (i+1)*block_size)``; its hash folds in the hash of block
    ``i-1``, starting from ``parent_hash`` (-1: the root), so one hash names the whole
    prefix. A trailing partial block is ignored. To extend a sequence's hashes, pass the
    tokens from the next block boundary on and the last hash as ``parent_hash`` (signed
    or unsigned: the hashes come back in the form it was given, unsigned ones as a
    uint64 array). Never returns -1 (the library's "none"). Returns a list of ints, or
    an int64 NumPy array with ``as_numpy=True``. Raises ValueError for ``block_size <=
    0`` or a ``parent_hash`` of 2**64 - 1, OverflowError for one outside [-2**63,
    2**64), TypeError for tokens that are not ints."""

def chain_block_keys(
    token_ids: _Ints,
    block_size: _Int,
    parent_key: bytes | None = None,
    seed: _Int = 0,
    salt: bytes | str | None = None,
) -> tuple[list[int], bytes]:
    """The 128-bit form of ``chain_block_hashes``: prefix keys for tiers below GPU memory.
    Block ``i``'s key is SipHash-2-4 (128-bit output) of block ``i-1``'s key and block
    ``i``'s tokens, under a deployment key derived from ``seed`` (an int) and ``salt``
    (bytes or str, optional), so prefixes cannot be made to collide without it.
    ``parent_key``: the 16-byte key to chain from (None: the root). Returns ``(hashes,
    keys)``: the 64-bit scheduler hash of each block (derived from its key, never -1)
    and the keys packed as ``16 * n`` bytes (key ``i`` is ``keys[16*i:16*i+16]``,
    little-endian). A trailing partial block is ignored. Raises ValueError for
    ``block_size <= 0`` or a ``parent_key`` that is not 16 bytes, TypeError for a
    ``salt`` that is not bytes, str or None."""

def scheduler_hash(key: bytes) -> int:
    """Returns the 64-bit scheduler hash (never -1) the 16-byte prefix key ``key`` names.
    Raises TypeError for a key that is not bytes, ValueError for one that is not 16
    bytes."""

def checkpoint_copy_ops_per_batch(max_num_seqs: _Int | None) -> int:
    """Returns the most PAGE store + restore ops one batch of ``max_num_seqs`` sequences
    can carry (two per sequence; 0 for None or 0), the executor's staging size. Raises
    TypeError for anything but an int or None (a str, a float, a bool), OverflowError
    when twice the count does not fit in 64 bits (a negative count is not refused)."""

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
        """Returns the transfer that keeps nothing (every hit is capped to 0). Raises
        nothing."""
    @staticmethod
    def fork(tokens: _Int, readable_midstep: bool = False) -> StateTransfer:
        """Returns a fork transfer whose successor forward commits ``tokens``.
        Raises ValueError for ``tokens <= 0``."""
    @staticmethod
    def copy(layout_id: str | None = None, readable_midstep: bool = False) -> StateTransfer:
        """Returns a copy (PAGE) transfer for the page layout ``layout_id``. Raises only
        for a bad argument (docs/contract.md, "Errors")."""
    @staticmethod
    def replay() -> StateTransfer:
        """Returns the transfer whose resuming forward rebuilds the state: hits never
        shrink and nothing is kept. Raises nothing."""
    @staticmethod
    def from_config(
        kind: _TransferKind,
        fork_tokens: _Int = 0,
        paged_layout_id: str | None = None,
        readable_midstep: bool = False,
    ) -> StateTransfer:
        """Returns the transfer an engine configuration names. Raises ValueError as the
        constructor does."""
    @staticmethod
    def from_wire(wire: Mapping[str, Any]) -> StateTransfer:
        """Returns the transfer ``to_wire`` described. Raises TypeError for a non-mapping,
        ValueError for another key set or a bad value."""
    def to_wire(self) -> dict[str, Any]:
        """Returns a new dict with exactly kind, fork_tokens, paged_layout_id and
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

    def __init__(self, page_unit_bytes: _Int, slot_bytes: _Int, layout_id: str, image_bytes: _Int) -> None:
        """Raises ValueError unless every size is a positive int and
        ``image_bytes <= slot_bytes``; TypeError for a non-str layout_id."""
    @staticmethod
    def from_wire(wire: Mapping[str, Any]) -> PagedStateCheckpointSpec:
        """Returns the spec ``to_wire`` described. Raises TypeError for a non-mapping,
        ValueError for another key set or a bad value."""
    def to_wire(self) -> dict[str, Any]:
        """Returns the four fields as a new dict. Raises nothing."""
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

    def __init__(self, src_slot: _Int, unit_ids: _Ints, total_bytes: _Int, layout_id: str) -> None: ...
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

    def __init__(self, dst_slot: _Int, unit_ids: _Ints, total_bytes: _Int, layout_id: str) -> None: ...
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

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
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
        """Appends ``value``; returns None. Raises TypeError (or OverflowError) for a value
        that is not an int64."""
    def extend(self, values: Iterable[_Int], /) -> None:
        """Appends every element of ``values``, all or none; returns None. Raises TypeError
        (or OverflowError) for an element that is not an int64, adding nothing."""
    def pop(self, index: SupportsIndex = -1) -> int:
        """Removes and returns the element at ``index`` (the last by default). Raises
        IndexError when the list is empty or ``index`` is out of range."""
    def clear(self) -> None:
        """Empties the list; returns None. Raises nothing."""
    def copy(self) -> list[int]:
        """Returns a plain list snapshot. Raises nothing."""

class IndexHashView:
    """``slot_hash`` / ``group_hash``: the hash filed at each index (-1 if none)."""

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, value: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def count(self, value: object, /) -> int:
        """Returns how many indices carry ``value``. Raises nothing."""
    def index(self, value: object, /) -> int:
        """Returns the first index carrying ``value``. Raises ValueError when none does."""
    def copy(self) -> list[int]:
        """Returns a plain list snapshot. Raises nothing."""
    def tolist(self) -> list[int]:
        """Returns a plain list snapshot. Raises nothing."""

class CheckpointIndexView:
    """``hash_to_slot`` / ``hash_to_group``: a live read-only mapping hash -> index."""

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
    def __len__(self) -> int: ...
    def __getitem__(self, key: _Int, /) -> int:
        """Raises KeyError for a hash with no checkpoint."""
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def get(self, key: object, default: Any = None) -> Any:
        """Returns the index holding the checkpoint filed under ``key``, or ``default``.
        Raises nothing."""
    def keys(self) -> Any:
        """Returns a snapshot of the hashes. Raises nothing."""
    def values(self) -> Any:
        """Returns a snapshot of the indices. Raises nothing."""
    def items(self) -> Any:
        """Returns a snapshot of the (hash, index) pairs. Raises nothing."""
    def copy(self) -> dict[int, int]:
        """Returns a plain dict snapshot. Raises nothing."""

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
        """Returns the value under ``key``, or ``default`` when there is none. Raises
        nothing."""
    def keys(self) -> list[int]:
        """Returns a list snapshot of the keys. Raises nothing."""
    def values(self) -> list[CheckpointRecord]:
        """Returns a list snapshot of the values. Raises nothing."""
    def items(self) -> list[tuple[int, CheckpointRecord]]:
        """Returns a list snapshot of the (key, value) pairs. Raises nothing."""
    def copy(self) -> dict[int, CheckpointRecord]:
        """Returns a plain dict snapshot. Raises nothing."""
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
        """Returns the value under ``key``, or ``default`` when there is none. Raises
        nothing."""
    def keys(self) -> list[int]:
        """Returns a list snapshot of the keys. Raises nothing."""
    def values(self) -> list[int]:
        """Returns a list snapshot of the values. Raises nothing."""
    def items(self) -> list[tuple[int, int]]:
        """Returns a list snapshot of the (key, value) pairs. Raises nothing."""
    def copy(self) -> dict[int, int]:
        """Returns a plain dict snapshot. Raises nothing."""
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

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
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
    """Per-need state slots with fork checkpoints (docs/contract.md, "Objects"):
    vacant slots lowest first, checkpointed ones spent LRU (guesses
    first); speculative-decode rollback slots, midstep reserve/publish,
    relocations. A copy transfer raises ValueError (use the PAGE coordinator)."""

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
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
    def slot_hash(self) -> IndexHashView: ...
    def has_free(self, count: _Int = 1) -> bool:
        """Returns whether ``count`` slots can be handed out now (checkpointed
        slots count: pop spends them). Raises ValueError for ``count < 0``."""
    def num_free(self) -> int:
        """Returns how many indices are free (vacant or checkpointed). Raises nothing."""
    def pop(self) -> int:
        """Returns an index now owned by the caller: vacant lowest first, else the least
        recently used checkpoint (counted evicted). Raises IndexError, changing nothing,
        when nothing is free."""
    def pop_many(self, count: _Int) -> list[int]:
        """Returns ``count`` slots for one request, element 0 first. Raises IndexError,
        taking nothing, when fewer are free; ValueError for ``count < 0``."""
    def release(self, slot: _Int) -> None:
        """Hands an owned index back: to the LRU tail (the head if speculative) when it
        carries a checkpoint, else to the vacant ones. Returns None. Raises ValueError
        for an index that is already free, IndexError for one out of range."""
    def release_many(self, slots: Iterable[_Int] | None) -> None:
        """Hands back a request's slots; -1 entries, None and an empty list are skipped.
        Returns None. Raises as ``release`` for any bad entry, and ValueError for a slot
        listed twice, before releasing any."""
    def claim(self, slot: _Int) -> None:
        """Takes one specific free index off the free list, checkpoint and all; returns
        None. Raises ValueError for an index that is not free, IndexError for one out of
        range."""
    def promote(self, slot: _Int) -> None:
        """A guess paid off: the slot's checkpoint is no longer spent first (to the LRU
        tail if free); returns None. Raises IndexError for a slot out of range."""
    def mark_speculative(self, slot: _Int) -> None:
        """Files this slot's checkpoint at the LRU head when it is released (spent first);
        returns None. Raises IndexError for a slot out of range."""
    def pin(self, slot: _Int, *, reader_is_next_batch: bool = False) -> None:
        """Keeps an owned index out of circulation until its reading forward was issued
        (``reader_is_next_batch``, keyword only: one pass longer); returns None. Raises
        ValueError for a free index (claim it first), IndexError for one out of range."""
    def unpin(self, slot: _Int) -> None:
        """Drops one pin without freeing (the caller took the index over; no-op without a
        pin); returns None. Raises IndexError for an index out of range."""
    def drop_reader(self, slot: _Int) -> None:
        """A reader left before it read: unpins, and frees the index on its last pin;
        returns None. Raises IndexError for an index out of range."""
    def release_pins(self) -> None:
        """Top of pass: frees every pinned index whose reading forward was issued; returns
        None. Raises nothing."""
    def is_free(self, slot: _Int) -> bool:
        """Returns whether the index is on the free list. Raises IndexError for an index
        out of range."""
    def is_pinned(self, slot: _Int) -> bool:
        """Returns whether a forward still has to read the index. Raises IndexError for an
        index out of range."""
    def pin_count(self, slot: _Int) -> int:
        """Returns how many readers hold the index pinned. Raises IndexError for an index
        out of range."""
    def holds_checkpoint(self, slot: _Int) -> bool:
        """Returns whether the index is free and still carries a checkpoint. Raises
        IndexError for an index out of range."""
    def lookup(self, h: _Int) -> int:
        """Returns the index holding the checkpoint filed under ``h``, or -1. Raises only
        for a bad argument (docs/contract.md, "Errors")."""
    def resumable_hit(self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False) -> int:
        """Returns the largest L <= ``hit`` whose boundary is checkpointed here and leaves
        the resuming forward ``min_fork_tokens``; 0 is always valid. ``block_hashes``: a
        list, tuple or NumPy integer array. Raises ValueError for ``hit < 0``,
        IndexError for ``hit > len(block_hashes)``."""
    def resumable_hits(
        self,
        seqs: _Seqs,
        hits: _Ints,
        block_hashes: _HashLists = None,
        assume_checkpointed: bool = False,
    ) -> list[int]:
        """Batched ``resumable_hit``: returns ``[resumable_hit(seqs[i], hits[i],
        block_hashes[i], assume_checkpointed) for i ...]``, computed in one call.
        ``hits``: a list or NumPy int64 array; ``block_hashes``: one hash list per
        sequence, a 2-D int64 array with a row per sequence, or None for each sequence's
        own ``block_hashes``. Raises ValueError, before any scan, when the lengths
        differ or a hit is negative or past a hash list the scan reads; TypeError for an
        item that is not a sequence or an int."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """Fork checkpoint: ``seq`` moves to a fresh slot and its old slot is filed under
        ``h``, pinned through the next pass; under none/replay or with nothing free
        nothing is kept (counted dropped). Returns None. Raises ValueError for ``h ==
        -1`` or ``boundary_blocks < 0``; RuntimeError, filing nothing, when a generic
        sequence's setter changed the pool."""
    def checkpoint_many(self, seqs: _Seqs, boundary_blocks: _Ints, hashes: _Ints) -> None:
        """Batched ``checkpoint``: the same end state as ``checkpoint(seqs[i],
        boundary_blocks[i], hashes[i])`` for each i in order. Returns None. The batch is
        checked as a whole first; raises ValueError when the lengths differ, a hash is
        -1 or a sequence appears twice, TypeError for an item that is not a sequence,
        and what ``checkpoint`` would raise for an entry (prefixed ``seqs[i]:``); a
        refused batch changes nothing. An engine object's setter that raises (or changes
        the pool: RuntimeError) stops the batch at its entry, whose fields get their old
        values back; the entries before it stay filed, as their ``checkpoint`` calls
        would have filed them."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this pool gates or checkpoints anything for ``seq``. Raises
        TypeError for an object without the sequence attributes."""
    def invalidate(self, slot: _Int) -> None:
        """Drops the index's checkpoint (no-op when it has none or the pool is disabled);
        returns None. Raises IndexError for an index out of range."""
    def unindex(self, h: _Int) -> None:
        """Drops the checkpoint filed under ``h`` (its KV block left the index; counted
        orphaned). Returns None. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def clear_index(self) -> None:
        """Drops every checkpoint (slots stay where they are); returns None. Raises
        nothing."""
    def extend(self, count: _Int) -> None:
        """Adds ``count`` indices at the top (the caller made room for their bytes);
        returns None. Raises ValueError for ``count < 0``."""
    def retire_top(self) -> SlotRetirement | None:
        """Removes the top index; returns what the runner must relocate (an owned top moves
        to a free index), or None when the top cannot go this pass or the pool is empty.
        Raises nothing."""
    def record_relocation(self, src: _Int, dst: _Int) -> None:
        """Schedules a slot copy ``src`` -> ``dst`` for the next batch; returns None.
        Raises IndexError for a slot out of range."""
    def take_relocations(self) -> tuple[tuple[int, int], ...]:
        """Returns and clears the (src, dst) slot copies the next batch must run first.
        Raises nothing."""
    def reserve_midstep(self, seq: _Seqish, positions: Iterable[tuple[_Int, _Int]]) -> list[_Midstep]:
        """Reserves a destination slot per interior (position, hash) boundary before the
        forward; returns (slot, position, hash) tuples, stopping at the first shortage
        (empty when the backend cannot read midstep). Raises ValueError for a hash of
        -1, TypeError for malformed positions."""
    def publish_midstep(self, reservations: Iterable[_Midstep], seq: _Seqish | None = None) -> None:
        """Files each reserved slot under its hash once the forward wrote it; returns None.
        Raises ValueError for a reservation this pool did not hand out."""
    def cancel_midstep(self, reservations: Iterable[_Midstep]) -> None:
        """Gives back reservations whose forward never ran; returns None. Raises ValueError
        for a reservation this pool did not hand out."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns a new dict: checkpoints_kept, checkpoints_dropped, checkpoints_evicted,
        checkpoints_orphaned. Raises nothing."""
    def occupancy(self) -> dict[str, int]:
        """Returns a new dict: slots_total, slots_used, slots_held, slots_vacant. Raises
        nothing."""
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
        """Chooses which checkpoint to spend first ('lru' or 'cost'; see
        ``eviction_policy``); returns None. Raises ValueError naming the argument,
        changing nothing, for an unknown kind or a weight that is negative or not
        finite."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

class StateGroupPool:
    """Per-request groups of ``entries_per_req`` entries with fork and copy
    checkpoints (copies are filed by ``take_copies`` as the next batch is
    built). Same free-list rules as ``StateSlotPool``."""

    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""
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
    def group_hash(self) -> IndexHashView: ...
    def has_free(self) -> bool:
        """Returns whether a group can be handed out now. Raises nothing."""
    def num_free(self) -> int:
        """Returns how many indices are free (vacant or checkpointed). Raises nothing."""
    def pop(self) -> int:
        """Returns an index now owned by the caller: vacant lowest first, else the least
        recently used checkpoint (counted evicted). Raises IndexError, changing nothing,
        when nothing is free."""
    def release(self, group: _Int) -> None:
        """Hands an owned index back: to the LRU tail (the head if speculative) when it
        carries a checkpoint, else to the vacant ones. Returns None. Raises ValueError
        for an index that is already free, IndexError for one out of range."""
    def claim(self, group: _Int) -> None:
        """Takes one specific free index off the free list, checkpoint and all; returns
        None. Raises ValueError for an index that is not free, IndexError for one out of
        range."""
    def pin(self, group: _Int, *, reader_is_next_batch: bool = False) -> None:
        """Keeps an owned index out of circulation until its reading forward was issued
        (``reader_is_next_batch``, keyword only: one pass longer); returns None. Raises
        ValueError for a free index (claim it first), IndexError for one out of range."""
    def unpin(self, group: _Int) -> None:
        """Drops one pin without freeing (the caller took the index over; no-op without a
        pin); returns None. Raises IndexError for an index out of range."""
    def drop_reader(self, group: _Int) -> None:
        """A reader left before it read: unpins, and frees the index on its last pin;
        returns None. Raises IndexError for an index out of range."""
    def release_pins(self) -> None:
        """Top of pass: frees every pinned index whose reading forward was issued; returns
        None. Raises nothing."""
    def is_free(self, group: _Int) -> bool:
        """Returns whether the index is on the free list. Raises IndexError for an index
        out of range."""
    def is_pinned(self, group: _Int) -> bool:
        """Returns whether a forward still has to read the index. Raises IndexError for an
        index out of range."""
    def pin_count(self, group: _Int) -> int:
        """Returns how many readers hold the index pinned. Raises IndexError for an index
        out of range."""
    def holds_checkpoint(self, group: _Int) -> bool:
        """Returns whether the index is free and still carries a checkpoint. Raises
        IndexError for an index out of range."""
    def lookup(self, h: _Int) -> int:
        """Returns the index holding the checkpoint filed under ``h``, or -1. Raises only
        for a bad argument (docs/contract.md, "Errors")."""
    def resumable_hit(self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False) -> int:
        """Returns the largest L <= ``hit`` whose boundary is checkpointed here and leaves
        the resuming forward ``min_fork_tokens``; 0 is always valid. ``block_hashes``: a
        list, tuple or NumPy integer array. Raises ValueError for ``hit < 0``,
        IndexError for ``hit > len(block_hashes)``."""
    def resumable_hits(
        self,
        seqs: _Seqs,
        hits: _Ints,
        block_hashes: _HashLists = None,
        assume_checkpointed: bool = False,
    ) -> list[int]:
        """Batched ``resumable_hit``: returns ``[resumable_hit(seqs[i], hits[i],
        block_hashes[i], assume_checkpointed) for i ...]``, computed in one call.
        ``hits``: a list or NumPy int64 array; ``block_hashes``: one hash list per
        sequence, a 2-D int64 array with a row per sequence, or None for each sequence's
        own ``block_hashes``. Raises ValueError, before any scan, when the lengths
        differ or a hit is negative or past a hash list the scan reads; TypeError for an
        item that is not a sequence or an int."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """fork: ``seq`` moves to a fresh group and the old one is filed under ``h`` and
        pinned; copy: the intent is recorded for ``take_copies``; none and replay:
        nothing changes at all. Returns None. Raises ValueError for ``h == -1`` or
        ``boundary_blocks < 0``; RuntimeError, filing nothing, when a generic sequence's
        setter changed the pool."""
    def forget_pending(self, seq: _Seqish) -> None:
        """Drops ``seq``'s uncommitted copy checkpoint (its group is being released);
        returns None. Raises TypeError for an object without the sequence attributes."""
    def checkpoint_many(self, seqs: _Seqs, boundary_blocks: _Ints, hashes: _Ints) -> None:
        """Batched ``checkpoint``: the same end state as ``checkpoint(seqs[i],
        boundary_blocks[i], hashes[i])`` for each i in order. Returns None. The batch is
        checked as a whole first; raises ValueError when the lengths differ, a hash is
        -1 or a sequence appears twice, TypeError for an item that is not a sequence,
        and what ``checkpoint`` would raise for an entry (prefixed ``seqs[i]:``); a
        refused batch changes nothing. An engine object's setter that raises (or changes
        the pool: RuntimeError) stops the batch at its entry, whose fields get their old
        values back; the entries before it stay filed, as their ``checkpoint`` calls
        would have filed them."""
    def forget_pending_many(self, seqs: _Seqs) -> None:
        """Batched ``forget_pending`` (finished or preempted requests). Returns
        None. Raises TypeError for an item that is not a sequence, before
        anything changes."""
    def release_many(self, groups: Iterable[_Int] | None) -> None:
        """Hands back several groups (``release`` of each); -1 entries, None and an empty
        list are skipped. Returns None. Raises as ``release`` for any bad entry, and
        ValueError for a group listed twice, before releasing any."""
    def record_copy(self, src: _Int, dst: _Int) -> None:
        """Schedules a group copy ``src`` -> ``dst`` for the next batch; returns None.
        Raises IndexError for a group out of range."""
    def take_copies(self) -> list[tuple[int, int]]:
        """Files last pass's copy intents and returns every (src, dst) pair the batch being
        built must copy before its forward. Raises what a generic sequence's getter or
        setter raised, or RuntimeError when a setter changed the pool, committing
        nothing and leaving every pending_checkpoint as it was."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this pool gates or checkpoints anything for ``seq``. Raises
        TypeError for an object without the sequence attributes."""
    def invalidate(self, group: _Int) -> None:
        """Drops the index's checkpoint (no-op when it has none or the pool is disabled);
        returns None. Raises IndexError for an index out of range."""
    def unindex(self, h: _Int) -> int:
        """Drops the checkpoint filed under ``h``; returns the group freed, or -1. Raises
        only for a bad argument (docs/contract.md, "Errors")."""
    def extend(self, count: _Int) -> None:
        """Adds ``count`` indices at the top (the caller made room for their bytes);
        returns None. Raises ValueError for ``count < 0``."""
    def retire_top(self) -> GroupRetirement | None:
        """Removes the top index; returns what the runner must relocate (an owned top moves
        to a free index), or None when the top cannot go this pass or the pool is empty.
        Raises nothing."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns a new dict: checkpoints_kept, checkpoints_dropped, checkpoints_evicted,
        checkpoints_orphaned. Raises nothing."""
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
        """Chooses which checkpoint to spend first ('lru' or 'cost'; see
        ``eviction_policy``); returns None. Raises ValueError naming the argument,
        changing nothing, for an unknown kind or a weight that is negative or not
        finite."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

# ------------------------------------------------------------- block pool --

class BlockPool:
    """One pool of blocks for the KV prefix cache and PAGE checkpoint units."""

    def __init__(self, num_blocks: _Int, on_evict: Callable[[int], object] | None = None) -> None:
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
        """Returns ``count`` free blocks now held by ``owner``, or None (nothing taken)
        when fewer are free. Raises ValueError for ``count < 0``, TypeError for an
        unhashable owner."""
    def release_units(self, unit_ids: _Ints, owner: _Owner) -> None:
        """Frees units ``owner`` holds; returns None. Raises ValueError, changing nothing,
        if any unit is not held by ``owner`` or belongs to a store's image."""
    def rekey_units(self, unit_ids: _Ints, old_owner: _Owner, new_owner: _Owner) -> None:
        """Moves units from ``old_owner`` to ``new_owner``; returns None. Raises
        ValueError, changing nothing, if any unit is not held by ``old_owner`` or
        belongs to a store's image."""
    def owner_of(self, unit: _Int) -> Any:
        """Returns the owner holding ``unit`` (equal to the one given), or None for a free
        block or one the KV cache holds. Raises IndexError for a unit out of range."""
    def allocate(self, count: _Int) -> list[int] | None:
        """Returns ``count`` blocks for the KV cache (one reference each), never-hashed
        first, then least recently freed; None (nothing taken) when fewer are free.
        Raises ValueError for ``count < 0``."""
    def free(self, block_ids: _Ints) -> None:
        """Drops one reference per listed block; at zero a hashed block stays findable
        until it is reused. Returns None. Raises ValueError, changing nothing, for a
        block the KV cache does not hold."""
    def incref(self, block_ids: _Ints) -> None:
        """Takes one more reference per listed block (a prefix hit; a cached free block is
        taken back). Returns None. Raises ValueError, changing nothing, for a block
        neither held nor cached."""
    def lookup(self, hash: _Int) -> int:
        """Returns the block indexed under ``hash``, or -1. Raises only for a bad argument
        (docs/contract.md, "Errors")."""
    def publish(self, block: _Int, hash: _Int) -> bool:
        """Indexes a full KV block under ``hash``; returns False when another block already
        holds that hash. Raises ValueError for a block the KV cache does not hold or
        ``hash == -1``."""
    def block_hash(self, block: _Int) -> int:
        """Returns the hash ``block`` is indexed under, or -1. Raises IndexError for a
        block out of range."""
    def ref_count(self, block: _Int) -> int:
        """Returns ``block``'s KV reference count. Raises IndexError for a block out of
        range."""
    def reset_prefix_cache(self) -> int:
        """Drops every cached free block from the index (on_evict fires for each); returns
        how many. Raises nothing (an on_evict handler's exception goes to
        sys.unraisablehook)."""
    def check_consistency(self) -> None:
        """Checks the pool's internal invariants (for tests); returns None. Raises
        AssertionError when one is broken."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

# ------------------------------------------------------- PAGE checkpoints --

class PageUnitCheckpointStore:
    """PAGE images in units of a ``BlockPool``: COPYING -> READY one batch
    later -> EVICTING; unpinned READY images are spent LRU."""

    def __init__(self, pool: BlockPool, spec: PagedStateCheckpointSpec, offload_sink: bool = False) -> None:
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
    def begin_store(self, prefix_hash: _Int, src_slot: _Int, position: _Int = 0) -> CheckpointStoreOp | None:
        """Returns the op filing a COPYING image of ``src_slot`` taken at ``position``
        (evicting unpinned READY images if needed), or None when the units cannot be had
        or the hash is already kept. Raises ValueError for ``position < 0`` or
        ``prefix_hash == -1``."""
    def begin_restore(self, prefix_hash: _Int, dst_slot: _Int) -> CheckpointRestoreOp | None:
        """Returns an op reading the READY image of ``prefix_hash`` into ``dst_slot`` (the
        image stays pinned until the batch completes), or None when no READY image is
        filed under the hash. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def take_restore_ops(self) -> tuple[CheckpointRestoreOp, ...]:
        """Returns and clears this batch's queued restores, oldest first. Raises nothing."""
    def complete_inflight(self) -> None:
        """Top of pass: the last batch's stores become READY and its restores unpin.
        Returns None. Raises nothing."""
    def lookup(self, prefix_hash: _Int) -> int:
        """Returns the READY checkpoint id filed under ``prefix_hash``, or -1. Raises only
        for a bad argument (docs/contract.md, "Errors")."""
    def contains(self, prefix_hash: _Int) -> bool:
        """Returns whether a READY image is filed under ``prefix_hash``. Raises only for a
        bad argument (docs/contract.md, "Errors")."""
    def contains_or_pending(self, prefix_hash: _Int) -> bool:
        """Returns whether an image of ``prefix_hash`` is READY or a store of it is on its
        way. Raises only for a bad argument (docs/contract.md, "Errors")."""
    def has_available_units(self, count: _Int, protected_hash: _Int | None = None) -> bool:
        """Returns whether ``count`` units could be had, evicting unpinned READY images if
        it came to that (never the one filed under ``protected_hash``). Raises
        ValueError for ``count < 0``."""
    def ensure_free_units(self, count: _Int) -> bool:
        """Evicts unpinned READY images until ``count`` units are free; returns whether
        they are (an unreachable count is refused before evicting anything). Raises
        ValueError for ``count < 0``."""
    def unindex(self, prefix_hash: _Int) -> bool:
        """Drops the unpinned image filed under ``prefix_hash``; returns whether one was
        dropped. Raises only for a bad argument (docs/contract.md, "Errors")."""
    def clear(self) -> None:
        """Drops every unpinned image and returns its units to the pool; returns None.
        Raises nothing (an on_evict handler's exception goes to sys.unraisablehook)."""
    def changed_since(self, generation: _Int) -> set[int] | None:
        """Returns the set of hashes whose READY standing may differ from what it was at
        ``generation``, or None when the log no longer reaches back that far (at least
        4,000 bumps are kept). Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def restore_queued_for(self, dst_slot: _Int) -> bool:
        """Returns whether a restore into ``dst_slot`` is queued. Raises only for a bad
        argument (docs/contract.md, "Errors")."""
    def cancel_queued_restore(self, dst_slot: _Int) -> None:
        """Drops the restore queued into ``dst_slot`` and its pin (no-op without one);
        returns None. Raises only for a bad argument (docs/contract.md, "Errors")."""
    def suspend_queued_restore(self, dst_slot: _Int) -> SuspendedCheckpointRestore | None:
        """Takes the restore queued into ``dst_slot`` out of the batch, keeping its pin;
        returns it, or None when none is queued. Raises AssertionError, changing
        nothing, when two restores are queued for the slot."""
    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Queues a suspended restore again; returns None. Raises ValueError for a restore
        this store did not suspend (or already resumed or released), AssertionError when
        its image lost its pin."""
    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drops a suspended restore and its pin; returns None. Raises ValueError for a
        restore this store did not suspend (or already resumed or released)."""
    def acquire_checkpoint_source(
        self, prefix_hash: _Int, *, max_inflight: _Int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Pins a READY image for an external transfer (never reclaimed by time); returns
        (operation id, unit ids), or None when there is no such image or
        ``max_inflight`` are out. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def adopt_units(self, unit_ids: tuple[int, ...], owner: _Owner, prefix_hash: _Int) -> bool:
        """Files units ``owner`` holds as a READY image under ``prefix_hash``; returns
        False (units left with the owner) when the hash is already kept. Raises
        ValueError, changing nothing, for a wrong unit count, units the owner does not
        hold, or ``prefix_hash == -1``."""
    def take_offload_stores(self, max_inflight: _Int) -> list[Any]:
        """Returns up to ``max_inflight`` (operation, unit ids) pairs to hand the tier now,
        each source pinned (none when ``max_inflight`` are already out). Raises only for
        a bad argument (docs/contract.md, "Errors")."""
    def release_offload_store_source(self, op: Any) -> None:
        """Phase one: the units were read out, so the source's pin goes; the operation
        stays dispatched. Returns None. Raises TypeError for an unhashable op."""
    def settle_offload_store(self, op: Any) -> None:
        """Phase two: the tier write completed; the operation is retired. Returns None.
        Raises TypeError for an unhashable op."""
    def was_reclaimed(self, op: Any) -> bool:
        """Returns whether a stale-pin reclamation took the operation's pin. Raises
        TypeError for an unhashable op."""
    def has_offload_pins(self) -> bool:
        """Returns whether any offload pin is held. Raises nothing."""
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Takes back offload pins older than ``timeout_s`` seconds (monotonic clock);
        returns how many. ``timeout_s <= 0`` reclaims nothing. Raises TypeError for a
        value that is not a number of seconds."""
    def use_clock(self, clock: Callable[[], float] | None) -> None:
        """Reads pin ages from ``clock()`` (seconds) instead of the monotonic clock; None
        restores it (for tests). Returns None. Raises TypeError for an object that is
        not callable or None."""
    def check_consistency(self) -> None:
        """Checks the store's internal invariants (for tests); returns None. Raises
        AssertionError when one is broken."""
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
        """Chooses which checkpoint to spend first ('lru' or 'cost'; see
        ``eviction_policy``); returns None. Raises ValueError naming the argument,
        changing nothing, for an unknown kind or a weight that is negative or not
        finite."""
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
        """Top of pass: the last batch's stores become READY and its restores unpin.
        Returns None. Raises RuntimeError when called from inside take_checkpoint_ops."""
    def checkpoint(self, seq: _Seqish, boundary_blocks: _Int, h: _Int) -> None:
        """Files the boundary for the next ``take_checkpoint_ops`` (a newer one of the same
        sequence supersedes it); returns None. Raises ValueError for ``boundary_blocks <
        0`` or ``h == -1``, TypeError for an object without the sequence attributes."""
    def take_checkpoint_ops(
        self,
    ) -> tuple[tuple[CheckpointStoreOp, ...], tuple[CheckpointRestoreOp, ...]]:
        """Begins the filed stores and returns this batch's (stores, restores) tuples.
        Raises RuntimeError when called from inside itself (an eviction handler), and
        what an engine object's state_slot getter raised, before anything changes; an
        on_evict handler's exception goes to sys.unraisablehook."""
    def begin_restore(self, h: _Int, dst_slot: _Int) -> bool:
        """Queues a restore of the READY image filed under ``h`` into ``dst_slot``; returns
        False when there is none. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def begin_restores(self, hashes: _Ints, dst_slots: _Ints) -> list[bool]:
        """Batched ``begin_restore``: returns the list ``[begin_restore(hashes[i],
        dst_slots[i]) for i ...]`` (True where a restore was queued), computed in one
        call, in order. ``hashes``, ``dst_slots``: lists or NumPy int64 arrays. The
        batch is checked as a whole first; raises ValueError when the lengths differ or
        a slot is negative, TypeError for an item that is not an int; a refused batch
        changes nothing."""
    def resumable_hit(self, seq: _Seqish, hit: _Int, block_hashes: _Ints, assume_checkpointed: bool = False) -> int:
        """Returns the longest prefix <= ``hit`` whose boundary is READY here or servable
        by the attached tier; 0 is always valid. Raises ValueError for ``hit < 0``,
        IndexError for ``hit > len(block_hashes)``."""
    def resumable_hits(
        self,
        seqs: _Seqs,
        hits: _Ints,
        block_hashes: _HashLists = None,
        assume_checkpointed: bool = False,
    ) -> list[int]:
        """Batched ``resumable_hit``: returns ``[resumable_hit(seqs[i], hits[i],
        block_hashes[i], assume_checkpointed) for i ...]``, computed in one call.
        ``hits``: a list or NumPy int64 array; ``block_hashes``: one hash list per
        sequence, a 2-D int64 array with a row per sequence, or None for each sequence's
        own ``block_hashes``. Raises ValueError, before any scan, when the lengths
        differ or a hit is negative or past a hash list the scan reads; TypeError for an
        item that is not a sequence or an int."""
    def contains(self, prefix_hash: _Int) -> bool:
        """Returns whether a READY image is filed under ``prefix_hash``. Raises only for a
        bad argument (docs/contract.md, "Errors")."""
    def has_available_units(self, count: _Int, protected_hash: _Int | None = None) -> bool:
        """Returns whether ``count`` units could be had, evicting unpinned READY images if
        it came to that (never the one filed under ``protected_hash``). Raises
        ValueError for ``count < 0``."""
    def ensure_free_units(self, count: _Int) -> bool:
        """Evicts unpinned READY images until ``count`` units are free; returns whether
        they are (an unreachable count is refused before evicting anything). Raises
        ValueError for ``count < 0``."""
    def unindex(self, h: _Int) -> None:
        """Drops the checkpoint filed under ``h`` (its KV block left the index; counted
        orphaned). Returns None. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def clear_index(self) -> None:
        """Drops every unpinned checkpoint; returns None. Raises nothing (an on_evict
        handler's exception goes to sys.unraisablehook)."""
    def forget_pending(self, seq: _Seqish) -> None:
        """Drops ``seq``'s filed boundary that no batch has begun yet (and a restore queued
        into its slot); returns None. Raises TypeError for an object without the
        sequence attributes."""
    def checkpoint_many(self, seqs: _Seqs, boundary_blocks: _Ints, hashes: _Ints) -> None:
        """Batched ``checkpoint``: the same filed boundaries (and so the same
        store ops at the next drain) as ``checkpoint(seqs[i],
        boundary_blocks[i], hashes[i])`` for each i in order. Returns None.
        The batch is checked as a whole first; raises ValueError when the
        lengths differ, a hash is -1, a boundary is negative or a sequence
        appears twice, TypeError for an item that is not a sequence; a refused
        batch changes nothing."""
    def forget_pending_many(self, seqs: _Seqs) -> None:
        """Batched ``forget_pending`` (finished or preempted requests): drops
        each sequence's filed boundary and a restore queued into its slot.
        Returns None. Raises TypeError for an item that is not a sequence,
        before anything changes."""
    def applies(self, seq: _Seqish) -> bool:
        """Returns whether this coordinator checkpoints anything for ``seq`` (enabled and
        the sequence has a per-request cache). Raises TypeError for an object without
        the sequence attributes."""
    def checkpoint_fates(self) -> dict[str, int]:
        """Returns a new dict of the fates (kept, dropped, evicted, orphaned, reclaimed
        pins) and, with a tier attached, the tier's stats under ``state_offload_*``.
        Raises nothing."""
    def reserve_midstep(self, seq: _Seqish, positions: Iterable[tuple[_Int, _Int]]) -> list[_Midstep]:
        """Reserves a scratch slot per interior (position, hash) boundary of the next
        forward; returns the (slot, position, hash) reservations, stopping at the first
        shortage (empty without scratch). Raises ValueError for a hash of -1, TypeError
        for malformed positions."""
    def publish_midstep(self, reservations: Iterable[_Midstep], seq: _Seqish | None = None) -> None:
        """Files the reserved midstep states for the next ``take_checkpoint_ops``; returns
        None. Raises ValueError for a reservation this coordinator did not hand out."""
    def cancel_midstep(self, reservations: Iterable[_Midstep]) -> None:
        """Returns reserved scratch slots unused (the forward never ran); returns None.
        Raises ValueError for a reservation this coordinator did not hand out."""
    def attach_midstep_scratch(self, slot_pool: StateSlotPool, max_ops_per_batch: _Int) -> None:
        """Borrows midstep scratch slots from ``slot_pool`` (a StateSlotPool), at most
        ``max_ops_per_batch`` copies a batch; returns None. Raises TypeError for another
        pool type, ValueError for a negative count."""
    def attach_offload(self, index: StateOffloadIndex | None, *, sink: bool = True) -> None:
        """Attaches a tier (its vote in ``resumable_hit``, and a sink for offload
        nominations unless ``sink=False``), or detaches with None; returns None. Raises
        only for a bad argument (docs/contract.md, "Errors")."""
    def restore_queued_for(self, dst_slot: _Int) -> bool:
        """Returns whether a restore into ``dst_slot`` is queued. Raises only for a bad
        argument (docs/contract.md, "Errors")."""
    def suspend_queued_restore(self, dst_slot: _Int) -> SuspendedCheckpointRestore | None:
        """Takes the restore queued into ``dst_slot`` out of the batch, keeping its pin;
        returns it, or None when none is queued. Raises AssertionError, changing
        nothing, when two restores are queued for the slot."""
    def resume_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Queues a suspended restore again; returns None. Raises ValueError for a restore
        this store did not suspend (or already resumed or released), AssertionError when
        its image lost its pin."""
    def release_suspended_restore(self, restore: SuspendedCheckpointRestore) -> None:
        """Drops a suspended restore and its pin; returns None. Raises ValueError for a
        restore this store did not suspend (or already resumed or released)."""
    def acquire_checkpoint_source(
        self, prefix_hash: _Int, *, max_inflight: _Int | None = None
    ) -> tuple[StateStoreOperationId, tuple[int, ...]] | None:
        """Pins a READY image for an external transfer (never reclaimed by time); returns
        (operation id, unit ids), or None when there is no such image or
        ``max_inflight`` are out. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def reserve_transfer_units(self, owner: _Owner) -> tuple[int, ...] | None:
        """Reserves one image's units under ("state-transfer", owner) for an external load;
        returns their ids, or None when they cannot be had. Raises ValueError for owner
        None, TypeError for an unhashable owner."""
    def adopt_transfer_units(self, owner: _Owner, prefix_hash: _Int) -> bool:
        """Files the loaded units as a READY image under ``prefix_hash``; returns False
        when ``owner`` holds no reservation or the hash is already kept (the units then
        go back). Raises ValueError for ``prefix_hash == -1``."""
    def release_transfer_units(self, owner: _Owner) -> None:
        """Gives a transfer reservation's units back (no-op without one); returns None.
        Raises TypeError for an unhashable owner."""
    def take_offload_stores(self, max_inflight: _Int) -> list[Any]:
        """Returns up to ``max_inflight`` (operation, unit ids) pairs to hand the tier now,
        each source pinned (none when ``max_inflight`` are already out). Raises only for
        a bad argument (docs/contract.md, "Errors")."""
    def release_offload_store_source(self, op: Any) -> None:
        """Phase one: the units were read out, so the source's pin goes; the operation
        stays dispatched. Returns None. Raises TypeError for an unhashable op."""
    def settle_offload_store(self, op: Any) -> None:
        """Phase two: the tier write completed; the operation is retired. Returns None.
        Raises TypeError for an unhashable op."""
    def was_reclaimed(self, op: Any) -> bool:
        """Returns whether a stale-pin reclamation took the operation's pin. Raises
        TypeError for an unhashable op."""
    def has_offload_pins(self) -> bool:
        """Returns whether any offload pin is held. Raises nothing."""
    def reclaim_stale_offload_pins(self, timeout_s: float) -> int:
        """Takes back offload pins older than ``timeout_s`` seconds (monotonic clock);
        returns how many. ``timeout_s <= 0`` reclaims nothing. Raises TypeError for a
        value that is not a number of seconds."""
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
        """Chooses which checkpoint to spend first ('lru' or 'cost'; see
        ``eviction_policy``); returns None. Raises ValueError naming the argument,
        changing nothing, for an unknown kind or a weight that is negative or not
        finite."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""
    def check_consistency(self) -> None:
        """Checks the invariants of the coordinator, its store and its pool (for tests);
        returns None. Raises AssertionError when one is broken."""

class StateOffloadIndex:
    """A lower tier's membership (capped LRU) and load bookkeeping."""

    def __init__(self, can_store: bool = True, can_load: bool = True, capacity: _Int | None = None) -> None:
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
        """Counts a store attempt of ``h``; returns None. Raises only for a bad argument
        (docs/contract.md, "Errors")."""
    def note_stored(self, h: _Int) -> None:
        """Records that the tier now holds ``h`` (the least recently used hash is dropped
        past capacity); returns None. Raises only for a bad argument (docs/contract.md,
        "Errors")."""
    def note_store_failed(self, h: _Int, untrusted: bool = False) -> None:
        """Counts a failed store of ``h`` (``untrusted``: it failed its integrity check);
        returns None. Raises only for a bad argument (docs/contract.md, "Errors")."""
    def forget(self, h: _Int) -> bool:
        """Drops ``h``; returns whether it was held. Raises only for a bad argument
        (docs/contract.md, "Errors")."""
    def could_serve(self, h: _Int) -> bool:
        """Returns ``can_load and h in hashes``. Raises only for a bad argument
        (docs/contract.md, "Errors")."""
    def request_load(self, h: _Int) -> bool:
        """Starts a load of ``h``; returns False (nothing started) when the tier cannot
        serve it. Raises only for a bad argument (docs/contract.md, "Errors")."""
    def complete_load(self, h: _Int) -> None:
        """Ends the load of ``h`` in flight; returns None. Raises ValueError when no load
        of ``h`` is in flight."""
    def fail_load(self, h: _Int, *, missing: bool = False, untrusted: bool = False) -> None:
        """Ends a failed load of ``h``, forgetting ``h`` when it was ``missing`` or
        ``untrusted``; returns None. Raises ValueError when no load of ``h`` is in
        flight."""
    def abandon_load(self, h: _Int) -> None:
        """Ends a load of ``h`` nobody waits for any more; returns None. Raises ValueError
        when no load of ``h`` is in flight."""
    def stats(self) -> dict[str, int]:
        """Returns a new dict: stores and loads attempted, completed, failed, untrusted,
        missing and abandoned, hashes held and evicted. Raises nothing."""
    def __reduce__(self) -> NoReturn:
        """Raises TypeError: a live object, not a value; it does not pickle or copy."""

# ------------------------------------------------------------- host tier --

class HostArena:
    """Which entries of the host tier's arena hold what: ``capacity_bytes //
    entry_bytes`` entries of one buffer the caller owns; values are filed under
    a key (bytes or str) in a class. ``class_budget_bytes``: per class a cap in
    bytes, or None (no cap: the class competes for the whole arena). Eviction
    ranks every value together with the cost model of the GPU caches
    (``set_eviction_policy``; per byte of the whole prefix with
    ``set_kv_bytes_per_position``), and within a class for room under its cap;
    ``ranking`` ("lru" or "cost") picks the starting model."""

    def __init__(
        self,
        entry_bytes: _Int,
        capacity_bytes: _Int,
        class_budget_bytes: _Seq[SupportsIndex | None],
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
        """Returns a new dict of class ``klass``: budget_entries (its cap, or the arena's
        entries when it has none), used_entries, values, evictions, refused, capped.
        Raises IndexError for an unknown class."""
    @property
    def kv_bytes_per_position(self) -> float: ...
    def set_kv_bytes_per_position(self, bytes: float) -> None:
        """Ranks values per byte of their whole prefix: ``bytes`` of KV per position
        besides the model's checkpoint_bytes (0: per checkpoint byte, as the GPU
        caches); kept across set_eviction_policy; returns None. Raises ValueError for a
        negative or non-finite value."""
    def refile(self, key: bytes | str, position: _Int) -> bool:
        """Files the sealed value under ``key`` at ``position``, as a use; returns
        whether it was there. Raises ValueError for a negative position."""
    def victims(self, klass: _Int, count: _Int) -> list[bytes] | None:
        """Returns the keys ``allocate`` would evict to fit ``count`` entries in class
        ``klass``, in order; None when they cannot be made to fit. Raises IndexError for
        an unknown class, ValueError for ``count < 0``."""
    def allocate(
        self, key: bytes | str, klass: _Int, count: _Int, nbytes: _Int, position: _Int
    ) -> tuple[list[int], list[bytes]] | None:
        """Reserves ``count`` entries for ``key`` (its prefix ends at ``position``, in the
        eviction model's position unit), evicting the lowest-ranked unpinned values (of
        its class when its cap is reached); returns (entry ids, evicted keys), or None
        (nothing changed) when they cannot be had.
        Raises IndexError for an unknown class, ValueError for a bad count, nbytes or
        position or a key already present."""
    def seal(self, key: bytes | str, meta: bytes) -> None:
        """Makes the value under ``key`` findable, with ``meta``; returns None. Raises
        ValueError for a key not allocated or already sealed."""
    def remove(self, key: bytes | str) -> bool:
        """Drops the value under ``key``; returns whether one was there. Raises only for a
        bad argument (docs/contract.md, "Errors")."""
    def contains(self, key: bytes | str) -> bool:
        """Returns whether a sealed value is filed under ``key``. Raises only for a bad
        argument (docs/contract.md, "Errors")."""
    def contains_many(self, keys: list[bytes] | list[str] | tuple[bytes | str, ...], touch: bool = False) -> list[bool]:
        """Returns, for each key of the list ``keys``, whether a sealed value is filed
        under it (one call for a whole chain); ``touch``: each one found counts as a use,
        as ``lookup(key, True)``. Raises TypeError for a key that is not bytes or str."""
    def refile_many(self, keys: list[bytes] | list[str] | tuple[bytes | str, ...], positions: _Seq[_Int]) -> int:
        """Refiles each sealed value of ``keys`` at its position (as ``refile``, in
        order); returns how many were there. Raises ValueError, nothing changed, for a
        negative position or lengths that differ; TypeError for a key that is not bytes
        or str."""
    @property
    def generation(self) -> int:
        """A counter bumped whenever what ``contains`` answers may have changed (a seal,
        a remove, an eviction): an answer derived from it holds while it is unchanged."""
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def lookup(self, key: bytes | str, touch: bool = True) -> tuple[list[int], int, bytes, int] | None:
        """Returns (entry ids, nbytes, meta, klass) of the sealed value under ``key``
        (``touch``: counts as a use), or None. Raises only for a bad argument
        (docs/contract.md, "Errors")."""
    def pin(self, key: bytes | str) -> None:
        """Pins the sealed value under ``key`` (never evicted while pinned); returns None.
        Raises ValueError for a key that is not a sealed value."""
    def unpin(self, key: bytes | str) -> None:
        """Drops one pin of the value under ``key``; returns None. Raises ValueError for a
        key that is not pinned."""
    def pins(self, key: bytes | str) -> int:
        """Returns the pin count of the value under ``key`` (0 without one). Raises only
        for a bad argument (docs/contract.md, "Errors")."""
    def keys(self) -> list[bytes]:
        """Returns the keys filed, as a list of bytes. Raises nothing."""
    def check_consistency(self) -> None:
        """Checks the arena's internal invariants (for tests); returns None. Raises
        AssertionError when one is broken."""
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
        """Chooses which checkpoint to spend first ('lru' or 'cost'; see
        ``eviction_policy``); returns None. Raises ValueError naming the argument,
        changing nothing, for an unknown kind or a weight that is negative or not
        finite."""
    @property
    def eviction_policy(self) -> _EvictionPolicy:
        """The eviction setting as a dict (the arguments of ``set_eviction_policy``)."""

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
        """Stages ``batch`` and launches its copy on the raw stream handle ``stream``;
        returns None. Raises ValueError for a batch this engine cannot hold,
        RuntimeError for a CUDA/HIP error."""
    def stage(self, batch: _CopyBatch) -> None:
        """Fills the next staging buffer with ``batch``'s descriptors, waiting until the
        device read it last time; returns None. Raises ValueError for a batch this
        engine cannot hold, RuntimeError for a CUDA/HIP error."""
    def launch(self, stream: _Int, full_transfer: bool = False, copy_descriptors: bool = True) -> None:
        """Enqueues the descriptor copy and the kernel on ``stream`` (capturable in a CUDA
        graph); returns None. Raises RuntimeError for a CUDA/HIP error."""
    def record_consumed(self, stream: _Int) -> None:
        """Marks the staging buffer as read once ``stream`` reaches this point; returns
        None. Raises RuntimeError for a CUDA/HIP error."""
