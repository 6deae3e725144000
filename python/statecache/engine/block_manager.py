"""KV prefix cache plus state attachment for one engine (docs/contract.md,
"The pass", "Reference engine").

A prefix hit is a joint claim on two caches: the KV blocks of the attention
layers (content-addressed in ``BlockPool``) and the recurrent state as of the
same position (a checkpoint in a state cache). ``BlockManager`` finds the KV
hit, caps it to what the state caches can resume, and attaches both.

Both indexes are addressed by 64-bit scheduler hashes, which an outsider who
knows the deployment key can make collide; a hash is a name, not a proof. So
``filed`` keeps, for every hash the KV index holds, the full 128-bit prefix
key of the block filed under it, and nothing resumes or files by hash alone:

* a KV hit counts a block only while its filed key is the sequence's own;
* a state checkpoint (anchor, rung, decode boundary, midstep, tier load) is
  filed under a hash only while the KV index holds the sequence's own block
  there, and a KV block leaving the index takes the checkpoints filed under
  its hash with it (``_on_kv_evict``, and ``take_ops`` for an image whose
  own unit reservation evicted its block). So a state under hash ``h`` always has
  the prefix key ``filed[h]``, and a state hit, which never reaches past the
  checked KV hit, resumes the sequence's own prefix;
* the tiers name their entries by these keys (the filed one for what goes
  down, the sequence's for what comes up).

Caller's obligations: ``allocate`` only after ``can_allocate`` said yes in the
same pass; ``free`` a sequence once, when it finishes or is preempted.
"""

from __future__ import annotations

from statecache import chain_block_keys

from .deployment_key import deployment_key
from .placement import AnchorLadderDemand, Boundary, GuessFirstLRU, PlacementContext, feasible_positions
from .state_caches import StateCaches

SOURCE_NONE = "none"
SOURCE_FORK = "fork"
SOURCE_PAGE = "PAGE"


class Admission:
    """What ``can_allocate`` found for one waiting sequence."""

    __slots__ = ("kv_hit", "hit", "new_blocks", "claim_src")

    def __init__(self, kv_hit: int, hit: int, new_blocks: int, claim_src: int):
        self.kv_hit = kv_hit  # blocks the KV index matched
        self.hit = hit  # blocks resumable after the state cap
        self.new_blocks = new_blocks  # blocks to allocate beyond the hit
        self.claim_src = claim_src  # fork source slot, -1 if none


