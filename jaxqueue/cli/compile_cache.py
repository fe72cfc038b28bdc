"""The command line's persistent compilation cache: compiled programs kept on disk.

A command compiles its programs afresh in every process, and for a small run
compiling is most of its time. ``python -m jaxqueue`` (and the ``jaxqueue``
script) therefore turn on JAX's persistent compilation cache in the user's
cache folder, ``$JAXQUEUE_CACHE_DIR/xla`` (else ``$XDG_CACHE_HOME/jaxqueue/xla``,
else ``~/.cache/jaxqueue/xla``): a later command that compiles the same
program loads it instead. ``JAXQUEUE_COMPILATION_CACHE=0`` turns it off.

It is a cache, not a result: a loaded program computes what the compiled one
does, bit for bit, and a folder that cannot be created or written leaves the
command without a cache, silently, as does an entry that cannot be read or
written. A cache JAX was already given (``JAX_COMPILATION_CACHE_DIR``, or
``JAX_ENABLE_COMPILATION_CACHE=false``) is left as it is. The library's
``import jaxqueue`` changes no JAX setting: the cache is the command's, set up
after the arguments were checked (a mistake still answers without JAX).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

__all__ = ["SWITCH", "MIN_COMPILE_SECONDS", "cache_folder", "enable"]

#: The environment variable that turns the cache off (``0``, ``off``, ``false`` or ``no``).
SWITCH = "JAXQUEUE_COMPILATION_CACHE"

#: Programs that compiled faster than this are not written (JAX's default is 1 s,
#: which would keep none of a small run's programs; docs/performance.md, "Start-up").
MIN_COMPILE_SECONDS = 0.0

_OFF = ("0", "off", "false", "no")


def cache_folder(environ=None) -> Path | None:
    """The folder of the cache, or None where ``JAXQUEUE_COMPILATION_CACHE`` turns it off."""
    env = os.environ if environ is None else environ
    if env.get(SWITCH, "").strip().lower() in _OFF:
        return None
    base = env.get("JAXQUEUE_CACHE_DIR")
    if not base:
        base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache", "jaxqueue")
    return Path(base, "xla")


def _writable(folder: Path) -> bool:
    """Whether files can be written in ``folder`` (created if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError:
        return False
    return True


def enable() -> Path | None:
    """Turn the persistent compilation cache on for this process (before its first
    compile); the folder used, or None where there is none (turned off, not writable,
    or a cache JAX was given elsewhere)."""
    folder = cache_folder()
    if folder is None or not _writable(folder):
        return None
    import jax

    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return None  # the user's own JAX setting
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # an entry that cannot be read or written (a full disk, a file cut short) is compiled
    # again, without a word: the cache is no part of the result
    warnings.filterwarnings("ignore", message="Error (reading|writing) persistent compilation")
    return folder
