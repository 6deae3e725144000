"""Loads the behaviour reference (../shared/reference) for differential tests.

The reference modules import a few names from the engine they came from; this
points those imports at statecache's own types, so both sides of a test share
one Sequence / StateTransfer / BlockPool and differ only in the class under
test. Returns None when the reference is not beside the checkout.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import statecache

_HERE = Path(__file__).resolve()
_CANDIDATES = [
    os.environ.get("STATECACHE_REFERENCE_DIR", ""),
    # beside the checkout, or beside any directory above it (worktrees)
    *(str(p / "shared" / "reference") for p in _HERE.parents),
]


def reference_dir() -> Path | None:
    for c in _CANDIDATES:
        if c and (Path(c) / "slot_pool.py").is_file():
            return Path(c)
    return None


def _module(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


def _install_shims() -> None:
    for pkg in ("atom", "atom.model_engine", "atom.kv_transfer", "atom.kv_transfer.disaggregation"):
        _module(pkg).__path__ = []
    _module("atom.model_engine.state_runtime", StateTransfer=statecache.StateTransfer)
    _module("atom.model_engine.sequence", Sequence=statecache.Sequence)
    _module("atom.model_engine.block_pool", BlockPool=getattr(statecache, "BlockPool", None))
    _module(
        "atom.kv_transfer.disaggregation.types",
        StateStoreOperationId=getattr(statecache, "StateStoreOperationId", tuple),
    )


def load(name: str):
    """The reference module `name` ('slot_pool', 'group_pool', 'paged_checkpoint'), or None."""
    d = reference_dir()
    if d is None:
        return None
    key = f"statecache_reference_{name}"
    if key in sys.modules:
        return sys.modules[key]
    _install_shims()
    spec = importlib.util.spec_from_file_location(key, d / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod
