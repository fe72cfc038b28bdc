"""The command line's persistent compilation cache (jaxqueue.cli.compile_cache): where it
lives, how it is turned off, that it never changes a result and never stops a command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxqueue.cli.compile_cache import SWITCH, cache_folder

ROOT = Path(__file__).resolve().parents[2]

#: A tiny run: its JSON must be the same, bit for bit, however its programs were obtained.
SIMULATE = [
    "simulate",
    "--policy",
    "jiq",
    "--servers",
    "20",
    "--dispatchers",
    "2",
    "--load",
    "0.8",
    "--replicas",
    "2",
    "--time",
    "5",
    "--seed",
    "3",
    "--json",
]


def _env(**extra) -> dict:
    """The test run's environment without its own JAX cache (tests/conftest.py), so that
    the command sets up its own; ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    env.pop(SWITCH, None)
    return {**env, **extra}


def _jaxqueue(argv, env) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "jaxqueue", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out


def _result(stdout: str) -> dict:
    """The JSON record without its wall time (the one field a cache may change)."""
    record = json.loads(stdout)
    record["settings"].pop("wall_seconds")
    return record


def test_the_folder_follows_the_environment(tmp_path):
    home = Path.home() / ".cache" / "jaxqueue" / "xla"
    assert cache_folder({}) == home
    assert cache_folder({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "jaxqueue" / "xla"
    assert cache_folder({"JAXQUEUE_CACHE_DIR": str(tmp_path)}) == tmp_path / "xla"
    for off in ("0", "off", "False", " no "):
        assert cache_folder({SWITCH: off, "JAXQUEUE_CACHE_DIR": str(tmp_path)}) is None
    assert cache_folder({SWITCH: "1"}) == home


_IN_PROCESS = """
import jax
from jaxqueue.cli import main
assert main(["policies"]) == 0
print("cache:", jax.config.jax_compilation_cache_dir)
"""


def test_main_called_in_a_program_leaves_its_jax_settings(tmp_path):
    """Only the command (main() with no arguments) sets up the cache: a program calling
    main([...]) keeps its own JAX settings."""
    out = subprocess.run(
        [sys.executable, "-c", _IN_PROCESS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(JAXQUEUE_CACHE_DIR=str(tmp_path)),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "cache: None"
    assert not (tmp_path / "xla").exists()


@pytest.mark.slow
def test_results_are_identical_with_and_without_the_cache(tmp_path):
    cache = tmp_path / "cache"
    cold = _jaxqueue(SIMULATE, _env(JAXQUEUE_CACHE_DIR=str(cache)))
    entries = sorted(p.name for p in (cache / "xla").iterdir() if p.name.endswith("-cache"))
    assert entries, "the command wrote no compiled program to its cache"
    warm = _jaxqueue(SIMULATE, _env(JAXQUEUE_CACHE_DIR=str(cache)))
    assert _result(warm.stdout) == _result(cold.stdout)
    # turned off: nothing written, the same numbers
    unused = tmp_path / "unused"
    off = _jaxqueue(SIMULATE, _env(JAXQUEUE_CACHE_DIR=str(unused), **{SWITCH: "0"}))
    assert not (unused / "xla").exists()
    assert _result(off.stdout) == _result(cold.stdout)
    # a folder that cannot be made (a file in its place): no cache, no word, the same numbers
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    silent = _jaxqueue(SIMULATE, _env(JAXQUEUE_CACHE_DIR=str(blocked)))
    assert _result(silent.stdout) == _result(cold.stdout)
    assert "cache" not in silent.stderr.lower(), silent.stderr
