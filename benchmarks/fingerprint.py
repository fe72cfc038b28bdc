"""Digests of the package's outputs, to show that a change of structure left them
bit for bit as they were (not a test, not run in CI).

Run it at two commits and compare the printed digests:

    python benchmarks/fingerprint.py --json > after.json
    git worktree add /tmp/before REV && (cd /tmp/before && python benchmarks/fingerprint.py --json)

Each digest is the SHA-256 of the float64 bytes of the values listed, in a fixed
order; settings that name versions or the source are left out. What is covered:

* ``main_job``: the README's main job (``jaxqueue compare --replicas 16``), its
  simulated and mean-field values per policy and load (about 30 s on 2 cores);
* ``sweep_store``: a two-point grid spec run into a store, its rows' values;
* ``exact``: the exact chain of every policy that has one at ``N = 3``;
* ``theory``: the mean field of every policy that has one, with exponential
  service, Erlang-2 service, pools and a finite buffer where it applies, and the
  refined mean field and Erlang C;
* ``crn``: the studies on common random numbers: a sensitivity in the load (with
  its Richardson check) and in the SCV, paired comparisons of two policies and of
  two loads, two iterations of design on the simulated system, and a grid spec
  with ``[run] sensitivity`` and ``paired`` rows (about 2 minutes on 2 cores).

Uses only the public entry points (the command line, ``jaxqueue.theory``,
``jaxqueue.exact``), so that it runs unchanged on older commits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SPEC = """\
name = "fingerprint"
[grid]
policy = ["jiq", { name = "pod", d = 2 }]
n_servers = [50]
ratio = [10]
load = [0.9]
[run]
replicas = 8
time = 20
warmup_time = 5
seed = 3
theory = "mean-field"
"""


def _numbers(value, out: list) -> None:
    """Every number in a JSON-like value, depth first, keys sorted."""
    if isinstance(value, dict):
        for k in sorted(value):
            if k not in ("versions", "source", "wall_seconds"):
                _numbers(value[k], out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _numbers(v, out)
    elif isinstance(value, bool) or value is None:
        out.append(float("nan") if value is None else float(value))
    elif isinstance(value, (int, float, np.integer, np.floating)):
        out.append(float(value))
    elif isinstance(value, np.ndarray):
        out.extend(np.asarray(value, np.float64).ravel().tolist())


def _digest(values: list) -> str:
    return hashlib.sha256(np.asarray(values, np.float64).tobytes()).hexdigest()[:16]


def main_job() -> str:
    cmd = [sys.executable, "-m", "jaxqueue", "compare", "--replicas", "16", "--json"]
    env = dict(os.environ, JAXQUEUE_COMPILATION_CACHE="0")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    values: list = []
    _numbers(json.loads(out), values)
    return _digest(values)


def sweep_store() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return _digest(_store_values(Path(tmp), SPEC))


def _store_values(tmp: Path, text: str) -> list:
    """The values of every row of ``text``'s spec run into a store, rows sorted."""
    spec = Path(tmp, "fingerprint.toml")
    spec.write_text(text)
    store = Path(tmp, "fingerprint.sqlite")
    env = dict(os.environ, JAXQUEUE_COMPILATION_CACHE="0")
    run = [sys.executable, "-m", "jaxqueue", "sweep", str(spec), "--store", str(store)]
    subprocess.run(run, capture_output=True, text=True, check=True, env=env)
    csv = Path(tmp, "rows.csv")
    export = [sys.executable, "-m", "jaxqueue", "export", str(store), "--csv", str(csv)]
    subprocess.run(export, capture_output=True, text=True, check=True, env=env)
    values = []
    lines = csv.read_text().splitlines()
    header = lines[0].split(",")
    for line in sorted(lines[1:]):
        for name, cell in zip(header, line.split(","), strict=False):
            if name in ("created", "elapsed", "versions", "source"):
                continue
            try:
                values.append(float(cell))
            except ValueError:
                values.append(float(len(cell)))
    return values


