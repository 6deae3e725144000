"""PAGE value types: fields, validation, wire form, value semantics, against the reference."""

import pickle

import pytest

import statecache as sc
from reference import load

ref = load("paged_checkpoint")
if ref is None:  # the reference lives beside the checkout (../shared/reference or STATECACHE_REFERENCE_DIR)
    pytest.skip("reference modules not found", allow_module_level=True)

GOOD = dict(page_unit_bytes=4096, slot_bytes=10_000, layout_id="gdn-L", image_bytes=9_000)


def test_spec_fields_units_and_wire_round_trip():
    s = sc.PagedStateCheckpointSpec(**GOOD)
    assert (s.page_unit_bytes, s.slot_bytes, s.layout_id, s.image_bytes) == (4096, 10_000, "gdn-L", 9_000)
    assert s.units_per_checkpoint == 3
    assert s.to_wire() == {"page_unit_bytes": 4096, "slot_bytes": 10_000, "image_bytes": 9_000, "layout_id": "gdn-L"}
    assert list(s.to_wire()) == list(ref.PagedStateCheckpointSpec(**GOOD).to_wire())
    assert sc.PagedStateCheckpointSpec.from_wire(s.to_wire()) == s
    assert sc.PagedStateCheckpointSpec(4096, 10_000, "gdn-L", 9_000) == s
    assert hash(sc.PagedStateCheckpointSpec(**GOOD)) == hash(s)
    assert s != sc.PagedStateCheckpointSpec(**{**GOOD, "image_bytes": 8_000})
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.image_bytes = 1


@pytest.mark.parametrize(
    "change, named",
    [
        ({"page_unit_bytes": 0}, "page_unit_bytes"),
        ({"page_unit_bytes": -4}, "page_unit_bytes"),
        ({"slot_bytes": 0}, "slot_bytes"),
        ({"image_bytes": 0}, "image_bytes"),
        ({"image_bytes": 10_001}, "image_bytes"),
        ({"page_unit_bytes": True}, "page_unit_bytes"),
        ({"slot_bytes": 4.0}, "slot_bytes"),
        ({"image_bytes": "9000"}, "image_bytes"),
        ({"image_bytes": None}, "image_bytes"),
        ({"layout_id": ""}, "layout_id"),
        ({"layout_id": 3}, "layout_id"),
        ({"layout_id": None}, "layout_id"),
        ({"page_unit_bytes": 0, "slot_bytes": "x"}, "page_unit_bytes"),
        ({"image_bytes": 20_000, "layout_id": ""}, "image_bytes"),
    ],
)
def test_spec_validation_matches_reference(change, named):
    kw = {**GOOD, **change}
    with pytest.raises(ValueError):
        ref.PagedStateCheckpointSpec(**kw)
    with pytest.raises(ValueError) as ours:
        sc.PagedStateCheckpointSpec(**kw)
    # The first bad field in the reference's check order is the one named.
    assert str(ours.value).startswith(named)


@pytest.mark.parametrize("wire", [None, [1, 2], "page_unit_bytes", 3, (("a", 1),)])
def test_from_wire_non_mapping_is_type_error(wire):
    with pytest.raises(TypeError):
        ref.PagedStateCheckpointSpec.from_wire(wire)
    with pytest.raises(TypeError):
        sc.PagedStateCheckpointSpec.from_wire(wire)


@pytest.mark.parametrize(
    "wire",
    [
        {},
        {k: v for k, v in GOOD.items() if k != "layout_id"},
        {**GOOD, "extra": 1},
        {**{k: v for k, v in GOOD.items() if k != "slot_bytes"}, "slot": 1},
    ],
)
def test_from_wire_wrong_keys_is_value_error(wire):
    with pytest.raises(ValueError):
        ref.PagedStateCheckpointSpec.from_wire(wire)
    with pytest.raises(ValueError):
        sc.PagedStateCheckpointSpec.from_wire(wire)


def test_from_wire_validates_values():
    with pytest.raises(ValueError, match="image_bytes"):
        sc.PagedStateCheckpointSpec.from_wire({**GOOD, "image_bytes": -1})


def test_ops_are_frozen_values():
    for cls, first in ((sc.CheckpointStoreOp, "src_slot"), (sc.CheckpointRestoreOp, "dst_slot")):
        op = cls(3, [7, 8], 9_000, "L")
        assert getattr(op, first) == 3 and op.unit_ids == (7, 8) and op.total_bytes == 9_000 and op.layout_id == "L"
        assert isinstance(op.unit_ids, tuple)
        same = cls(**{first: 3, "unit_ids": (7, 8), "total_bytes": 9_000, "layout_id": "L"})
        assert op == same and hash(op) == hash(same) and len({op, same}) == 1
        assert op != cls(3, [8, 7], 9_000, "L")
        assert pickle.loads(pickle.dumps(op)) == op
        assert repr(op) == repr(getattr(ref, cls.__name__)(3, (7, 8), 9_000, "L"))
        with pytest.raises(AttributeError):
            setattr(op, first, 4)
    assert sc.CheckpointStoreOp(1, (2,), 3, "L") != sc.CheckpointRestoreOp(1, (2,), 3, "L")


def test_record_is_mutable_unhashable_value():
    r = sc.CheckpointRecord(prefix_hash=11, unit_ids=(4, 5))
    assert (r.prefix_hash, r.unit_ids, r.state, r.pin_count) == (11, (4, 5), sc.COPYING, 0)
    r.state = sc.READY
    r.pin_count += 2
    assert r == sc.CheckpointRecord(11, (4, 5), "READY", 2)
    assert repr(r) == repr(ref.CheckpointRecord(11, (4, 5), "READY", 2))
    with pytest.raises(TypeError):
        hash(r)
    with pytest.raises(ValueError, match="state"):
        r.state = "GONE"


def test_suspended_restore_and_constants():
    op = sc.CheckpointRestoreOp(1, (2, 3), 10, "L")
    s = sc.SuspendedCheckpointRestore(4, op)
    assert (s.checkpoint_id, s.operation) == (4, op)
    assert s == sc.SuspendedCheckpointRestore(checkpoint_id=4, operation=op) and hash(s) == hash(
        sc.SuspendedCheckpointRestore(4, op)
    )
    assert (sc.COPYING, sc.READY, sc.EVICTING) == (ref.COPYING, ref.READY, ref.EVICTING)


@pytest.mark.parametrize("n", [None, 0, 1, 7, 256])
def test_copy_ops_per_batch(n):
    assert sc.checkpoint_copy_ops_per_batch(n) == ref.checkpoint_copy_ops_per_batch(n)
    assert type(sc.checkpoint_copy_ops_per_batch(n)) is int


def test_operation_id_is_tuple_like():
    op = sc.StateStoreOperationId(-5, 3)
    h, g = op
    assert (h, g) == (-5, 3) and op[0] == -5 and op[1] == 3 and op[-1] == 3
    assert (op.prefix_hash, op.generation) == (-5, 3)
    assert op == (-5, 3) and (-5, 3) == op and op == sc.StateStoreOperationId(-5, 3)
    assert op != (-5, 4) and hash(op) == hash((-5, 3))
    assert {(-5, 3): "x"}[op] == "x"
    assert pickle.loads(pickle.dumps(op)) == op
    assert len(op) == 2 and isinstance(op, tuple)
    assert sc.StateStoreOperationId(1, 0).generation == 0
    with pytest.raises(ValueError, match="generation"):
        sc.StateStoreOperationId(1, -1)
    with pytest.raises(TypeError):
        sc.StateStoreOperationId("1", 0)
    with pytest.raises(TypeError):
        sc.StateStoreOperationId(1)
