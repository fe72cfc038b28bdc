"""Wang et al.'s Table II (arXiv:1709.10119): the largest relative error of q_k over k.

Reads a store of ``wang_table2_qk.toml`` and, for each policy, N and load,
prints the largest relative error ``|theory - simulation| / simulation`` of
q_k (the fraction of servers with exactly k tasks) over the k that enter:
k = 0 to 5, the paper's printed range, where the mean field's q_k is at
least 0.001 (below that a relative error is noise). Columns: against the
mean field, against the 1/N-refined mean field (each with the k where it is
largest and the 95% half-width of that q_k relative to it), and the
refined mean field's own prediction of the mean field's error,
``|refined - mean field| / refined``, which has no sampling noise. The paper:
3.3% for q_5 under JIQ at N = 500.

    python sweeps/wang_table2_qk.py STORE [-o errors.png] [--csv errors.csv] [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict

from jaxqueue.studies.grids.store import Store
from jaxqueue.studies.plotting.plot_axes import pyplot_free_figure

#: The paper's largest relative error (q_5, JIQ, N = 500).
PAPER = 0.033
#: The k that enter: 0 to K_MAX, where the mean field's q_k is at least Q_MIN.
K_MAX = 5
Q_MIN = 1e-3
#: How far apart the markers of the lines at one load are drawn (in load).
DODGE = 0.002
FIELDS = (
    "policy",
    "n_servers",
    "load",
    "k_mean_field",
    "error_mean_field",
    "ci_mean_field",
    "k_refined",
    "error_refined",
    "ci_refined",
    "k_predicted",
    "predicted",
    "warmup_passed",
)


def _policy(row) -> str:
    return (
        row["policy"]
        if row["d"] is None or row["policy"] == "jiq"
        else f"{row['policy']}(d={row['d']})"
    )


def _largest(entries, value) -> tuple:
    """The k, relative error and relative half-width where ``value(entry)`` is largest."""
    best = max(entries, key=value)
    return int(best["k"]), value(best), best["ci95"] / best["mean"]


def errors(rows) -> list[dict]:
    """One dict of :data:`FIELDS` per point with q_k rows (theory and refined values)."""
    points = defaultdict(list)
    for r in rows:
        if r["metric"] == "occupancy" and 0 <= r["k"] <= K_MAX and r["theory"] is not None:
            if r["theory"] >= Q_MIN:
                points[(_policy(r), r["n_servers"], r["load"])].append(r)
    out = []
    for (policy, n, load), entries in sorted(points.items()):
        k_mf, e_mf, c_mf = _largest(entries, lambda r: abs(r["theory"] - r["mean"]) / r["mean"])
        refined = [r for r in entries if r["refined"] is not None]
        k_rf = e_rf = c_rf = k_pr = e_pr = None
        if refined:
            k_rf, e_rf, c_rf = _largest(
                refined, lambda r: abs(r["refined"] - r["mean"]) / r["mean"]
            )
            k_pr, e_pr, _ = _largest(
                refined, lambda r: abs(r["refined"] - r["theory"]) / r["refined"]
            )
        passed = {r["warmup_passed"] for r in entries}
        out.append(
            dict(
                zip(
                    FIELDS,
                    (policy, n, load, k_mf, e_mf, c_mf, k_rf, e_rf, c_rf, k_pr, e_pr),
                    strict=False,
                ),
                warmup_passed=None if None in passed else int(min(passed)),
            )
        )
    return out


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def print_table(table, file=sys.stdout) -> None:
    print(
        f"largest relative error of q_k over k = 0..{K_MAX} with q_k >= {Q_MIN:g} "
        f"(the paper: {100 * PAPER:.1f}%, q_5, JIQ, N = 500); +- the q_k's relative 95% half-width",
        file=file,
    )
    print(
        f"{'policy':12s} {'N':>5s} {'load':>5s}  {'mean field':>20s}  {'refined':>20s}  "
        f"{'refined vs mean field':>22s}",
        file=file,
    )
    for t in table:
        mf = f"q_{t['k_mean_field']} {_percent(t['error_mean_field'])} +- {_percent(t['ci_mean_field'])}"
        rf = (
            "-"
            if t["k_refined"] is None
            else f"q_{t['k_refined']} {_percent(t['error_refined'])} +- {_percent(t['ci_refined'])}"
        )
        pr = "-" if t["k_predicted"] is None else f"q_{t['k_predicted']} {_percent(t['predicted'])}"
        print(
            f"{t['policy']:12s} {t['n_servers']:5d} {t['load']:5.2f}  {mf:>20s}  {rf:>20s}  {pr:>22s}",
            file=file,
        )


def draw(table, path) -> None:
    """Largest relative error against the load: a panel per policy, a colour per N;
    solid: against the mean field, dashed: against the refined mean field,
    dotted: the refined mean field's prediction of the mean field's error."""
    policies = sorted({t["policy"] for t in table})
    fig = pyplot_free_figure(figsize=(5.2 * len(policies), 4.6))
    axes = fig.subplots(1, len(policies), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        for i, n in enumerate(sorted({t["n_servers"] for t in table if t["policy"] == policy})):
            line = [t for t in table if t["policy"] == policy and t["n_servers"] == n]
            x = [t["load"] for t in line]
            color = f"C{i}"
            for j, (key, style, marker, what) in enumerate(
                (("mean_field", "-", "o", "mean field"), ("refined", "--", "s", "refined"))
            ):
                y = [100 * (t[f"error_{key}"] or 0.0) for t in line]
                ci = [100 * (t[f"ci_{key}"] or 0.0) for t in line]
                ax.errorbar(
                    [v + DODGE * (2 * i + j - 1.5) for v in x],  # no line hides another's bars
                    y,
                    yerr=[[min(c, v) for c, v in zip(ci, y)], ci],  # an error is not negative
                    ls=style,
                    marker=marker,
                    color=color,
                    capsize=2,
                    mfc="none" if key == "refined" else color,
                    label=f"N = {n}, {what}",
                )
            pred = [100 * (t["predicted"] or 0.0) for t in line]
            ax.plot(x, pred, ls=":", color=color, label=f"N = {n}, refined vs mean field")
        ax.axhline(100 * PAPER, color="grey", lw=0.8, label="the paper: 3.3%")
        ax.set_title(policy.replace("jiq-pod(d=2)", "JIQ-Pod(2)").replace("jiq", "JIQ"))
        ax.set_xlabel("load")
        ax.set_ylabel(f"largest relative error of $q_k$, $k \\leq {K_MAX}$ (%)")
        ax.set_ylim(bottom=0.0)
        ax.legend(fontsize=7)
    fig.suptitle("Wang et al. Table II: simulation against the mean field, r = 10", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a store of sweeps/wang_table2_qk.toml")
    ap.add_argument("-o", "--output", help="the figure (.png, .pdf or .svg)")
    ap.add_argument("--csv", help="write the table as CSV")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    with Store.open_existing(args.store) as store:
        table = errors(store.rows())
    if not table:
        print(f"{args.store}: no q_k rows with a mean field", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(table))
    else:
        print_table(table)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(table)
    if args.output:
        draw(table, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
