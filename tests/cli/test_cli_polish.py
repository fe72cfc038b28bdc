"""The command line's surface: ``--version``, a ``--help`` that imports no JAX, help on
every flag, lazy package attributes, "did you mean" and policy names in any case."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import main as cli_main
from jaxqueue.cli.parser import build_parser, package_version
from jaxqueue.core.versions import __version__
from jaxqueue.policies.registry import make, policy_class
from jaxqueue.studies.grids.spec import SpecError, parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter (no device count chosen); its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=ROOT,
        check=True,
    )
    return out.stdout


_NO_JAX = """
import sys
from jaxqueue.cli import main
for argv, status in (
    (["--help"], 0), (["--version"], 0), (["simulate", "--help"], 0), (["simulate"], 2)
):
    try:
        main(argv)
    except SystemExit as exit:
        assert exit.code == status, (argv, exit.code)
    else:
        raise AssertionError(argv)
print("jax imported:", any(m == "jax" or m.startswith("jax.") for m in sys.modules))
"""


def test_help_version_and_usage_errors_import_no_jax():
    out = _python(_NO_JAX)
    assert f"jaxqueue {__version__}\n" in out
    assert out.splitlines()[-1] == "jax imported: False"


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit:
        cli_main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"jaxqueue {__version__}\n"
    assert package_version() == jq.__version__ == __version__


def test_import_sets_one_device_per_core_before_jax_and_forgets_the_variable():
    code = (
        "import os, sys, jaxqueue\n"
        "assert 'jax' not in sys.modules\n"
        "chosen = os.environ.get('JAX_NUM_CPU_DEVICES')\n"
        "import jax\n"
        "print(chosen, os.environ.get('JAX_NUM_CPU_DEVICES'), jax.device_count())\n"
    )
    n = os.cpu_count()
    assert _python(code).split() == [str(n), "None", str(n)]
    # a count the user chose is kept, and so is their variable
    assert _python(code, JAX_NUM_CPU_DEVICES="1").split() == ["1", "1", "1"]


def test_public_names_are_lazy_attributes_listed_by_dir():
    for name in jq.__all__:
        assert getattr(jq, name) is not None, name
        assert name in dir(jq)
    from jaxqueue import WarmupWarning, simulate

    assert simulate is jq.simulate and issubclass(WarmupWarning, Warning)
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        jq.simulat  # noqa: B018


def _actions(parser: argparse.ArgumentParser, where: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, name)
        elif not isinstance(action, argparse._HelpAction):
            yield where, action


def test_every_flag_of_every_subcommand_has_help():
    found = list(_actions(build_parser(), "jaxqueue"))
    assert len({where for where, _ in found}) == 10  # the top level and nine subcommands
    missing = [f"{where} {a.option_strings or a.dest}" for where, a in found if not a.help]
    assert not missing, missing


def test_an_unknown_policy_names_the_closest():
    for given, close in (("podd", "pod"), ("jiqpod", "jiq-pod"), ("JSQQ", "jsq")):
        with pytest.raises(ValueError, match=rf"valid names: .*; did you mean '{close}'\?$"):
            policy_class(given)
    with pytest.raises(ValueError) as err:
        policy_class("xyz")
    assert "did you mean" not in str(err.value)


def test_the_command_line_says_did_you_mean(capsys):
    assert cli_main(["theory", "--policy", "jiq-pd", "--load", "0.5"]) == 2
    assert "did you mean 'jiq-pod'?" in capsys.readouterr().err


SPEC = """\
[grid]
policy = ["JIQ", { name = "JIQ-Pod", d = [2, 3] }]
n_servers = [100]
load = [0.5, 0.9]
[run]
replicas = 4
time = 50
"""


def test_spec_keys_and_policies_say_did_you_mean():
    for old, new, message in (
        ("n_servers =", "servrs =", r"line 3: unknown key 'servrs' .*; did you mean 'n_servers'\?"),
        ("replicas", "replica", r"line 6: unknown key 'replica' .*; did you mean 'replicas'\?"),
        ("[run]", "[rn]", r"unknown key or table 'rn'.*; did you mean 'run'\?"),
        ('"JIQ",', '"jiqq",', r"line 2: unknown policy 'jiqq'.*; did you mean 'jiq'\?"),
    ):
        with pytest.raises(SpecError, match=message):
            parse_spec(SPEC.replace(old, new))


def test_policy_names_in_any_case():
    assert make("JIQ-Pod", d=3) == make("jiq-pod", d=3) and make("JIQ").name == "jiq"
    spec, lower = parse_spec(SPEC), parse_spec(SPEC.lower())
    assert {p.policy for p in spec.points} == {"jiq", "jiq-pod"}
    assert spec.spec_hash() == lower.spec_hash()
    assert [p.point_id() for p in spec.points] == [p.point_id() for p in lower.points]
    upper = theory.mean_field("JIQ-Pod", 0.9, 10, d=3)
    assert upper.to_dict() == theory.mean_field("jiq-pod", 0.9, 10, d=3).to_dict()


def test_the_command_line_takes_policy_names_in_any_case(capsys):
    outs = []
    for name in ("JIQ", "jiq"):
        assert (
            cli_main(["theory", "--policy", name, "--load", "0.9", "--ratio", "10", "--json"]) == 0
        )
        outs.append(json.loads(capsys.readouterr().out))
    for out in outs:
        out["settings"].pop("versions", None)
    assert outs[0] == outs[1] and outs[0]["settings"]["policy"] == "jiq"


@pytest.mark.slow
def test_simulate_takes_policy_names_in_any_case():
    kw = dict(replicas=2, steps=4096, warmup=512, levels=48, seed=3)
    upper, lower = jq.simulate("JIQ", 0.5, 8, **kw), jq.simulate("jiq", 0.5, 8, **kw)
    assert upper.settings["policy"] == "jiq"
    assert upper.to_dict()["mean_response_time"] == lower.to_dict()["mean_response_time"]
    assert upper.to_dict()["tail"] == lower.to_dict()["tail"]


# -- compare's run flags and its warm-up warning ----------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_no_flag_is_taken_by_a_prefix():
    """``compare --warmup auto`` was ``--warmup-time auto`` (argparse's prefix match)."""
    parser = build_parser()
    assert not parser.allow_abbrev
    assert all(not sub.allow_abbrev for sub in _subparsers(parser).values())
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--policy", "pod", "--serv", "10", "--load", "0.5"])
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "--warm", "5"])


