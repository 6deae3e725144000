"""statecache: prefix-cache checkpoints for the recurrent state of hybrid LLMs.

The scheduler-side classes are C++ (``statecache._C``) with the Python API of
the behaviour reference; see SPEC.md for the contract.
"""

from statecache._C import *  # noqa: F401,F403  (the public C++ API)
from statecache._C import COPY, FORK, NONE, REPLAY, Sequence, StateTransfer  # noqa: F401
from statecache._operation_id import StateStoreOperationId  # noqa: F401

__version__ = "0.1.0"
from statecache import engine  # noqa: E402,F401  (reference engine, torch-free)


def __getattr__(name):  # the torch-based layers load on first use only
    if name in ("StateLayout", "PageLayout", "paged_checkpoint_spec", "layout_id", "TPShard", "tp_shard_layouts"):
        from statecache import layout
        return getattr(layout, name)
    if name in ("StateCopyExecutor", "CapturedStateCopy"):
        from statecache import executor
        return getattr(executor, name)
    raise AttributeError(f"module 'statecache' has no attribute {name!r}")
