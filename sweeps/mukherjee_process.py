"""Mukherjee et al. at the process level: diffusion-scaled trajectories beside their limit.

Mukherjee, Borst, van Leeuwaarden and Whiting, "Universality of load balancing
schemes on the diffusion scale" (arXiv:1510.02657): under idle-first-else-JSQ(d)
in the Halfin-Whitt regime ``lambda N = N - beta sqrt(N)``, the processes
``(Q_1 - N) / sqrt(N)`` and ``Q_2 / sqrt(N)`` converge to one diffusion for every
``d`` (Eschenfeldt and Gamarnik's limit for JSQ, arXiv:1502.00999), and
``Q_3 / sqrt(N)`` to 0. From a start with every server holding one task, this
script estimates the scaled trajectories over replicas (exact in time,
:func:`jaxqueue.transient`) for d = 1, 2, log N, sqrt(N) log N and N, integrates
the diffusion over many paths (:mod:`jaxqueue.theory.baselines.diffusion`), plots both and
prints the largest gap of each curve from the limit with its interval.

    python sweeps/mukherjee_process.py --quick   # N = 100, 400, 1600: about a minute on 2 CPU cores
    python sweeps/mukherjee_process.py --cpu     # N up to 6400, 4096 replicas: 2 CPU cores
    python sweeps/mukherjee_process.py           # N up to 102400: for a GPU

Each finished curve is written at once to the mode's store,
``sweeps/results/mukherjee_process.<mode>.json`` (``--store``), and a rerun
with the same settings resumes after the last finished curve; ``--figure`` and
the printed table are drawn from the store when every curve is in it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import jaxqueue as jq
from jaxqueue.core.versions import versions
from jaxqueue.results.estimates import Estimate
from jaxqueue.runs.bounds import horizon_levels
from jaxqueue.sim.transient import poisson_weights
from jaxqueue.theory.baselines.diffusion import diffusion_paths

#: The servers, replicas and diffusion paths of each mode.
MODES = {
    "quick": {"servers": (100, 400, 1600), "replicas": 256, "paths": 1 << 14},
    # paper scale on 2 CPU cores: to N = 6400, with the replicas that resolve a gap
    # of order 1/sqrt(N) there (an interval of about 0.03 on the diffusion scale); at
    # N = 25600 one d alone took 520 to 930 s beside other work
    "cpu": {"servers": (100, 400, 1600, 6400), "replicas": 4096, "paths": 1 << 16},
    "full": {
        "servers": (100, 400, 1600, 6400, 25600, 102400),
        "replicas": 4096,
        "paths": 1 << 17,
    },
}
#: The times of every trajectory (multiples of the diffusion's step).
TIMES = tuple(np.round(np.arange(0.0, 5.0001, 0.25), 10))
#: The diffusion's time step (docs/diffusion.md: its error is below the paths' noise).
DT = 0.01
#: The start: every server holds one task, so Q_1(0) = 0 = Q_2(0) on the diffusion scale.
START = [0.0, 1.0]


#: The labels of :func:`d_values`, in order (each keeps its colour in the figure).
LABELS = ("1", "2", "log N", "sqrt(N) log N", "N")


def d_values(n: int) -> dict[str, int]:
    """The probe counts compared at ``N = n``, by label (a value already listed is left out)."""
    wanted = {
        "1": 1,
        "2": 2,
        "log N": math.ceil(math.log(n)),
        "sqrt(N) log N": min(n, math.ceil(math.sqrt(n) * math.log(n))),
        "N": n,
    }
    out: dict[str, int] = {}
    for label, d in wanted.items():
        if d not in out.values():
            out[label] = d
    return out


def column(est: Estimate, k: int, scale: float, shift: float = 0.0) -> Estimate:
    """``scale * (est[:, k] + shift)``: one level of a transient's tail, rescaled."""
    mean = scale * (np.asarray(est.mean)[:, k] + shift)
    return Estimate(mean, abs(scale) * np.asarray(est.ci95)[:, k], est.n)


