"""The command line's surface: ``--version``, a ``--help`` that imports no JAX, help on
every flag, lazy package attributes, "did you mean" and policy names in any case."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import main as cli_main
from jaxqueue.cli.parser import build_parser, package_version
from jaxqueue.core.versions import __version__
from jaxqueue.policies.registry import make, policy_class
from jaxqueue.studies.spec import SpecError, parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
