"""Liu and Ying's exponents, fitted across N from a sweep's store, beside the paper's.

Liu and Ying, "On Universal Scaling of Distributed Queues under Load
Balancing" (arXiv:1912.11904), at lambda = 1 - N^-alpha. For each policy and
alpha in the store this fits, by weighted least squares of log y on log N
(jaxqueue.studies.plotting.fits: each point weighted by its own interval, the
exponent's 95% interval from theirs), the exponent of

* E[N (S_2 - S_3)], the servers with exactly two tasks (Fig. 1: the line
  alpha for 0.5 <= alpha <= 1, proved O(N^alpha log N) for alpha < 1 and
  conjectured tight; o(1) below 0.5);
* E[N S_2] (Corollary 2.2: O(N^alpha log N)) and E[N S_3] (o(1));
* P(wait) and the mean wait E[W] = T - 1 (Corollary 2.3: both
  O(log N / N^(1 - alpha)); conjectured Theta(1 / N^(1 - alpha)));
* where the store has them (liu_ying_fig1.toml's and liu_ying_theorem.toml's
  [metrics]), the time averages of max{sum_i S_i - 1 - k log N / N^(1 - alpha), 0}
  at k = 0, 1 and 2 and of their squares (Theorem 2.1's quantity; the simple
  system it is coupled to gives N^(alpha - 1) at k = 0), the probability that
  Lemma 3.1's state-space collapse fails, and p_W (busy_routing_probability:
  the arrivals sent to a busy server, blocked ones included);

and prints them beside the stated rates (alpha or alpha - 1, and the
effective exponent of the stated bound over the same N, which its log N
factor raises by about 1 / log N) and beside the M/M/N queue's exact
exponents over the same N (jaxqueue.theory.baselines.erlang: its number waiting, its
P(wait) and E[W]). It draws the fitted exponents against alpha with the
paper's line and the M/M/N queue's (E[N S_3] against N is liu_ying_fig2.toml's
figure "s3"). The fits and the drawing are the spec figures' own
(``kind = "exponent"``: liu_ying_fig1.toml's "fig1", "exponents_waiting" and
"exponents_excess", drawn by ``python -m jaxqueue plot``); this script adds
what a figure of stored values cannot: E[W] = T - 1, the M/M/N counterparts of
the counts, the bounds' exponents, and the table.

    python sweeps/liu_ying_fig1.py liu_ying_fig1.sqlite -o figures/ [--json]
    python sweeps/liu_ying_fig1.py liu_ying_fig2.sqlite -o figures/ [--json]
    python sweeps/liu_ying_fig1.py liu_ying_theorem.sqlite -o figures/ [--json]

A point whose estimate is 0 (no server ever held two tasks: alpha < 0.5 at
small N) has no logarithm and is left out; with fewer than two points left
there is no exponent.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from jaxqueue.studies.grids.store import Store
from jaxqueue.studies.plotting.figures import Series
from jaxqueue.studies.plotting.fits import positive_fit, power_law_fit, store_series
from jaxqueue.studies.plotting.plot_axes import pyplot_free_figure
from jaxqueue.studies.plotting.plots import plot_series
from jaxqueue.theory.baselines import erlang

#: What is fitted: (label, metric, index, scale of a row's mean, the paper's exponent,
#: the stated bound as a function of N and alpha, for 0.5 <= alpha < 1).
QUANTITIES = (
    ("N(S2-S3)", "occupancy", 2, "servers", lambda a: a, lambda n, a: n**a * np.log(n)),
    ("N S2", "tail", 2, "servers", lambda a: a, lambda n, a: n**a * np.log(n)),
    ("N S3", "tail", 3, "servers", lambda a: math.nan, None),
    (
        "P(wait)",
        "waiting_probability",
        None,
        None,
        lambda a: a - 1,
        lambda n, a: np.log(n) / n ** (1 - a),
    ),
    (
        "E[W]",
        "mean_response_time",
        None,
        "wait",
        lambda a: a - 1,
        lambda n, a: np.log(n) / n ** (1 - a),
    ),
    ("excess k=0", "excess0", None, None, lambda a: a - 1, None),
    # k >= 1: the theorem bounds these moments without a rate to compare with
    ("excess k=1", "excess1", None, None, lambda a: math.nan, None),
    # liu_ying_theorem.toml's metrics: k = 2, the second moments, the collapse, p_W
    ("excess k=2", "excess2", None, None, lambda a: math.nan, None),
    ("excess^2 k=0", "excess0_sq", None, None, lambda a: 2 * (a - 1), None),
    ("excess^2 k=1", "excess1_sq", None, None, lambda a: math.nan, None),
    ("excess^2 k=2", "excess2_sq", None, None, lambda a: math.nan, None),
    ("SSC fails", "ssc_fails", None, None, lambda a: math.nan, None),
    (
        "p_W",
        "busy_routing_probability",
        None,
        None,
        lambda a: a - 1,
        lambda n, a: np.log(n) / n ** (1 - a),
    ),
)
#: What the M/M/N queue's counterpart is, where its name differs.
MMN_NAMES = {"N(S2-S3)": "tasks waiting", "N S2": "tasks waiting", "excess k=0": "waiting / N"}
#: The M/M/N queue's counterparts, by label.
ERLANG = {
    "N(S2-S3)": erlang.mean_waiting_number,
    "N S2": erlang.mean_waiting_number,
    "P(wait)": erlang.erlang_c,
    "E[W]": erlang.mean_wait,
    "excess k=0": lambda n, load: erlang.mean_waiting_number(n, load) / n,
}


#: The figures: (quantities, file name, title, y range).
FIGURES = (
    (
        ("N(S2-S3)",),
        "exponents_fig1",
        r"Liu and Ying Fig. 1: exponent of $\mathrm{E}[N(S_2 - S_3)]$ against $\alpha$",
        (-1.0, 1.6),
    ),
    (
        ("P(wait)", "E[W]"),
        "exponents_waiting",
        r"Corollary 2.3: exponents of P(wait) and E[W] against $\alpha$",
        (-1.6, 0.8),
    ),
    (
        ("excess k=0",),
        "exponents_excess",
        r"Theorem 2.1: exponent of $\mathrm{E}[\max(\sum_i S_i - 1, 0)]$ against $\alpha$",
        (-1.6, 0.8),
    ),
)


def _scaled(rows, metric, index, scale, **where):
    series = store_series(rows, metric, index, **where)
    if scale == "servers":
        series["y"], series["ci95"] = series["y"] * series["x"], series["ci95"] * series["x"]
    elif scale == "wait":  # E[W] = T - E[S], E[S] = 1; the interval is T's
        series["y"] = series["y"] - 1.0
    return series


def _fit(series) -> dict:
    keep = (series["y"] > 0) & (series["ci95"] > 0)
    out = {"servers": [int(n) for n in series["x"][keep]], "slope": None, "ci95": None}
    fit = positive_fit(series["x"], series["y"], series["ci95"], series["replicas"])
    if fit is not None:
        out.update(slope=fit.slope, ci95=fit.ci95, chi2_per_dof=fit.chi2 / max(fit.dof, 1))
    return out


def _bound_exponent(bound, alpha: float, servers) -> float | None:
    """The effective exponent of a stated bound (``N^alpha log N``, ``log N / N^(1 - alpha)``)
    over ``servers``: the theorem's range is ``0.5 <= alpha < 1``."""
    if bound is None or len(servers) < 2 or not 0.5 <= alpha < 1:
        return None
    n = np.asarray(servers, dtype=np.float64)
    return power_law_fit(n, bound(n, alpha)).slope


