"""statecache: prefix-cache checkpoints for the recurrent state of hybrid LLMs.

The scheduler-side classes are C++ (``statecache._C``, typed in ``_C.pyi``)
with the Python API of the behaviour reference; docs/contract.md is the
contract. ``import statecache`` loads only that core: it never imports torch.
The torch-based layers (layout, executor), the reference engine, the models
and the simulator load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from statecache._C import *  # noqa: F401,F403  (the public C++ API)
from statecache._C import COPY, FORK, NONE, REPLAY, Sequence, StateTransfer  # noqa: F401
from statecache._operation_id import StateStoreOperationId  # noqa: F401
from statecache._version import __version__ as __version__

# name -> module that defines it, imported on first access
_LAZY_ATTRS = {
    "StateLayout": "statecache.layout",
    "PageLayout": "statecache.layout",
    "paged_checkpoint_spec": "statecache.layout",
    "layout_id": "statecache.layout",
    "TPShard": "statecache.layout",
    "tp_shard_layouts": "statecache.layout",
    "StateCopyExecutor": "statecache.executor",
    "CapturedStateCopy": "statecache.executor",
}
_LAZY_MODULES = ("engine", "models", "sim", "layout", "executor", "metrics", "cli", "demo", "tiers")


if TYPE_CHECKING:  # what the lazy names are, for type checkers (no __getattr__ -> Any)
    from statecache import cli as cli
    from statecache import demo as demo
    from statecache import engine as engine
    from statecache import executor as executor
    from statecache import layout as layout
    from statecache import metrics as metrics
    from statecache import models as models
    from statecache import sim as sim
    from statecache.executor import CapturedStateCopy as CapturedStateCopy
    from statecache.executor import StateCopyExecutor as StateCopyExecutor
    from statecache.layout import PageLayout as PageLayout
    from statecache.layout import StateLayout as StateLayout
    from statecache.layout import TPShard as TPShard
    from statecache.layout import layout_id as layout_id
    from statecache.layout import paged_checkpoint_spec as paged_checkpoint_spec
    from statecache.layout import tp_shard_layouts as tp_shard_layouts
else:

    def __getattr__(name: str) -> Any:
        if name in _LAZY_ATTRS:
            return getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
        if name in _LAZY_MODULES:
            return importlib.import_module(f"statecache.{name}")
        raise AttributeError(f"module 'statecache' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ATTRS) | set(_LAZY_MODULES))
