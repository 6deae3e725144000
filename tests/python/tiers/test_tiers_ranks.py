"""Tensor-parallel shards in the tiers: a rank never adopts another rank's image.

Each rank stores its own shard under a key that names (layout_id, tp_rank,
tp_size, prefix key); the full key travels in the value's header and is
checked before adoption, so a value filed under (or copied to) another rank's
key is refused."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("xxhash")

from statecache.tiers import integrity  # noqa: E402
from statecache.tiers.keys import TierKey  # noqa: E402

PREFIX = bytes(range(16))


def _value(key: TierKey, payload: bytes) -> tuple[bytes, bytes]:
    return integrity.make_header(key.encode(), len(payload), integrity.checksum([payload])), payload


def test_every_rank_has_its_own_key():
    keys = {TierKey("state", "L", r, 4, PREFIX).encode() for r in range(4)}
    assert len(keys) == 4
    assert TierKey("state", "L", 0, 2, PREFIX).encode() != TierKey("state", "L", 0, 4, PREFIX).encode()


@pytest.mark.parametrize("tp_size", [2, 4])
def test_a_rank_refuses_another_ranks_shard(tp_size):
    shards = [os.urandom(4096) for _ in range(tp_size)]
    stored = {r: _value(TierKey("state", "L", r, tp_size, PREFIX), shards[r]) for r in range(tp_size)}
    for r in range(tp_size):
        mine = TierKey("state", "L", r, tp_size, PREFIX).encode()
        header, payload = stored[r]
        assert integrity.check(header, mine, [payload], len(shards[r])) == integrity.OK
        for other in range(tp_size):
            if other == r:
                continue
            header, payload = stored[other]  # another rank's bytes, e.g. filed under the wrong key
            assert integrity.check(header, mine, [payload], len(payload)) == integrity.WRONG_KEY


def test_a_rank_is_named_wherever_shards_are_written():
    from statecache.tiers.ranks import rank_identity

    assert rank_identity(None, 1) == (0, 1)
    assert rank_identity(3, 4) == (3, 4)
    with pytest.raises(ValueError, match="tp_rank is required"):
        rank_identity(None, 2)
    with pytest.raises(ValueError, match="tp_rank"):
        rank_identity(2, 2)
    with pytest.raises(ValueError, match="tp_size"):
        rank_identity(0, 0)


def test_a_prefix_counts_only_with_every_ranks_shard():
    from statecache.tiers.ranks import every_rank_holds, shard_keys

    a, b = bytes(16), bytes(range(16))
    stored = set(shard_keys("state", "L", 4, a)) | set(shard_keys("state", "L", 4, b)[:3])  # b lacks rank 3
    calls = []

    def held(keys):
        calls.append(len(keys))
        return [k in stored for k in keys]

    assert every_rank_holds(held, "state", "L", 4, [a, b]) == [True, False]
    assert calls == [8]  # one question for every rank of every prefix
    assert every_rank_holds(held, "state", "L", 4, []) == []
    with pytest.raises(ValueError, match="answered"):
        every_rank_holds(lambda keys: [True], "state", "L", 4, [a])
