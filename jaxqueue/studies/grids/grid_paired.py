"""The differences of a paired grid spec's points (``[run] paired = true``): each point's
metrics minus those of its line's reference, with the paired intervals and correlations
of :func:`jaxqueue.paired`, as store rows (docs/sweeps.md, Sensitivities and paired points).
"""

from __future__ import annotations

import json
import math

from jaxqueue.results.schema import QUANTILE_NAMES, QUANTILES
from jaxqueue.studies.crn.paired import compare_samples
from jaxqueue.studies.crn.sensitivity import scalar_names, side_samples
from jaxqueue.studies.grids.derivatives import CORRELATION, COUPLED, difference_name
from jaxqueue.studies.grids.spec import GridSpec, Point
from jaxqueue.studies.grids.store import parameter_values

__all__ = ["line_key", "references", "PairedRows"]

#: The parameters that move a point along its line (the load, or what sets it).
_ALONG = ("load", "alpha", "beta")


def line_key(point: Point) -> str:
    """A point's line: its parameters but the load (and ``alpha``, ``beta``)."""
    params = {k: v for k, v in point.params().items() if k not in _ALONG}
    return json.dumps(params, sort_keys=True, default=str)


def references(points) -> dict:
    """``{point: reference}``: each point's line's point of lowest load (the first
    of the spec's order among equal loads)."""
    lowest: dict = {}
    for p in points:
        key = line_key(p)
        if key not in lowest or p.load < lowest[key].load:
            lowest[key] = p
    return {p: lowest[line_key(p)] for p in points}


class PairedRows:
    """The difference rows of a sweep's points, as their batches finish.

    A point's per-replica values are held in memory until its reference's are
    there (a reference's for the whole sweep), so a point and its reference may
    run in any batches of one sweep; a point whose reference was stored by an
    earlier sweep into the same store gets no difference rows (:meth:`missed`).
    """

    def __init__(self, spec: GridSpec, ids: dict, done: set):
        self.spec, self.ids = spec, ids
        self.reference = references(spec.points) if spec.run.paired else {}
        self.samples: dict = {}
        self.theory: dict = {}
        self.lengths: dict = {}
        self.waiting: dict = {}
        self.missed = [
            p
            for p, ref in self.reference.items()
            if p != ref and (ids[p] in done) != (ids[ref] in done)
        ]

    def rows(self, batch: list, results: list, run, stored=()) -> list:
        """The difference rows this batch completes (none unless the spec is paired):
        its points against references already run, and points waiting for its
        references; ``stored``: the batch's rows, whose theory the differences take."""
        if not self.reference:
            return []
        names = scalar_names(results[0], run.plan)
        theory = {(r["point_id"], r["metric"], r["k"]): r["theory"] for r in stored}
        for j, p in enumerate(batch):
            self.samples[p] = side_samples(run, j, names)
            self.theory[p] = {m: theory.get((self.ids[p], *_row_key(m))) for m in names}
            self.lengths[p] = {k: results[j].settings[k] for k in ("steps", "warmup")}
        out = []
        for p in batch:
            ref = self.reference[p]
            if p == ref:
                out += [r for q in self.waiting.pop(p, ()) for r in self._pair(q, ref)]
            elif ref in self.samples:
                out += self._pair(p, ref)
            else:
                self.waiting.setdefault(ref, []).append(p)
        return out

    def warning(self) -> str:
        """Why :attr:`missed` points have no difference rows."""
        return (
            f"[jaxqueue] {self.spec.name}: warning: {len(self.missed)} points have no "
            "diff_ rows: they and their line's reference ran in different sweeps into "
            "this store (the per-replica values are kept during a sweep only); run the "
            "spec into a new store to have them"
        )

    def _pair(self, p: Point, ref: Point) -> list:
        """The rows of ``p``'s differences from ``ref`` (``p``'s values then let go)."""
        run = self.spec.run
        diff, _, corr, coupled, _ = compare_samples([self.samples[ref], self.samples.pop(p)])
        at, at_ref = self.theory.pop(p), self.theory[ref]
        base = {
            "point_id": self.ids[p],
            **parameter_values(p.params()),
            "k": None,
            "refined": None,
            "replicas": run.replicas,
            **self.lengths.pop(p),
            "warmup_passed": None,
            "seed": run.seed,
        }
        rows = []
        for name, est in diff[0].items():
            metric = difference_name(name)
            r = corr[0][name]
            gap = None if None in (at.get(name), at_ref.get(name)) else at[name] - at_ref[name]
            rows += [
                {
                    **base,
                    "metric": metric,
                    "mean": float(est.mean),
                    "ci95": float(est.ci95),
                    "theory": gap,
                },
                {
                    **base,
                    "metric": metric + CORRELATION,
                    "mean": r if math.isfinite(r) else None,
                    "ci95": None,
                    "theory": None,
                },
                {
                    **base,
                    "metric": metric + COUPLED,
                    "mean": float(coupled[0][name]),
                    "ci95": None,
                    "theory": None,
                },
            ]
        return rows


def _row_key(name: str) -> tuple:
    """``(metric, k)`` of a scalar's row in the store (``p99``: a quantile's)."""
    if name in QUANTILE_NAMES:
        return "response_quantile", QUANTILES[QUANTILE_NAMES.index(name)]
    return name, None
