"""Versions of jaxqueue and what it runs on, recorded with every result.

A version string does not change with every edit of the code, so the
versions also hold ``source``: a digest of the package's own Python code
(:func:`source_digest`). A result store and a checkpoint record them, and
resuming either with other code is refused (a store once finished a half-done
sweep with a copy whose seed derivation had changed: 490 rows differed, and
nothing said so) unless the user accepts the change explicitly
(``--accept-code-change``), which the store records.

The digest is taken over the code's syntax tree without its docstrings, so an
edit of a comment, a docstring or the layout leaves it unchanged: only code
that could change a result changes it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import jax
import jaxlib
import numpy as np

__all__ = ["versions", "source_digest", "code_text", "__version__"]

__version__ = "0.1.0"


def code_text(source: str) -> str:
    """The code of a module's text, as compared between versions: its syntax tree
    (:func:`ast.dump`, no line numbers) without docstrings, so comments, docstrings
    and layout do not count."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def _cache_file() -> Path:
    """Where :func:`source_digest` remembers the digests it computed (the user's cache
    folder; ``JAXQUEUE_CACHE_DIR`` or ``XDG_CACHE_HOME`` move it)."""
    base = os.environ.get("JAXQUEUE_CACHE_DIR")
    if base is None:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "jaxqueue")
    return Path(base, "code-digests.json")


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """The first 16 hex digits of the sha256 of the package's code: each ``.py``
    file's path within the package and its :func:`code_text`, in path order.

    Parsing every module takes most of a second, so the digest is remembered
    under the sha256 of the files' bytes (a file in the user's cache folder; if it
    cannot be read or written, the digest is computed each time, with the same value).
    """
    root = Path(__file__).resolve().parent.parent
    paths = sorted(root.rglob("*.py"))
    texts = [p.read_bytes() for p in paths]
    names = [p.relative_to(root).as_posix().encode() for p in paths]
    raw = hashlib.sha256(b"".join(n + b"\0" + t + b"\0" for n, t in zip(names, texts)))
    key = raw.hexdigest()
    cache = _cache_file()
    try:
        known = json.loads(cache.read_text())
        if isinstance(known, dict) and isinstance(known.get(key), str):
            return known[key]
    except (OSError, ValueError):
        known = {}
    h = hashlib.sha256()
    for name, text in zip(names, texts):
        h.update(name + b"\0")
        h.update(code_text(text.decode("utf-8")).encode() + b"\0")
    digest = h.hexdigest()[:16]
    _remember(cache, known if isinstance(known, dict) else {}, key, digest)
    return digest


def _remember(cache: Path, known: dict, key: str, digest: str) -> None:
    """Add ``key: digest`` to the cache file (its last 32 entries kept), atomically."""
    entries = {k: v for k, v in list(known.items())[-31:] if isinstance(v, str)}
    entries[key] = digest
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".code-digests.")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, cache)
    except OSError:  # a read-only home: the digest is recomputed next time
        with contextlib.suppress(OSError, UnboundLocalError):
            os.remove(tmp)


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