def test_compare_takes_the_run_length_flags_of_simulate():
    parse = build_parser().parse_args
    args = parse(["compare"])  # compare's defaults are applied by compare()
    assert (args.steps, args.time, args.warmup, args.warmup_time) == (None,) * 4
    assert parse(["compare", "--warmup", "auto"]).warmup == "auto"
    assert parse(["compare", "--warmup", "512", "--steps", "1000"]).steps == 1000
    assert parse(["compare", "--time", "20", "--warmup-time", "5"]).warmup_time == 5.0
    for pair in (["--steps", "1000", "--time", "5"], ["--warmup", "auto", "--warmup-time", "5"]):
        with pytest.raises(SystemExit):
            parse(["compare", *pair])
    # the flags are simulate's own (declared once): the same help but the defaults
    compare, simulate = (_subparsers(build_parser())[c] for c in ("compare", "simulate"))
    flags = ("--steps", "--time", "--warmup", "--warmup-time")
    for flag in flags:
        a, b = compare._option_string_actions[flag], simulate._option_string_actions[flag]
        assert (a.type, a.dest, a.default) == (b.type, b.dest, b.default), flag


def _failed(load: float, auto: bool = False) -> dict:
    return {
        "passed": False,
        "mser_truncation": 9,
        "batches": 20,
        "half_drift": 0.5,
        "half_drift_ci99": 0.2,
        "auto": auto,
        "extensions": 4 if auto else 0,
    }


