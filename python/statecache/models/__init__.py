"""Real hybrid models (transformers) running on statecache's slot-indexed state
and the engine's paged KV blocks. Needs torch and transformers (``.[demo]``)."""

from .hybrid import MODELS, HybridGeometry, build_model, probe_geometry
from .runner import HybridModelRunner
from .serve import build_engine

__all__ = ["MODELS", "HybridGeometry", "HybridModelRunner", "build_engine", "build_model",
           "probe_geometry"]
