"""Runs one batch of state maintenance ops (docs/contract.md, "The pass", "Copying").

A batch is the relocations (``StateSlotPool.take_relocations``), group copies
(``StateGroupPool.take_copies``), PAGE stores and PAGE restores
(``take_checkpoint_ops``) the runner must execute before the next forward.
The C++ span planner validates every op and flattens the batch into
``(src, dst, bytes)`` spans; a GPU executor moves them with one kernel launch
on the current stream, a CPU executor with memcpy. Nothing moves unless the
whole batch is valid.
"""

from __future__ import annotations

import functools
import time

import torch

from statecache import _C
from statecache.layout import PageLayout, StateLayout, layout_id, paged_checkpoint_spec
from statecache.logs import log_config, warn_degraded


@functools.lru_cache(maxsize=32)
def _planner(image: tuple, slots: tuple, units: tuple, num_slots: int, num_units: int, lid: str):
    # One plan template per layout: batches only change bases.
    return _C.SpanPlanner(list(image), list(slots), list(units), num_slots, num_units, lid)


class StateCopyExecutor:
    """Executes maintenance batches over one state layout and one page layout.

    ``device``: ``"cpu"`` (memcpy on CPU tensors) or a CUDA/HIP device; by
    default the layouts' device. ``max_num_seqs`` sizes the descriptor staging:
    ``checkpoint_copy_C.checkpoint_copy_ops_per_batch(max_num_seqs)`` PAGE ops plus
    ``max_slot_copies`` (default ``max_num_seqs``) relocations and copies.
    """

    def __init__(self, state_layout: StateLayout, page_layout: PageLayout, max_num_seqs: int,
                 device=None, *, max_slot_copies: int | None = None):
        if not isinstance(state_layout, StateLayout):
            raise TypeError(f"state_layout must be a StateLayout, got {type(state_layout).__name__}")
        if not isinstance(page_layout, PageLayout):
            raise TypeError(f"page_layout must be a PageLayout, got {type(page_layout).__name__}")
        for name, v in (("max_num_seqs", max_num_seqs), ("max_slot_copies", max_slot_copies)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.device = torch.device(device) if device is not None else state_layout.device
        for name, lay in (("state_layout", state_layout), ("page_layout", page_layout)):
            if lay.device != self.device and not (lay.device.type == self.device.type
                                                  and self.device.index is None):
                raise ValueError(f"{name} lives on {lay.device}, the executor runs on {self.device}")
        if self.device.type != "cpu" and not _C.has_gpu_kernels:
            raise ValueError(f"device={self.device}: statecache was built without GPU kernels")
        self.state_layout = state_layout
        self.page_layout = page_layout
        self.layout_id = layout_id(state_layout, page_layout)
        self.max_num_seqs = max_num_seqs
        self.planner = _planner(tuple(state_layout.image_segment_table()),
                                tuple(state_layout.segment_table()),
                                tuple(page_layout.segment_table()), state_layout.num_slots,
                                page_layout.num_units, self.layout_id)
        self.max_paged_ops = _C.checkpoint_copy_ops_per_batch(max_num_seqs)
        self.max_slot_copies = max_slot_copies if max_slot_copies is not None else max_num_seqs
        self.capacity_spans = (self.max_paged_ops * self.planner.spans_per_paged_op
                               + self.max_slot_copies * self.planner.spans_per_slot_copy)
        self._engine = None
        if self.device.type != "cpu":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device(self.device.type, index)
            self._engine = _C.GpuCopyEngine(index, self.capacity_spans)
        # read by statecache.metrics; seconds: host time to plan and run/enqueue a batch
        self.copy_stats = dict(batches=0, refused=0, spans=0, bytes=0, seconds=0.0)
        log_config("StateCopyExecutor", dict(device=str(self.device), layout_id=self.layout_id,
                                             max_num_seqs=max_num_seqs, spans=self.capacity_spans))

    @property
    def spec(self):
        """The ``PagedStateCheckpointSpec`` of this layout pair."""
        return paged_checkpoint_spec(self.state_layout, self.page_layout)

    def plan(self, relocations=(), copies=(), stores=(), restores=()):
        """Validate the batch and flatten it into spans (nothing moves)."""
        relocations, copies, stores, restores = (
            () if ops is None else tuple(ops) for ops in (relocations, copies, stores, restores))
        plan = self.planner.plan(relocations, copies, stores, restores)
        paged, pairs = len(stores) + len(restores), len(relocations) + len(copies)
        if paged > self.max_paged_ops or pairs > self.max_slot_copies:
            raise ValueError(
                f"the batch has {paged} stores + restores and {pairs} relocations + copies; the "
                f"staging holds {self.max_paged_ops} (checkpoint_copy_ops_per_batch(max_num_seqs="
                f"{self.max_num_seqs})) and {self.max_slot_copies} (max_slot_copies)")
        return plan

    def __call__(self, relocations=(), copies=(), stores=(), restores=()):
        """Run a batch on the current stream (in the order of docs/contract.md,
        "The pass"); returns its plan. Counted in ``copy_stats``.

        Raises ValueError naming the first bad op before any byte moves.
        """
        t0, st = time.perf_counter(), self.copy_stats
        try:
            plan = self.plan(relocations, copies, stores, restores)
        except ValueError as e:
            st["refused"] += 1
            warn_degraded("executor.refused", "copy batch refused, nothing moved: %s", e)
            raise
        if plan.num_spans:
            if self._engine is None:
                plan.run_on_cpu()
            else:
                self._engine.submit(plan, self._stream())
        st["batches"] += 1
        st["spans"] += plan.num_spans
        st["bytes"] += plan.bytes
        st["seconds"] += time.perf_counter() - t0
        return plan

    run = __call__

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def capture(self, max_spans: int | None = None) -> "CapturedStateCopy":
        """A CUDA/HIP graph of one batch launch, to replay with new ops."""
        if self._engine is None:
            raise ValueError("graph capture needs a GPU executor, this one runs on the CPU")
        return CapturedStateCopy(self, max_spans if max_spans is not None else self.capacity_spans)


class CapturedStateCopy:
    """One descriptor copy + kernel captured in a graph, replayed per batch.

    The graph copies ``max_spans`` descriptors from its own pinned staging at
    every replay, so keep ``max_spans`` near the largest batch it will carry.
    ``replay(...)`` validates and stages the batch, replays, and marks the
    staging as read. To put the launch in a larger graph of your own, call
    ``record()`` inside that capture and ``stage(...)`` / ``consumed()``
    around each replay of it.
    """

    def __init__(self, executor: StateCopyExecutor, max_spans: int):
        if not isinstance(max_spans, int) or max_spans <= 0 or max_spans > executor.capacity_spans:
            raise ValueError(f"max_spans={max_spans!r} must be in [1, {executor.capacity_spans}]")
        self.executor = executor
        self.max_spans = max_spans
        self._engine = _C.GpuCopyEngine(executor.device.index, max_spans, 1)
        self._engine.stage(executor.planner.plan())  # empty: replays before staging move nothing
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(executor.device), torch.cuda.graph(self.graph):
            self.record()

    def record(self) -> None:
        self._engine.launch(self.executor._stream(), self.max_spans)

    def stage(self, relocations=(), copies=(), stores=(), restores=()):
        plan = self.executor.plan(relocations, copies, stores, restores)
        if plan.num_spans > self.max_spans:
            raise ValueError(f"the batch needs {plan.num_spans} copy spans, the graph was "
                             f"captured for {self.max_spans}")
        self._engine.stage(plan)
        return plan

    def consumed(self) -> None:
        self._engine.record_consumed(self.executor._stream())

    def replay(self, relocations=(), copies=(), stores=(), restores=()):
        plan = self.stage(relocations, copies, stores, restores)
        self.graph.replay()
        self.consumed()
        return plan
