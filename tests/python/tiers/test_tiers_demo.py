"""``statecache demo --tiers`` end to end: it starts and stops mooncake_master
itself, runs a fresh process that resumes from Mooncake Store, and every run's
greedy tokens equal the run without caching."""

import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from tier_support import need  # noqa: E402


def test_demo_tiers_three_runs_identical():
    need("mooncake_master", "pip install 'statecache[mooncake]'")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statecache.cli",
            "demo",
            "--tiers",
            "--no-progress",
            "--conversations",
            "2",
            "--turns",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "starting mooncake_master" in text and "stopped mooncake_master" in text
    lines = re.findall(r"generated tokens identical: (\d+)/(\d+)", text)
    assert len(lines) == 3 and all(a == b and int(b) > 0 for a, b in lines)
    fresh = re.search(r"\(c\) fresh process, Mooncake Store\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", text)
    assert fresh and int(fresh.group(4)) > 0  # resumed tokens that came from Mooncake
