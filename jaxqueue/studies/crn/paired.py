"""Paired comparisons of simulated systems: points (one policy at several loads, or
several policies) run on the same random words, each metric's difference from the
first point with a paired 95% interval, and the correlation the pairing achieved
(docs/crn.md, "Paired comparisons").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from jaxqueue.core.config import Model, split_keywords
from jaxqueue.results.display import StudyTable, optional_import
from jaxqueue.results.estimates import Estimate
from jaxqueue.runs import planner
from jaxqueue.studies.crn.sides import STREAM, Group, Sides, combine, refuse_auto_warmup

__all__ = [
    "paired",
    "Paired",
    "plan_points",
    "HEADLINE",
    "coupling_threshold",
    "MIN_COUPLING_REPLICAS",
    "MIN_COUPLED_CORRELATION",
    "coupling_of",
    "compare_samples",
]

#: The metric whose correlation says whether a point is coupled to the first.
HEADLINE = "mean_response_time"

#: The fewest replicas whose correlation can pass :func:`coupling_threshold`
#: (``2 / sqrt(n) < 1``): with fewer, coupling is not measured.
MIN_COUPLING_REPLICAS = 5

#: The least correlation called coupled however many replicas resolve it: a
#: correlation ``r`` narrows the paired interval by ``1 / sqrt(1 - r)`` (sides
#: of equal variance), 1.2x at 0.3. Two policies read the words at other
#: positions, and a weak correlation (about 0.1 measured, Pod(2) and JIQ at
#: ``N = 6``) can remain: many replicas resolve it, but it gains nothing.
MIN_COUPLED_CORRELATION = 0.3


def coupling_threshold(n: int) -> float:
    """The correlation of ``n`` paired values below which a pair reads as not
    coupled: ``2 / sqrt(n)``, about twice the standard error of the sample
    correlation of ``n`` independent pairs."""
    return 2.0 / math.sqrt(max(n, 1))


def coupling_of(a, b) -> tuple[float, int, bool]:
    """The coupling of two points from their per-replica values ``a``, ``b``
    (each replica's whole window, replica ``i`` of both on one key).

    The replicas are independent, so the correlation of ``n`` replicas' pairs
    is that of ``n`` independent pairs, whose standard error without coupling
    is about ``1 / sqrt(n)``: the pair is coupled where it is above
    :func:`coupling_threshold` of ``n`` and above
    :data:`MIN_COUPLED_CORRELATION`. (Batch means are not independent pairs:
    a replica's batches follow one path, and counting them as ``n`` would call
    two policies coupled by chance.) With fewer than
    :data:`MIN_COUPLING_REPLICAS` replicas no correlation passes.

    Returns:
        ``(r, n, coupled)``: the correlation (NaN where a side has no spread,
        a metric constant on it, or fewer than 2 pairs), the pairs with a value
        on both sides, and the verdict.
    """
    r, n = _correlation(a, b)
    return r, n, bool(r > max(coupling_threshold(n), MIN_COUPLED_CORRELATION))


@dataclasses.dataclass(frozen=True, repr=False)
class Paired(StudyTable):
    """Points run on common random numbers, each beside the first.

    Attributes:
        labels: each point's label (policy, N, load).
        differences: for each point after the first, ``{metric: Estimate}`` of
            ``X(point) - X(first)`` with the paired 95% interval (per-replica
            differences, Student t; or batch means of the paired per-batch differences).
        unpaired: the same points' half-widths as independent runs of the same
            length would give them: ``sqrt(ci_first^2 + ci_point^2)``.
        correlation: ``{metric: r}``, the correlation of the two points'
            per-replica values (their whole windows, with batch means too); NaN
            where a metric is constant on a side (the probe rate of JIQ, 0).
        coupled: ``{metric: bool}``: ``r`` above :func:`coupling_threshold` of
            the replicas and :data:`MIN_COUPLED_CORRELATION` (:func:`coupling_of`).
        results: each point's :class:`~jaxqueue.results.simulation.SimulationResult`.
        settings: the run's settings (those of the first point).
        pairs: ``{metric: n}``, the replicas the correlation is over.
    """

    labels: tuple
    differences: tuple
    unpaired: tuple
    correlation: tuple
    coupled: tuple
    results: tuple
    settings: dict
    pairs: tuple = ()

    def __getitem__(self, key) -> Estimate:
        """``c["p99"]``: the second point's difference from the first;
        ``c["p99", k]``: point ``k``'s (``k >= 1``)."""
        metric, k = key if isinstance(key, tuple) else (key, 1)
        if not 1 <= k < len(self.labels):
            raise IndexError(f"point {k} is not compared: use 1 .. {len(self.labels) - 1}")
        return self.differences[k - 1][metric]

    _HTML_COLUMNS = (
        "point",
        "metric",
        "difference",
        "ci95",
        "unpaired_ci95",
        "correlation",
        "coupled",
    )

    def records(self) -> list[dict]:
        """One row per compared point and metric: its ``difference`` from the first
        point with the paired 95% half-width ``ci95``, the half-width independent
        runs would give (``unpaired_ci95``), the ``correlation`` and the replicas it
        is over, ``coupled``; the point's label and index ``k``, the reference's label."""
        rows = []
        for k in range(1, len(self.labels)):
            for name, est in self.differences[k - 1].items():
                rows.append(
                    {
                        "reference": self.labels[0],
                        "point": self.labels[k],
                        "k": k,
                        "metric": name,
                        "difference": float(est.mean),
                        "ci95": float(est.ci95),
                        "unpaired_ci95": float(self.unpaired[k - 1][name]),
                        "correlation": float(self.correlation[k - 1][name]),
                        "correlation_replicas": self._pairs(name, k),
                        "coupled": bool(self.coupled[k - 1][name]),
                    }
                )
        return rows

    def to_xarray(self):
        """An xarray Dataset over ``point`` (the compared points' labels) and
        ``metric`` (extra ``xarray``): the columns of :meth:`records` as variables,
        NaN (False for ``coupled``) where a point lacks a metric; the reference's
        label as an attribute."""
        xr = optional_import("xarray", "xarray")
        rows = self.records()
        points = list(self.labels[1:])
        metrics = list(dict.fromkeys(r["metric"] for r in rows))
        columns = ("difference", "ci95", "unpaired_ci95", "correlation", "correlation_replicas")
        tables = {c: np.full((len(points), len(metrics)), np.nan) for c in columns}
        coupled = np.zeros((len(points), len(metrics)), bool)
        for r in rows:
            at = (r["k"] - 1, metrics.index(r["metric"]))
            for c in columns:
                tables[c][at] = r[c]
            coupled[at] = r["coupled"]
        data = {c: (("point", "metric"), t) for c, t in tables.items()}
        data["coupled"] = (("point", "metric"), coupled)
        ds = xr.Dataset(data, coords={"point": points, "metric": metrics})
        ds.attrs.update(reference=str(self.labels[0]))
        return ds

    def narrowing(self, metric: str = HEADLINE, k: int = 1) -> float:
        """How many times narrower point ``k``'s paired interval is than independent runs'."""
        half = self[metric, k].ci95
        return self.unpaired[k - 1][metric] / half if half > 0 else math.inf

    def to_dict(self) -> dict:
        """A JSON-ready dict: every Estimate as :meth:`Estimate.to_dict`."""
        points = []
        for k in range(1, len(self.labels)):
            diff, unp, corr = (
                x[k - 1] for x in (self.differences, self.unpaired, self.correlation)
            )
            point = {
                "label": self.labels[k],
                "coupled": self.coupled[k - 1],
                "coupling": self.coupling(k),
                "differences": {m: e.to_dict() for m, e in diff.items()},
                "unpaired_ci95": {m: _number(v) for m, v in unp.items()},
                "correlation": {m: _number(v) for m, v in corr.items()},
            }
            if self.pairs:
                point["correlation_replicas"] = dict(self.pairs[k - 1])
            points.append(point)
        settings = {k: v for k, v in self.settings.items() if k != "versions"}
        return {"reference": self.labels[0], "points": points, "settings": settings}

    def __str__(self) -> str:
        s = self.settings
        lines = [
            f"differences from {self.labels[0]} (common random numbers, "
            f"{s.get('replicas')} replicas, interval: {s.get('paired_interval')})"
        ]
        for k in range(1, len(self.labels)):
            lines.append(f"{self.labels[k]}: {self.coupling(k)}")
            diff, unp, corr = (
                x[k - 1] for x in (self.differences, self.unpaired, self.correlation)
            )
            width = max(len(m) for m in diff)
            for name, est in diff.items():
                row = f"  {name:<{width}}  {est:.4g}   {self._correlation_text(name, k)}"
                if est.ci95 > 0 and self.coupled[k - 1][name]:
                    row += f"   {unp[name] / est.ci95:.3g}x narrower"
                lines.append(row)
        return "\n".join(lines)

    def _pairs(self, metric: str, k: int) -> int:
        """The replicas behind point ``k``'s correlation of ``metric``."""
        if self.pairs:
            return self.pairs[k - 1][metric]
        return int(self.settings.get("replicas") or 0)

    def _correlation_text(self, metric: str, k: int) -> str:
        r = self.correlation[k - 1][metric]
        if math.isfinite(r):
            return f"correlation {r:.3f}"
        if self._pairs(metric, k) < 2:
            return "correlation not measured (fewer than 2 replicas)"
        return "no correlation: constant on a side"

    def coupling(self, k: int = 1) -> str:
        """A sentence on how well point ``k`` is coupled to the first (by :data:`HEADLINE`),
        judged from the correlation of their per-replica values (:func:`coupling_of`)."""
        if HEADLINE not in self.correlation[k - 1]:
            return "coupling not measured"
        r, n = self.correlation[k - 1][HEADLINE], self._pairs(HEADLINE, k)
        if n < MIN_COUPLING_REPLICAS:
            few = f"{n} replica is" if n == 1 else f"{n} replicas are"
            return (
                f"coupling not measured: {few} too few (a correlation over fewer than "
                f"{MIN_COUPLING_REPLICAS} cannot pass 2 / sqrt(replicas)); the interval is "
                "valid, but whether it gains on independent runs is not known"
            )
        if not math.isfinite(r):
            return f"coupling not measured: the {HEADLINE} is constant on a side"
        if not self.coupled[k - 1][HEADLINE]:
            weak = (
                f", too weak to gain: coupled is above {MIN_COUPLED_CORRELATION:g}"
                if r > coupling_threshold(n)
                else ""
            )
            return (
                f"not coupled (correlation {r:.2f} over {n} replicas{weak}): the interval is "
                "that of independent runs"
            )
        return (
            f"coupled (correlation {r:.3f} over {n} replicas, interval "
            f"{self.narrowing(HEADLINE, k):.3g}x narrower)"
        )


def _number(x):
    x = float(x)
    return x if math.isfinite(x) else None


def paired(
    models,
    load=None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    run=None,
    bounds=None,
    progress: bool = False,
    stream: int = STREAM,
    **options,
) -> Paired:
    """Points of a simulated system run on the same random words, each metric's
    difference from the first point with a paired 95% interval.

    Replica ``i`` of every point draws from the same key. Points of one model
    (the same policy at several loads) run as the loads of one batch, as a
    sensitivity's sides do: their paths part only at the steps whose first word
    falls between the loads' thresholds. Points of other models (another
    policy, another ``d``) run in batches of their own on the same keys: they
    are coupled as far as they read the words alike. How far is measured, not
    assumed: the correlation of the points' per-replica values; where it is
    below :func:`coupling_threshold` of the replicas (or
    :data:`MIN_COUPLED_CORRELATION`; :func:`coupling_of`) the pair is "not
    coupled", and its paired interval is no narrower than that of independent
    runs (it stays valid).

    Args:
        models: a policy name, a Policy or a :class:`~jaxqueue.Model`, or a
            sequence of them: one per point (or one for all).
        load: ``lambda``, one for all points or one per point.
        n_servers, n_dispatchers: with policy names (as :func:`jaxqueue.simulate`).
        stream: the stream word every point draws from (0; a paired grid
            spec's points draw from
            :func:`~jaxqueue.studies.grids.points.paired_word` of its seed).
        run, bounds, progress, **options: the keywords of :func:`jaxqueue.simulate`
            (``replicas``, ``steps``, ``seed``, ``d``, ``levels``, ...), the same
            for every point; ``warmup="auto"`` is refused (its extensions would
            give the points windows of their own).

    Returns:
        a :class:`Paired`: ``c["mean_response_time"]`` is the second point's
        difference from the first; ``print(c)`` shows every metric.
    """
    sides = plan_points(
        models, load, n_servers, n_dispatchers, run=run, bounds=bounds, stream=stream, **options
    )
    found = sides.run(progress)
    return _compare(found.samples, found.results)


def plan_points(
    models,
    load=None,
    n_servers=None,
    n_dispatchers=1,
    *,
    run=None,
    bounds=None,
    stream: int = STREAM,
    **options,
) -> Sides:
    """The sides of :func:`paired` (arguments as there), checked, nothing compiled:
    one plan per distinct model, its points' loads on one stream."""
    many = isinstance(models, Sequence) and not isinstance(models, str)
    models = list(models) if many else [models]
    loads = list(np.atleast_1d(np.asarray(load, np.float64))) if load is not None else []
    if not loads:
        raise TypeError("paired() needs load: one for all points or one per point")
    count = max(len(models), len(loads))
    if len(models) not in (1, count) or len(loads) not in (1, count):
        raise ValueError(
            f"paired() got {len(models)} models and {len(loads)} loads: give one of "
            "either for all points, or as many of each"
        )
    if count < 2:
        raise ValueError("paired() compares two or more points: give two models or two loads")
    models, loads = models * (count // len(models)), loads * (count // len(loads))
    by_model: dict = {}
    for k, policy in enumerate(models):
        model, opts, bound = split_keywords(
            policy, n_servers, n_dispatchers, dict(options), run, bounds, where="paired"
        )
        refuse_auto_warmup(opts, "a paired comparison", "points")
        by_model.setdefault(_key(model), (model, opts, bound, []))[3].append(k)
    groups = []
    for model, opts, bound, ks in by_model.values():
        group_loads = [float(loads[k]) for k in ks]
        p = planner.plan_model(model, group_loads, opts, bound, streams=[stream] * len(ks))
        groups.append(Group(p, tuple(ks)))
    return Sides(tuple(groups))


def _key(model: Model):
    """A model's identity (a Policy given as an object by itself)."""
    return repr(model)


def _compare(samples: list, results: list) -> Paired:
    """Each point's paired differences from the first, their unpaired width, the correlations."""
    differences, unpaired, correlation, coupled, batched = compare_samples(samples)
    labels = tuple(_label(res) for res in results)
    settings = dict(results[0].settings, paired_interval="batch-means" if batched else "replicas")
    first = samples[0][0]
    pairs = tuple(
        {m: coupling_of(first[m], s[0][m])[1] for m in diff}
        for s, diff in zip(samples[1:], differences)
    )
    return Paired(
        labels,
        tuple(differences),
        tuple(unpaired),
        tuple(correlation),
        tuple(coupled),
        tuple(results),
        settings,
        pairs,
    )


def compare_samples(samples: list) -> tuple:
    """The comparison of points from their values (:func:`side_samples`: per replica,
    and per batch or None), each point after the first beside the first.

    The correlation and the coupling come from the per-replica values, with
    batch means too (:func:`coupling_of`): replicas are independent, a
    replica's batches are not.

    Returns:
        ``(differences, unpaired, correlation, coupled, batched)``: a list per
        point after the first of the :class:`Paired` attributes of those names
        (``{metric: ...}``), and whether the intervals are batch means.
    """
    batched = all(s[1] is not None for s in samples)
    if batched and len({next(iter(s[1].values())).shape for s in samples}) > 1:
        batched = False  # batches that do not line up: pair the replicas' whole windows
    if not batched:
        samples = [(s[0], None) for s in samples]
    first = samples[0]
    differences, unpaired, correlation, coupled = [], [], [], []
    for s in samples[1:]:
        names = [m for m in first[0] if m in s[0]]
        pair = [tuple(_only(part, names) for part in x) for x in (first, s)]
        differences.append(combine(lambda a, b: b - a, pair, batched))
        alone = [combine(lambda a: a, [x], batched) for x in pair]
        unpaired.append({m: math.hypot(alone[0][m].ci95, alone[1][m].ci95) for m in names})
        verdicts = {m: coupling_of(pair[0][0][m], pair[1][0][m]) for m in names}
        correlation.append({m: v[0] for m, v in verdicts.items()})
        coupled.append({m: v[2] for m, v in verdicts.items()})
    return differences, unpaired, correlation, coupled, batched


def _only(values: dict | None, names: list) -> dict | None:
    return None if values is None else {m: values[m] for m in names}


def _correlation(a, b) -> tuple[float, int]:
    """The sample correlation of paired values and their number (NaN pairs left
    out; NaN without spread or with fewer than 2 pairs)."""
    a, b = np.ravel(a), np.ravel(b)
    ok = np.isfinite(a) & np.isfinite(b)
    n = int(np.sum(ok))
    if n < 2:
        return math.nan, n
    a, b = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
    den = math.sqrt(float(np.sum(a * a) * np.sum(b * b)))
    return (float(np.sum(a * b) / den) if den > 0 else math.nan), n


def _label(result) -> str:
    s = result.settings
    return f"{s['policy_label']}, N = {s['n_servers']}, load {s['load']:.6g}"
