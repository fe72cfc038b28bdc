"""Start-up: what a fresh process pays before its first result, with and without
JAX's persistent compilation cache.

    python benchmarks/startup.py                 # a table on stdout, progress on stderr
    python benchmarks/startup.py --json          # the record alone on stdout
    python benchmarks/startup.py --repeats 1 --policies pod,jiq --no-cli

Each figure is a wall time in one fresh Python process (the median over
``--repeats``), timed inside it but for the command line's, whole processes:

- ``import jaxqueue`` (no JAX: the public names load on first use), and
  ``import jaxqueue; jaxqueue.simulate`` (JAX, the API and its subpackages);
- the first ``jaxqueue.simulate`` call of each policy (Random, JSQ, Pod(2),
  JIQ with M = 10, I1F, idle-first d = 2) at a small size (N = 100, 4
  replicas, 20 time units: compiling is most of it), three ways: with no
  persistent cache, with an empty cache folder (cold: the programs are
  compiled and written) and with the folder the cold run filled (warm: they
  are loaded);
- the command line (``python -m jaxqueue simulate ... --json`` of Pod(2) and
  JIQ, and the README's main job cut short), whole-process wall times, with
  the command's cache turned off (``JAXQUEUE_COMPILATION_CACHE=0``), cold and
  warm (``JAXQUEUE_CACHE_DIR`` naming a fresh folder).

The three processes of each repeat (no cache, cold, warm) must print the same
results, wall times aside: the cache must not change a digit. A row whose
outputs differ says where, and the script exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxqueue.cli.compile_cache import MIN_COMPILE_SECONDS, SWITCH  # noqa: E402 (no JAX)

#: name: (policy, keyword arguments of jq.simulate after the load and N)
POLICIES = {
    "random": ("random", {}),
    "jsq": ("jsq", {}),
    "pod": ("pod", {"d": 2}),
    "jiq": ("jiq", {"n_dispatchers": 10}),
    "i1f": ("i1f", {}),
    "idle-first": ("idle-first", {"d": 2}),
}

_IMPORT = """
import json, time; t0 = time.perf_counter()
import jaxqueue{touch}
print(json.dumps({{"seconds": time.perf_counter() - t0}}))
"""

_FIRST_CALL = """
import json, sys, time, warnings
t0 = time.perf_counter()
import jax
folder, min_seconds = {folder!r}, {min_seconds!r}
if folder:
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import jaxqueue as jq
jq.simulate
t1 = time.perf_counter()
warnings.simplefilter("ignore")
res = jq.simulate({policy!r}, 0.9, 100, replicas=4, time=20, seed=1, **{kwargs!r})
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "seconds": t2 - t1,
                   "result": repr(res.mean_response_time.mean)}}))
"""


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _clean_env(**extra) -> dict:
    """The environment of a measured process: no JAX cache of the caller's, ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    return {**env, **extra}


