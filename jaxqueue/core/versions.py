"""Versions of jaxqueue and what it runs on, recorded with every result."""

from __future__ import annotations

import platform

__all__ = ["versions", "__version__"]

__version__ = "0.1.0"


def versions() -> dict:
    """``{"jaxqueue", "jax", "jaxlib", "numpy", "python"}`` version strings."""
    import jax
    import numpy as np

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except Exception:  # pragma: no cover
        jaxlib_version = None
    return {
        "jaxqueue": __version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
