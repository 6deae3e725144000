"""Chained token-block hashes (docs/contract.md, "Words", "Reference engine")."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statecache
from statecache import chain_block_hashes


def test_chain_extends_from_parent():
    toks = list(range(100, 117))
    full = chain_block_hashes(toks, 4)
    assert len(full) == 4 and all(isinstance(h, int) for h in full)
    assert chain_block_hashes(toks[8:], 4, full[1]) == full[2:]
    assert chain_block_hashes(toks[8:], 4, parent_hash=full[1]) == full[2:]


def test_numpy_in_and_out_match_lists():
    toks = np.arange(40, dtype=np.int64)
    arr = chain_block_hashes(toks, 8, as_numpy=True)
    assert arr.dtype == np.int64 and arr.shape == (5,)
    assert arr.tolist() == chain_block_hashes(toks.tolist(), 8)
    assert chain_block_hashes(toks.astype(np.int32), 8) == arr.tolist()


def test_partial_tail_and_empty():
    assert chain_block_hashes([1, 2, 3], 4) == []
    assert chain_block_hashes([], 4) == []


@pytest.mark.parametrize("bad", [0, -3])
def test_bad_block_size(bad):
    with pytest.raises(ValueError, match="block_size"):
        chain_block_hashes([1, 2], bad)


def test_bad_types():
    with pytest.raises(TypeError, match="token_ids"):
        chain_block_hashes("abc", 2)
    with pytest.raises(TypeError, match="block_size"):
        chain_block_hashes([1, 2], 2.0)
    with pytest.raises(TypeError, match="parent_hash"):
        chain_block_hashes([1, 2], 2, None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31), min_size=0, max_size=64), st.integers(1, 9), st.integers(0, 63))
def test_prefix_property(toks, bs, change):
    """Block i's hash depends on tokens [0, (i+1)*bs) only, and on all of them."""
    h = chain_block_hashes(toks, bs)
    assert len(h) == len(toks) // bs and -1 not in h
    if not toks:
        return
    pos = change % len(toks)
    other = list(toks)
    other[pos] += 1
    h2 = chain_block_hashes(other, bs)
    first = pos // bs
    assert h2[:first] == h[:first]
    assert all(a != b for a, b in zip(h[first:], h2[first:]))


def test_sequence_block_hashes_take_a_chain_and_slice():
    """The engine stores chains on Sequence.block_hashes; slicing the view
    returns a plain list (it used to return a dangling accessor)."""
    seq = statecache.Sequence(num_tokens=12)
    seq.block_hashes = chain_block_hashes(list(range(12)), 4)
    want = chain_block_hashes(list(range(12)), 4)
    assert seq.block_hashes[:2] == want[:2] and seq.block_hashes[::-1] == want[::-1]
    assert list(seq.block_hashes) == want