def _python(code: str, env=None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env or _clean_env(),
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli(argv: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "jaxqueue", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
    return time.perf_counter() - t0, out.stdout


def _cli_runs() -> dict[str, list[str]]:
    small = ["--servers", "100", "--load", "0.9", "--replicas", "4", "--time", "20", "--json"]
    return {
        "simulate pod --d 2": ["simulate", "--policy", "pod", "--d", "2", *small],
        "simulate jiq --dispatchers 10": ["simulate", "--policy", "jiq", "--dispatchers", "10"]
        + small,
        "compare (the main job, 1 load, 4 replicas, 10 time units)": [
            "compare",
            "--load",
            "0.9",
            "--replicas",
            "4",
            "--time",
            "10",
            "--json",
        ],
    }


def _without_times(text: str) -> str:
    """A command's JSON output without its wall times (all that differs between runs)."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "wall_seconds"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(json.loads(text)), sort_keys=True)


def _differences(a: str, b: str, path: str = "") -> list[str]:
    """Where two outputs (JSON, or text) differ: a path each."""
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return [path or "(text)"] if a != b else []
    if isinstance(x, dict) and isinstance(y, dict):
        keys = sorted(set(x) | set(y))
        return [
            d
            for k in keys
            for d in _differences(json.dumps(x.get(k)), json.dumps(y.get(k)), f"{path}.{k}")
        ]
    return [path or "(value)"] if x != y else []


def _three_ways(run, repeats: int) -> dict:
    """``run(folder)`` (None: no cache) with no cache, a cold folder and the same folder
    warm, ``repeats`` times; the median seconds of each way, and whether the three
    outputs of each repeat agreed (three processes in a row: the code cannot change
    between them unless it is being edited)."""
    times, differ = {"none": [], "cold": [], "warm": []}, []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            outputs = []
            for way, folder in (("none", None), ("cold", tmp), ("warm", tmp)):
                seconds, output = run(folder)
                times[way].append(seconds)
                outputs.append(output)
        differ += [d for o in outputs[1:] for d in _differences(outputs[0], o)]
    row = {f"{way}_s": statistics.median(v) for way, v in times.items()}
    row["identical"] = not differ
    if differ:
        row["differences"] = sorted(set(differ))[:20]
    return row


def measure(policies, repeats: int, min_seconds: float, cli: bool) -> dict:
    rows = {}
    for touch, name in (("", "import jaxqueue"), ("; jaxqueue.simulate", "import + API (JAX)")):
        secs = [_python(_IMPORT.format(touch=touch))["seconds"] for _ in range(repeats)]
        rows[name] = {"seconds": statistics.median(secs)}
        _log(f"{name}: {rows[name]['seconds']:.2f} s")
    first = {}
    for name in policies:
        policy, kwargs = POLICIES[name]

        def run(folder, policy=policy, kwargs=kwargs):
            code = _FIRST_CALL.format(
                folder=folder, min_seconds=min_seconds, policy=policy, kwargs=kwargs
            )
            rec = _python(code)
            return rec["seconds"], rec["result"]

        first[name] = _three_ways(run, repeats)
        _log(f"first simulate, {name}: " + _row_text(first[name]))
    commands = {}
    for name, argv in (_cli_runs() if cli else {}).items():

        def run(folder, argv=argv):
            env = _clean_env(**{SWITCH: "1", "JAXQUEUE_CACHE_DIR": folder} if folder else {})
            if folder is None:
                env[SWITCH] = "0"
            seconds, out = _cli(argv, env)
            return seconds, _without_times(out)

        commands[name] = _three_ways(run, repeats)
        _log(f"python -m jaxqueue {name}: " + _row_text(commands[name]))
    return {"imports": rows, "first_simulate": first, "cli": commands}


def _row_text(r: dict) -> str:
    return f"no cache {r['none_s']:.2f} s, cold {r['cold_s']:.2f} s, warm {r['warm_s']:.2f} s" + (
        "" if r["identical"] else " (OUTPUTS DIFFER)"
    )


def markdown(record: dict) -> str:
    m = record["meta"]
    lines = [
        f"Start-up, {m['date']}: {m['cpus']} CPUs, load {m['load_before']} before and "
        f"{m['load_after']} after, jax {m['jax']}, median of {m['repeats']}, "
        f"min compile time {m['min_compile_seconds']} s",
        "",
        "| what | no cache | cold cache | warm cache | identical |",
        "|---|---|---|---|---|",
    ]
    for name, r in record["imports"].items():
        lines.append(f"| `{name}` | {r['seconds']:.2f} | | | |")
    for title, part in (("first `jq.simulate`", "first_simulate"), ("`python -m jaxqueue`", "cli")):
        for name, r in record[part].items():
            lines.append(
                f"| {title} {name} | {r['none_s']:.2f} | {r['cold_s']:.2f} | "
                f"{r['warm_s']:.2f} | {'yes' if r['identical'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="the JSON record alone on stdout")
    ap.add_argument("--repeats", type=int, default=3, help="processes a figure (default 3)")
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"first calls of these (comma-separated; default {','.join(POLICIES)})",
    )
    ap.add_argument(
        "--min-compile-time",
        type=float,
        default=MIN_COMPILE_SECONDS,
        help="JAX's persistent cache keeps programs that compiled at least this long "
        f"(default {MIN_COMPILE_SECONDS}, the command line's)",
    )
    ap.add_argument("--no-cli", action="store_true", help="leave out the command-line rows")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    if not policies or any(p not in POLICIES for p in policies) or args.repeats < 1:
        ap.error(f"--policies takes a comma-separated list of {', '.join(POLICIES)}")
    import jax  # its version only: the measured processes are fresh

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "repeats": args.repeats,
        "min_compile_seconds": args.min_compile_time,
        "load_before": _load(),
    }
    record = measure(policies, args.repeats, args.min_compile_time, not args.no_cli)
    meta["load_after"] = _load()
    record = {"meta": meta, **record}
    print(json.dumps(record, indent=1) if args.json else markdown(record))
    return (
        0
        if all(r["identical"] for p in ("first_simulate", "cli") for r in record[p].values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
