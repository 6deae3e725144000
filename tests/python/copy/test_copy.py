"""Copy engine on the CPU: layouts, span planning, the memcpy executor, and
validation (docs/contract.md, "Copying"). The GPU kernel is compared against this executor in
copy/test_copy_gpu.py."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import statecache as sc
from copy_model import Model, make_world, random_batch, random_bytes


def gdn_world(num_slots=6, num_units=40, layers=3, image_ranges=None):
    """GDN-style state (conv bf16 [L, slots, 3, 10], recurrent fp32 [L, slots, 2, 4, 6])
    and K/V pages of two attention layers ([2, blocks, 4, 2, 3] bf16 each)."""
    g = torch.Generator().manual_seed(7)
    conv = torch.randn(layers, num_slots, 3, 10, generator=g).to(torch.bfloat16)
    rec = torch.randn(layers, num_slots, 2, 4, 6, generator=g)
    kv = [torch.randn(2, num_units, 4, 2, 3, generator=g).to(torch.bfloat16) for _ in range(2)]
    state = sc.StateLayout([conv, rec], slot_dim=1, image_ranges=image_ranges)
    page = sc.PageLayout(kv, unit_dim=1)
    return state, page


def poison(*tensors):
    for t in tensors:
        t.view(torch.uint8).fill_(0xA5) if t.is_contiguous() else None


def snapshot(layout):
    return [t.clone() for t in layout.tensors]


def same(a, b):
    """Bit-for-bit (NaN payloads included)."""
    return all(torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)) for x, y in zip(a, b))


@dataclass(frozen=True)
class StandInStore:  # any object with the op's attributes is accepted
    src_slot: int
    unit_ids: tuple
    total_bytes: int
    layout_id: str


def test_layout_geometry_and_spec():
    state, page = gdn_world()
    assert state.num_slots == 6 and page.num_units == 40
    row = 3 * 10 * 2 + 2 * 4 * 6 * 4
    assert state.slot_bytes == 3 * row and state.image_bytes == state.slot_bytes
    assert page.unit_bytes == 2 * 2 * (4 * 2 * 3 * 2)
    spec = sc.paged_checkpoint_spec(state, page)
    assert isinstance(spec, sc.PagedStateCheckpointSpec)
    assert (spec.slot_bytes, spec.image_bytes, spec.page_unit_bytes) == (
        state.slot_bytes,
        state.image_bytes,
        page.unit_bytes,
    )
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    assert ex.spec == spec and ex.layout_id == spec.layout_id
    assert ex.units_per_image == spec.units_per_checkpoint
    # Segment tables: one row per (tensor, layer), base/stride in bytes.
    seg = state.segments[1]
    assert (seg.base, seg.stride, seg.bytes) == (state.tensors[0][1].data_ptr(), 3 * 10 * 2, 3 * 10 * 2)


def test_layout_id_tracks_geometry_and_dtype_not_addresses():
    a, pa = gdn_world()
    b, pb = gdn_world()
    assert sc.layout_id(a, pa) == sc.layout_id(b, pb)
    assert a.tensors[0].data_ptr() != b.tensors[0].data_ptr()
    # Pool sizes are not geometry of an image.
    c, pc = gdn_world(num_slots=9, num_units=50)
    assert sc.layout_id(c, pc) == sc.layout_id(a, pa)
    d, pd = gdn_world(layers=4)
    assert sc.layout_id(d, pd) != sc.layout_id(a, pa)
    e, pe = gdn_world(image_ranges=[None, (8, 64)])
    assert sc.layout_id(e, pe) != sc.layout_id(a, pa)
    f = sc.StateLayout([a.tensors[0].to(torch.float16), a.tensors[1]])
    assert sc.layout_id(f, pa) != sc.layout_id(a, pa)


def test_store_then_restore_reproduces_the_image_bit_for_bit():
    state, page = gdn_world(image_ranges=[(4, 50), None])
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    model = Model(state, page)
    spec = ex.spec
    units = (31, 2, 17, 5, 8, 30, 11)[: spec.units_per_checkpoint]
    assert len(units) == spec.units_per_checkpoint
    # Poison every unit first: the store must write exactly its image bytes.
    for t in page.tensors:
        t.view(torch.uint8).fill_(0xA5)
    before_units = {u: model.unit(u).clone() for u in range(page.num_units)}
    image = model.image(2).clone()
    ex(
        stores=[
            sc.CheckpointStoreOp(src_slot=2, unit_ids=units, total_bytes=spec.image_bytes, layout_id=spec.layout_id)
        ]
    )
    stream = torch.cat([model.unit(u) for u in units])
    assert torch.equal(stream[: spec.image_bytes], image)
    # The last unit's bytes past the image and every unlisted unit are untouched.
    assert torch.equal(stream[spec.image_bytes :], torch.full_like(stream[spec.image_bytes :], 0xA5))
    for u in range(page.num_units):
        if u not in units:
            assert torch.equal(model.unit(u), before_units[u])
    # Restore into a poisoned slot: image bytes come back, the rest stays poison.
    for t in state.tensors:
        t[:, 4].view(torch.uint8).fill_(0x5A)
    others = [t.clone() for t in state.tensors]
    ex(
        restores=[
            sc.CheckpointRestoreOp(dst_slot=4, unit_ids=units, total_bytes=spec.image_bytes, layout_id=spec.layout_id)
        ]
    )
    assert torch.equal(model.image(4), image)
    conv4 = state.tensors[0][:, 4].contiguous().view(torch.uint8).reshape(3, -1)
    assert torch.all(conv4[:, :4] == 0x5A) and torch.all(conv4[:, 54:] == 0x5A)
    for t, o in zip(state.tensors, others):
        keep = [s for s in range(state.num_slots) if s != 4]
        assert torch.equal(t[:, keep].view(torch.uint8), o[:, keep].view(torch.uint8))


def test_relocations_and_copies_move_whole_slots():
    state, page = gdn_world(image_ranges=[(4, 50), (0, 8)])
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    model = Model(state, page)
    want1, want3 = model.whole(1).clone(), model.whole(3).clone()
    ex(relocations=[(1, 5)], copies=[(3, 0)])
    assert torch.equal(model.whole(5), want1) and torch.equal(model.whole(0), want3)


def test_stand_in_ops_and_reference_value_types_plan_alike():
    state, page = gdn_world()
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=2)
    n = ex.spec.units_per_checkpoint
    a = ex.plan(stores=[StandInStore(1, tuple(range(n)), ex.spec.image_bytes, ex.layout_id)])
    b = ex.plan(
        stores=[
            sc.CheckpointStoreOp(
                src_slot=1, unit_ids=tuple(range(n)), total_bytes=ex.spec.image_bytes, layout_id=ex.layout_id
            )
        ]
    )
    assert ex._planner.spans(a) == ex._planner.spans(b) and a.bytes == ex.spec.image_bytes


@pytest.mark.parametrize("kv", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_the_model(seed, kv):
    """Misaligned bases, odd row and unit sizes, partial images, random dtypes,
    multi-tensor KV page layouts with both unit dims, random batches."""
    rng = random.Random(seed)
    state, page, _, _ = make_world(rng, misaligned=seed % 2 == 0, partial=seed % 3 != 0, kv=kv)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=8)
    units_per = ex.units_per_image
    for _ in range(4):
        batch = random_batch(rng, state, page, ex.layout_id, ex.spec.image_bytes, units_per)
        # Model on clones of the same memory.
        twin_state = [t.clone() for t in state.tensors]
        twin_page = [t.clone() for t in page.tensors]
        m = Model(
            sc.StateLayout(twin_state, state.slot_dims, state.image_ranges), sc.PageLayout(twin_page, page.unit_dims)
        )
        m.run(*batch, unit_bytes=page.unit_bytes)
        plan = ex(*batch)
        assert (
            plan.bytes
            == (len(batch[0]) + len(batch[1])) * state.slot_bytes + (len(batch[2]) + len(batch[3])) * state.image_bytes
        )
        assert same(state.tensors, twin_state) and same(page.tensors, twin_page)


def test_template_merges_rows_adjacent_on_both_sides():
    # K and V of a unit are neighbours in one buffer ([units, 2, 8] bytes): the
    # template moves each unit's 16 bytes as one piece, not two.
    buf = torch.arange(4 * 64, dtype=torch.int32).to(torch.uint8)
    state = sc.StateLayout(buf[: 4 * 64].view(4, 64), slot_dim=0)
    kv = torch.zeros(32, 2, 8, dtype=torch.uint8)
    page = sc.PageLayout([kv[:, 0], kv[:, 1]])
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=2)
    assert ex.units_per_image == 4 and ex._planner.pieces_per_paged_op == 4
    split = sc.PageLayout([torch.zeros(32, 8, dtype=torch.uint8), torch.zeros(32, 8, dtype=torch.uint8)])
    assert sc.StateCopyExecutor(state, split, max_num_seqs=2)._planner.pieces_per_paged_op == 8
    ex(stores=[StandInStore(1, (4, 9, 6, 7), ex.spec.image_bytes, ex.layout_id)])
    assert torch.equal(kv[[4, 9, 6, 7]].reshape(-1), state.tensors[0][1])


def _bad_batches(ex):
    lid, n, k = ex.layout_id, ex.spec.image_bytes, ex.spec.units_per_checkpoint
    ok = sc.CheckpointStoreOp(src_slot=0, unit_ids=tuple(range(k)), total_bytes=n, layout_id=lid)
    units = tuple(range(10, 10 + k))

    def store(**kw):
        d = dict(src_slot=1, unit_ids=units, total_bytes=n, layout_id=lid)
        d.update(kw)
        return sc.CheckpointStoreOp(**d)

    def restore(**kw):
        d = dict(dst_slot=3, unit_ids=units, total_bytes=n, layout_id=lid)
        d.update(kw)
        return sc.CheckpointRestoreOp(**d)

    return [
        (dict(stores=[ok, store(layout_id="other")]), "stores[1].*layout_id"),
        (dict(stores=[ok, store(total_bytes=n - 1)]), "stores[1].*total_bytes"),
        (dict(stores=[ok, store(unit_ids=units[:-1])]), "stores[1].*unit_ids"),
        (dict(stores=[ok, store(unit_ids=units[:-1] + (40,))]), "stores[1].*out of range"),
        (dict(stores=[ok, store(unit_ids=units[:-1] + (-1,))]), "stores[1].*out of range"),
        (dict(stores=[ok, store(src_slot=6)]), "stores[1].*slot 6"),
        (dict(stores=[ok], restores=[restore(dst_slot=-1)]), "restores[0].*slot -1"),
        (dict(stores=[ok, store(unit_ids=(0,) + units[1:])]), "stores[1].*unit 0.*stores[0]"),
        (dict(stores=[ok], restores=[restore(unit_ids=tuple(range(k)))]), "restores[0].*reads unit"),
        (dict(stores=[ok], restores=[restore(dst_slot=0)]), "stores[0].*reads slot 0"),
        (dict(stores=[ok], relocations=[(2, 5)], copies=[(4, 5)]), "copies[0].*slot 5"),
        (dict(stores=[ok], relocations=[(2, 2)]), "relocations[0].*onto itself"),
        (dict(stores=[ok], copies=[(1, 6)]), "copies[0].*slot 6"),
        (dict(stores=[ok], copies=[(1, 2, 3)]), "copies[0].*pair"),
    ]


def test_validation_rejects_each_bad_op_and_moves_nothing():
    state, page = gdn_world()
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    for kwargs, pattern in _bad_batches(ex):
        before_s, before_p = snapshot(state), snapshot(page)
        with pytest.raises(ValueError, match=pattern.replace("[", r"\[").replace("]", r"\]")):
            ex(**kwargs)
        assert same(before_s, state.tensors) and same(before_p, page.tensors), pattern


def test_batches_beyond_the_staging_are_refused_before_moving():
    state, page = gdn_world(num_slots=8)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=1, max_slot_copies=1)
    before = snapshot(state)
    with pytest.raises(ValueError, match="staging"):
        ex(relocations=[(0, 4), (1, 5), (2, 6)], copies=[(3, 7)])
    assert same(before, state.tensors)


def test_type_errors_name_the_field():
    state, page = gdn_world()
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=2)
    with pytest.raises(TypeError, match="layout_id"):
        ex(stores=[StandInStore(0, (0,), ex.spec.image_bytes, None)])
    with pytest.raises(TypeError, match="relocations"):
        ex(relocations=[("a", 1)])
    with pytest.raises(TypeError):
        sc.StateCopyExecutor("state", page, 2)
    with pytest.raises(ValueError, match="max_num_seqs"):
        sc.StateCopyExecutor(state, page, 0)
    with pytest.raises(ValueError, match="graph capture"):
        ex.capture()


def test_layout_errors():
    t = torch.zeros(3, 5, 4, 6)
    with pytest.raises(ValueError, match="not contiguous"):
        sc.StateLayout([t.transpose(2, 3)])
    with pytest.raises(ValueError, match="holds 4 slots"):
        sc.StateLayout([t, torch.zeros(3, 4, 2)])
    with pytest.raises(ValueError, match="must be 0 or 1"):
        sc.StateLayout([t], slot_dim=2)
    with pytest.raises(ValueError, match="does not fit"):
        sc.StateLayout([t], image_ranges=[(90, 10)])
    with pytest.raises(TypeError, match="image_ranges"):
        sc.StateLayout([t], image_ranges=[5])
    with pytest.raises(ValueError, match="overlap"):
        sc.StateLayout([torch.zeros(40).as_strided((4, 8), (4, 1))], slot_dim=0)
    with pytest.raises(ValueError, match="strided"):
        sc.PageLayout([torch.zeros(4, 4).to_sparse()])
    with pytest.raises(ValueError, match="at least one"):
        sc.PageLayout([])
    with pytest.raises(TypeError, match="torch.Tensor"):
        sc.PageLayout([[1, 2]])
    # A slot axis 0 tensor whose slots are strided apart is served.
    wide = torch.zeros(4, 16)[:, :8]
    assert sc.StateLayout([wide], slot_dim=0).segments[0].stride == 64


def test_poisoned_random_bytes_never_zero():
    g = torch.Generator().manual_seed(0)
    assert int(random_bytes(4096, g).min()) >= 1


def test_raw_address_classes_are_private():
    for name in ("SpanPlanner", "GpuCopyEngine", "CopyPlan", "_SpanPlanner", "_GpuCopyEngine"):
        assert not hasattr(sc, name), name
    assert hasattr(sc._C, "_SpanPlanner") and not hasattr(sc._C, "SpanPlanner")
    state, page = gdn_world()
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=2)
    assert not any(n for n in vars(ex) if not n.startswith("_") and "planner" in n)


@pytest.mark.parametrize("change", ["set_", "resize_", "storage_resize", "page_set_"])
def test_storage_replaced_or_resized_raises_before_moving(change):
    state, page = gdn_world()
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=2)
    n, k = ex.spec.image_bytes, ex.units_per_image
    op = sc.CheckpointStoreOp(src_slot=1, unit_ids=tuple(range(k)), total_bytes=n, layout_id=ex.layout_id)
    ex(stores=[op])  # fine before the change
    conv, rec = state.tensors
    if change == "set_":
        conv.set_(torch.zeros_like(conv))
    elif change == "resize_":
        rec.resize_(rec.shape[0] + 1, *rec.shape[1:])
    elif change == "storage_resize":
        rec.untyped_storage().resize_(rec.untyped_storage().nbytes() * 2)
    else:
        page.tensors[1].set_(torch.zeros_like(page.tensors[1]))
    before_s, before_p = snapshot(state), snapshot(page)
    with pytest.raises(ValueError, match="replaced or resized"):
        ex(stores=[op])
    with pytest.raises(ValueError, match="replaced or resized"):
        ex.plan(relocations=[(0, 1)])
    assert same(before_s, state.tensors) and same(before_p, page.tensors)


def test_an_executor_is_safe_to_share_between_threads():
    """Threads run batches on disjoint slots and units through one executor
    (some batches invalid); the result equals running them one by one."""
    import threading

    state, page = gdn_world(num_slots=16, num_units=400)
    ex = sc.StateCopyExecutor(state, page, max_num_seqs=4)
    lid, n, k = ex.layout_id, ex.spec.image_bytes, ex.units_per_image
    twin_state = [t.clone() for t in state.tensors]
    twin_page = [t.clone() for t in page.tensors]
    twin = sc.StateCopyExecutor(sc.StateLayout(twin_state), sc.PageLayout(twin_page, unit_dim=1), 4)
    errors, seen_invalid = [], []

    def worker(w):
        try:
            for r in range(40):
                units = tuple(range(w * 100 + (r % 10) * k, w * 100 + (r % 10 + 1) * k))
                store = sc.CheckpointStoreOp(src_slot=w, unit_ids=units, total_bytes=n, layout_id=lid)
                restore = sc.CheckpointRestoreOp(dst_slot=8 + w, unit_ids=units, total_bytes=n, layout_id=lid)
                ex(stores=[store])
                ex(restores=[restore], relocations=[(w, 12 + w)])
                try:
                    ex(stores=[store, store])  # two writers of the same units
                except ValueError:
                    seen_invalid.append(w)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(seen_invalid) == 4 * 40
    for w in range(4):  # the last round of each worker, applied once
        units = tuple(range(w * 100 + 9 * k, w * 100 + 10 * k))
        twin(stores=[sc.CheckpointStoreOp(src_slot=w, unit_ids=units, total_bytes=n, layout_id=lid)])
        twin(
            restores=[sc.CheckpointRestoreOp(dst_slot=8 + w, unit_ids=units, total_bytes=n, layout_id=lid)],
            relocations=[(w, 12 + w)],
        )
    # Every unit range a worker wrote holds its slot's image (stores of one
    # slot always write the same bytes), so the final states agree.
    for w in range(4):
        for r in range(10):
            units = range(w * 100 + r * k, w * 100 + (r + 1) * k)
            model, tmodel = Model(state, page), Model(twin.state_layout, twin.page_layout)
            got = torch.cat([model.unit(u) for u in units])[:n]
            assert torch.equal(got, tmodel.image(w))
    assert same(state.tensors, twin_state)


@pytest.mark.parametrize("where", ["index", "property", "pair"])
def test_an_op_that_replaces_a_tensors_storage_while_it_converts_is_refused(where):
    """Every op converts before the tensors are checked: an op whose
    ``__index__`` (or a duck-typed op's property) replaces a layout tensor's
    storage with ``set_()`` makes the batch raise ValueError, and nothing is
    written, neither to the new storage nor to the old one (kept alive here to
    look at it; without the order the copy wrote to it after it was freed)."""
    slots = torch.arange(8 * 64, dtype=torch.uint8).reshape(8, 64).clone()
    pages = torch.zeros(32, 64, dtype=torch.uint8)
    ex = sc.StateCopyExecutor(sc.StateLayout([slots]), sc.PageLayout([pages], unit_dim=0), max_num_seqs=4)
    lid, n = ex.layout_id, ex.spec.image_bytes
    kept = []

    def swap_storage():
        kept.append(torch.zeros(0, dtype=torch.uint8).set_(pages.untyped_storage()))
        pages.set_(torch.zeros(32, 64, dtype=torch.uint8).untyped_storage(), 0, (32, 64))

    class Swapping:
        def __index__(self):
            swap_storage()
            return 3

    class DuckStore:
        src_slot = 1
        total_bytes = n
        layout_id = lid

        @property
        def unit_ids(self):
            swap_storage()
            return [3]

    if where == "index":
        batch = dict(stores=[StandInStore(src_slot=1, unit_ids=(Swapping(),), total_bytes=n, layout_id=lid)])
    elif where == "property":
        batch = dict(stores=[DuckStore()])
    else:  # a relocation's slot
        slot_ex = sc.StateCopyExecutor(sc.StateLayout([pages]), sc.PageLayout([slots], unit_dim=0), max_num_seqs=4)
        ex, batch = slot_ex, dict(relocations=[(Swapping(), 5)])
    with pytest.raises(ValueError, match="storage was replaced"):
        ex(**batch)
    assert not kept[0].any() and not pages.any()
    assert ex.copy_stats["refused"] == 1
