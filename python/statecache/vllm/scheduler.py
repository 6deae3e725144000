"""The scheduler side: what statecache holds below vLLM's memory, what each
admission can resume from it, and what each step saves (docs/vllm.md, "How
it works").

The host tier's index (the C++ ``HostArena``: which entries hold which value,
ranked by recompute cost per byte and recency) lives here, so one place
decides for every tensor-parallel rank: a value becomes findable only when
every rank has reported its shard stored, and a shared-tier value counts only
when every rank's key is there.

Names: a value is named by the tiers' 128-bit prefix key, chained (keyed
SipHash, ``statecache.chain_block_keys``) over vLLM's own block hashes at each
block boundary, under a salt derived from the deployment secret and the
model's identity; the tier key adds the layout (geometry and dtypes) and the
rank. A KV value ``i`` and the state at boundary ``i + 1`` share a prefix key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from statecache import _C
from statecache.tiers.placement import PrefixChains, TierPlacement
from statecache.tiers.ranks import every_rank_holds, shard_keys
from statecache.vllm.config import ConnectorConfig
from statecache.vllm.geometry import KV, STATE, TAIL, Geometry
from statecache.vllm.metadata import Load, StateCacheMeta, Value, WorkerReport, arena_key, arena_key_hex
from statecache.vllm.shared import open_shared_tier

log = logging.getLogger("statecache.vllm")

HOST, SHARED = "host", "shared"
# the scheduler-side hooks, in the order of ``ConnectorScheduler.hook_seconds``
HOOKS = ("match", "after_alloc", "build_meta", "update", "finished", "hit_sources", "stats")
MATCH, AFTER_ALLOC, BUILD_META, UPDATE, FINISHED, HIT_SOURCES, STATS = range(len(HOOKS))
_HOOK_COUNTERS = tuple(f"scheduler_seconds_{name}" for name in HOOKS)
# While requests run, counters are reported at most this often (vLLM asks every
# step; the next report carries what waited), and at once when the last one
# finishes. Prometheus scrapes and vLLM's log lines come seconds apart; a
# report every 50 ms cost 1.2-1.6% of vLLM's scheduler step on conversations.
STATS_EVERY_S = 1.0
MAX_LOAD_FAILURES = 3
# A tail saved when a request finished reaches the host tier a step later; a
# next turn matched before that waits (vLLM retries it next step) this often
# at most, rather than recompute up to a block
MAX_TAIL_WAITS = 8
# vLLM's block hashers no prompt can collide (the names trust them alone)
TRUSTED_BLOCK_HASHES = ("sha256", "sha256_cbor")
_PENDING = (-1, -1, b"")  # _find_tail's answer while the tail it would take is being saved

# cumulative counters (connector stats report their increase per interval)
COUNTERS = (
    "admissions",
    "admissions_kv_miss",
    "admissions_state_miss",
    "admissions_hit_cut_short",
    "admissions_full_hit",
    "admitted_tokens",
    "kv_hit_tokens",
    "state_miss_tokens",
    "cut_short_tokens",
    "tokens_resumed_local",
    "tokens_resumed_host",
    "tokens_resumed_shared",
    "tokens_planned_external",
    "loads",
    "loads_failed",
    "loads_untrusted",
    "loads_missing",
    "loads_timed_out",
    "retries_recomputed",
    "values_saved",
    "values_loaded",
    "values_fetched",
    "bytes_saved",
    "bytes_loaded",
    "saves_dropped_host_full",
    "saves_skipped_unnamed",
    "saves_deferred",
    "state_saves_decode",
    "tail_saves",
    "tail_waits",
    "tokens_resumed_tail",
    "shared_writes",
    "shared_writes_failed",
    "shared_lookups",
    "shared_lookup_failures",
    "scheduler_seconds",
    "scheduler_calls",
    "steps",
)


def pack_headers(headers: list[bytes]) -> bytes:
    if len(headers) == 1:  # one rank: no join
        return len(headers[0]).to_bytes(2, "little") + headers[0]
    return b"".join(len(h).to_bytes(2, "little") + h for h in headers)


def unpack_headers(meta: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(meta):
        n = int.from_bytes(meta[i : i + 2], "little")
        out.append(meta[i + 2 : i + 2 + n])
        i += 2 + n
    return out


_KV_PREFIX = len(arena_key_hex(KV, ""))


def _h(prefix_key: bytes) -> int:
    """A prefix key as the placement's chains name a block (ranking only)."""
    return int.from_bytes(prefix_key, "little")


class HostPlacement:
    """Where the connector's values rank in the host tier: the tiers' one
    placement (``statecache.tiers.placement``), as the engine and the
    simulator use it. KV blocks and states share one byte budget, ranked by
    recency and the prefill FLOPs a hit saves per byte of the whole prefix;
    a KV block ranks with the deepest state its chain leads to, a state at
    its own boundary, a tail one block past its boundary; a resume refreshes
    its chain tail first. Positions are in vLLM blocks (docs/vllm.md,
    "Policy")."""

    def __init__(
        self,
        geometry: Geometry,
        capacity_bytes: int,
        ranking: str,
        model_flops: tuple[float, float],
        gpu_bytes: int = 0,
    ):
        self.geometry = geometry
        self.arena = _C.HostArena(geometry.entry_bytes, capacity_bytes, [None], ranking)
        self.chains = PrefixChains()
        self.tier = TierPlacement(self.arena, self.chains, self._key_of, kv_payload=True)
        self._filing: dict[str, int] = {}  # state / tail keys allocated, not sealed yet
        self._sizes = {k: (geometry.value_entries(k), geometry.value_bytes(k)) for k in (KV, STATE, TAIL)}
        if ranking == "cost":
            per_token, per_context = model_flops
            self.arena.set_eviction_policy(
                "cost",
                flops_per_token=per_token,
                flops_per_context_token=per_context,
                checkpoint_bytes=float(max(1, geometry.value_bytes(STATE))),
                tokens_per_position=float(geometry.block_size),
            )
            self.tier.use_model(self.arena.eviction_policy, float(geometry.value_bytes(KV)), gpu_bytes)

    def _key_of(self, kind: str, h: int) -> str | None:
        kv_name = self.chains.payload(h)  # a block's payload is its KV value's name
        if kv_name is None or kind == KV:
            return kv_name
        return arena_key_hex(kind, kv_name[_KV_PREFIX:])

    def note(self, keys: list[bytes], kv_names: list[str], first: int, parent: bytes | None) -> None:
        """Prefix keys (and their KV values' names) of boundaries ``first + 1, ...`` of one request."""
        self.chains.note([_h(k) for k in keys], first, None if parent is None else _h(parent), kv_names)

    def allocate(self, key: str, kind: str, prefix_key: bytes) -> list[int] | None:
        """Entries for a new value (evicting by rank), or None (no room, or
        ``key`` is there already). A tail's ``prefix_key`` is that of the
        boundary it starts from."""
        return self.allocate_many([key], [kind], [prefix_key])[0]

    def allocate_many(self, keys: list[str], kinds: list[str], prefix_keys: list[bytes]) -> list[list[int] | None]:
        """``allocate`` of each, in order, in one arena call (a step's saves)."""
        chains, tier, sizes = self.chains, self.tier, self._sizes
        hs = [_h(k) for k in prefix_keys]
        positions = [chains.position(h) + 1 if kind == TAIL else tier.position(kind, h) for kind, h in zip(kinds, hs)]
        got = self.arena.allocate_many(
            keys, 0, [sizes[kind][0] for kind in kinds], [sizes[kind][1] for kind in kinds], positions
        )
        for key, kind, h, entries in zip(keys, kinds, hs, got):
            if kind != KV and entries is not None:
                self._filing[key] = h
        return got

    def seal_one_rank(self, saved: dict[str, dict[int, bytes]], pending: dict[str, dict[int, bytes]]) -> None:
        """Seals each value of ``saved`` still ``pending`` (removed from it),
        one rank and no shared tier: one arena call, no per-rank bookkeeping."""
        keys = [key for key in saved if pending.pop(key, None) is not None]
        filing = self._filing
        start = 0
        for i, key in enumerate(keys):
            if key not in filing and i + 1 < len(keys):
                continue
            # up to each state, as one by one: its chain is refiled with what was sealed before it
            run = keys[start : i + 1]
            start = i + 1
            self.arena.seal_many(run, [len(h).to_bytes(2, "little") + h for h in (saved[k][0] for k in run)])
            h = filing.pop(key, None)
            if h is not None:
                self.tier.state_stored(h)

    def sealed(self, key: str) -> None:
        """The value under ``key`` became findable: a state (or tail) makes
        the KV blocks of its chain lead to it."""
        h = self._filing.pop(key, None)
        if h is not None:
            self.tier.state_stored(h)

    def dropped(self, key: str) -> None:
        """An allocated value was given up before it was sealed."""
        self._filing.pop(key, None)

    def used(self, prefix_key: bytes) -> None:
        """A prefix ending at this boundary was resumed (by vLLM or from here)."""
        self.tier.used(_h(prefix_key))


