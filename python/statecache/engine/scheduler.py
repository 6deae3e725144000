"""Continuous-batching scheduler following the pass protocol (docs/contract.md, "The pass").

One ``Engine.step()`` is one pass:

1. top of pass: ``release_pins`` and ``complete_previous_batch``;
2. admission and scheduling under a token budget (running sequences first,
   then waiting ones in arrival order);
3. build the batch: ``take_relocations`` and ``take_checkpoint_ops`` (and a
   group pool's ``take_copies``, where a backend has one; none here) become
   the batch's ``StateOps``; a pass with no sequences still drains them and
   hands the runner the ops alone, so no image is READY without its bytes;
4. forward: ``runner.execute(batch)`` runs the ops, then the model;
5. postprocess: publish full KV blocks, then checkpoint the boundaries the
   placement chose that this forward ended on.

A runner is any object with ``execute(batch) -> dict[seq_id, token | None]``
(see :class:`Batch`). With no model (the trace simulator) it returns None per
sequence and the engine takes the request's scripted output instead.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import statecache
from statecache.logs import log_config

from .adaptive import AdaptiveCheckpointPolicy
from .block_manager import BlockManager
from .placement import AnchorLadderDemand, GuessFirstLRU
from .state_caches import StateCaches, StateOps

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass
class EngineConfig:
    hash_block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True
    # 0: keep no checkpoints, -1: prompt-end anchor and demand rung only,
    # N > 0: also a rung every N tokens.
    checkpoint_interval_tokens: int = -1
    num_spec: int = 0
    # The deployment key of the 128-bit prefix keys (engine/deployment_key.py):
    # None and None draw a random one per process; engines sharing a tier
    # below GPU memory configure one, as a secret (docs/operations.md).
    hash_seed: int | None = field(default=None, repr=False)
    hash_salt: bytes | str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("hash_block_size", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive int")
        n = self.checkpoint_interval_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < -1:
            raise ValueError(f"checkpoint_interval_tokens={n!r} must be -1, 0 or a positive int")
        # The messages name the type, not the value: it is a secret.
        if self.hash_seed is not None and (
            not isinstance(self.hash_seed, int)
            or isinstance(self.hash_seed, bool)
            or not (-(2**63) <= self.hash_seed < 2**63)
        ):
            raise ValueError(f"hash_seed (a {type(self.hash_seed).__name__}) must be a 64-bit int or None")
        if self.hash_salt is not None and not isinstance(self.hash_salt, (bytes, str)):
            raise ValueError(f"hash_salt (a {type(self.hash_salt).__name__}) must be bytes, str or None")
        if not isinstance(self.num_spec, int) or self.num_spec < 0:
            raise ValueError(f"num_spec={self.num_spec!r} must be an int >= 0")


class Request(statecache.Sequence):
    """One generation request: prompt, output so far, and its KV/state holdings."""

    _ids = itertools.count()

    def __init__(
        self,
        prompt_token_ids,
        max_new_tokens: int,
        request_id=None,
        scripted_output=None,
        eos_token_id=None,
        arrival=0.0,
    ):
        seq_id = next(Request._ids)
        super().__init__(seq_id=seq_id, num_tokens=len(prompt_token_ids), num_prompt_tokens=len(prompt_token_ids))
        self.request_id = request_id if request_id is not None else seq_id
        self.token_ids = list(prompt_token_ids)
        self.max_new_tokens = max_new_tokens
        self.scripted_output = list(scripted_output) if scripted_output is not None else None
        self.eos_token_id = eos_token_id
        self.arrival = arrival
        self.status = WAITING
        self.block_table: list[int] = []
        self.hashes: list[int] = []  # chained block hashes (mirrored in block_hashes)
        self.prefix_keys: list[bytes] = []  # 16-byte prefix key per full block
        self.num_computed_tokens = 0
        self.num_published_blocks = 0
        self.num_cached_tokens = 0
        self.state_source = "none"
        self.planned = []
        self.placement_ctx = None
        self.num_preemptions = 0
        self.prefill_computed = 0
        self.prefill_chunks = 0
        self.logits = []  # per output token, when the runner returns them

    @property
    def output_token_ids(self) -> list[int]:
        """The tokens generated so far."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_prefill(self) -> bool:
        """Whether the prompt (or a recompute after preemption) is not fully computed."""
        return self.num_computed_tokens < self.num_tokens - 1 or not self.output_token_ids

    def append_token(self, token: int) -> None:
        """Appends a generated token (``num_tokens`` follows)."""
        self.token_ids.append(int(token))
        self.num_tokens = len(self.token_ids)


