"""Versions of jaxqueue and what it runs on, recorded with every result.

A version string does not change with every edit of the code, so the
versions also hold ``source``: the sha256 of the package's own Python
sources (:func:`source_digest`). A result store and a checkpoint record
them, and resuming either with other code is refused (a store once finished
a half-done sweep with a copy whose seed derivation had changed: 490 rows
differed, and nothing said so).
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

import jax
import jaxlib
import numpy as np

__all__ = ["versions", "source_digest", "__version__"]

__version__ = "0.1.0"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """The first 16 hex digits of the sha256 of the package's ``.py`` files
    (each one's path within the package and its bytes, in path order)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def versions() -> dict:
    """``{"jaxqueue", "source", "jax", "jaxlib", "numpy", "python"}``: version
    strings, and the digest of the package's sources (:func:`source_digest`)."""
    return {
        "jaxqueue": __version__,
        "source": source_digest(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