def model_flops(vllm_config: Any) -> tuple[float, float]:
    """Rough prefill FLOPs per token and per (token, earlier token) pair of
    the model; only their ratio matters to the ranking."""
    mc = vllm_config.model_config
    hf = mc.hf_text_config
    hidden = float(getattr(hf, "hidden_size", 1024))
    layers = float(getattr(hf, "num_hidden_layers", 1))
    types = getattr(hf, "layer_types", None) or []
    attn = float(sum(1 for t in types if "full" in str(t))) if types else layers
    heads = float(getattr(hf, "num_attention_heads", 1)) * float(getattr(hf, "head_dim", hidden / 16))
    return 24.0 * hidden * hidden * layers, 4.0 * attn * heads


@dataclass
class _Plan:
    local: int  # tokens vLLM resumes itself
    boundary: int  # blocks the connector resumes to (0: none)
    kv_run: int  # blocks with KV below vLLM's memory, counted from local
    kv_sources: list[str] = field(default_factory=list)
    state_source: str | None = None
    tail: tuple[int, bytes] | None = None  # (tail tokens past ``boundary``, its prefix key)
    tail_source: str = "host"


@dataclass
class _Req:
    request: Any
    keys: list[bytes] = field(default_factory=list)  # prefix key per boundary (index i: boundary i + 1)
    kv_names: list[str] = field(default_factory=list)  # the arena's name of each boundary's KV value
    state_names: list[str] = field(default_factory=list)  # ... and of its state
    plan: _Plan | None = None
    # the last match: (what it read, plan, answer, the host tier's generation
    # then, which of the values it read the host held, the host tail it
    # would load or None); answered again while none of it changed
    matched: tuple[tuple[int, ...], _Plan, int, int, list[bool], str | None] | None = None
    shared: dict[tuple[str, int], bool] = field(default_factory=dict)
    shared_local: int = -1  # the local hit ``shared`` was looked up for
    shared_tail: tuple[tuple[int, ...], tuple[int, int, bytes] | None] | None = None  # (what it read, found)
    failures: int = 0  # loads of this request that failed
    # values computed before vLLM hashed their block (async scheduling):
    # (kind, boundary, their blocks' ids then), saved once named
    late: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    admitting: _Plan | None = None  # admitted with no load: counted once vLLM says its local hit
    tail_waits: int = 0  # steps it waited for a tail being saved