def scaled(res, n: int) -> dict[str, Estimate]:
    """The diffusion-scaled means of a transient: ``Q_1``, ``Q_2`` and ``Q_3`` over ``sqrt(N)``."""
    root = math.sqrt(n)
    return {
        "q1": column(res.tail, 1, root, -1.0),
        "q2": column(res.tail, 2, root),
        "q3": column(res.tail, 3, root),
    }


def largest_gap(sim: Estimate, limit: Estimate) -> dict:
    """The largest ``|sim - limit|`` over the times, its 95% half-width (the two
    independent half-widths in quadrature) and its time."""
    gap = np.abs(np.asarray(sim.mean) - np.asarray(limit.mean))
    i = int(np.argmax(gap))
    half = math.hypot(float(np.asarray(sim.ci95)[i]), float(np.asarray(limit.ci95)[i]))
    return {"gap": float(gap[i]), "ci95": half, "time": float(TIMES[i])}


def simulate(n: int, d: int, beta: float, replicas: int, seed: int):
    """The scaled means at ``TIMES`` for one ``N`` and ``d``.

    For ``d = 1`` the level bound is the finite horizon's
    (:func:`jaxqueue.runs.bounds.horizon_levels`: 28 at N = 1600, where the
    stationary default is Random's tail, 1048); a queue passing it would fail the run.
    """
    load = jq.halfin_whitt_load(n, beta)
    policy = jq.make("idle-first", d=d)
    levels = horizon_levels(policy, n, load, max(TIMES), start_top=len(START) - 1)
    res = jq.transient(
        policy,
        load,
        n,
        times=TIMES,
        replicas=replicas,
        seed=seed,
        init=START,
        levels=levels,
    )
    return scaled(res, n)


def jsq_chain(n: int, beta: float, times: np.ndarray) -> np.ndarray:
    """``E[Q_1(t)]``, ``E[Q_2(t)]`` on the diffusion scale, ``(T, 2)``, of JSQ from
    every server holding one task: the exact chain of (idle servers ``i``,
    servers with two tasks ``k``; none reach three in this range),
    uniformized, its state truncated at ``8 sqrt(N) + 20`` (mass left there
    below 1e-5)."""
    lam, top = n - beta * math.sqrt(n), int(8 * math.sqrt(n)) + 20
    i, k = np.meshgrid(np.arange(top + 1), np.arange(top + 1), indexing="ij")
    one = np.maximum(n - i - k, 0).astype(float)
    rate = lam + n
    last = int(rate * times.max() + 10 * math.sqrt(rate * times.max()) + 50)
    w = poisson_weights(rate * times, np.arange(last + 1))
    p = np.zeros(i.shape)
    p[0, 0] = 1.0
    out = np.zeros((times.size, 2))
    for step in range(last + 1):
        out += w[:, step : step + 1] * [-(p * i).sum(), (p * k).sum()]
        q = (1.0 - (lam + one + k) / rate) * p
        arrive = lam / rate * p
        q[:-1] += arrive[1:]  # to an idle server
        q[0, 1:] += arrive[0, :-1]  # none idle: to a server with one task
        q[0, -1] += arrive[0, -1]
        leave = one / rate * p
        q[1:] += leave[:-1]
        q[-1] += leave[-1]
        q[:, :-1] += (k / rate * p)[:, 1:]
        p = q
    return out / math.sqrt(n)


def settings(mode: dict, beta: float, seed: int) -> dict:
    """What a store's curves depend on: a resumed run must match it exactly. The
    servers and labels are not among them: each curve is kept under its own ``N``
    and ``d``, so a run over more of them adds to the store."""
    out = {"replicas": mode["replicas"], "paths": mode["paths"]}
    out.update(beta=beta, seed=seed, times=list(TIMES), dt=DT)
    return out