@pytest.fixture
def fake_runs(monkeypatch):
    """compare's runs, faked: each policy's results at each load, the warm-up
    diagnostic failed for jiq-pod at 0.98; the RunOptions each run got."""
    from types import SimpleNamespace

    from jaxqueue.results.estimates import Estimate
    from jaxqueue.studies import compare as compare_module

    runs = []

    def simulate(model, loads, run, progress=False):
        runs.append(run)
        label = model.policy.label()
        out = []
        for load in loads:
            failed = label.startswith("jiq-pod") and load == 0.98
            out.append(
                SimpleNamespace(
                    settings={"policy_label": label, "load": load, "n_servers": model.n_servers},
                    diagnostics={"warmup_diagnostic": _failed(load, run.warmup == "auto")}
                    if failed
                    else {"warmup_diagnostic": {"passed": True}},
                    metric=lambda name: Estimate(1.5, 0.01, 32),
                )
            )
        # the simulator's own warning (no policy in it), which compare replaces
        for res in out:
            if res.diagnostics["warmup_diagnostic"]["passed"] is False:
                text = "the warm-up diagnostic failed at load 0.98"
                warnings.warn(jq.WarmupWarning(text), stacklevel=2)
        return out

    monkeypatch.setattr(compare_module, "simulate", simulate)
    monkeypatch.setattr(compare_module, "mean_field", lambda *a, **k: None)
    return runs


def test_compare_names_the_policy_whose_warmup_failed_and_marks_its_row(fake_runs, capsys):
    argv = ["compare", "--servers", "100", "--load", "0.9,0.98", "--replicas", "4"]
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning.startswith(
        "warning: the warm-up diagnostic failed for jiq-pod(d=2) at load 0.98, N=100 ("
    )
    assert "--init" not in warning and "=" not in warning.split("(99%)")[1]  # flags only
    advised = re.findall(r"--[a-z-]+(?: auto)?", warning)
    assert set(advised) == {"--warmup", "--warmup-time", "--steps", "--time", "--warmup auto"}
    rows = [line for line in out.splitlines() if line.startswith(("jiq", "pod"))]
    marked = [line for line in rows if line.endswith(" *")]
    assert len(rows) == 6 and [line.split()[:2] for line in marked] == [["jiq-pod(d=2)", "0.980"]]
    note = out.splitlines()[-1]
    assert note.startswith("  *: the warm-up diagnostic failed")
    # every flag either advises is one compare has
    for flag in set(advised) | set(re.findall(r"--[a-z-]+(?: auto)?", note)):
        value = [] if flag.endswith("auto") else ["auto" if flag == "--warmup" else "5"]
        build_parser().parse_args(["compare", *flag.split(), *value])
    # the default run is as before: 300 time units measured after 50 of warm-up
    assert {(r.steps, r.time, r.warmup, r.warmup_time) for r in fake_runs} == {
        (None, 300.0, None, 50.0)
    }


def test_compare_runs_steps_and_an_automatic_warmup(fake_runs, capsys):
    argv = ["compare", "--servers", "100", "--load", "0.98", "--policies", "jiq-pod"]
    assert cli_main([*argv, "--steps", "25600", "--warmup", "auto"]) == 0
    (run,) = fake_runs
    assert (run.steps, run.time, run.warmup, run.warmup_time) == (25600, None, "auto", None)
    err = capsys.readouterr().err
    assert "still fails for jiq-pod(d=2) at load 0.98, N=100 after --warmup auto extended" in err
    assert cli_main([*argv, "--warmup", "1024", "--time", "20"]) == 0
    assert (fake_runs[1].time, fake_runs[1].warmup, fake_runs[1].warmup_time) == (20.0, 1024, None)