class ConnectorScheduler:
    """Scheduler-side state of the connector."""

    def __init__(self, config: ConnectorConfig, geometry: Geometry, tp_size: int, vllm_config: Any):
        self.config = config
        self.geometry = geometry
        self.tp_size = tp_size
        self.bs = geometry.block_size
        self.hash_ratio = 1
        self.layout_ids = {k: geometry.layout_id(k) for k in (KV, STATE, TAIL)}
        self.kv_groups = [g.group for g in geometry.kv_groups]
        self.state_groups = [g.group for g in geometry.state_groups]
        gpu_bytes = geometry.num_blocks * (geometry.value_bytes(KV) + geometry.value_bytes(STATE))
        self.placement = HostPlacement(
            geometry, config.host_memory, config.ranking, model_flops(vllm_config), gpu_bytes
        )
        self.arena = self.placement.arena
        self._salt = hashlib.blake2b(
            b"statecache-vllm-v1\0" + config.secret + geometry.identity.encode(), digest_size=32
        ).digest()
        # Names chain over vLLM's block hashes. Its sha256 ones cannot be
        # collided; any other (xxhash: fast, not collision resistant) can be
        # by whoever picks a prompt, and a collision would resume another
        # prefix's values, so then each block's tokens are chained in too.
        self.hash_algo = getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo", None)
        self.fold_tokens = self.hash_algo not in TRUSTED_BLOCK_HASHES
        self._reqs: dict[str, _Req] = {}
        # the lengths of the tails saved, filed under (the key of the boundary
        # they start from, their first token): a match hashes only as far as
        # the longest of them. Tails of requests shorter than a block start at
        # boundary 0, named from this root.
        self._tails: OrderedDict[tuple[bytes, int], set[int]] = OrderedDict()
        # the tails' own keys: of the lengths filed under one boundary (up to
        # a block's, where many requests share a system prompt), only those
        # this request's tokens name are looked up in the arena
        self._tail_names: OrderedDict[bytes, None] = OrderedDict()
        self._tails_changes = 0  # a kept match is answered again only while this is unchanged
        self._root = hashlib.blake2b(b"statecache-vllm-root\0" + self._salt, digest_size=16).digest()
        self._finished_saves: list[str] = []
        self._late: set[str] = set()  # requests with values waiting for their names
        self._admitting: dict[str, _Req] = {}  # admitted without a load this step, not counted yet
        # decode steps of the requests last planned (``_quiet_ids``) that
        # complete no value: build_meta skips its per-request pass for them
        self._quiet_steps = 0
        self._quiet_ids: list[str] = []
        # one metadata for every step with nothing to move (the workers only read it)
        self._no_work = StateCacheMeta([], [], config.shared is not None, [])
        self._loads: list[Load] = []
        self._saves: list[Value] = []
        self._inflight: dict[str, list[tuple[str, str]]] = {}  # req -> [(value key, "pinned" | "staged")]
        self._load_tokens: dict[str, dict[str, int]] = {}  # req -> tokens by source, counted when it lands
        self._acc_saved: dict[str, dict[int, bytes]] = {}
        self._acc_fetched: dict[str, dict[int, bytes]] = {}
        self._fetch_failed: dict[str, set[int]] = {}
        self._acc_shared: dict[str, set[int]] = {}
        self._staged: set[str] = set()
        self._shared_pending: set[str] = set()
        # a plain dict: a counter bumps in C; a report (about once a second) walks them all
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        # the connector times each hook into these (a list item per call, no
        # dict); folded into the counters when they are read
        self.hook_seconds = [0.0] * len(HOOKS)
        self.hook_calls = [0] * len(HOOKS)
        self._reported: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.stats_due = 0.0  # time.perf_counter() of the next report (0: the next step's)
        self.kv_cache_manager: Any = None
        self.shared = None
        self._shared_down_until = 0.0
        if config.shared is not None:
            self.shared = open_shared_tier(config.shared, config.lookup_timeout_s, staging_bytes=4096)
        log.info(
            "statecache connector scheduler: host %.2f GB in %d entries of %d bytes, block %d tokens, "
            "%d KV + %d state groups, tp %d, shared %s, layouts kv=%s state=%s, block hashes %s%s",
            config.host_memory / 1e9,
            self.arena.num_entries,
            geometry.entry_bytes,
            self.bs,
            len(self.kv_groups),
            len(self.state_groups),
            tp_size,
            config.shared.kind if config.shared else None,
            self.layout_ids[KV],
            self.layout_ids[STATE],
            self.hash_algo,
            " (not collision resistant: names chain the tokens too)" if self.fold_tokens else "",
        )

    # ---------------------------------------------------------------- keys --

    def bind(self, kv_cache_manager: Any) -> None:
        self.kv_cache_manager = kv_cache_manager
        hbs = getattr(getattr(kv_cache_manager, "block_pool", None), "hash_block_size", None) or self.bs
        if self.bs % hbs:
            raise ValueError(f"block_size {self.bs} is not a multiple of vLLM's hash block size {hbs}")
        self.hash_ratio = self.bs // hbs

    def _keys(self, r: _Req, upto: int) -> list[bytes]:
        """Prefix keys of boundaries 1..upto (fewer when vLLM has not hashed
        that far yet)."""
        keys = r.keys
        if len(keys) >= upto:
            return keys
        hashes = r.request.block_hashes
        upto = min(upto, len(hashes) // self.hash_ratio)
        if len(keys) >= upto:
            return keys
        first = len(keys)
        ratio = self.hash_ratio
        # the hash of each boundary's last hash block (vLLM's are 32 bytes: joined as they are)
        ends = hashes[first:upto] if ratio == 1 else hashes[(first + 1) * ratio - 1 : upto * ratio : ratio]
        words = b"".join(ends)
        if len(words) != 32 * len(ends):  # another hasher's width: each folded to 32 bytes
            words = b"".join(hashlib.blake2b(bytes(h), digest_size=32).digest() for h in ends)
        n = len(ends)
        parent = keys[-1] if keys else None
        chained = np.frombuffer(words, dtype=np.int64)
        width = 4
        if self.fold_tokens:  # a hash whoever picks the prompt can collide: the block's tokens are chained too
            if parent is None and getattr(r.request, "cache_salt", None):
                parent = self._parent(r, 0)  # and the salt, which a tenant picks freely, from the salted root
            bs = self.bs
            rows = np.empty((n, 4 + bs), dtype=np.int64)
            rows[:, :4] = chained.reshape(n, 4)
            rows[:, 4:] = np.asarray(r.request.all_token_ids[first * bs : upto * bs], dtype=np.int64).reshape(n, bs)
            chained, width = rows.reshape(-1), 4 + bs
        _hs, packed = _C.chain_block_keys(chained, width, parent, 0, self._salt)
        new = [packed[16 * i : 16 * i + 16] for i in range(n)]
        hexes = [k.hex() for k in new]
        keys.extend(new)
        kv_names = [arena_key_hex(KV, h) for h in hexes]
        r.kv_names.extend(kv_names)
        r.state_names.extend([arena_key_hex(STATE, h) for h in hexes])
        self.placement.note(new, kv_names, first, parent)
        return keys

    def _req(self, request: Any) -> _Req:
        r = self._reqs.get(request.request_id)
        if r is None or r.request is not request:
            r = self._reqs[request.request_id] = _Req(request)
        return r

    def tier_keys(self, kind: str, prefix_key: bytes) -> list[str]:
        """Every rank's shared-tier key of a value."""
        return shard_keys(STATE if kind == TAIL else kind, self.layout_ids[kind], self.tp_size, prefix_key)

    def _tail_chain(self, parent: bytes, tokens: list[int]) -> bytes:
        """The prefix keys (16 bytes each, packed) of the prefixes that end 0,
        1, ... ``len(tokens)`` tokens past the boundary named ``parent``: one
        chain of a key per token after a marker (one-token steps: never a
        block's key), so every length's key comes from one pass."""
        return bytes(_C.chain_block_keys([-7, *tokens], 1, parent, 0, self._salt)[1])

    def _tail_keys(self, parent: bytes, tokens: list[int]) -> list[bytes]:
        """The keys of lengths 1 .. ``len(tokens)`` (``_tail_chain``)."""
        packed = self._tail_chain(parent, tokens)
        return [packed[16 * i : 16 * i + 16] for i in range(1, len(tokens) + 1)]

    def _tail_key(self, parent: bytes, tokens: list[int]) -> bytes:
        """The key of a tail of exactly ``tokens`` (``_tail_chain``'s last)."""
        return self._tail_chain(parent, tokens)[-16:]

    def _tails_possible(self) -> bool:
        return bool(self._tails) or self.shared is not None

    def _parent(self, r: _Req, b: int) -> bytes:
        """The prefix key a tail starting at boundary ``b`` chains from. At
        boundary 0 that is the root, salted with the request's
        ``cache_salt``: vLLM folds the salt into the first block's hash only,
        so past a block the boundary's key carries it, and before one tenants
        with different salts must not resume each other's tails."""
        if b:
            return r.keys[b - 1]
        salt = getattr(r.request, "cache_salt", None)
        if not salt:
            return self._root
        # a tenant's string: lone surrogates (valid JSON escapes) encode too, one to one
        return hashlib.blake2b(
            self._root + b"cache_salt\0" + str(salt).encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()

    @staticmethod
    def _tail_named(request: Any) -> bool:
        """Whether the tokens past a boundary name all of a tail's content:
        not where vLLM's hash folds in more than tokens (a LoRA adapter,
        multimodal inputs, prompt embeddings, whose placeholder ids say
        nothing of the values). Such a request neither saves a tail nor is
        offered one: another request's tail with the same ids is another
        state."""
        return (
            getattr(request, "lora_request", None) is None
            and not getattr(request, "mm_features", None)
            and getattr(request, "prompt_embeds", None) is None
        )

    def _find_tail(self, r: _Req, first: int, run: int) -> tuple[int, int, bytes] | None:
        """The longest tail the host holds that starts at a boundary in
        ``[first, run]`` (its KV before it held) and leaves a token to compute;
        ``_PENDING`` where the longest one is still being saved."""
        if not self._tails or not self.state_groups or not self._tail_named(r.request):
            return None
        for b in range(run, first - 1, -1):
            found = self._tail_at(r, b)
            if found is not None:
                return found
        return None

    def _tail_at(self, r: _Req, b: int) -> tuple[int, int, bytes] | None:
        """The longest tail the host holds at boundary ``b`` that leaves a
        token to compute: of the lengths filed for it, those whose key (from
        one pass over the tokens) names a tail saved, longest first, one
        lookup."""
        req = r.request
        start = b * self.bs
        room = req.num_tokens - 1 - start
        if room <= 0:
            return None
        toks = req.all_token_ids
        parent = self._parent(r, b)
        lengths = self._tails.get((parent, toks[start]))
        top = max((n for n in lengths if n <= room), default=0) if lengths else 0
        if not top:
            return None
        packed = self._tail_chain(parent, toks[start : start + top])
        names = self._tail_names
        want = sorted(
            ((n, k) for n in lengths if n <= top and (k := packed[16 * n : 16 * n + 16]) in names), reverse=True
        )
        if not want:
            return None
        akeys = [arena_key(TAIL, k) for _, k in want]
        for (n, key), akey, held in zip(want, akeys, self.arena.contains_many(akeys)):
            if held:
                return b, n, key
            if akey in self._acc_saved:
                return _PENDING
        return None

    def _shared_tail(self, r: _Req, b: int, shorter: int) -> tuple[int, int, bytes] | None:
        """The longest tail longer than ``shorter`` tokens that the shared
        tier holds at boundary ``b`` (where the KV the tiers hold for ``r``
        ends) and that leaves a token to compute. Another engine saved it, so
        its length is not known here: every length is looked up, in one
        batched lookup per admission (at boundary 0 too: a conversation
        shorter than a block has no other value to resume, and an admission
        past a block asks the shared tier for its blocks anyway)."""
        req = r.request
        bs = self.bs
        start, last = b * bs, req.num_tokens - 1
        upto = min(bs - 1, last - start)
        if not self.state_groups or not self.config.save_decode or upto <= shorter:
            return None
        if not self._tail_named(req):
            return None
        read = (r.shared_local, b, req.num_tokens, shorter)
        if r.shared_tail is not None and r.shared_tail[0] == read:
            return r.shared_tail[1]
        if time.monotonic() < self._shared_down_until:
            return None
        assert self.shared is not None
        toks = req.all_token_ids
        parent = self._parent(r, b)
        lengths = range(upto, shorter, -1)
        keys = self._tail_keys(parent, toks[start : start + upto])[shorter:][::-1]  # longest first
        shared = self.shared
        held = self._ask_shared(
            lambda: every_rank_holds(shared.contains_many, STATE, self.layout_ids[TAIL], self.tp_size, keys),
            len(keys),
            "tail",
        )
        if held is None:
            return None
        found = next(((b, n, k) for n, k, h in zip(lengths, keys, held) if h), None)
        r.shared_tail = (read, found)
        return found

    # --------------------------------------------------------------- match --

    def _ask_shared(self, lookup: Callable[[], Sequence[bool]], n: int, what: str) -> list[bool] | None:
        """The shared tier's answer to one batched lookup of ``n`` keys, or
        None where the call failed: it raised, answered short, or the tier
        counted a failed call while answering (its misses are then not
        answers). A failure is counted and logged, and the tier is skipped
        for 5 s: a server that is down costs one timeout, not one per
        admission. A tier failure is a miss, never an engine failure."""
        assert self.shared is not None
        self.counters["shared_lookups"] += 1
        failed = self.shared.failed_calls()
        try:
            found = list(lookup())
            why = None if len(found) == n else f"answered {len(found)} of {n} keys"
        except Exception as e:
            found, why = [], repr(e)
        if why is None and self.shared.failed_calls() != failed:
            why = self.shared.last_error or "the call failed"
        if why is None:
            return found
        log.warning("statecache: shared tier %s lookup failed (%s); skipping the tier for 5 s", what, why)
        self.counters["shared_lookup_failures"] += 1
        self._shared_down_until = time.monotonic() + 5.0
        return None

    def _shared_has(self, r: _Req, local_blocks: int, max_k: int) -> None:
        """Fills ``r.shared`` for the values past the local hit the host does
        not hold: one batch lookup per admission, every rank's key."""
        if self.shared is None or r.shared_local == local_blocks or time.monotonic() < self._shared_down_until:
            return
        r.shared_local = local_blocks
        r.shared = {}
        r.matched = None  # it read the old answers
        held = self.arena.contains_many(r.kv_names[local_blocks:max_k] + r.state_names[local_blocks:max_k])
        n = max_k - local_blocks
        ask: list[tuple[str, int]] = []
        for j in range(n):
            if not held[j]:
                ask.append((KV, local_blocks + j))
            if self.state_groups and not held[n + j]:
                ask.append((STATE, local_blocks + j))
        if not ask:
            return
        names = [k for kind, i in ask for k in self.tier_keys(kind, r.keys[i])]
        shared = self.shared
        found = self._ask_shared(lambda: shared.contains_many(names), len(names), "block")  # both kinds at once
        if found is None:
            return
        answer = dict(zip(names, found))
        for kind in (KV, STATE):
            idx = [i for k, i in ask if k == kind]
            held = every_rank_holds(
                lambda ks: [answer[k] for k in ks], kind, self.layout_ids[kind], self.tp_size, [r.keys[i] for i in idx]
            )
            r.shared.update(((kind, i), h) for i, h in zip(idx, held))

    def match(self, request: Any, local: int) -> int | None:
        """Tokens past ``local`` (block aligned) that statecache can resume:
        KV blocks for every block after ``local`` and the state at the same
        boundary, never one without the other. Remembers the plan. None:
        ask again next step (the tail it would resume from is being saved)."""
        r = self._reqs.get(request.request_id)
        if r is not None and r.request is request and not r.failures and not r.late:
            # A request vLLM cannot admit yet is matched again every step:
            # while nothing the last match read changed (the host tier's
            # generation counts every seal, remove and eviction), the answer
            # is the same.
            m = r.matched
            if (
                m is not None
                and m[3] == self.arena.generation
                and m[0] == (local, request.num_tokens, len(request.block_hashes), self._tails_changes)
            ):
                r.plan = m[1]
                return m[2]
        r = self._req(request)
        if r.late:  # preempted: the blocks those values were in are gone
            self.counters["saves_skipped_unnamed"] += len(r.late)
            r.late.clear()
        bs = self.bs
        max_k = (request.num_tokens - 1) // bs
        first = local // bs
        # A plan never allocated means vLLM refused the async load's blocks. A
        # request whose load failed stays in vLLM's in-flight reservation while
        # it waits (0.32), so its async retries can be refused forever when
        # several fail at once: it retries without the connector instead.
        refused = r.plan is not None and r.failures > 0
        if refused:
            self.counters["retries_recomputed"] += 1
        # after repeated failures the request is recomputed whatever the tiers say
        if (
            max_k < first
            # past the hit, only a tail can add
            or (max_k == first and not (self._tails_possible() and self.state_groups))
            or refused
            or r.failures >= MAX_LOAD_FAILURES
            or getattr(request, "skip_reading_prefix_cache", False)
        ):
            r.plan = _Plan(local, 0, 0)
            return 0
        keys = self._keys(r, max_k)
        max_k = min(max_k, len(keys))
        self._shared_has(r, first, max_k)
        # what the answer depends on (max_k: the tokens and the blocks vLLM hashed)
        read = (local, request.num_tokens, len(request.block_hashes), self._tails_changes)
        n = max_k - first
        states = self.state_groups
        names = r.kv_names[first:max_k]
        held = self.arena.contains_many(names + r.state_names[first:max_k] if states else names)
        m = r.matched
        if m is not None and m[0] == read and m[4] == held and (m[5] is None or self.arena.contains(m[5])):
            # The host tier changed, but not in what this match reads (its
            # values, and the tail it would load): the answer stands.
            r.matched = (read, m[1], m[2], self.arena.generation, held, m[5])
            r.plan = m[1]
            return m[2]
        shared = r.shared
        kv_sources = []
        for j in range(n):
            if held[j]:
                kv_sources.append(HOST)
            elif shared and shared.get((KV, first + j)):
                kv_sources.append(SHARED)
            else:
                break
        run = first + len(kv_sources)
        best, state_src = 0, None
        for k in range(run, first, -1):
            if not states or held[n + k - 1 - first]:
                best, state_src = k, HOST
                break
            if shared and shared.get((STATE, k - 1)):
                best, state_src = k, SHARED
                break
        plan = _Plan(local, best, run - first, kv_sources, state_src)
        tail, tail_source = self._find_tail(r, first, run), HOST
        if tail is _PENDING:
            if r.tail_waits < MAX_TAIL_WAITS:
                r.tail_waits += 1
                r.plan = None
                self.counters["tail_waits"] += 1
                return None
            tail = None
        if self.shared is not None:  # another engine may have saved a longer one
            longer = self._shared_tail(r, run, tail[1] if tail is not None and tail[0] == run else 0)
            if longer is not None:
                tail, tail_source = longer, SHARED
        if tail is not None and tail[0] * bs + tail[1] > best * bs:
            plan.boundary, plan.tail, plan.tail_source = tail[0], (tail[1], tail[2]), tail_source
            plan.kv_sources = kv_sources[: tail[0] - first]
        r.plan = plan
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "match %s: %d tokens, local %d, KV to block %d, state boundary %d, tail %s",
                request.request_id,
                request.num_tokens,
                local,
                run,
                best,
                plan.tail and (plan.boundary, plan.tail[0]),
            )
        if plan.tail is not None:
            answer = plan.boundary * bs + plan.tail[0] - local
        else:
            answer = best * bs - local if best else 0
        host_tail = arena_key(TAIL, plan.tail[1]) if plan.tail is not None and plan.tail_source == HOST else None
        r.matched = (read, plan, answer, self.arena.generation, held, host_tail)
        return answer

    # ------------------------------------------------------------- loading --

    def _count_admission(self, r: _Req, plan: _Plan, local: int, external: int) -> None:
        c = self.counters
        bs = self.bs
        request = r.request
        cacheable = (request.num_tokens - 1) // bs * bs
        resumed = local + external
        # a tail carries the KV of its partial block: the KV hit reaches what was resumed
        kv_hit = max(local, plan.local + plan.kv_run * bs, resumed)
        if resumed >= bs and len(r.keys) >= resumed // bs:
            self.placement.used(r.keys[resumed // bs - 1])  # its copies here stay fresh
        c["admissions"] += 1
        c["admitted_tokens"] += request.num_tokens
        c["kv_hit_tokens"] += kv_hit
        c["tokens_resumed_local"] += local
        c["tokens_planned_external"] += external
        # why the resume falls short of the prompt's last full block, if it does
        if resumed >= cacheable:
            c["admissions_full_hit"] += 1
        elif kv_hit <= resumed:  # the KV held (vLLM's own, then the tiers') ends where the resume does
            c["admissions_kv_miss"] += 1
        elif external == 0:
            c["admissions_state_miss"] += 1
            c["state_miss_tokens"] += kv_hit - local
        else:
            c["admissions_hit_cut_short"] += 1
            c["cut_short_tokens"] += kv_hit - resumed

    def after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        """Plans the load of what ``match`` found into the blocks vLLM
        allocated; counts the admission."""
        r = self._reqs.get(request.request_id)
        plan = r.plan if r is not None else None
        if r is None or plan is None:
            return  # the second call after an async load, or a request never matched
        r.plan = None
        if num_external == 0:
            # vLLM's local hit is known once it is scheduled: it may be shorter
            # than the one match() was shown (a diverged hybrid hit is cut back
            # to where every group agrees), and the blocks this step computes
            # carry their hashes already, so they cannot tell it
            r.admitting = plan
            self._admitting[request.request_id] = r
            return
        self._count_admission(r, plan, plan.local, num_external)
        ids = blocks.get_block_ids()
        first, k = plan.local // self.bs, plan.boundary
        values: list[Value] = []
        headers: list[list[bytes] | None] = []
        holds: list[tuple[str, str]] = []
        tokens = {HOST: 0, SHARED: 0}
        end = k * self.bs + (plan.tail[0] if plan.tail else 0)
        fail = plan.local + num_external != end
        wanted = [(KV, i, plan.kv_sources[i - first], r.keys[i]) for i in range(first, k)]
        if plan.tail is not None:
            wanted.append((TAIL, k, plan.tail_source, plan.tail[1]))  # blocks of index k: the partial one, the state's
        elif self.state_groups:
            wanted.append((STATE, k - 1, plan.state_source, r.keys[k - 1]))
        state_source = plan.tail_source if plan.tail is not None else plan.state_source
        for kind, i, src, pkey in wanted if not fail else ():
            if kind == TAIL:
                dst = [ids[g][i] for g in self.kv_groups] + [ids[g][i] for g in self.state_groups]
            else:
                dst = [ids[g][i] for g in (self.kv_groups if kind == KV else self.state_groups)]
            if min(dst) <= 0:
                fail = True
                break
            key = arena_key(kind, pkey)
            got = self.arena.lookup(key, True)
            if got is not None:
                self.arena.pin(key)
                holds.append((key, "pinned"))
                values.append(Value(kind, pkey, list(got[0]), dst))
                headers.append(unpack_headers(got[2]))
            elif src == SHARED:
                # a tail ranks from the boundary it starts at
                entries = self.placement.allocate(key, kind, self._parent(r, k) if kind == TAIL else pkey)
                if entries is None:
                    fail = True
                    break
                self._staged.add(key)
                holds.append((key, "staged"))
                if kind == TAIL:  # fetched into the host: a later match here finds it there
                    assert plan.tail is not None
                    self._file_tail(self._parent(r, k), request.all_token_ids[k * self.bs], plan.tail[0], pkey)
                values.append(Value(kind, pkey, entries, dst))
                headers.append(None)
            else:
                fail = True  # evicted since match(): recompute
                break
            if kind == KV:
                tokens[SHARED if src == SHARED or state_source == SHARED else HOST] += self.bs
            elif kind == TAIL:
                tokens[src] += plan.tail[0]
                tokens["tail"] = plan.tail[0]
        if fail:  # nothing is read: give back what was taken, the worker reports the load failed
            log.debug("load for %s not planned (a value went missing or no room to stage it)", request.request_id)
            for key, how in holds:
                if how == "pinned":
                    self.arena.unpin(key)
                else:
                    self._staged.discard(key)
                    self.arena.remove(key)
                    self.placement.dropped(key)
            values, headers, holds, tokens = [], [], [], {}
        self._inflight[request.request_id] = holds
        self._load_tokens[request.request_id] = tokens
        self._loads.append(Load(request.request_id, values, headers, fail))
        self.counters["loads"] += 1

    def hit_sources(self, request: Any) -> dict[str, int]:
        return dict(self._load_tokens.get(request.request_id, {}))

    # ------------------------------------------------------------- saving --

    def _save_many(self, wanted: list[tuple[str, bytes, str, list[int]]]) -> int:
        """Queues each (kind, prefix key, arena key, blocks) of values not in
        the host tier, allocated in one arena call; returns how many."""
        wanted = [w for w in wanted if all(b > 0 for b in w[3])]
        if not wanted:
            return 0
        got = self.placement.allocate_many([w[2] for w in wanted], [w[0] for w in wanted], [w[1] for w in wanted])
        acc, saves = self._acc_saved, self._saves
        before = len(saves)
        for (kind, pkey, key, blocks), entries in zip(wanted, got):
            if entries is None:
                if not self.arena.contains(key) and key not in acc:
                    self.counters["saves_dropped_host_full"] += 1
                continue
            acc[key] = {}
            saves.append(Value(kind, pkey, entries, blocks))
        return len(saves) - before

    def _plan_saves(self, req_id: str, start: int, end: int, admitted: bool) -> None:
        """Values completed by computing tokens ``[start, end)``: KV of every
        block that fills, the state if ``end`` is a boundary; on admission
        also the local hit's chain and state the host tier lacks."""
        r = self._reqs.get(req_id)
        if r is None:
            return
        bs = self.bs
        lo = 0 if admitted else start // bs
        hi = end // bs
        states = []
        if self.state_groups:
            if admitted and start and start % bs == 0:
                states.append(start // bs)  # the local hit's state: vLLM's cached block
            if end % bs == 0 and end > start and (self.config.save_decode or end <= r.request.num_prompt_tokens):
                states.append(end // bs)
                if end > r.request.num_prompt_tokens:
                    self.counters["state_saves_decode"] += 1
        if hi <= lo and not states:
            return
        keys = self._keys(r, max(hi, *states) if states else hi)
        named_hi = max(lo, min(hi, len(keys)))
        named = [k for k in states if k <= len(keys)]
        # vLLM's async scheduling appends a step's token only after it has
        # scheduled the next step, so the block a decode step fills is not
        # hashed yet: those values are saved from the same blocks once named
        late = [(KV, b + 1) for b in range(named_hi, hi)] + [(STATE, k) for k in states if k > len(keys)]
        if late:
            late = self._awaiting_names(r, late)
        hi = named_hi
        kv = r.kv_names[lo:hi]
        names = kv + [r.state_names[k - 1] for k in named]
        held = self.arena.contains_many(names, True) if names else []  # those held: a use, keeps the chain warm
        if all(held) and not late:
            return
        # the request's blocks per group; only the few saved are read (not
        # get_block_ids, which lists every block of every group)
        blocks = self.kv_cache_manager.coordinator.get_blocks(req_id)
        if late:
            r.late += [(kind, b, self._block_ids(blocks, kind, b)) for kind, b in late]
            self._late.add(req_id)
        keys = r.keys
        wanted = [
            (KV, keys[i], names[j], [blocks[g][i].block_id for g in self.kv_groups])
            for j, i in enumerate(range(lo, hi))
            if not held[j]
        ]
        wanted += [
            (STATE, keys[k - 1], names[j], [blocks[g][k - 1].block_id for g in self.state_groups])
            for j, k in enumerate(named, len(kv))
            if not held[j]
        ]
        self._save_many(wanted)

    def _awaiting_names(self, r: _Req, values: list[Any]) -> list[Any]:
        """Those of ``values`` (``(kind, boundary, ...)``, not named yet)
        whose block vLLM will hash: its tokens are not all appended yet.
        The others it never hashes (prefix caching off): dropped, counted."""
        appended = r.request.num_tokens // self.bs
        keep = [v for v in values if v[1] > appended]
        self.counters["saves_skipped_unnamed"] += len(values) - len(keep)
        return keep

    def _block_ids(self, blocks: Any, kind: str, boundary: int) -> tuple[int, ...]:
        """The ids of the blocks holding ``kind``'s value at ``boundary``, from
        a request's blocks per group (``KVCacheBlock`` lists, or ids as a
        finished request's are given); 0 where there is none."""
        j = boundary - 1
        groups = self.kv_groups if kind == KV else self.state_groups
        ids = []
        for g in groups:
            x = blocks[g][j] if j < len(blocks[g]) else 0
            ids.append(x if type(x) is int else x.block_id)
        return tuple(ids)

    def _save_late(self, r: _Req, now: dict[tuple[str, int], tuple[int, ...]]) -> None:
        """Queues the saves of ``r``'s values vLLM has hashed since they were
        computed, where ``now`` (their blocks' ids at present) shows the
        request still holds the blocks they were computed in: a block is
        written once, so its bytes are still that value's."""
        keys = self._keys(r, max(b for _, b, _ in r.late))
        wanted, left = [], []
        for kind, b, ids in r.late:
            if b > len(keys):
                left.append((kind, b, ids))
            elif now[kind, b] == ids and min(ids) > 0:
                name = (r.kv_names if kind == KV else r.state_names)[b - 1]
                wanted.append((kind, keys[b - 1], name, list(ids)))
            else:
                self.counters["saves_skipped_unnamed"] += 1
        r.late = self._awaiting_names(r, left) if left else left
        self.counters["saves_deferred"] += self._save_many(wanted)

    def _save_late_running(self) -> None:
        """``_save_late`` of every running request with values waiting."""
        coordinator = self.kv_cache_manager.coordinator
        for req_id in list(self._late):
            r = self._reqs.get(req_id)
            if r is not None and r.late:
                blocks = coordinator.get_blocks(req_id)
                self._save_late(r, {(kind, b): self._block_ids(blocks, kind, b) for kind, b, _ in r.late})
            if r is None or not r.late:
                self._late.discard(req_id)

    def _count_admitted(self, so: Any) -> None:
        """Counts the admissions without a load that this step schedules,
        with the tokens vLLM resumed itself (its first computed position)."""
        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        if cached.resumed_req_ids:  # preempted requests admitted again
            computed.update(
                (i, c) for i, c in zip(cached.req_ids, cached.num_computed_tokens) if i in cached.resumed_req_ids
            )
        pending = self._admitting
        for req_id in [i for i in pending if i in computed]:
            r = pending.pop(req_id)
            plan, r.admitting = r.admitting, None
            if plan is not None:
                self._count_admission(r, plan, computed[req_id], 0)
        pending.clear()  # not scheduled after all: not admitted

    def _plan_step(self, so: Any, new: Any, cached: Any) -> None:
        """Plans the saves of the values this step completes, and how many
        next steps of these requests decoding a token each complete none
        (``_quiet_steps``)."""
        nsched = so.num_scheduled_tokens
        bs = self.bs
        quiet = bs
        for nr in new:
            n = nsched.get(nr.req_id, 0)
            if n:
                self._plan_saves(nr.req_id, nr.num_computed_tokens, nr.num_computed_tokens + n, True)
        for req_id, c in zip(cached.req_ids, cached.num_computed_tokens):
            n = nsched.get(req_id, 0)
            # the common decode step crosses no boundary: nothing to plan
            if n and (c + n) // bs != c // bs:
                self._plan_saves(req_id, c, c + n, False)
            # decoding on from c + n, a token a step: the step computing token
            # c + n + j ends a block where (c + n + j + 1) % bs == 0
            quiet = min(quiet, (-c - n - 1) % bs)
        # new requests are cached ones next step (then counted): none now
        self._quiet_steps = quiet if not new else 0
        self._quiet_ids = list(cached.req_ids)

    def build_meta(self, so: Any) -> StateCacheMeta:
        """vLLM's ``build_connector_meta``: the connector binds it directly
        (vLLM calls it every step; a forwarder's frame cost more than a quiet
        step's work), so it is timed here."""
        t0 = perf_counter()
        if self._admitting:
            self._count_admitted(so)
        if self._late:
            self._save_late_running()
        new, cached = so.scheduled_new_reqs, so.scheduled_cached_reqs
        if (
            self._quiet_steps > 0
            and not new
            and so.total_num_scheduled_tokens == len(cached.req_ids)  # a token each: decode
            and cached.req_ids == self._quiet_ids
            and not cached.resumed_req_ids
        ):
            # the same requests decoding as when last planned, none reaching a boundary yet
            self._quiet_steps -= 1
        elif self.config.saves:
            self._plan_step(so, new, cached)
        if not (self._saves or self._loads or self._finished_saves):
            meta = self._no_work
        else:
            meta = StateCacheMeta(self._saves, self._loads, self.shared is not None, self._finished_saves)
            self._saves, self._loads, self._finished_saves = [], [], []
        self.hook_seconds[BUILD_META] += perf_counter() - t0
        self.hook_calls[BUILD_META] += 1
        return meta

    # -------------------------------------------------------------- results --

    def _seal(self, key: str, per_rank: dict[int, bytes]) -> None:
        n = self.tp_size
        self.arena.seal(key, pack_headers([per_rank[r] for r in range(n)] if n > 1 else [per_rank[0]]))
        self.placement.sealed(key)

    def update(self, output: Any) -> None:
        """Reads the workers' report and the finished / failed loads."""
        rep = getattr(output, "kv_connector_worker_meta", None)
        if type(rep) is not WorkerReport:  # not isinstance: an ABC's check costs more than the rest of a quiet step
            rep = None
        failed = getattr(output, "failed_recving", None)
        recv = getattr(output, "finished_recving", None)
        if not recv and not failed and rep is None:
            return  # most decode steps: nothing saved, loaded or failed
        if not self._reqs:
            self.stats_due = 0.0  # what the last requests left (a tail saved, a write done): reported now
        failed = failed or set()
        n = self.tp_size
        if rep is not None:
            if n == 1 and self.shared is None:
                self.placement.seal_one_rank(rep.saved, self._acc_saved)
            for key, per_rank in rep.saved.items() if n > 1 or self.shared is not None else ():
                acc = self._acc_saved.get(key)
                if acc is None:
                    continue
                acc.update(per_rank)
                if len(acc) == n:
                    del self._acc_saved[key]
                    self._seal(key, acc)
                    if self.shared is not None:
                        self.arena.pin(key)  # until every rank's shared write is done
                        self._shared_pending.add(key)
                        self._acc_shared[key] = set()
            for key in rep.save_failed:
                if self._acc_saved.pop(key, None) is not None:
                    self.arena.remove(key)
                    self.placement.dropped(key)
            for key, per_rank in rep.fetched.items():
                self._acc_fetched.setdefault(key, {}).update(per_rank)
            for key, ranks in rep.fetch_failed.items():
                self._fetch_failed.setdefault(key, set()).update(ranks)
                for why in ranks.values() if isinstance(ranks, dict) else ():
                    if why == "missing":
                        self.counters["loads_missing"] += 1
            for key in list(self._staged) if self._staged else ():
                got, bad = self._acc_fetched.get(key, {}), self._fetch_failed.get(key, set())
                if len(got) + len(bad - set(got)) < n:
                    continue  # some rank's read may still land in these entries
                self._staged.discard(key)
                self._acc_fetched.pop(key, None)
                self._fetch_failed.pop(key, None)
                if not bad and len(got) == n:
                    self._seal(key, got)
                else:
                    self.arena.remove(key)
                    self.placement.dropped(key)
            for key in rep.untrusted:
                self.arena.remove(key)  # a pinned one goes at its last unpin
            for key, ranks in rep.shared_done.items():
                acc = self._acc_shared.get(key)
                if acc is not None:
                    acc.update(ranks)
                    if len(acc) == n:
                        self._release_shared(key)
            for key in rep.shared_failed:
                if key in self._acc_shared:
                    self._release_shared(key)
            for name, v in rep.counters.items():
                self.counters[name] = self.counters.get(name, 0) + v
        self.counters["loads_failed"] += len(failed)
        for req_id in failed:
            r = self._reqs.get(req_id)
            if r is not None:
                r.failures += 1
                r.shared_local = -1  # what the shared tier holds may have changed: ask again
        for req_id in recv or ():
            for key, how in self._inflight.pop(req_id, ()):
                if how == "pinned":
                    self.arena.unpin(key)
            tokens = self._load_tokens.pop(req_id, {})
            if req_id not in failed:
                self.counters["tokens_resumed_host"] += tokens.get(HOST, 0)
                self.counters["tokens_resumed_shared"] += tokens.get(SHARED, 0)
                self.counters["tokens_resumed_tail"] += tokens.get("tail", 0)

    def _release_shared(self, key: str) -> None:
        del self._acc_shared[key]
        self._shared_pending.discard(key)
        if self.arena.pins(key):
            self.arena.unpin(key)

    def finished(self, request: Any, block_ids: tuple[list[int], ...] | None) -> bool:
        """A request is done. Saves what it computed before vLLM named it
        (async scheduling) and the state it ends with where that is off a
        boundary (with its partly filled attention block): returns True when
        vLLM must keep its blocks until the worker reports those saves done."""
        r = self._reqs.pop(request.request_id, None)
        if not self._reqs:
            self.stats_due = 0.0  # the last request: what it counted is reported in this step
        if r is None or block_ids is None or not self.config.saves:
            return False
        if request.request_id in self._inflight:
            return False  # aborted while its load is in flight: its blocks do not hold that state yet
        late = False
        if r.late:  # its last tokens are appended now: what was computed before it was named
            self._late.discard(request.request_id)
            n = len(self._saves)
            self._save_late(r, {(kind, b): self._block_ids(block_ids, kind, b) for kind, b, _ in r.late})
            self.counters["saves_skipped_unnamed"] += len(r.late)
            r.late = []
            late = len(self._saves) > n
        if self._save_tail(r, request, block_ids) or late:
            self._finished_saves.append(request.request_id)
            return True
        return False

    def _save_tail(self, r: _Req, request: Any, block_ids: tuple[list[int], ...]) -> bool:
        """Queues the save of the state a finished request ends with, where
        that is off a boundary (with its partly filled attention block)."""
        if not self.state_groups or not self.config.save_decode:
            return False
        if not self._tail_named(request):
            return False
        bs = self.bs
        done = request.num_computed_tokens
        b, n = divmod(done, bs)
        if n == 0 or (b and len(self._keys(r, b)) < b):
            return False  # on a boundary, or vLLM has not named the blocks before it
        blocks = [block_ids[g][b] for g in self.kv_groups] + [block_ids[g][b] for g in self.state_groups]
        if min(blocks) <= 0:
            return False
        tail = request.all_token_ids[b * bs : done]  # a new list
        parent = self._parent(r, b)
        key = self._tail_key(parent, tail)
        akey = arena_key(TAIL, key)
        entries = self.placement.allocate(akey, TAIL, parent)  # None where it is there already
        if entries is None:
            if self.arena.lookup(akey, True) is None:  # held: a use; else no room (or its save is pending)
                self.counters["saves_dropped_host_full"] += 1
            return False
        self._acc_saved[akey] = {}
        self._saves.append(Value(TAIL, key, entries, blocks))
        self._file_tail(parent, tail[0], n, key)
        self.counters["tail_saves"] += 1
        return True

    def _file_tail(self, parent: bytes, first: int, n: int, key: bytes) -> None:
        """Makes a tail coming into the host (saved here, or fetched from the
        shared tier) findable by ``_tail_at``: ``n`` tokens from the boundary
        named ``parent``, the first of them ``first``, under ``key``."""
        self._tails_changes += 1
        filed = (parent, first)
        self._tails.setdefault(filed, set()).add(n)
        self._tails.move_to_end(filed)
        self._tail_names[key] = None
        self._tail_names.move_to_end(key)
        for index in (self._tails, self._tail_names):  # what is forgotten is not found: a miss
            while len(index) > 1 << 18:
                index.popitem(last=False)

    # -------------------------------------------------------------- metrics --

    def funnel(self) -> dict[str, float]:
        """Cumulative counters, plus the host tier's occupancy."""
        self._fold_hook_times()
        d = dict(self.counters)
        d["resumed_tokens"] = d["tokens_resumed_local"] + d["tokens_resumed_host"] + d["tokens_resumed_shared"]
        st = self.arena.class_stats(0)
        d["host_values"] = st["values"]
        d["host_used_bytes"] = st["used_entries"] * self.geometry.entry_bytes
        d["host_evictions"] = st["evictions"]
        return d

    def _fold_hook_times(self) -> None:
        c = self.counters
        c["scheduler_seconds"] = sum(self.hook_seconds)
        c["scheduler_calls"] = sum(self.hook_calls)
        c["steps"] = self.hook_calls[BUILD_META]  # one build_meta per step
        for name, t in zip(_HOOK_COUNTERS, self.hook_seconds):
            c[name] = t

    def take_interval(self, now: float | None = None) -> dict[str, float]:
        """Counter increases since the last report (vLLM's connector stats,
        asked for every step): at most every ``STATS_EVERY_S``, and at once
        in a step where no request is left; nothing is lost, only reported
        later. ``now``: ``perf_counter()`` if the caller read it."""
        if now is None:
            now = perf_counter()
        if now < self.stats_due:
            return {}
        self._fold_hook_times()
        reported, out = self._reported, {}
        for k, v in self.counters.items():
            d = v - reported.get(k, 0)
            if d:
                out[k] = d
                reported[k] = v
        self.stats_due = now + STATS_EVERY_S
        return out

    def shutdown(self) -> None:
        if self.shared is not None:
            self.shared.close()