def load_store(path: Path | None, wanted: dict) -> list[dict]:
    """The finished curves of a store written with ``wanted`` settings ([] if none)."""
    if path is None or not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("settings") != wanted:
        have = data.get("settings", {})
        diff = sorted(k for k in set(have) | set(wanted) if have.get(k) != wanted.get(k))
        raise SystemExit(
            f"error: the store {path} was written with other settings ({', '.join(diff)}); "
            "use another --store, or delete it to start again"
        )
    return data["curves"]


def save_store(path: Path | None, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def run(mode: dict, beta: float, seed: int, log=sys.stderr, store: Path | None = None) -> dict:
    """Every curve of a mode, the limit's and the gaps (JSON-ready).

    ``mode``: ``servers``, ``replicas``, ``paths`` (as :data:`MODES`), and
    optionally ``labels``, the labels of :func:`d_values` to run (default all).
    ``store``: a JSON file that keeps each finished curve; a rerun resumes from it.
    """
    wanted = settings(mode, beta, seed)
    done = {(row["servers"], row["label"]): row for row in load_store(store, wanted)}
    limit = diffusion_paths(beta, TIMES, paths=mode["paths"], dt=DT, seed=seed)
    out = {
        "settings": wanted,
        "beta": beta,
        "times": list(TIMES),
        "replicas": mode["replicas"],
        "limit": {
            "q1": limit.q1.to_dict(),
            "q2": limit.q2.to_dict(),
            "quantiles": list(limit.quantiles),
            "q1_quantiles": limit.q1_quantiles.tolist(),
            "q2_quantiles": limit.q2_quantiles.tolist(),
            "settings": limit.settings,
        },
        "curves": [],
    }
    for n in mode["servers"]:
        for label, d in d_values(n).items():
            if label not in mode.get("labels", (label,)):
                continue
            if (n, label) in done:
                out["curves"].append(done[(n, label)])
                continue
            start = time.perf_counter()
            curves = simulate(n, d, beta, mode["replicas"], seed)
            row = {"servers": n, "label": label, "d": d}
            row.update({k: v.to_dict() for k, v in curves.items()})
            row["gap_q1"] = largest_gap(curves["q1"], limit.q1)
            row["gap_q2"] = largest_gap(curves["q2"], limit.q2)
            row["max_q3"] = float(np.max(curves["q3"].mean))
            row["seconds"] = round(time.perf_counter() - start, 1)
            row["versions"] = versions()
            out["curves"].append(row)
            save_store(store, out)
            print(f"N={n} d={d} ({label}): {row['seconds']:.1f} s", file=log)
    return out


def table(data: dict) -> str:
    """The largest gaps from the limit, by ``N`` and ``d``, with their 95% intervals."""
    lines = [
        f"{'N':>7s} {'d':>20s} {'max|Q1 - limit|':>18s} {'at t':>5s} "
        f"{'max|Q2 - limit|':>18s} {'at t':>5s} {'max Q3/sqrt(N)':>15s}"
    ]
    for row in data["curves"]:
        g1, g2 = row["gap_q1"], row["gap_q2"]
        d = f"{row['d']} ({row['label']})" if row["label"] not in ("1", "2") else str(row["d"])
        lines.append(
            f"{row['servers']:>7d} {d:>20s} {g1['gap']:>9.3f} ± {g1['ci95']:<6.3f} "
            f"{g1['time']:>5.2f} {g2['gap']:>9.3f} ± {g2['ci95']:<6.3f} {g2['time']:>5.2f} "
            f"{row['max_q3']:>15.4f}"
        )
    return "\n".join(lines)


def chain_table(servers, beta: float, seed: int) -> str:
    """JSQ's exact ``E[Qbar_2(t)]`` (:func:`jsq_chain`) at each ``N`` and the limit's, by time."""
    limit = diffusion_paths(beta, TIMES, paths=MODES["quick"]["paths"], dt=DT, seed=seed).q2
    exact = {n: jsq_chain(n, beta, np.asarray(TIMES))[:, 1] for n in servers}
    head = f"{'t':>5s} {'limit':>15s} " + " ".join(f"{f'N={n}':>8s} {'gap':>6s}" for n in servers)
    lines = [head]
    for i, t in enumerate(TIMES):
        cells = " ".join(f"{exact[n][i]:8.4f} {limit.mean[i] - exact[n][i]:6.3f}" for n in servers)
        lines.append(f"{t:5.2f} {limit.mean[i]:8.4f} ± {limit.ci95[i]:.3f} {cells}")
    return "\n".join(lines)


def _limit_panel(ax, data: dict, key: str) -> None:
    """The limit's mean and its 95% band (its paths' spread is in the JSON's quantiles)."""
    lim, t = data["limit"], np.asarray(data["times"])
    m, h = np.asarray(lim[key]["mean"]), np.asarray(lim[key]["ci95"])
    ax.fill_between(t, m - h, m + h, color="0.75", lw=0)
    ax.plot(t, m, "k--", lw=1.5, label="limit")


def plot(data: dict, path: str) -> None:
    """Rows ``Q_1``, ``Q_2`` and ``Q_3`` over ``sqrt(N)``, a column per ``N``, a curve per ``d``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({row["servers"] for row in data["curves"]})
    fig, axes = plt.subplots(3, len(servers), figsize=(3.4 * len(servers), 8.2), squeeze=False)
    t = np.asarray(data["times"])
    names = (r"$E[\bar Q_1(t)]$", r"$E[\bar Q_2(t)]$", r"$E[Q_3(t)]/\sqrt{N}$")
    for j, n in enumerate(servers):
        for i, key in enumerate(("q1", "q2", "q3")):
            ax = axes[i, j]
            if key != "q3":
                _limit_panel(ax, data, key)
            for row in (r for r in data["curves"] if r["servers"] == n):
                m, h = np.asarray(row[key]["mean"]), np.asarray(row[key]["ci95"])
                color = f"C{LABELS.index(row['label'])}"
                ax.plot(t, m, lw=1, color=color, label=f"d = {row['label']}")
                ax.fill_between(t, m - h, m + h, color=color, alpha=0.2, lw=0)
            if i == 0:
                ax.set_title(f"N = {n}", fontsize=9)
            if j == 0:
                ax.set_ylabel(names[i])
            ax.tick_params(labelsize=8)
        axes[2, j].set_xlabel("t")
    axes[1, 0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Idle first, else JSQ(d), beta = {data['beta']}: diffusion-scaled means "
        f"({data['replicas']} replicas, 95% bands) and their limit",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="N = 100, 400, 1600 (a CPU)")
    mode.add_argument("--cpu", action="store_true", help="N up to 6400, 4096 replicas (2 CPUs)")
    ap.add_argument("--beta", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--figure", default="docs/figures/mukherjee_process.png")
    ap.add_argument("--json", default=None, help="also write every curve and gap to this file")
    ap.add_argument(
        "--store",
        default=None,
        help="keep finished curves here and resume from them "
        "(default: sweeps/results/mukherjee_process.<mode>.json; 'none' for no store)",
    )
    ap.add_argument(
        "--chain",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: JSQ's exact E[Qbar_2(t)] at these N beside the limit (no simulation)",
    )
    args = ap.parse_args(argv)
    if args.chain:
        print(chain_table(args.chain, args.beta, args.seed))
        return 0
    name = "quick" if args.quick else "cpu" if args.cpu else "full"
    store = (
        None
        if args.store == "none"
        else Path(
            args.store or Path(__file__).parent / "results" / f"mukherjee_process.{name}.json"
        )
    )
    data = run(MODES[name], args.beta, args.seed, store=store)
    print(table(data))
    if args.figure:
        plot(data, args.figure)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