def test_the_python_compare_names_its_own_keywords(fake_runs):
    from jaxqueue.studies.compare import compare

    with pytest.warns(jq.WarmupWarning) as seen:
        compare(["jiq-pod"], 100, loads=(0.98,))
    (text,) = [str(w.message) for w in seen]
    assert text.startswith("the warm-up diagnostic failed for jiq-pod(d=2) at load 0.98")
    assert "(warmup= or warmup_time=)" in text and "(steps= or time_units=)" in text
    assert 'warmup="auto"' in text and "init" not in text


# -- one name for the dispatchers --------------------------------------------------------


def test_dispatchers_and_ratio_are_two_spellings_of_one_setting():
    """--ratio R is M = N / R: simulate takes it beside --dispatchers, compare and theory
    take --dispatchers beside --ratio; both give the same arguments, so the same run."""
    from jaxqueue.cli.checks import prepare

    def args(argv):
        return vars(prepare(build_parser().parse_args(argv)))

    sim = ["simulate", "--policy", "jiq", "--servers", "100", "--load", "0.9"]
    assert args([*sim, "--ratio", "10"])["dispatchers"] == 10
    assert args([*sim, "--ratio", "10"]) == {**args([*sim, "--dispatchers", "10"]), "ratio": 10.0}
    assert args(sim)["dispatchers"] == 1
    assert args(["compare", "--dispatchers", "100"]) == {**args(["compare"]), "dispatchers": 100}
    assert args(["compare", "--servers", "20", "--dispatchers", "2"])["ratio"] == 10.0
    theory = ["theory", "--policy", "jiq", "--load", "0.9", "--servers", "1000"]
    assert (
        args([*theory, "--dispatchers", "100"])["ratio"]
        == args([*theory, "--ratio", "10"])["ratio"]
    )
    assert args([*theory, "--dispatchers", "1"])["ratio"] is None  # one dispatcher: the default
    with pytest.raises(ValueError, match="--dispatchers 10 gives the ratio r = N / M with"):
        args(["theory", "--policy", "jiq", "--load", "0.9", "--dispatchers", "10"])
    with pytest.raises(ValueError, match="ratio=3 does not split n_servers=100"):
        args([*sim, "--ratio", "3"])
    for argv in (
        [*sim, "--ratio", "10", "--dispatchers", "10"],
        ["compare", "--ratio", "5", "--dispatchers", "2"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)


@pytest.mark.slow  # (with --servers the theory adds the 1/N-refined mean field: 8 s)
def test_theory_gives_the_same_numbers_by_ratio_or_dispatchers(capsys):
    outs = []
    for flags in (["--ratio", "10"], ["--dispatchers", "100", "--servers", "1000"]):
        assert cli_main(["theory", "--policy", "jiq", "--load", "0.9", *flags, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    for out in outs:
        out["settings"].pop("versions", None)
        for key in ("refined", "correction", "refined_status"):
            out.pop(key, None)
    assert outs[0] == outs[1]


# -- plain text in the terminal ----------------------------------------------------------

MARKUP = ("``", ":mod:", ":func:", ":class:", ":meth:", ":data:", ":attr:")


def test_help_and_policies_print_no_restructuredtext(capsys):
    for argv in (["--help"], *([name, "--help"] for name in _subparsers(build_parser()))):
        with pytest.raises(SystemExit) as exit:
            cli_main(argv)
        assert exit.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage: ")
        assert not [m for m in MARKUP if m in text], (argv, text)
    assert cli_main(["policies"]) == 0
    text = capsys.readouterr().out
    assert not [m for m in MARKUP if m in text], text
    head, *rows = text.splitlines()
    assert head.split()[:3] == ["policy", "options", "mean"] and "summary" in head
    assert [row.split()[0] for row in rows] == jq.available()
    assert "holding at most z tasks" in text  # (``z`` in jiq-threshold's docstring)
