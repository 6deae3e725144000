import math
import pickle

import pytest

import statecache as sc


def test_transfer_kinds_and_rooms():
    assert sc.StateTransfer.none().kind == "none"
    assert sc.StateTransfer.none().successor_room == math.inf
    assert sc.StateTransfer.replay().successor_room == math.inf
    f = sc.StateTransfer.fork(4)
    assert (f.kind, f.fork_tokens, f.forks, f.copies, f.replays) == ("fork", 4, True, False, False)
    assert f.successor_room == 4.0
    c = sc.StateTransfer.copy("L1", readable_midstep=True)
    assert (c.copies, c.paged_layout_id, c.readable_midstep, c.successor_room) == (True, "L1", True, 0.0)


@pytest.mark.parametrize(
    "args, exc",
    [
        (("fork", 0), ValueError),
        (("none", 3), ValueError),
        (("copy", 1), ValueError),
        (("fork", 2, "L"), ValueError),
        (("none", 0, None, True), ValueError),
        (("replay", 0, None, True), ValueError),
        (("bogus",), ValueError),
        (("fork", True), TypeError),
        ((3,), TypeError),
    ],
)
def test_transfer_validation(args, exc):
    with pytest.raises(exc):
        sc.StateTransfer(*args)


def test_transfer_value_semantics_and_wire():
    a = sc.StateTransfer.fork(8, readable_midstep=True)
    assert a == sc.StateTransfer("fork", 8, None, True)
    assert a != sc.StateTransfer.fork(8)
    assert hash(a) == hash(sc.StateTransfer("fork", 8, None, True))
    assert sc.StateTransfer.from_wire(a.to_wire()) == a
    assert set(a.to_wire()) == {"kind", "fork_tokens", "paged_layout_id", "readable_midstep"}
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(TypeError):
        sc.StateTransfer.from_wire([("kind", "none")])
    with pytest.raises(ValueError):
        sc.StateTransfer.from_wire({"kind": "none"})
    with pytest.raises(AttributeError):
        a.kind = "none"
    assert sc.StateTransfer.from_config("copy", 5) == sc.StateTransfer.copy()
    assert sc.StateTransfer.from_config("fork", 5) == sc.StateTransfer.fork(5)


def test_sequence_fields_and_subclass():
    class Req(sc.Sequence):
        def __init__(self, rid):
            super().__init__(seq_id=rid, num_tokens=10, num_prompt_tokens=10)
            self.note = "extra"

    r = Req(7)
    assert (r.seq_id, r.num_tokens, r.state_slot, r.state_fork_src, r.note) == (7, 10, -1, -1, "extra")
    assert r.state_slots == [] and r.block_hashes == []
    r.state_slots = [3, 5, 6]
    r.state_slot = 9
    assert r.state_slots == [9, 5, 6] and r.state_slot == 9
    r.block_hashes.append(11)
    r.block_hashes.extend([12, 13])
    assert list(r.block_hashes) == [11, 12, 13] and len(r.block_hashes) == 3
    assert sc.Sequence().seq_id is None and sc.Sequence().has_per_req_cache is True
    with pytest.raises(TypeError, match="num_tokens"):
        r.num_tokens = "x"
    with pytest.raises(TypeError, match="state_slots"):
        r.state_slots = ["a"]
    view = r.block_hashes
    del r
    assert list(view) == [11, 12, 13]  # the view keeps its sequence alive
