"""Run the papers' results at their own scale into sweeps/results/, and draw every
figure of docs/figures/ from those stores.

Each spec runs in the mode that reaches the paper's scale on two CPU cores: the
full mode, or the spec's ``[cpu]`` mode where the full one is sized for a GPU
(many replicas from the mean-field start instead of 16 from an empty one). A
run resumes from its store after a kill, so the same command continues a run
that one sitting could not finish. The repository keeps the finished stores
(``python -m jaxqueue export STORE --csv FILE`` gives their rows); each is also
exported as CSV beside it (``NAME.MODE.csv``, not kept), and its wall time on
2 CPU cores is recorded in ``sweeps/results/timings.json``.

    python sweeps/reproduce.py run                 # every result, resuming
    python sweeps/reproduce.py run liu_ying_fig2   # one spec
    python sweeps/reproduce.py figures             # docs/figures/ from the stores
    python sweeps/reproduce.py list                # what runs, in which mode

Mukherjee et al.'s process-level comparison is a script with its own store
(``python sweeps/mukherjee_process.py --cpu``, resuming from
``sweeps/results/mukherjee_process.cpu.json``); ``figures`` redraws its figure
from that store once every curve is in it.

A figure is drawn only from a finished store of the mode listed here, never
from a quick mode; a point whose warm-up diagnostic failed is drawn hollow
(``python -m jaxqueue plot`` says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIGURES = HERE.parent / "docs" / "figures"

#: ``spec: mode`` (None: the full mode), in the order they run: cheapest first.
RUNS = {
    "wang_fig4": None,
    "wang_fig6": None,
    "wang_threshold": None,
    "wang_fig7_8": None,
    "mitzenmacher_jiq": None,
    "wang_table2_qk": None,
    "wang_table2_fig5": None,
    "mukherjee_hw": "cpu",
    "liu_ying_alpha1": "cpu",
    "liu_ying_class": None,
    "liu_ying_theorem": "cpu",
    "liu_ying_fig2": "cpu",
    "liu_ying_fig1": "cpu",
    "wang_trace": None,
}

#: The figures of docs/figures/: ``file: (spec, figure)`` (a [[figure]] of the spec).
DOC_FIGURES = {
    "wang_fig4.png": ("wang_fig4", "fig4"),
    "wang_fig6.png": ("wang_fig6", "fig6"),
    "wang_fig5.png": ("wang_table2_fig5", "fig5"),
    "wang_fig8.png": ("wang_fig7_8", "fig8"),
    "mitzenmacher_jiq.png": ("mitzenmacher_jiq", "response_time"),
    "mukherjee_hw.png": ("mukherjee_hw", "two"),
    "liu_ying_fig2.png": ("liu_ying_fig2", "fig2_s2"),
    "liu_ying_alpha1.png": ("liu_ying_alpha1", "fig2_s2"),
    "liu_ying_fig1.png": ("liu_ying_fig1", "fig1"),
    "liu_ying_fig1_counts.png": ("liu_ying_fig1", "fig1_counts"),
    "liu_ying_class.png": ("liu_ying_class", "p_w"),
    "wang_fig9.png": ("wang_trace", "fig9"),
    "wang_fig10.png": ("wang_trace", "fig10"),
    "liu_ying_theorem_excess.png": ("liu_ying_theorem", "excess"),
    "liu_ying_theorem_ssc.png": ("liu_ying_theorem", "ssc"),
}


def store_path(name: str) -> Path:
    mode = RUNS[name]
    return RESULTS / f"{name}{f'.{mode}' if mode else ''}.sqlite"


def _jaxqueue(*args: str) -> int:
    return subprocess.call([sys.executable, "-m", "jaxqueue", *args])


def _finished(name: str) -> bool:
    """Whether the store holds every point of its spec as the repository has it now (the
    same spec hash; whatever code version wrote it, which the store records)."""
    from jaxqueue.studies.grids.spec import load_spec
    from jaxqueue.studies.grids.store import Store

    store = store_path(name)
    if not store.exists():
        return False
    spec = load_spec(HERE / f"{name}.toml", mode=RUNS[name])
    with Store.open_existing(store) as opened:
        if opened.meta()["spec_hash"] != spec.spec_hash():
            return False
        done = opened.done()
    return all(p.point_id() in done for p in spec.points)


def run(names: list[str], accept_code_change: bool) -> int:
    RESULTS.mkdir(exist_ok=True)
    timings_file = RESULTS / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    for name in names:
        mode = RUNS[name]
        store = store_path(name)
        args = ["sweep", str(HERE / f"{name}.toml"), "--store", str(store), "--progress"]
        args += [f"--{mode}"] if mode else []
        args += ["--accept-code-change"] if accept_code_change else []
        print(f"[reproduce] {name} ({mode or 'full'} mode) into {store}", file=sys.stderr)
        start = time.time()
        if _jaxqueue(*args) != 0:
            print(f"[reproduce] {name} failed: stopping", file=sys.stderr)
            return 1
        wall = time.time() - start
        entry = timings.setdefault(name, {"mode": mode or "full", "seconds": 0.0})
        entry["seconds"] = round(entry["seconds"] + wall, 1)  # summed over sittings
        timings_file.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")
        csv = store.with_suffix(".csv")
        if _jaxqueue("export", str(store), "--csv", str(csv)) != 0:
            return 1
    return 0


def figures() -> int:
    FIGURES.mkdir(parents=True, exist_ok=True)
    missing = sorted({spec for spec, _ in DOC_FIGURES.values() if not _finished(spec)})
    if missing:
        print(
            f"[reproduce] not finished, their figures are not drawn: {', '.join(missing)} "
            "(python sweeps/reproduce.py run)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for file, (spec, figure) in DOC_FIGURES.items():
            if spec in missing:
                continue
            out = Path(tmp, file)
            # the figures as the spec file defines them now (titles, labels), over the
            # store's rows (the same spec hash: figures are not part of it)
            args = ["plot", str(store_path(spec)), "--figure", figure, "-o", str(out)]
            args += ["--spec", str(HERE / f"{spec}.toml")]
            if _jaxqueue(*args) != 0:
                return 1
            shutil.copyfile(out, FIGURES / file)
            print(f"[reproduce] docs/figures/{file}", file=sys.stderr)
    if "liu_ying_fig1" not in missing:  # the corollaries' exponents, by the fits script
        with tempfile.TemporaryDirectory() as tmp:
            script = HERE / "liu_ying_fig1.py"
            code = subprocess.call(
                [sys.executable, str(script), str(store_path("liu_ying_fig1")), "-o", tmp],
                stdout=subprocess.DEVNULL,
            )
            if code != 0:
                return code
            for png in Path(tmp).glob("*.png"):
                shutil.copyfile(png, FIGURES / f"liu_ying_{png.stem}.png")
    return _process_figure()


def _process_figure() -> int:
    """docs/figures/mukherjee_process.png from the finished ``--cpu`` store (the
    script simulates nothing when every curve is stored)."""
    sys.path.insert(0, str(HERE))
    import mukherjee_process as mp

    store = RESULTS / "mukherjee_process.cpu.json"
    stored = set()
    if store.exists():
        stored = {(c["servers"], c["label"]) for c in json.loads(store.read_text())["curves"]}
    wanted = {(n, label) for n in mp.MODES["cpu"]["servers"] for label in mp.d_values(n)}
    if not wanted <= stored:
        print(
            f"[reproduce] {len(wanted - stored)} curves of {store.name} are missing, its "
            "figure is not drawn (python sweeps/mukherjee_process.py --cpu)",
            file=sys.stderr,
        )
        return 0
    script = [sys.executable, str(HERE / "mukherjee_process.py"), "--cpu"]
    code = subprocess.call(script + ["--figure", str(FIGURES / "mukherjee_process.png")])
    if code == 0:
        print("[reproduce] docs/figures/mukherjee_process.png", file=sys.stderr)
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run (or resume) the specs into sweeps/results/")
    p.add_argument("names", nargs="*", help=f"specs (default: all): {', '.join(RUNS)}")
    p.add_argument(
        "--accept-code-change",
        action="store_true",
        help="resume stores written by another version (see jaxqueue sweep --help)",
    )
    sub.add_parser("figures", help="draw docs/figures/ from the finished stores")
    sub.add_parser("list", help="the specs, their modes and whether their stores are finished")
    args = ap.parse_args(argv)
    os.chdir(HERE.parent)
    if args.command == "run":
        unknown = [n for n in args.names if n not in RUNS]
        if unknown:
            ap.error(f"unknown spec {', '.join(unknown)}: use one of {', '.join(RUNS)}")
        return run(args.names or list(RUNS), args.accept_code_change)
    if args.command == "figures":
        return figures()
    for name, mode in RUNS.items():
        state = "finished" if _finished(name) else "to run"
        print(f"{name:<20} {mode or 'full':<5} {state:<9} {store_path(name).relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