def exact() -> str:
    from jaxqueue.exact import solve_exact
    from jaxqueue.policies import available, make

    values: list = []
    for name in sorted(available()):
        pol = make(name)
        if pol.exact_rule() is None:
            continue
        m = 1 if pol.single_dispatcher or not pol.uses_iqueues else 2
        res = solve_exact(name, 0.7, 3, m, buffer=4)
        _numbers(res.to_dict(), values)
    return _digest(values)


def theory_outputs() -> str:
    from jaxqueue import theory
    from jaxqueue.policies import available, make

    try:
        from jaxqueue.theory.baselines import erlang
    except ImportError:  # before theory/ had sub-packages
        from jaxqueue.theory import erlang

    values: list = []
    for name in sorted(available()):
        pol = make(name)
        if pol.mean_field_kind() == "none":
            continue
        ratio = 5.0 if pol.uses_iqueues and not pol.single_dispatcher else None
        cases = [dict()]
        if pol.mean_field_kind() not in ("tagged-server", "composition"):
            cases += [dict(buffer=8), dict(service="erlang:2")]
            if name != "jsew":
                cases.append(dict(pools="0.5:1.2,0.5:0.8"))
        for case in cases:
            load = 0.6 if "pools" in case else 0.8
            res = theory.mean_field(name, load, ratio, **case)
            _numbers(res.to_dict(), values)
    refined = theory.refined_mean_field("pod", 0.9, d=2, n_servers=20)
    _numbers(refined.to_dict() if hasattr(refined, "to_dict") else vars(refined), values)
    values.extend(np.ravel(erlang.response_time_quantile(20, 0.9, [0.5, 0.9, 0.99])))
    return _digest(values)


CRN_SPEC = (
    SPEC.replace('name = "fingerprint"', 'name = "fingerprint-crn"')
    .replace("load = [0.9]", "load = [0.8, 0.9]")
    .replace('policy = ["jiq", { name = "pod", d = 2 }]', 'policy = [{ name = "pod", d = 2 }]')
    .replace("n_servers = [50]", "n_servers = [10]")
    .replace('theory = "mean-field"', 'theory = "mean-field"\nsensitivity = "load"\npaired = true')
)


def crn() -> str:
    import jaxqueue as jq

    try:
        from jaxqueue.studies.crn.design_sim import design_simulated
    except ImportError:  # before studies/ had sub-packages
        from jaxqueue.studies.design_sim import design_simulated

    run = dict(replicas=8, steps=4000, warmup=1000, seed=5)
    values: list = []
    sens = jq.sensitivity("pod", 0.8, 10, d=2, **run)
    _numbers(sens.to_dict(), values)
    scv = jq.sensitivity(
        "pod", 0.7, 10, d=2, service="erlang:2", parameter="scv", richardson=False, **run
    )
    _numbers(scv.to_dict(), values)
    for models, loads in (([jq.make("pod", d=2), "jsq"], 0.8), (jq.make("pod", d=2), [0.7, 0.8])):
        _numbers(jq.paired(models, loads, 10, **run).to_dict(), values)
    design = design_simulated(
        "pod",
        3.0,
        10,
        d=2,
        iterations=2,
        replicas=4,
        max_replicas=8,
        steps=4000,
        warmup=1000,
        seed=7,
    )
    _numbers(design.to_dict(), values)
    with tempfile.TemporaryDirectory() as tmp:
        values.extend(_store_values(Path(tmp), CRN_SPEC))
    return _digest(values)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON record alone on stdout")
    ap.add_argument(
        "--only", nargs="*", default=None, help="main_job, sweep_store, exact, theory, crn"
    )
    args = ap.parse_args(argv)
    parts = {
        "main_job": main_job,
        "sweep_store": sweep_store,
        "exact": exact,
        "theory": theory_outputs,
        "crn": crn,
    }
    record = {}
    for name, fn in parts.items():
        if args.only is None or name in args.only:
            print(f"fingerprint: {name} ...", file=sys.stderr, flush=True)
            record[name] = fn()
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        for k, v in record.items():
            print(f"{k:12s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
