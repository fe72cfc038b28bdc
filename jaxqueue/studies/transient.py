"""Transient experiments: a run from empty, or a load step from the stationary regime
(:func:`jaxqueue.runs.transient.transient`), beside the mean-field ODE from the matching
start (:func:`transient_study`), and a plot of both against time (:func:`plot_transient`).
"""

from __future__ import annotations

import numpy as np

from jaxqueue.core.config import Bounds
from jaxqueue.core.service import realized_pools
from jaxqueue.policies.registry import make
from jaxqueue.runs.bounds import limit_ratio
from jaxqueue.runs.transient import TransientResult, transient
from jaxqueue.studies.plotting.plot_axes import pyplot_free_figure
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit

__all__ = ["transient_study", "plot_transient"]

#: Tail levels a study reports.
SHOWN = (1, 2, 3)


def transient_study(
    policy,
    load: float,
    n_servers: int,
    n_dispatchers: int = 1,
    *,
    times,
    start_load: float | None = None,
    dt: float = 0.01,
    **kwargs,
) -> dict:
    """A transient run beside the mean-field ODE from the same start.

    Args:
        policy, load, n_servers, n_dispatchers, times, start_load: as for
            :func:`~jaxqueue.runs.transient.transient` (the simulation starts
            empty, or from ``warmup_time`` at ``start_load``).
        dt: the ODE's RK4 step.
        kwargs: more arguments of :func:`~jaxqueue.runs.transient.transient`
            (``d``, ``replicas``, ``seed``, ``service``, ``pools``, ...).

    Returns:
        ``{"result": TransientResult, "rows": [...]}``: a row per time with
        the simulated ``s_k`` (mean and 95% half-width), their mean-field
        values (``mf_s1``...), ``p0`` where it applies, and with pools each
        pool's busy fraction (``busy0``, ``busy0_ci95``, ``mf_busy0``, ...).
    """
    pol = make(policy, d=kwargs.get("d"))
    if kwargs.get("pools") is not None and pol.routes_by_speed:  # before anything runs
        raise NotImplementedError(
            f"transient_study compares with the mean field, and {pol.name!r} with pools has "
            "none (it routes by expected wait): use jaxqueue.runs.transient.transient"
        )
    pools = kwargs.get("pools")
    if pools is not None:  # the pools as simulated, whole servers each (said if rounded)
        pools = kwargs["pools"] = realized_pools(pools, n_servers, stacklevel=2)
    init = "mean-field" if start_load is not None else "empty"
    res: TransientResult = transient(
        policy,
        load,
        n_servers,
        n_dispatchers,
        times=times,
        start_load=start_load,
        init=init,
        **kwargs,
    )
    ratio = limit_ratio(pol, n_servers, n_dispatchers)
    levels = res.settings["levels"]
    opts = dict(d=kwargs.get("d"), buffer=kwargs.get("buffer"), levels=levels)
    busy = None
    if kwargs.get("service") is not None or pools is not None:
        if pools is not None:
            opts["pools"] = pools
        tt, tails, iq, busy = _phase_ode(
            pol, load, kwargs.get("service"), ratio, res, start_load, dt, opts
        )
    else:
        tt, tails, iq = _exponential_ode(pol, load, ratio, res, start_load, dt, opts)
    return {
        "result": res,
        "rows": _rows(res, tt, tails, iq, levels, busy),
        "ode": {"times": tt, "tails": tails, "iq_tails": iq, "pool_busy": busy},
    }


def _exponential_ode(pol, load, ratio, res, start_load, dt, opts):
    """The mean-field ODE (:func:`jaxqueue.theory.generic.meanfield.transient`) in steps of
    ``dt``, from the empty system or the fixed point at ``start_load``:
    ``(times, tails, iq_tails)``, time 0 included."""
    levels = opts["levels"]
    x0 = None
    if start_load is not None:
        fp = meanfield.fixed_point(pol, start_load, ratio, **opts)
        x0 = np.concatenate([np.asarray(fp.tail)[1:], np.asarray(fp.iq_tail)[1:]])
    t_end = float(np.max(res.times))
    tt, tails, iq = meanfield.transient(
        pol, load, ratio, t_end=max(t_end, dt), dt=dt, x0=x0, **opts
    )
    return (
        np.concatenate([[0.0], tt]),
        np.vstack([_start(x0, tails), tails]),
        np.vstack([_start_iq(x0, iq, levels), iq]),
    )


