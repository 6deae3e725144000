"""Real hybrid models (transformers) running on statecache's slot-indexed state
and the engine's paged KV blocks. Needs torch and transformers (``.[demo]``)."""

from ._requirements import MIN_TRANSFORMERS, require_transformers

require_transformers()  # a clear ImportError here, not an AttributeError in probe_geometry

from .hybrid import MODELS, HybridGeometry, build_model, probe_geometry  # noqa: E402
from .runner import HybridModelRunner  # noqa: E402
from .serve import build_engine  # noqa: E402

__all__ = [
    "MIN_TRANSFORMERS",
    "MODELS",
    "HybridGeometry",
    "HybridModelRunner",
    "build_engine",
    "build_model",
    "probe_geometry",
    "require_transformers",
]
