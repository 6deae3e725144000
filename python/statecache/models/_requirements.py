"""The transformers these models need, checked before anything uses it.

The runner stages state through transformers' linear-attention cache layers
(``cache_utils.LinearAttentionCacheLayerMixin``, ``DynamicCache(config=)``),
which older releases do not have; without this check an old install fails
with an AttributeError deep inside ``probe_geometry``.
"""

from __future__ import annotations

import importlib.metadata
import re

MIN_TRANSFORMERS = "5.24"  # keep equal to the [demo] extra in pyproject.toml


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def require_transformers(installed: str | None = None) -> str:
    """Returns the installed transformers version; raises ImportError naming
    the version needed when it is missing or older than MIN_TRANSFORMERS."""
    fix = f"pip install 'transformers>={MIN_TRANSFORMERS}' (or pip install 'statecache[demo]')"
    if installed is None:
        try:
            installed = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            raise ImportError(
                f"statecache.models needs transformers>={MIN_TRANSFORMERS}, which is not installed: {fix}"
            ) from None
    if _release(installed) < _release(MIN_TRANSFORMERS):
        raise ImportError(
            f"statecache.models needs transformers>={MIN_TRANSFORMERS}, found "
            f"{installed} (it lacks the linear-attention cache layers the runner "
            f"stages state through): {fix}"
        )
    return installed
