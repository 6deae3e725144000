"""Runs one batch of state maintenance ops (docs/contract.md, "The pass", "Copying").

A batch is the relocations (``StateSlotPool.take_relocations``), group copies
(``StateGroupPool.take_copies``), PAGE stores and PAGE restores
(``take_checkpoint_ops``) the runner must execute before the next forward.
The C++ planner validates every op and compiles the batch into one small
descriptor per op; the layout's templates (which bytes one op moves) were
built once. A GPU executor moves the batch with one kernel launch on the
device's current stream, a CPU executor with memcpy. Nothing moves unless the
whole batch is valid and every tensor still has the storage its layout read.

``HostCopyExecutor`` moves whole rows of one layout (page units, or slot
images) between device memory and the entries of a pinned host buffer: the
copy kernel on a few SMs for short rows, DMA for long ones (the crossover
measured on the device at first use), on side streams with events, so the
forward never waits for an offload and a load lands before the work queued
after it. The CPU executor moves the same bytes with memcpy, synchronously,
behind the same API.

Threading: an executor (and its captured graphs) may be shared between Python
threads; each batch (convert the ops, check the tensors, copy) runs under the
executor's lock, and the C++ side never releases the GIL.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import torch

from statecache import _C
from statecache.layout import PageLayout, StateLayout, layout_id, paged_checkpoint_spec, storage_fingerprint
from statecache.logs import log_config, warn_degraded

# The current stream's raw handle without building a Stream object (a few
# microseconds a batch); torch.cuda.current_stream where torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_handle(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _ops(ops):
    return () if ops is None else ops if type(ops) in (list, tuple) else tuple(ops)


@functools.lru_cache(maxsize=32)
def _planner(image: tuple, slots: tuple, units: tuple, num_slots: int, num_units: int, lid: str):
    # One template per layout (addresses included): batches only name slots and units.
    return _C._SpanPlanner(list(image), list(slots), list(units), num_slots, num_units, lid)


def _resolve_device(device, state_layout: StateLayout, page_layout: PageLayout) -> torch.device:
    """The executor's device: explicit, never whatever device is current."""
    dev = torch.device(device) if device is not None else state_layout.device
    for name, lay in (("state_layout", state_layout), ("page_layout", page_layout)):
        if lay.device.type != dev.type or (dev.index is not None and lay.device != dev):
            raise ValueError(f"{name} lives on {lay.device}, the executor runs on {dev}")
    if dev.type != "cpu" and dev.index is None:
        dev = state_layout.device  # "cuda" means the layouts' GPU
    if state_layout.device != page_layout.device:
        raise ValueError(f"state_layout lives on {state_layout.device}, page_layout on {page_layout.device}")
    return dev


