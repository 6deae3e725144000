"""Placement within a tier (statecache.tiers.placement, issue 20): one byte
budget for KV blocks and state images, a KV block ranked with the deepest
state it leads to, chains refreshed tail first, loads cut at the deepest
resumable boundary."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statecache as sc
from statecache.tiers import HostTier
from statecache.tiers.placement import PrefixChains, TierPlacement, blocks_to_load

STATE, KV = 0, 1


def key_of(kind, h):
    return f"{kind}/{h}"


def chain_of(n, base=0):
    return [base + i for i in range(n)]


def test_chains_know_parents_positions_and_what_each_block_leads_to():
    c = PrefixChains()
    c.note(chain_of(3), 0)
    c.note([3, 4], 3, parent=2)  # the same prefix, two blocks more
    c.note([10, 11], 2, parent=1)  # a branch after block 1
    assert c.chain(4) == [4, 3, 2, 1, 0] and c.chain(11) == [11, 10, 1, 0]
    assert [c.position(h) for h in (0, 2, 4, 11)] == [1, 3, 5, 4]
    assert c.note_state(4) == [4, 3, 2, 1, 0]
    c.note_state(11)
    assert [c.lead(h) for h in (0, 1, 2, 4, 10, 11)] == [5, 5, 5, 5, 4, 4]
    c.note_state(2)  # a shallower state changes no lead
    assert c.lead(0) == 5 and c.lead(99) == 0 and c.position(99) == 0 and c.chain(99) == []


def test_chains_are_bounded():
    c = PrefixChains(max_known=64)
    for i in range(20):
        c.note(chain_of(8, 100 * i), 0)
    assert len(c) <= 64
    with pytest.raises(ValueError, match="max_known"):
        PrefixChains(max_known=1)


def _cost_model(arena):
    # what the adaptive default installs on the PAGE store (hybrid-7b-like)
    arena.set_eviction_policy(
        "cost", flops_per_token=1.3e10, flops_per_context_token=6.5e4, checkpoint_bytes=2.6e7, tokens_per_position=512
    )


def test_a_chain_is_spent_from_its_tail_never_cut_at_its_root():
    """Filed at their own positions, a chain's root blocks rank cheapest and
    go first, so the state at its end can never be resumed again; filed
    with what they lead to, the tail goes first."""
    arena = sc.HostArena(1, 12, [None, None])
    _cost_model(arena)
    chains = PrefixChains()
    p = TierPlacement(arena, chains, key_of)
    chains.note(chain_of(8), 0)
    for h in range(8):  # blocks arrive as the GPU evicts them: tail first
        h = 7 - h
        arena.allocate(key_of("kv", h), KV, 1, 1, p.position("kv", h))
        arena.seal(key_of("kv", h), b"")
    arena.allocate(key_of("state", 7), STATE, 1, 1, p.position("state", 7))
    arena.seal(key_of("state", 7), b"")
    p.state_stored(7)
    # newer states of deeper prefixes push the chain out one at a time
    spent = []
    for i in range(9):
        got = arena.allocate(f"other/{i}", STATE, 1, 1, 20)
        arena.seal(f"other/{i}", b"")
        spent += [k.decode() for k in got[1]]
    chain_spent = [k for k in spent if not k.startswith("other")]
    assert len(chain_spent) == 6 and chain_spent[0] == "state/7"
    assert chain_spent[1:] == ["kv/7", "kv/6", "kv/5", "kv/4", "kv/3"]  # the root outlives every block after it


def test_a_resume_refreshes_its_state_and_chain_tail_first():
    arena = sc.HostArena(1, 5, [None, None], "lru")
    chains = PrefixChains()
    p = TierPlacement(arena, chains, key_of)
    chains.note(chain_of(3), 0)
    chains.note([50], 0)
    for k in ("kv/0", "kv/1", "kv/2", "state/2", "kv/50"):
        arena.allocate(k, KV if k.startswith("kv") else STATE, 1, 1, 0)
        arena.seal(k, b"")
    assert arena.victims(KV, 5)[0] == b"kv/0"
    p.used(2)  # resumed at block 2 (from the GPU, say): its host copies stay fresh
    assert arena.victims(KV, 5) == [b"kv/50", b"state/2", b"kv/2", b"kv/1", b"kv/0"]


def test_a_host_tier_is_one_budget_by_default_and_caps_are_optional():
    t = HostTier(100 * 10, 10)
    for klass in (STATE, KV):
        s = t.arena.class_stats(klass)
        assert s["budget_entries"] == 100 and not s["capped"]
    split = HostTier(100 * 10, 10, kv_bytes=300)  # one cap: the other class has the rest
    assert (
        split.arena.class_stats(KV)["budget_entries"] == 30 and split.arena.class_stats(STATE)["budget_entries"] == 70
    )
    with pytest.raises(ValueError, match="class_budget_bytes"):
        sc.HostArena(10, 100, [-5, None])
    with pytest.raises(TypeError, match="class_budget_bytes"):
        sc.HostArena(10, 100, "all")


@settings(max_examples=60, deadline=None)
@given(
    present=st.lists(st.booleans(), max_size=12),
    gpu_hit=st.integers(0, 5),
    states=st.sets(st.integers(1, 20), max_size=5),
)
def test_loads_stop_at_the_deepest_resumable_boundary(present, gpu_hit, states):
    def resumable(n):
        return max([s for s in states if s <= n], default=0)

    n = blocks_to_load(gpu_hit, present, resumable)
    run = next((i for i, p in enumerate(present) if not p), len(present))
    assert 0 <= n <= run
    if n:
        assert gpu_hit + n in states  # ends on a state
        assert not any(gpu_hit + n < s <= gpu_hit + run for s in states)  # the deepest one reachable
    else:
        assert not any(gpu_hit < s <= gpu_hit + run for s in states)