def _erlang_exponent(label: str, alpha: float, servers) -> float | None:
    if label not in ERLANG or len(servers) < 2:
        return None
    n = np.asarray(servers, dtype=np.float64)
    y = np.array([ERLANG[label](int(k), 1 - k**-alpha) for k in n])
    if np.any(y <= 0):
        return None
    return power_law_fit(n, y).slope


def fits(rows) -> list[dict]:
    """One record per policy, probe count, alpha and quantity (see the module notes)."""
    groups = sorted(
        {(r["policy"], r["d"], r["alpha"]) for r in rows if r["alpha"] is not None},
        key=lambda g: (g[0], g[1] or 0, g[2]),
    )
    out = []
    for policy, d, alpha in groups:
        for label, metric, index, scale, paper, bound in QUANTITIES:
            series = _scaled(rows, metric, index, scale, policy=policy, d=d, alpha=alpha)
            fit = _fit(series)
            servers = [int(n) for n in series["x"]]
            out.append(
                {
                    "policy": policy,
                    "d": d,
                    "alpha": alpha,
                    "quantity": label,
                    **fit,
                    "paper": None if alpha < 0.5 or math.isnan(paper(alpha)) else paper(alpha),
                    "bound": _bound_exponent(bound, alpha, servers),
                    "mmn": _erlang_exponent(label, alpha, servers),
                }
            )
    return out


