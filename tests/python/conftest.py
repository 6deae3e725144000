"""Tests are grouped by subject in the folders below; the helpers they share
(reference.py, pool_diff.py, paged_harness.py, ...) live here, on sys.path."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
