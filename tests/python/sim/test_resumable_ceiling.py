"""The ceiling benchmarks/bench_vllm.py reports each row against: what an
unbounded cache could resume from the earlier requests. A row's share of it
is only meaningful if no real cache could beat it and it counts what one can."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_vllm.py"
BS = 256


def ceiling(results):
    spec = importlib.util.spec_from_file_location("bench_vllm", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.resumable_ceiling(results, BS)


def req(prompt, answer):
    return {"prompt": list(prompt), "tokens": list(answer)}


def test_whole_blocks_of_a_shared_prefix_and_a_finished_sequence():
    a = list(range(600))
    first = req(a, [1, 2, 3, 4])  # computed: the prompt and the answer but its last token (603)
    assert ceiling([first, req(a + [1, 2, 3, 4, 9, 9], [5])]) == 603  # the state it ended with
    assert ceiling([first, req(a[:300] + [7] * 10, [1])]) == 256  # one whole block shared
    assert ceiling([first, req(a[:512], [1])]) == 256  # one token is always left to compute
    assert ceiling([first, req(a[:513], [1])]) == 512
    # resent as it was: no state at 599, its end (603) is past the prompt: the blocks only
    assert ceiling([first, req(a, [1])]) == 512


def test_nothing_from_later_requests_or_a_differing_block():
    a = list(range(600))
    assert ceiling([req(a, [1]), req(list(range(1, 601)), [1])]) == 0
    b = a[:255] + [-1] + a[256:]  # the first block differs in its last token
    assert ceiling([req(a, [1]), req(b, [1])]) == 0
    assert ceiling([req(a, [1])]) == 0  # nothing earlier


def test_every_request_counts_what_any_earlier_one_left():
    a = list(range(1000))
    rs = [req(a[:300], [1, 2]), req(a[:700], [3]), req(a[:900], [4])]
    # the second shares a block with the first; the third starts with all the second computed (its
    # prompt: a one-token answer adds nothing), so it resumes from the state the second ended with
    assert ceiling(rs) == 256 + 700
    rs[1] = req(a[:700], [3, 8])  # now the second computed a token the third does not have
    assert ceiling(rs) == 256 + 512