class BlockManager:
    def __init__(
        self,
        block_pool,
        caches: StateCaches,
        hash_block_size: int,
        enable_prefix_caching: bool = True,
        num_spec: int = 0,
        placement=None,
        eviction=None,
        interval_tokens: int = -1,
        hash_seed: int | None = None,
        hash_salt=None,
    ):
        self.pool = block_pool
        self.caches = caches
        self.hbs = hash_block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_spec = num_spec
        self.placement = placement or AnchorLadderDemand()
        self.eviction = eviction or GuessFirstLRU()
        self.interval_tokens = interval_tokens
        self.funnel: dict[str, int] = {}
        # None, None: this process's random key (deployment_key.py)
        self.deployment_key = deployment_key(hash_seed, hash_salt)
        self.tiering = None  # engine.tiering.Tiering, when tiers are attached
        # scheduler hash -> 128-bit prefix key of the KV block indexed under it
        self.filed: dict[int, bytes] = {}
        # hash -> key it had, for the blocks evicted while a batch's ops are taken
        self._evicted: dict[int, bytes | None] | None = None
        # The KV index and the state caches are addressed by the same hash: a
        # checkpoint whose KV block left the index can never be reached again.
        self.pool.on_evict = self._on_kv_evict

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to one ``checkpoint_funnel()`` counter."""
        self.funnel[key] = self.funnel.get(key, 0) + n

    def _on_kv_evict(self, h: int) -> None:
        self.count("kv_blocks_evicted")
        try:
            if self.tiering is not None:
                self.tiering.on_kv_evict(h)  # reads filed[h]: the key its copy goes down under
        finally:
            try:
                self.caches.unindex(h)
            finally:
                key = self.filed.pop(h, None)
                if self._evicted is not None:
                    self._evicted[h] = key

    def take_ops(self):
        """Step 3 of a pass: the state caches' ``take_ops``, then every hash
        whose KV block was evicted meanwhile is unindexed once more. A PAGE
        store reserving units for an image can evict that image's own KV
        block (or a queued one's) and files the image after the eviction's
        unindex ran: it would outlive its block, and a colliding prefix filing
        the hash next would resume it."""
        self._evicted = {}
        try:
            ops = self.caches.take_ops()
        finally:
            gone, self._evicted = self._evicted, None
        for h in gone:
            if h not in self.filed:
                self.caches.unindex(h)
        return ops

    def publish_block(self, block: int, h: int, key: bytes) -> bool:
        """Indexes KV ``block`` under ``h`` and files its prefix key; False
        (nothing filed) when the index holds another block under ``h``."""
        if not self.pool.publish(block, h):
            return False
        self.filed[h] = key
        return True

    def holds(self, h: int, key: bytes) -> bool:
        """Whether the KV index holds the block of prefix ``key`` under ``h``
        (not merely some block under ``h``)."""
        return self.filed.get(h) == key and self.pool.lookup(h) >= 0

    def drop_checkpoint(self, h: int) -> None:
        """Forget the state checkpoint filed under ``h`` (for eviction policies)."""
        self.caches.unindex(h)

    # ------------------------------- hashes -------------------------------- #

    def update_hashes(self, seq) -> list[int]:
        """Extend ``seq.block_hashes`` to every full block of its tokens (one
        C++ call for all new blocks). The 64-bit hashes derive from 128-bit
        prefix keys (``chain_block_keys``, keyed per deployment), which the
        indexes check on every hit and the tiers name entries by;
        ``seq.prefix_keys`` keeps them, one 16-byte key per block."""
        hashes = seq.hashes  # a Python list; seq.block_hashes mirrors it
        full = seq.num_tokens // self.hbs
        if len(hashes) < full:
            first = len(hashes)
            start = first * self.hbs
            keys = seq.prefix_keys
            dk = self.deployment_key
            new, new_keys = chain_block_keys(
                seq.token_ids[start : full * self.hbs],
                self.hbs,
                keys[-1] if keys else None,
                seed=dk.seed,
                salt=dk.salt,
            )
            hashes += new
            keys += [new_keys[i : i + 16] for i in range(0, len(new_keys), 16)]
            seq.block_hashes = hashes
            if self.tiering is not None:
                self.tiering.note_keys(new, new_keys, first, hashes[first - 1] if first else None)
        return hashes

    # ------------------------------ admission ------------------------------ #

    def kv_hit(self, seq) -> int:
        """Leading blocks held by the KV index, never the last block of the
        sequence (the forward needs at least one token)."""
        if not self.enable_prefix_caching:
            return 0
        hashes = self.update_hashes(seq)
        keys = seq.prefix_keys
        limit = min(len(hashes), (seq.num_tokens - 1) // self.hbs)
        filed = self.filed
        n = 0
        # The block under the hash must be this prefix's: a colliding
        # prompt's block ends the hit. ``filed`` mirrors the KV index (set on
        # publish, dropped by on_evict), so one dict probe per block does.
        while n < limit and filed.get(hashes[n]) == keys[n]:
            n += 1
        return n

    def can_allocate(self, seq) -> Admission | None:
        """Whether ``seq`` can be admitted now, and with which hit."""
        kv_hit = self.kv_hit(seq)
        tiering = self.tiering
        if tiering is not None and self.enable_prefix_caching:
            # Blocks and checkpoints below GPU memory extend the hit.
            limit = min(len(seq.hashes), (seq.num_tokens - 1) // self.hbs)
            kv_hit = tiering.kv_extend(seq, kv_hit, limit)
            if kv_hit:
                tiering.discover(seq, kv_hit)
        hit = self.caches.resumable_hit(seq, kv_hit, seq.hashes) if kv_hit else 0
        if hit and tiering is not None and self.caches.pages:
            # The hit's KV blocks are held while a load makes room for units.
            held = [self.pool.lookup(h) for h in seq.hashes[:hit]]
            self.pool.incref(held)
            try:
                hit = self._load_state(seq, hit)
            finally:
                self.pool.free(list(reversed(held)))
        need_slots = 1 + self.num_spec
        claim_src = -1
        if hit and self.caches.forks:
            src = self.caches.slot_pool.lookup(seq.hashes[hit - 1])
            if src < 0:
                hit = 0
            elif not self.caches.slot_pool.is_pinned(src):
                claim_src = src  # comes off the free list before the pops
                need_slots += 1
        if not self.caches.slot_pool.has_free(need_slots):
            return None
        total_blocks = -(-seq.num_tokens // self.hbs)
        new_blocks = total_blocks - hit
        # Hit blocks nobody references sit on the free list: taking them
        # costs free capacity too.
        hit_ids = [self.pool.lookup(h) for h in seq.hashes[:hit]]
        if -1 in hit_ids:
            raise AssertionError("the KV index lost a filed block: the pool's on_evict is not the block manager's")
        cached_free = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        if not self._blocks_available(new_blocks + cached_free, seq.hashes[hit - 1] if hit else None):
            return None
        return Admission(kv_hit, hit, new_blocks, claim_src)

    def _load_state(self, seq, hit: int) -> int:
        """Caps ``hit`` to a boundary whose image is in the PAGE store, loading
        it from a tier when only a tier holds it; a failed load recomputes."""
        coord, tiering = self.caches.coordinator, self.tiering
        for _ in range(4):
            if not hit or coord.contains(seq.hashes[hit - 1]):
                return hit
            h, key = seq.hashes[hit - 1], seq.prefix_keys[hit - 1]
            # Filed under h only while h's KV is this prefix's (held by the caller).
            if self.holds(h, key) and tiering.load_state(h, key):
                self.count("state_loads")
                return hit
            self.count("state_loads_failed")
            hit = self.caches.resumable_hit(seq, hit - 1, seq.hashes)
        return hit if hit and coord.contains(seq.hashes[hit - 1]) else 0

    def _blocks_available(self, count: int, protected_hash=None) -> bool:
        coord = self.caches.coordinator
        if coord is not None:
            # KV blocks and PAGE images share the pool: READY images count.
            return coord.has_available_units(count, protected_hash)
        return count <= self.pool.num_free

    def _ensure_blocks(self, count: int) -> bool:
        coord = self.caches.coordinator
        if coord is not None:
            return coord.ensure_free_units(count)
        return count <= self.pool.num_free

    def allocate(self, seq, adm: Admission) -> None:
        """Attach the KV blocks and the state for an admission ``can_allocate``
        granted. Sets ``seq.num_computed_tokens`` to the resumed position."""
        caches, hbs = self.caches, self.hbs
        hit = adm.hit
        h = seq.hashes[hit - 1] if hit else -1
        seq.state_source = SOURCE_NONE
        # State first: a PAGE restore pins its image before KV allocation may
        # evict images for room.
        slot_pool = caches.slot_pool
        if hit and caches.forks:
            src = slot_pool.lookup(h)
            slot_pool.promote(src)
            if adm.claim_src >= 0:
                slot_pool.claim(src)
            seq.state_slots = slot_pool.pop_many(1 + self.num_spec)
            seq.state_fork_src = src
            slot_pool.pin(src)
            seq.state_source = SOURCE_FORK
        else:
            seq.state_slots = slot_pool.pop_many(1 + self.num_spec)
            if hit and caches.pages:
                if caches.coordinator.begin_restore(h, seq.state_slot):
                    seq.state_source = SOURCE_PAGE
                else:
                    hit = 0
        if hit and not caches.voters:
            seq.state_source = "replay"
        hit_ids = [self.pool.lookup(x) for x in seq.hashes[:hit]]
        self.pool.incref(hit_ids)
        new = adm.new_blocks + (adm.hit - hit)
        if not self._ensure_blocks(new):
            raise AssertionError("can_allocate granted blocks that are not there")
        seq.block_table = list(hit_ids) + list(self.pool.allocate(new))
        seq.num_published_blocks = hit
        seq.num_computed_tokens = hit * hbs
        seq.num_cached_tokens = hit * hbs
        if hit:
            self.eviction.on_resume(caches, seq, h)
            if self.tiering is not None and seq.state_source == SOURCE_PAGE:
                self.count(f"resumed_tokens_{self.tiering.source_of(h)}", hit * hbs)
        self.count("admitted")
        self.count("kv_hit_tokens", adm.kv_hit * hbs)
        self.count("resumed_tokens", hit * hbs)
        if hit < adm.kv_hit:
            self.count("hits_cut_short")
        # why the resumed prefix is shorter than the prompt (statecache.metrics)
        self.count("admitted_tokens", seq.num_tokens)
        if adm.kv_hit == 0:
            self.count("admissions_kv_miss")
        elif hit == 0:
            self.count("admissions_state_miss")
            self.count("state_miss_tokens", adm.kv_hit * hbs)
        elif hit < adm.kv_hit:
            self.count("admissions_hit_cut_short")
            self.count("cut_short_tokens", (adm.kv_hit - hit) * hbs)
        else:
            self.count("admissions_full_hit")
        self._plan(seq, adm.kv_hit * hbs)

    def _plan(self, seq, kv_hit_pos: int) -> None:
        ctx = PlacementContext(
            hash_block_size=self.hbs,
            successor_room=self.caches.successor_room,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_tokens=seq.num_tokens,
            resume_position=seq.num_computed_tokens,
            kv_hit_position=kv_hit_pos,
            interval_tokens=self.interval_tokens if self.enable_prefix_caching else 0,
            block_hashes=seq.hashes,
        )
        asked = self.placement.prompt_boundaries(ctx)
        plan = feasible_positions(asked, ctx)
        self.count("boundaries_planned", len(asked))
        self.count("boundaries_infeasible", len(asked) - len(plan))
        seq.placement_ctx = ctx
        seq.planned = plan
        known = [b.position for b in plan if not b.guess]
        # The pools file every position but this one as a guess.
        seq.checkpoint_end_pos = known[-1] if known else 0

    def next_cut(self, seq) -> int:
        """The first planned position past what ``seq`` has computed, or its
        token count. Chunks end there unless the backend reads midstep."""
        for b in seq.planned:
            if b.position > seq.num_computed_tokens:
                return b.position
        return seq.num_tokens

    # ------------------------------- running ------------------------------- #

    def can_append(self, seq) -> bool:
        """Whether the KV slot for the next decode token exists or can be had."""
        if seq.num_tokens <= len(seq.block_table) * self.hbs:
            return True
        return self._blocks_available(1)

    def append_slot(self, seq) -> None:
        while seq.num_tokens > len(seq.block_table) * self.hbs:
            if not self._ensure_blocks(1):
                raise AssertionError("can_append granted a block that is not there")
            seq.block_table.extend(self.pool.allocate(1))

    def publish(self, seq) -> None:
        """Index every full block whose KV is now computed."""
        if not self.enable_prefix_caching:
            return
        hashes = self.update_hashes(seq)
        done = min(seq.num_computed_tokens // self.hbs, len(hashes))
        keys = seq.prefix_keys
        for i in range(seq.num_published_blocks, done):
            # Not indexed when the index holds a block under this hash already
            # (the same prefix computed twice, or a colliding one).
            if self.publish_block(seq.block_table[i], hashes[i], keys[i]) and self.tiering is not None:
                self.tiering.note_published(seq.block_table[i], hashes[i])
        seq.num_published_blocks = max(seq.num_published_blocks, done)

    def checkpoint(self, seq, boundary: Boundary) -> None:
        """Hand the boundary ``seq``'s forward just ended on to every cache
        whose successor room the rest of the prompt covers."""
        blocks = boundary.position // self.hbs
        h = seq.hashes[blocks - 1]
        if self.filed.get(h) != seq.prefix_keys[blocks - 1]:
            # The KV index holds another prefix's block under h (a collision):
            # a state filed here would be resumed with that block's KV.
            self.count("checkpoints_refused_foreign_kv")
            return
        rest = seq.num_tokens - boundary.position
        asked = False
        for cache in self.caches.voters:
            if rest >= cache.successor_room:
                cache.checkpoint(seq, blocks, h)
                asked = True
        if asked:
            self.count("checkpoints_requested")
            self.count(f"checkpoints_requested_{boundary.kind}")
            self.eviction.on_checkpoint(self.caches, seq, boundary)

    def decode_boundary(self, seq) -> None:
        """After a decode step that completed a hash block, ask the placement
        whether to keep it (a copy backend can; a fork's room is not covered
        by one decode token, so ``checkpoint`` skips it there)."""
        pos = seq.num_computed_tokens
        if pos % self.hbs or seq.placement_ctx is None or not self.enable_prefix_caching:
            return
        b = self.placement.decode_boundary(seq.placement_ctx, pos)
        if b is not None and b.position == pos:
            self.count("boundaries_planned")
            self.checkpoint(seq, b)

    def reserve_midstep(self, seq, bounds: list[Boundary]) -> list[tuple]:
        """Reserve destinations for positions strictly inside this forward."""
        positions = [(b.position, seq.hashes[b.position // self.hbs - 1]) for b in bounds]
        out = []
        for cache in self.caches.voters:
            res = cache.reserve_midstep(seq, positions)
            if res:
                out.append((cache, list(res)))
        self.count("checkpoints_requested", len(positions))
        return out

    def publish_midstep(self, seq, reservations) -> None:
        """Files the midstep states of ``seq``'s forward (after ``publish``);
        a position whose KV block under its hash is not ``seq``'s is cancelled."""
        keys, filed, hbs = seq.prefix_keys, self.filed, self.hbs
        for cache, res in reservations:
            own = [r for r in res if filed.get(r[2]) == keys[r[1] // hbs - 1]]
            if len(own) < len(res):
                cache.cancel_midstep([r for r in res if filed.get(r[2]) != keys[r[1] // hbs - 1]])
                self.count("checkpoints_refused_foreign_kv", len(res) - len(own))
            if own:
                cache.publish_midstep(own, seq)

    # ------------------------------ releasing ------------------------------ #

    def free(self, seq, reservations=()) -> None:
        """Return everything ``seq`` holds and drop its pending work (finish
        or preemption)."""
        for cache in self.caches.voters:
            forget = getattr(cache, "forget_pending", None)
            if forget is not None:
                forget(seq)
        for cache, res in reservations:
            cache.cancel_midstep(res)
        if seq.state_fork_src >= 0:
            self.caches.slot_pool.drop_reader(seq.state_fork_src)
            seq.state_fork_src = -1
        self.caches.slot_pool.release_many(list(seq.state_slots))
        seq.state_slots = []
        if seq.block_table:
            self.pool.free(list(reversed(seq.block_table)))
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_published_blocks = 0

    def checkpoint_funnel(self) -> dict[str, int]:
        """Where checkpoints were asked for and what became of them.

        Engine counters: ``admitted``, ``kv_hit_tokens`` (what the KV index
        matched), ``resumed_tokens`` (what the state caches let resume),
        ``hits_cut_short``, ``boundaries_planned`` / ``boundaries_infeasible``,
        admissions by cause (``admissions_kv_miss`` / ``_state_miss`` /
        ``_hit_cut_short`` / ``_full_hit``) with ``admitted_tokens`` and the
        tokens a KV hit lost to the state (``state_miss_tokens``,
        ``cut_short_tokens``),
        ``checkpoints_requested`` (and ``_anchor`` / ``_ladder`` / ``_demand``),
        ``kv_blocks_evicted``, ``preempted_with_pending_checkpoint``,
        ``checkpoints_refused_foreign_kv`` (a boundary whose hash the KV index
        holds for another prefix: a 64-bit collision); then the
        state caches' own fates (``checkpoints_kept`` / ``dropped`` /
        ``evicted`` / ``orphaned``), summed over caches.
        """
        out = dict(self.funnel)
        out.update(self.caches.checkpoint_fates())
        return out