def _phase_ode(pol, load, service, ratio, res, start_load, dt, opts):
    """The mean-field ODE by class (:func:`jaxqueue.theory.generic.phases.transient`) on a
    grid of 200 steps and the simulated times, from the empty system or the
    fixed point at ``start_load``: ``(times, tails, iq_tails, pool_busy)``,
    ``pool_busy`` ``(times, pools)`` each pool's busy fraction (None without pools)."""
    limit = Limit(pol, ratio, opts["d"], opts["buffer"], service, opts.get("pools"))
    bounds, start = Bounds(opts["levels"]), None
    if start_load is not None:
        start = phases.fixed_point(limit, start_load, bounds=bounds)
    t_end = float(np.max(res.times))
    grid = np.unique(np.concatenate([np.linspace(0.0, t_end, 201), np.asarray(res.times)]))
    ode = phases.transient(limit, load, times=grid, start=start, dt=dt, bounds=bounds)
    iq = ode.iq_tails if ode.iq_tails is not None else np.ones((grid.size, 1))
    busy = None
    if opts.get("pools") is not None:  # x[k, c] summed over a pool's busy classes, over its share
        classes = phases.server_classes(service, opts["pools"])
        counts = np.asarray(ode.phase_counts)
        busy = np.stack(
            [
                counts[:, 1:, b : b + lw.n_phases].sum(axis=(1, 2)) / f
                for b, lw, f in zip(classes.base, classes.laws, classes.fractions)
            ],
            axis=1,
        )
    return grid, np.asarray(ode.tails), np.asarray(iq), busy


def _rows(res, tt, tails, iq, levels, busy=None):
    """A row per simulated time: the estimates beside the ODE (interpolated)."""
    rows = []
    for j, t in enumerate(res.times):
        row = {"time": float(t)}
        for k in SHOWN:
            if k <= levels:
                row[f"s{k}"] = float(res.tail.mean[j][k])
                row[f"s{k}_ci95"] = float(res.tail.ci95[j][k])
                row[f"mf_s{k}"] = float(np.interp(t, tt, tails[:, k]))
        if res.p0 is not None:
            row["p0"], row["p0_ci95"] = float(res.p0.mean[j]), float(res.p0.ci95[j])
            if iq.shape[1] > 1:
                row["mf_p0"] = float(np.interp(t, tt, 1.0 - iq[:, 1]))
        if res.pool_utilization is not None:
            for i in range(res.pool_utilization.mean.shape[1]):
                row[f"busy{i}"] = float(res.pool_utilization.mean[j][i])
                row[f"busy{i}_ci95"] = float(res.pool_utilization.ci95[j][i])
                if busy is not None:
                    row[f"mf_busy{i}"] = float(np.interp(t, tt, busy[:, i]))
        rows.append(row)
    return rows


def _start(x0, tails):
    first = np.zeros(tails.shape[1])
    first[0] = 1.0
    if x0 is not None:
        first[1:] = x0[: tails.shape[1] - 1]
    return first


def _start_iq(x0, iq, levels):
    first = np.ones(iq.shape[1])
    if iq.shape[1] > 1:
        first[1:] = x0[levels:] if x0 is not None else iq[0, 1:]  # empty start: all I-queues full
    return first


def plot_transient(study: dict, out=None, *, title: str | None = None, dpi: int = 120):
    """Draw a :func:`transient_study`: simulated points with 95% intervals, the ODE as lines.

    Returns the figure (and writes a PNG to ``out`` when given).
    """
    res, ode = study["result"], study["ode"]
    has_p0 = res.p0 is not None and ode["iq_tails"].shape[1] > 1
    fig = pyplot_free_figure(figsize=(6.4 * (1 + has_p0), 4.2))
    axes = fig.subplots(1, 1 + has_p0, squeeze=False)[0]
    ax = axes[0]
    for i, k in enumerate(SHOWN):
        if k >= res.tail.mean.shape[1]:
            continue
        color = f"C{i}"
        ax.plot(ode["times"], ode["tails"][:, k], color=color, lw=1.2, label=f"mean field $s_{k}$")
        ax.errorbar(
            res.times,
            res.tail.mean[:, k],
            yerr=res.tail.ci95[:, k],
            fmt="o",
            ms=3,
            color=color,
            capsize=2,
            label=f"simulation $s_{k}$",
        )
    ax.set_xlabel("time t (mean service times)")
    ax.set_ylabel(r"$s_k(t)$")
    ax.legend(fontsize=8)
    if has_p0:
        ax = axes[1]
        ax.plot(ode["times"], 1.0 - ode["iq_tails"][:, 1], color="C3", lw=1.2, label="mean field")
        ax.errorbar(
            res.times,
            res.p0.mean,
            yerr=res.p0.ci95,
            fmt="o",
            ms=3,
            color="C3",
            capsize=2,
            label="simulation",
        )
        ax.set_xlabel("time t (mean service times)")
        ax.set_ylabel(r"$p_0(t)$")
        ax.legend(fontsize=8)
    s = res.settings
    step = (
        f"{s['start_load']} -> {s['load']}"
        if s["start_load"] is not None
        else f"{s['load']} from empty"
    )
    fig.suptitle(
        title
        or f"{s['policy_label']}  N={s['n_servers']}  M={s['n_dispatchers']}  "
        f"load {step}  ({s['replicas']} replicas)",
        fontsize=10,
    )
    if out is not None:
        fig.savefig(out, dpi=dpi)
    return fig