@dataclass
class BatchItem:
    """One sequence's share of a forward: tokens ``[start, start+len)``.

    The state is read from ``read_slot`` (the fork source on a fork, else the
    sequence's own slot) and written to ``write_slot``. ``midstep`` lists
    ``(slot, position)`` interior states to copy out (readable_midstep
    backends). ``sample`` asks for the next token.
    """

    seq: Request
    start: int
    token_ids: list
    block_table: list
    read_slot: int
    write_slot: int
    sample: bool
    midstep: list = field(default_factory=list)


@dataclass
class Batch:
    ops: StateOps
    items: list


class Engine:
    """Reference engine: a block manager and a scheduler over the library."""

    def __init__(
        self,
        config: EngineConfig,
        block_pool,
        caches: StateCaches,
        runner,
        placement=None,
        eviction=None,
        tiers=None,
        tier_options=None,
    ):
        self.config = config
        self.caches = caches
        self.runner = runner
        # The adaptive default serves both seams; a pinned seam gets the
        # fixed reference policy as its partner.
        if placement is None and eviction is None:
            placement = eviction = AdaptiveCheckpointPolicy()
        self.block_manager = BlockManager(
            block_pool,
            caches,
            config.hash_block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            num_spec=config.num_spec,
            placement=placement or AnchorLadderDemand(),
            eviction=eviction or GuessFirstLRU(),
            interval_tokens=config.checkpoint_interval_tokens,
            hash_seed=config.hash_seed,
            hash_salt=config.hash_salt,
        )
        self.tiering = None
        if tiers:
            from .tiering import attach_tiers

            self.tiering = attach_tiers(self, tiers, **(tier_options or {}))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.num_passes = 0
        self.num_preemptions = 0
        secret = ("hash_seed", "hash_salt")
        log_config(
            "Engine",
            dict(
                **{k: v for k, v in vars(config).items() if k not in secret},
                hash_key="configured" if self.block_manager.deployment_key.configured else "random per process",
                transfer=caches.transfer.kind,
                slots=caches.slot_pool.num_slots,
                paged=caches.pages,
                blocks=block_pool.num_blocks,
            ),
        )

    # ------------------------------- intake -------------------------------- #

    def add_request(self, req: Request) -> None:
        """Queues ``req``. Raises ValueError if it was added before or its prompt is empty."""
        if req.status != WAITING or any(r is req for r in self.waiting):
            raise ValueError(f"request {req.request_id} was already added (status {req.status})")
        if req.num_prompt_tokens < 1:
            raise ValueError(f"prompt_token_ids must not be empty (request {req.request_id})")
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    def run_until_done(self, max_passes: int = 1_000_000) -> list[Request]:
        """Steps until nothing waits or runs (at most ``max_passes``); returns the
        requests that finished. Raises RuntimeError if a request can never be admitted."""
        done = []
        for _ in range(max_passes):
            if not self.has_unfinished():
                break
            done += self.step()
        return done

    # -------------------------------- pass --------------------------------- #

    def step(self) -> list[Request]:
        """One pass. Returns the requests that finished in it."""
        self.num_passes += 1
        bm = self.block_manager
        # 1. top of pass
        self.caches.top_of_pass()
        if self.tiering is not None:
            self.tiering.top_of_pass()
        bm.eviction.before_admission(self)
        # 2. admission + scheduling
        items, reservations = self._schedule()
        if not items and not self.running and self.waiting:
            raise RuntimeError(
                f"request {self.waiting[0].request_id} cannot be admitted even with nothing "
                "running: the KV block pool or the state slots are too small for it"
            )
        # 3. build the batch
        ops = bm.take_ops()
        if self.tiering is not None:
            self.tiering.flush_kv()  # evicted KV blocks go down before the forward reuses them
        # 4. forward (an empty pass still runs the drained ops, no model)
        results = self.runner.execute(Batch(ops, items)) if (items or ops) else {}
        # 5. postprocess
        return self._postprocess(items, reservations, results or {})

    def _schedule(self):
        cfg, bm = self.config, self.block_manager
        budget = cfg.max_num_batched_tokens
        items, reservations = [], {}
        # Running sequences: a pending fork source must be read next forward
        # (its pin clears within two passes), so those go first.
        order = sorted(self.running, key=lambda s: (s.state_fork_src < 0, s.arrival, s.seq_id))
        scheduled = set()
        for seq in order:
            if seq.status != RUNNING or budget <= 0 and seq.state_fork_src < 0:
                continue
            if not seq.is_prefill:
                while not bm.can_append(seq):
                    victim = self._pick_victim(exclude=seq, scheduled=scheduled)
                    if victim is None:
                        break
                    self.preempt(victim)
                if seq.status != RUNNING or not bm.can_append(seq):
                    if seq.status == RUNNING:
                        self.preempt(seq)
                    continue
                bm.append_slot(seq)
            item, n = self._make_item(seq, budget, reservations)
            items.append(item)
            scheduled.add(seq.seq_id)
            budget -= n
        # Waiting sequences, in arrival order; stop at the first that does not fit.
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            adm = bm.can_allocate(seq)
            if adm is None:
                break
            self.waiting.popleft()
            bm.allocate(seq, adm)
            seq.status = RUNNING
            self.running.append(seq)
            item, n = self._make_item(seq, budget, reservations)
            items.append(item)
            scheduled.add(seq.seq_id)
            budget -= n
        return items, reservations

    def _make_item(self, seq: Request, budget: int, reservations) -> tuple[BatchItem, int]:
        bm = self.block_manager
        start = seq.num_computed_tokens
        if not seq.is_prefill:
            n = 1
        else:
            end = seq.num_tokens
            if not self.caches.readable_midstep:
                end = bm.next_cut(seq)
            # A fork's successor must commit its room in one forward.
            floor = int(self.caches.slot_pool.min_fork_tokens) if seq.state_fork_src >= 0 else 1
            n = min(end - start, max(budget, floor))
        midstep = []
        if self.caches.readable_midstep and seq.is_prefill:
            inside = [b for b in seq.planned if start < b.position < start + n]
            if inside:
                res = bm.reserve_midstep(seq, inside)
                reservations[seq.seq_id] = res
                for _cache, rs in res:
                    midstep += [(r[0], r[1]) for r in rs]
        read = seq.state_fork_src if seq.state_fork_src >= 0 else seq.state_slot
        ends_prompt = start + n >= seq.num_tokens
        item = BatchItem(
            seq,
            start,
            seq.token_ids[start : start + n],
            list(seq.block_table),
            read,
            seq.state_slot,
            ends_prompt,
            midstep,
        )
        return item, n

    def _postprocess(self, items, reservations, results) -> list[Request]:
        bm = self.block_manager
        done = []
        for item in items:
            seq = item.seq
            if seq.status != RUNNING:
                continue
            n = len(item.token_ids)
            was_prefill = seq.is_prefill
            seq.num_computed_tokens = item.start + n
            if was_prefill:
                seq.prefill_computed += n
                seq.prefill_chunks += 1
            seq.state_fork_src = -1  # the forward read it
            bm.publish(seq)  # first: states are filed only where the KV is seq's own
            res = reservations.pop(seq.seq_id, None)
            if res:
                bm.publish_midstep(seq, res)
            for b in seq.planned:
                if b.position == seq.num_computed_tokens:
                    bm.checkpoint(seq, b)
            if not was_prefill:
                bm.decode_boundary(seq)
            if item.sample:
                out = results.get(seq.seq_id)
                token, logits = out if isinstance(out, tuple) else (out, None)
                if token is None:
                    token = seq.scripted_output[len(seq.output_token_ids)]
                if logits is not None:
                    seq.logits.append(logits)
                seq.append_token(token)
                if self._is_finished(seq):
                    self._finish(seq)
                    done.append(seq)
        return done

    def _is_finished(self, seq: Request) -> bool:
        out = seq.output_token_ids
        if len(out) >= seq.max_new_tokens:
            return True
        return seq.eos_token_id is not None and out and out[-1] == seq.eos_token_id

    def _finish(self, seq: Request) -> None:
        self.block_manager.free(seq)
        seq.status = FINISHED
        self.running.remove(seq)
        self.finished.append(seq)

    def _pick_victim(self, exclude, scheduled):
        for seq in reversed(self.running):
            if seq is not exclude and seq.seq_id not in scheduled:
                return seq
        return None

    def preempt(self, seq: Request) -> None:
        """Recompute-style preemption: everything goes back, the request waits
        at the front of the queue with its tokens so far."""
        if seq.state_fork_src >= 0 or any(b.position == seq.num_computed_tokens for b in seq.planned):
            # its last forward ended on a boundary whose checkpoint is in flight
            self.block_manager.count("preempted_with_pending_checkpoint")
        self.block_manager.free(seq)
        seq.status = WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def close(self) -> None:
        """Finishes the tiers' writes in flight and detaches them."""
        if self.tiering is not None:
            self.tiering.close()

    def checkpoint_funnel(self) -> dict[str, int]:
        """The block manager's funnel plus ``preemptions`` and ``passes``
        (see ``BlockManager.checkpoint_funnel``)."""
        out = self.block_manager.checkpoint_funnel()
        out["preemptions"] = self.num_preemptions
        out["passes"] = self.num_passes
        return out
