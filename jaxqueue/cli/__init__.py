"""Command line: ``python -m jaxqueue SUBCOMMAND`` or the ``jaxqueue`` script.

:func:`main` parses the arguments (:mod:`jaxqueue.cli.parser`, whose description
``--help`` prints) and runs one subcommand, turning its errors into one line and
an exit status. Progress and logs (the ``jaxqueue`` logger, at INFO) go to stderr.

Started as a command (``python -m jaxqueue``, the ``jaxqueue`` script: ``main()``
without arguments), it keeps compiled programs in a persistent compilation cache
(:mod:`jaxqueue.cli.compile_cache`; ``JAXQUEUE_COMPILATION_CACHE=0`` turns it off);
``main([...])`` called within another program leaves that program's JAX settings alone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import warnings

from jaxqueue.cli.checks import prepare
from jaxqueue.cli.output import num
from jaxqueue.cli.parser import build_parser
from jaxqueue.core.progress import LOGGER, stderr_handler

__all__ = ["main"]

# the names these had when the command line was one module
_parser, _num = build_parser, num


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = str(message)
    if category.__name__ == "WarmupWarning":  # its advice names the flags, not the keywords
        from jaxqueue.results.warmup import SPELLINGS  # loaded by then: no start-up cost

        for keyword, flag in zip(SPELLINGS["python"], SPELLINGS["cli"]):
            text = text.replace(keyword, flag)
        # compare's own keyword for the window in time units (jaxqueue.studies.compare)
        text = text.replace("steps= or time_units=", SPELLINGS["cli"][3])
    elif category.__name__ == "RunSizeWarning":  # likewise: the flags that make a run smaller
        from jaxqueue.runs.estimates import SPELLINGS as SIZE_SPELLINGS

        for keyword, flag in zip(SIZE_SPELLINGS["python"], SIZE_SPELLINGS["cli"]):
            text = text.replace(f"({keyword})", f"({flag})")
    print(f"warning: {text}", file=sys.stderr)


def main(argv=None) -> int:
    # a process started as the command: its JAX settings are the command's own
    persistent_cache = argv is None
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings(), _log_to_stderr():
        warnings.showwarning = _show_warning  # one line on stderr, not a source excerpt
        # a failed warm-up is always said (whatever the caller's filters), never raised:
        # the command's output stands and it exits 0
        warnings.filterwarnings("always", message="the warm-up diagnostic")
        # an earlier spelling in a spec says so (Python hides DeprecationWarnings by default)
        warnings.filterwarnings("default", category=DeprecationWarning, module="jaxqueue")
        return _run(args, persistent_cache)


@contextlib.contextmanager
def _log_to_stderr():
    """The ``jaxqueue`` logger at INFO on stderr while a command runs (and as it was after)."""
    handler, saved = stderr_handler(), (LOGGER.level, LOGGER.propagate)
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(saved[0])
        LOGGER.propagate = saved[1]


def _run(args, persistent_cache: bool = False) -> int:
    try:
        # the flags' ranges first (no JAX yet: a mistake answers at once), then the command
        name = prepare(args).command
        if persistent_cache:  # before the command's first compile
            from jaxqueue.cli.compile_cache import enable

            enable()
        return _command(name)(args)
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # LevelOverflowError and friends
        print(f"error: {err}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 1
    except OSError as err:  # a folder that cannot be written, a folder given as a file, ...
        text = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)
        if err.errno == errno.ENOSPC:
            text += " (free some space and run the command again)"
        print(f"error: {text}", file=sys.stderr)
        return 2
    except ImportError as err:  # an extra not installed: its message says what to install
        if "pip install" not in str(err):
            raise  # (a broken install: its traceback)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            "error: out of memory: run fewer replicas (or fewer loads) at a time", file=sys.stderr
        )
        return 3
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback, the shell's 128 + SIGINT
        print(f"interrupted{_resume_note(args)}", file=sys.stderr)
        return 130


def _resume_note(args) -> str:
    """Where an interrupted command keeps what it had done, if anywhere."""
    if args.command == "sweep" and not args.plan and args.store:
        return (
            f": the batches committed so far are in {args.store}; the same command "
            "resumes from there"
        )
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint:
        return (
            f": the run resumes from its last save in {checkpoint} (if one was written) "
            "with the same command"
        )
    return ""


def _command(name: str):
    """The function of a subcommand. Its module is imported here, when the command runs:
    the command modules import the simulator, theory and studies (JAX), which ``--help``,
    a usage error and a number out of range (:mod:`jaxqueue.cli.checks`) do not need
    (the one place the command line defers imports)."""
    if name in ("simulate", "transient"):
        from jaxqueue.cli import run_commands as module
    elif name == "policies":  # the registry alone
        from jaxqueue.cli import policies_command as module
    elif name in ("theory", "exact"):
        from jaxqueue.cli import theory_commands as module
    else:
        from jaxqueue.cli import study_commands as module
    return getattr(module, f"cmd_{name}")
