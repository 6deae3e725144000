"""Runs the adversarial fuzzer (fuzz/fuzz_driver.py) one case class per subprocess,
so that a crash fails its test instead of taking the test runner down.

STATECACHE_FUZZ_SECONDS sets each case's budget (default 4 s; .ci/run also
runs a short budget under the ASan+UBSan build of the extension)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("fuzz_driver.py")
SECONDS = float(os.environ.get("STATECACHE_FUZZ_SECONDS", "4"))
CASES = [
    "slot_pool",
    "group_pool",
    "paged",
    "uninitialised",
    "pickling",
    "views",
    "threads",
    # issue 18: unsigned engines' hashes, ops that replace tensors' storage,
    # arrays changed by code that runs mid-call, the threading promises
    "slot_pool_u64",
    "group_pool_u64",
    "paged_u64",
    "mutating_ops",
    "mutated_arrays",
    "thread_promises",
    "tier_batches",
    "tier_reclaim",
    "collision_pair",
]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", CASES)
def test_fuzz_case(case, seed):
    env = dict(os.environ)
    env.setdefault("PYTHONMALLOC", "debug")  # freed memory read back is poisoned
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(DRIVER), case, str(seed), str(SECONDS)],
        capture_output=True,
        text=True,
        timeout=SECONDS * 10 + 60,
        env=env,
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"{case} seed {seed}: exit {proc.returncode}\n{tail}"
