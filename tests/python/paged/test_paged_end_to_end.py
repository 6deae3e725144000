"""Coordinator ops executed by the CPU executor: a stored image restores bit for bit."""

import pytest

torch = pytest.importorskip("torch")

import statecache as sc  # noqa: E402
from paged_harness import check_conservation  # noqa: E402


def setup(num_units=48):
    state = torch.randn(2, 4, 100)  # [layers, slots, row]
    kv = torch.zeros(num_units, 32)  # one 128-byte unit per block
    executor = sc.StateCopyExecutor(sc.StateLayout(state, slot_dim=1), sc.PageLayout(kv, unit_dim=0), max_num_seqs=4)
    pool = sc.BlockPool(num_units)
    coord = sc.PagedStateCheckpointCoordinator(pool, executor.spec, enabled=True)
    pool.on_evict = coord.unindex
    return state, executor, pool, coord


def run_pass(coord, executor):
    coord.complete_previous_batch()
    stores, restores = coord.take_checkpoint_ops()
    executor(stores=stores, restores=restores)
    return stores, restores


def test_store_then_restore_reproduces_the_image():
    state, executor, pool, coord = setup()
    assert coord.store.units_per_checkpoint == 7  # 800 image bytes over 128-byte units
    seq = sc.Sequence(seq_id=1)
    seq.state_slots = [1]
    image = state[:, 1].clone()
    coord.checkpoint(seq, 3, 777)
    stores, _ = run_pass(coord, executor)
    assert len(stores) == 1 and not coord.contains(777)
    state[:, 1] = 0  # the request moves on
    run_pass(coord, executor)
    assert coord.contains(777)
    resumer = sc.Sequence(seq_id=2)
    resumer.state_slots = [2]
    assert coord.resumable_hit(resumer, 4, [1, 2, 777, 9]) == 3
    assert coord.begin_restore(777, 2)
    _, restores = run_pass(coord, executor)
    assert [r.dst_slot for r in restores] == [2]
    assert torch.equal(state[:, 2], image)
    check_conservation(pool)


def test_pinned_image_survives_pressure_until_its_restore_ran():
    state, executor, pool, coord = setup(num_units=14)  # room for two images
    a, b = sc.Sequence(seq_id=1), sc.Sequence(seq_id=2)
    a.state_slots, b.state_slots = [0], [1]
    image = state[:, 0].clone()
    coord.checkpoint(a, 1, 10)
    coord.checkpoint(b, 1, 20)
    run_pass(coord, executor)
    run_pass(coord, executor)
    assert coord.begin_restore(10, 3)  # pins 10 until the restore has run
    c = sc.Sequence(seq_id=3)
    c.state_slots = [2]
    coord.checkpoint(c, 1, 30)  # needs units: only 20 may be spent
    run_pass(coord, executor)
    assert coord.contains(10) and not coord.contains(20)
    assert torch.equal(state[:, 3], image)
    check_conservation(pool)
