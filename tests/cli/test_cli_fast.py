"""A mistake on the command line answers at once: the flags are parsed and their
ranges checked (jaxqueue.cli.checks) before the simulator or the theory, and JAX
with them, is imported; the message is the one the run would have given."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxqueue.cli.checks import prepare
from jaxqueue.cli.parser import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Mistakes, and what their one error line says.
MISTAKES = [
    (
        ["simulate", "--policy", "pod", "--servers", "10", "--load", "1.5"],
        "error: load=1.5 is out of range: infinite buffers need 0 < load < 1",
    ),
    (["simulate", "--bogus"], "error: unrecognized arguments: --bogus"),
    (["compare", "--replicas", "0"], "error: replicas=0 is out of range: need 1 <= replicas"),
    (["compare", "--servers", "105"], "error: ratio=10 does not split n_servers=105"),
    (
        ["exact", "--policy", "jsq", "--servers", "0", "--load", "0.5"],
        "error: n_servers=0 is out of range: need 1 <= n_servers",
    ),
]


def _jaxqueue(argv, **env) -> subprocess.CompletedProcess:
    """``python -m jaxqueue ARGV`` in a fresh interpreter. (Tests time nothing: that a
    mistake answers at once rests on JAX not being imported for it, tested below; the
    time, 0.19 s against 1.7 s, is measured in docs/performance.md.)"""
    return subprocess.run(
        [sys.executable, "-m", "jaxqueue", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=60,
    )


@pytest.mark.parametrize("argv, said", MISTAKES, ids=lambda v: " ".join(v)[:40])
def test_a_mistake_answers_in_one_line(argv, said):
    out = _jaxqueue(argv)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and said in errors[0], out.stderr
    assert out.stdout == ""


def test_help_answers_without_importing_jax():
    for argv in (["--help"], ["simulate", "--help"], ["compare", "--help"]):
        code = f"import runpy, sys\nsys.argv = ['jaxqueue', *{argv!r}]\n" + (
            "try:\n    runpy.run_module('jaxqueue', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('jax imported:', any(m == 'jax' or m.startswith('jax.') for m in sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
        )
        assert out.stdout.startswith("usage: "), out.stderr
        assert out.stdout.splitlines()[-1] == "jax imported: False", argv


_NO_JAX = """
import sys
from jaxqueue.cli import main
for argv in {argvs!r}:
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    assert status == 2, (argv, status)
print("jax imported:", any(m == "jax" or m.startswith("jax.") for m in sys.modules))
"""


def test_mistakes_are_refused_without_importing_jax():
    code = _NO_JAX.format(argvs=[argv for argv, _ in MISTAKES])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.splitlines()[-1] == "jax imported: False", out.stderr


def test_the_early_checks_say_what_the_run_says():
    """The time units' words are the run's own (jaxqueue.runs.arguments.run_steps)."""
    from jaxqueue.runs.arguments import run_steps

    for flag, name, least, value in (
        ("--time", "time", 1, "0"),
        ("--time", "time", 1, "nan"),
        ("--warmup-time", "warmup_time", 0, "-1"),
    ):
        with pytest.raises(ValueError) as run:
            run_steps(name.replace("_time", ""), None, name, float(value), 1.0, 1, least=least)
        args = build_parser().parse_args(["compare", flag, value])
        with pytest.raises(ValueError) as early:
            prepare(args)
        assert str(early.value) == str(run.value)


def test_an_unknown_flag_is_named_before_the_missing_ones(capsys):
    for argv, bad in (
        (["simulate", "--bogus"], "--bogus"),
        (["simulate", "--policy", "pod", "--servres=3"], "--servres=3"),
        (["--bogus"], "--bogus"),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"unrecognized arguments: {bad}")
    with pytest.raises(SystemExit):  # nothing unknown: the missing ones, as before
        build_parser().parse_args(["simulate", "--policy", "pod"])
    assert "the following arguments are required: --servers" in capsys.readouterr().err