def _number(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(records, out=sys.stdout) -> None:
    print(
        f"{'policy':10s} {'alpha':>5s} {'quantity':9s} {'fitted exponent':>17s} "
        f"{'chi2/dof':>8s} {'paper':>6s} {'bound':>6s} {'M/M/N':>6s}  N",
        file=out,
    )
    for r in records:
        name = r["policy"] + ("" if r["d"] is None else f"({r['d']})")
        fitted = "no exponent" if r["slope"] is None else f"{r['slope']:.3f} ± {r['ci95']:.3f}"
        print(
            f"{name:10s} {r['alpha']:5.2f} {r['quantity']:9s} {fitted:>17s} "
            f"{_number(r.get('chi2_per_dof'), 2):>8s} {_number(r['paper'], 2):>6s} "
            f"{_number(r['bound'], 2):>6s} {_number(r['mmn'], 2):>6s}  "
            f"{','.join(map(str, r['servers']))}",
            file=out,
        )


def _plot_exponents(records, folder: Path, quantities, name: str, title: str, ylim) -> Path:
    """The fitted exponents against alpha, drawn as a spec's exponent figure is
    (:func:`~jaxqueue.studies.plotting.plots.plot_series`, with the paper's line as its
    reference), and the M/M/N queue's exponents beside them."""
    mpl_fig = pyplot_free_figure(figsize=(6.4, 4.4), layout="constrained")
    ax = mpl_fig.add_subplot()
    lines = sorted({(r["policy"], r["d"], r["quantity"]) for r in records}, key=str)
    series = []
    for policy, d, q in (line for line in lines if line[2] in quantities):
        mine = [r for r in records if (r["policy"], r["d"], r["quantity"]) == (policy, d, q)]
        fitted = [r for r in mine if r["slope"] is not None]
        column = lambda key, fitted=fitted: np.array([float(r[key]) for r in fitted])  # noqa: E731
        label = f"{policy}{'' if d is None else f'({d})'}: {q}"
        nan = np.full(len(fitted), np.nan)
        series.append(Series(None, label, q, column("alpha"), column("slope"), column("ci95"), nan))
    shift = 0.0 if quantities[0].startswith("N") else -1.0
    a = np.linspace(0.5, 1.0, 11)
    reference = (a, a + shift, "paper: alpha" + (" - 1" if shift else ""))
    plot_series(
        series,
        ax,
        title=title,
        xlabel=r"$\alpha$",
        ylabel="exponent fitted across N (95% interval)",
        reference=reference,
    )
    for q, style in zip(quantities, ("k:", "k--"), strict=False):
        mmn = [r for r in records if r["quantity"] == q and r["mmn"] is not None]
        mmn = list({r["alpha"]: r for r in mmn}.values())
        label = "M/M/N: " + MMN_NAMES.get(q, q)
        ax.plot([r["alpha"] for r in mmn], [r["mmn"] for r in mmn], style, label=label)
    ax.axvspan(0.0, 0.5, color="0.9", zorder=0)
    ax.text(
        0.12, ylim[0] + 0.05 * (ylim[1] - ylim[0]), "alpha < 0.5: o(1), no exponent", fontsize=8
    )
    ax.set_xlim(0.05, 1.05)
    ax.set_ylim(*ylim)
    ax.legend(fontsize=8, frameon=False)
    path = folder / f"{name}.png"
    mpl_fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a sweep's store (liu_ying_fig1 or liu_ying_fig2)")
    ap.add_argument(
        "-o", "--output", default=None, help="folder for the figures (none: no figures)"
    )
    ap.add_argument("--json", action="store_true", help="print the fits as JSON")
    args = ap.parse_args(argv)
    with Store.open_existing(args.store) as store:
        rows = store.rows()
    records = fits(rows)
    if args.json:
        print(json.dumps(records))
    else:
        print_table(records)
    if args.output is not None:
        folder = Path(args.output)
        folder.mkdir(parents=True, exist_ok=True)
        for quantities, name, title, ylim in FIGURES:
            if any(r["quantity"] in quantities and r["slope"] is not None for r in records):
                path = _plot_exponents(records, folder, quantities, name, title, ylim)
                print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