class StateCopyExecutor:
    """Executes maintenance batches over one state layout and one page layout.

    ``device``: ``"cpu"`` (memcpy on CPU tensors) or the CUDA/HIP device the
    layouts live on; by default the layouts' device. Every launch happens on
    that device (current stream of that device), whichever device is current.
    ``max_num_seqs`` sizes the descriptor staging:
    ``checkpoint_copy_ops_per_batch(max_num_seqs)`` PAGE ops plus
    ``max_slot_copies`` (default ``max_num_seqs``) relocations and copies.
    """

    def __init__(
        self,
        state_layout: StateLayout,
        page_layout: PageLayout,
        max_num_seqs: int,
        device=None,
        *,
        max_slot_copies: int | None = None,
    ):
        if not isinstance(state_layout, StateLayout):
            raise TypeError(f"state_layout must be a StateLayout, got {type(state_layout).__name__}")
        if not isinstance(page_layout, PageLayout):
            raise TypeError(f"page_layout must be a PageLayout, got {type(page_layout).__name__}")
        for name, v in (("max_num_seqs", max_num_seqs), ("max_slot_copies", max_slot_copies)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.device = _resolve_device(device, state_layout, page_layout)
        if self.device.type != "cpu" and not _C.has_gpu_kernels:
            raise ValueError(f"device={self.device}: statecache was built without GPU kernels")
        self.state_layout = state_layout
        self.page_layout = page_layout
        self.layout_id = layout_id(state_layout, page_layout)
        self.max_num_seqs = max_num_seqs
        self._planner = _planner(
            tuple(state_layout.image_segment_table()),
            tuple(state_layout.segment_table()),
            tuple(page_layout.segment_table()),
            state_layout.num_slots,
            page_layout.num_units,
            self.layout_id,
        )
        self.max_paged_ops = _C.checkpoint_copy_ops_per_batch(max_num_seqs)
        self.max_slot_copies = max_slot_copies if max_slot_copies is not None else max_num_seqs
        self._lock = threading.RLock()
        self._fingerprint = state_layout._table.fingerprint + page_layout._table.fingerprint
        self._engine = None
        if self.device.type != "cpu":
            with torch.cuda.device(self.device):
                self._engine = _C._GpuCopyEngine(
                    self.device.index, self._planner, self.max_slot_copies, self.max_paged_ops
                )
        # read by statecache.metrics; seconds: host time to plan and run/enqueue a batch
        self.copy_stats = dict(batches=0, refused=0, spans=0, bytes=0, seconds=0.0)
        log_config(
            "StateCopyExecutor",
            dict(
                device=str(self.device),
                layout_id=self.layout_id,
                max_num_seqs=max_num_seqs,
                max_paged_ops=self.max_paged_ops,
            ),
        )

    @property
    def spec(self):
        """The ``PagedStateCheckpointSpec`` of this layout pair."""
        return paged_checkpoint_spec(self.state_layout, self.page_layout)

    @property
    def units_per_image(self) -> int:
        return self._planner.units_per_image

    def plan(self, relocations=(), copies=(), stores=(), restores=()):
        """Validate the batch and compile it (nothing moves). Returns the batch
        (``num_ops``, ``bytes``). Raises ValueError naming the first bad op, a
        batch larger than the staging, or a layout whose storage changed.

        Every op is converted (its ``__index__``, a duck-typed op's properties:
        Python code that may replace a tensor's storage) before the tensors are
        checked, and nothing runs between the check and the copy that follows."""
        relocations, copies, stores, restores = _ops(relocations), _ops(copies), _ops(stores), _ops(restores)
        paged, pairs = len(stores) + len(restores), len(relocations) + len(copies)
        if paged > self.max_paged_ops or pairs > self.max_slot_copies:
            raise ValueError(
                f"the batch has {paged} stores + restores and {pairs} relocations + copies; the "
                f"staging holds {self.max_paged_ops} (checkpoint_copy_ops_per_batch(max_num_seqs="
                f"{self.max_num_seqs})) and {self.max_slot_copies} (max_slot_copies)"
            )
        batch = self._planner.compile(relocations, copies, stores, restores)
        if _C._first_changed(self._fingerprint) >= 0:
            self.state_layout.check()  # raises, naming the tensor
            self.page_layout.check()
        return batch

    def __call__(self, relocations=(), copies=(), stores=(), restores=()):
        """Run a batch on the device's current stream (in the order of docs/contract.md,
        "The pass"); returns it. Counted in ``copy_stats``.

        Raises ValueError naming the first bad op before any byte moves.
        """
        with self._lock:
            t0, st = time.perf_counter(), self.copy_stats
            stream = None if self._engine is None else self._stream()  # before the check: torch code
            try:
                batch = self.plan(relocations, copies, stores, restores)
            except ValueError as e:
                st["refused"] += 1
                warn_degraded("executor.refused", "copy batch refused, nothing moved: %s", e)
                raise
            if batch.num_ops:
                if self._engine is None:
                    self._planner.run_on_cpu(batch)
                else:
                    self._engine.submit(batch, stream)
            st["batches"] += 1
            st["spans"] += batch.num_ops
            st["bytes"] += batch.bytes
            st["seconds"] += time.perf_counter() - t0
            return batch

    run = __call__

    def _stream(self) -> int:
        return _stream_handle(self.device)

    def capture(
        self, max_paged_ops: int | None = None, max_slot_copies: int | None = None, buffers: int = 2
    ) -> CapturedStateCopy:
        """A CUDA/HIP graph of one batch launch, to replay with new ops.

        The graph copies room for ``max_paged_ops`` stores + restores and
        ``max_slot_copies`` relocations + copies (default: the executor's) at
        every replay, so keep them near the largest batch it will carry.
        ``buffers=2`` captures two graphs over two staging buffers, used in
        turn, so the host stages the next batch while the last one runs.
        Returns the ``CapturedStateCopy``. Raises ValueError on a CPU executor
        and for bad sizes.
        """
        if self._engine is None:
            raise ValueError("graph capture needs a GPU executor, this one runs on the CPU")
        paged = self.max_paged_ops if max_paged_ops is None else max_paged_ops
        pairs = self.max_slot_copies if max_slot_copies is None else max_slot_copies
        return CapturedStateCopy(self, paged, pairs, buffers)


class CapturedStateCopy:
    """Descriptor copy + kernel captured in a graph on the executor's device,
    replayed per batch (one graph per staging buffer, used in turn).

    ``replay(...)`` validates and stages the batch, replays, and marks the
    staging as read. To put the launch in a larger graph of your own, capture
    with ``buffers=1``, call ``record()`` inside your capture (on the
    executor's device) and ``stage(...)`` / ``consumed()`` around each replay
    of it.
    """

    def __init__(self, executor: StateCopyExecutor, max_paged_ops: int, max_slot_copies: int, buffers: int = 2):
        for name, v, top in (
            ("max_paged_ops", max_paged_ops, executor.max_paged_ops),
            ("max_slot_copies", max_slot_copies, executor.max_slot_copies),
            ("buffers", buffers, 2),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > top:
                raise ValueError(f"{name}={v!r} must be in [0, {top}]")
        if max_paged_ops + max_slot_copies == 0:
            raise ValueError("max_paged_ops + max_slot_copies must be > 0")
        if buffers == 0:
            raise ValueError("buffers=0 must be 1 or 2")
        self.executor = executor
        self.device = executor.device
        self.max_paged_ops = max_paged_ops
        self.max_slot_copies = max_slot_copies
        self._current = 0
        with torch.cuda.device(self.device):
            self._engines = [
                _C._GpuCopyEngine(self.device.index, executor._planner, max_slot_copies, max_paged_ops, 1)
                for _ in range(buffers)
            ]
            self._graphs = []
            for b in range(buffers):
                g = torch.cuda.CUDAGraph()
                # torch's default capture stream lives on whichever device captured first
                with torch.cuda.graph(g, stream=torch.cuda.Stream(self.device)):
                    self.record(b)
                self._graphs.append(g)

    @property
    def graph(self) -> torch.cuda.CUDAGraph:
        """The graph that reads the most recently staged batch."""
        return self._graphs[self._current]

    @property
    def _engine(self):
        return self._engines[self._current]

    def record(self, buffer: int = 0) -> None:
        """Enqueue the descriptor copy of staging ``buffer`` and the kernel
        (inside a capture); returns None. Raises IndexError for a buffer that
        does not exist, RuntimeError for a CUDA/HIP error."""
        self._engines[buffer].launch(self.executor._stream(), True)

    def stage(self, relocations=(), copies=(), stores=(), restores=()):
        """Validates the batch and writes it to the next staging buffer (waits
        until the device read that buffer last time); returns the compiled
        batch. Raises ValueError as ``plan`` does, or for a batch larger than
        the graph was captured for."""
        with self.executor._lock:
            batch = self.executor.plan(relocations, copies, stores, restores)
            if batch.num_paged_ops > self.max_paged_ops or batch.num_slot_copies > self.max_slot_copies:
                raise ValueError(
                    f"the batch has {batch.num_paged_ops} stores + restores and {batch.num_slot_copies} "
                    f"relocations + copies, the graph was captured for {self.max_paged_ops} and "
                    f"{self.max_slot_copies}"
                )
            nxt = (self._current + 1) % len(self._engines)
            self._engines[nxt].stage(batch)  # waits until that buffer's last replay read it
            self._current = nxt
            return batch

    def consumed(self) -> None:
        """Marks the current staging buffer as read once the stream gets here;
        returns None. Raises RuntimeError for a CUDA/HIP error."""
        self._engine.record_consumed(self.executor._stream())

    def replay(self, relocations=(), copies=(), stores=(), restores=()):
        """Stages the batch and replays the graph on the current stream;
        returns the compiled batch. Raises ValueError as ``stage`` does."""
        with self.executor._lock:
            batch = self.stage(relocations, copies, stores, restores)
            self.graph.replay()
            self.consumed()
            return batch


_PATHS = {"auto": 0, "sm": 1, "dma": 2}
_PATH_NAMES = {0: "none", 1: "sm", 2: "dma"}


class HostCopy:
    """One batch of host moves: queued on a side stream (GPU) or done (CPU).

    ``done()`` polls; ``wait()`` blocks the host until the bytes have landed
    (then the device rows of an offload may be rewritten and its host entries
    read, or the host entries of a load reused); ``wait_stream(stream)`` makes
    a stream (default: the current one) wait for it without blocking the host.
    ``path`` is how it travelled (``"sm"``, ``"dma"``, ``"cpu"``; ``"none"`` when
    empty) and ``bytes`` what it moved.
    """

    __slots__ = ("event", "bytes", "path", "device")

    def __init__(self, event, nbytes: int, path: str, device: torch.device):
        self.event, self.bytes, self.path, self.device = event, nbytes, path, device

    def done(self) -> bool:
        """Returns True once every byte has landed. Raises nothing."""
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Blocks until every byte has landed; returns None. Raises RuntimeError for a CUDA/HIP error."""
        if self.event is not None:
            self.event.synchronize()

    def wait_stream(self, stream=None) -> None:
        """Makes ``stream`` (default: the device's current stream) wait for this
        move; returns None. Raises RuntimeError for a CUDA/HIP error."""
        if self.event is not None:
            (stream if stream is not None else torch.cuda.current_stream(self.device)).wait_event(self.event)


class HostCopyExecutor:
    """Moves whole items of one layout between device memory and a host buffer.

    ``layout``: a ``PageLayout`` (an item is a page unit, all its rows) or a
    ``StateLayout`` (an item is a slot's checkpoint image). ``host``: a 2-D
    contiguous uint8 CPU tensor ``[entries, entry_bytes]`` (pinned when the
    layout is on a GPU); an item takes ``entries_per_item`` entries, given in
    order, each filled from its start (the last one may be partly used).
    ``max_items``: items the SM path stages per launch (larger moves go in
    slices; DMA takes any size at once); default: 8192 entries' worth.
    ``path``: ``"auto"`` (the copy kernel on a few SMs for rows shorter than
    the crossover measured on the device, DMA for longer ones), ``"sm"`` or
    ``"dma"``. A CPU layout moves with memcpy, synchronously; the API is the
    same.
    """

    def __init__(self, layout, host, *, max_items: int | None = None, path: str = "auto"):
        if isinstance(layout, PageLayout):
            image = slot = layout.segment_table()
            count, item_bytes = layout.num_units, layout.unit_bytes
        elif isinstance(layout, StateLayout):
            image, slot = layout.image_segment_table(), layout.segment_table()
            count, item_bytes = layout.num_slots, layout.image_bytes
        else:
            raise TypeError(f"layout must be a PageLayout or a StateLayout, got {type(layout).__name__}")
        if not isinstance(host, torch.Tensor):
            raise TypeError(f"host must be a torch.Tensor, got {type(host).__name__}")
        if host.device.type != "cpu" or host.dtype != torch.uint8 or host.dim() != 2 or not host.is_contiguous():
            raise ValueError(
                f"host must be a contiguous 2-D uint8 CPU tensor [entries, entry_bytes], got {host.dtype} "
                f"{tuple(host.shape)} on {host.device}"
            )
        if host.numel() == 0:
            raise ValueError(f"host {tuple(host.shape)} holds no bytes")
        if max_items is not None and (not isinstance(max_items, int) or isinstance(max_items, bool) or max_items <= 0):
            raise ValueError(f"max_items={max_items!r} must be a positive int")
        if path not in _PATHS:
            raise ValueError(f"path={path!r} must be one of {sorted(_PATHS)}")
        self.layout, self.host, self.device = layout, host, layout.device
        self.entry_bytes = host.shape[1]
        self.item_bytes = item_bytes
        self.entries_per_item = -(-item_bytes // self.entry_bytes)
        self.max_items = max_items if max_items is not None else max(1, 8192 // self.entries_per_item)
        self._planner = _planner(
            tuple(image),
            tuple(slot),
            (host.data_ptr(), self.entry_bytes, self.entry_bytes),
            count,
            host.shape[0],
            "host-moves",
        )
        self._fingerprint = layout._table.fingerprint + (storage_fingerprint(host),)
        self._lock = threading.RLock()
        self._engines = self._streams = None
        self._path = _PATHS[path]
        # read by statecache.metrics; seconds: host time to plan and enqueue
        self.copy_stats = dict(batches=0, to_host_bytes=0, from_host_bytes=0, sm=0, dma=0, seconds=0.0)
        if self.device.type == "cpu":
            return
        if not _C.has_gpu_kernels:
            raise ValueError(f"device={self.device}: statecache was built without GPU kernels")
        if not host.is_pinned():
            raise ValueError("host must be pinned memory (pin_memory=True) for a GPU layout")
        if not _C._host_memory_mapped(self.device.index, host.data_ptr(), host.numel()):
            if path == "sm":
                raise ValueError("path='sm': this device's kernels cannot address the host buffer; use 'dma'")
            self._path = _PATHS["dma"]  # DMA reaches any pinned memory
        with torch.cuda.device(self.device):
            # One engine and one stream a direction: loads never queue behind offloads.
            self._engines = tuple(
                _C._GpuCopyEngine(self.device.index, self._planner, 0, self.max_items, 2, 0, True) for _ in range(2)
            )
            self._streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))

    def offload(self, items, entries) -> HostCopy:
        """Copies the device rows of ``items`` (unit or slot ids) into host
        ``entries`` (``entries_per_item`` per item, flat, in order). Ordered
        after the work queued so far on the current stream; the current stream
        does not wait for it. Until it is done the rows must not be written nor
        the entries read. Returns the ``HostCopy``. Raises ValueError naming the
        first bad item (out of range, an entry written twice, a wrong entry
        count) before anything moves."""
        return self._move(items, entries, True)

    def load(self, entries, items) -> HostCopy:
        """Copies host ``entries`` into the device rows of ``items``. Ordered
        after the work queued so far on the current stream, which then waits
        for it (work queued later reads the loaded rows); the host does not
        wait. Until it is done the entries must not change. Returns the
        ``HostCopy``. Raises ValueError as ``offload`` does."""
        return self._move(items, entries, False)

    def _move(self, items, entries, to_host: bool) -> HostCopy:
        items = np.asarray(items, dtype=np.int64).reshape(-1)
        entries = np.asarray(entries, dtype=np.int64).reshape(-1)
        with self._lock:
            t0 = time.perf_counter()
            if _C._first_changed(self._fingerprint) >= 0:
                self.layout.check()
                raise ValueError("host: its storage was replaced or resized since the HostCopyExecutor was built")
            if len(entries) != len(items) * self.entries_per_item:
                raise ValueError(
                    f"entries has {len(entries)} ids for {len(items)} items; each takes {self.entries_per_item}"
                )
            batch = self._planner.compile_paged(items, entries, not to_host)  # validates the whole move
            st = self.copy_stats
            st["batches"] += 1
            st["to_host_bytes" if to_host else "from_host_bytes"] += batch.bytes
            if self._engines is None:
                if batch.num_ops:
                    self._planner.run_on_cpu(batch)
                st["seconds"] += time.perf_counter() - t0
                return HostCopy(None, batch.bytes, "cpu" if batch.num_ops else "none", self.device)
            engine, stream = self._engines[1 - to_host], self._streams[1 - to_host]
            current = torch.cuda.current_stream(self.device)
            stream.wait_stream(current)
            # The SM path stages max_items at a time (the engine slices); DMA takes any size.
            path = engine.submit(batch, stream.cuda_stream, self._path) if batch.num_ops else 0
            event = torch.cuda.Event()
            event.record(stream)
            if not to_host:
                current.wait_event(event)
            st[_PATH_NAMES[path]] = st.get(_PATH_NAMES[path], 0) + 1
            st["seconds"] += time.perf_counter() - t0
            return HostCopy(event, batch.bytes, _PATH_NAMES[path], self.device)
