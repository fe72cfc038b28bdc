"""The theory beside a grid's simulated points (mean field, refined mean field or exact,
solved once per what it depends on), and the store rows of a point's result.
"""

from __future__ import annotations

from jaxqueue.core.arrivals import Profile
from jaxqueue.core.config import Model
from jaxqueue.core.service import pool_shares
from jaxqueue.core.user_metrics import at_fixed_point
from jaxqueue.exact import solve_exact
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS
from jaxqueue.policies.registry import make
from jaxqueue.results.schema import pool_row_value, split_pool_row_metric
from jaxqueue.runs.bounds import limit_ratio
from jaxqueue.studies.grids.spec import GridSpec, Point
from jaxqueue.studies.grids.store import parameter_values
from jaxqueue.theory import mean_field
from jaxqueue.theory.baselines.erlang import erlang_result
from jaxqueue.theory.baselines.lu import lu_covers, lu_result
from jaxqueue.theory.finite_n.refined import refined_mean_field
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles import periodic
from jaxqueue.theory.result import fill_quantiles

__all__ = [
    "point_ratio",
    "theory_key",
    "theory_values",
    "refined_values",
    "theory_value",
    "store_rows",
]


def point_ratio(point: Point) -> float | None:
    """The ratio the point's mean field is solved at (None: one dispatcher's limit)."""
    return limit_ratio(make(point.policy, **dict(point.options)), point.servers, point.dispatchers)


def theory_key(point: Point, kind: str) -> tuple:
    """What a theory value depends on: a mean field not on N (nor M beyond ``r``), but
    on the fractions of N's whole servers that its pools hold (``Point.pool_set``, as simulated)."""
    if kind in ("mean-field", "lu"):
        return (
            kind,
            point.policy,
            point.options,
            point.load,
            point_ratio(point),
            point.buffer,
            point.service,
            pool_shares(point.pool_set()),
            point.arrivals,
        )
    return (
        kind,
        point.policy,
        point.options,
        point.load,
        point.servers,
        point.dispatchers,
        point.buffer,
        point.service,
        point.pools,
        point.arrivals,
    )


def theory_values(points: list[Point], kind: str, cache: dict, results=None, sources=None) -> list:
    """The theory of each point (``kind``: "none", "mean-field", "exact" or "erlang"), or None each.

    ``cache`` holds results by :func:`theory_key`. Mean fields are solved
    without their response-time quantiles, which are then computed for the
    whole batch in one vectorised call (:func:`~jaxqueue.theory.result.fill_quantiles`).
    A point with a rate profile (``sources(point.arrivals)`` is a
    :class:`~jaxqueue.core.arrivals.Profile`) gets the periodic mean field
    averaged over its simulation's measured window (``results``, in the
    order of ``points``), with its service law and pools where that mean
    field covers them (:func:`jaxqueue.theory.profiles.periodic.refusal`); other
    arrival sources have none: the mean field and the exact chain are
    written for Poisson arrivals. With pools the mean field is solved at the
    fractions of the point's whole servers (``Point.pool_set``, as simulated).
    "lu" is Lu et al.'s approximation (:mod:`jaxqueue.theory.baselines.lu`), where it
    covers the policy (JIQ, JIQ-SQ(d), exp(1) servers, infinite buffers).
    "erlang" is the M/M/N queue of the point's N and load (one shared queue,
    whatever the policy and buffer: the pooled benchmark), for exponential
    servers without pools.
    """
    if kind == "none":
        return [None] * len(points)
    keys, windows = [], []
    for i, point in enumerate(points):
        key, window = theory_key(point, kind), None
        if (
            point.arrivals is not None
            and kind == "mean-field"
            and sources is not None
            and results is not None
            and isinstance(sources(point.arrivals), Profile)
        ):
            s = results[i].settings
            window = (float(s["time_warmup"]), float(s["time_measured"]))
            key += (window,)
        keys.append(key)
        windows.append(window)
    new = {}
    for point, key, window in zip(points, keys, windows):
        if key not in cache and key not in new:
            new[key] = _solve(point, kind, window, sources)
    cache.update(zip(new, fill_quantiles(list(new.values()))))
    return [cache[key] for key in keys]


def _servers(point: Point) -> dict:
    """The point's servers as the theory takes them: buffer, service law and pools."""
    return dict(buffer=point.buffer, service=point.service, pools=point.pool_set())


def _solve(point: Point, kind: str, window, sources):
    """The theory of one point (see :func:`theory_values`), or None; its mean field
    without the response-time quantiles."""
    opts = dict(point.options)
    plain = point.service is None and point.pools is None
    if point.arrivals is not None:
        value = None
        pol = make(point.policy, **opts)
        if (
            window is not None
            and periodic.refusal(
                Limit(pol, point_ratio(point), arrivals=sources(point.arrivals), **_servers(point)),
                point.load,
            )
            is None
        ):
            value = mean_field(
                pol,
                point.load,
                point_ratio(point),
                with_quantiles=False,
                arrivals=sources(point.arrivals),
                window=window,
                **_servers(point),
            )
    elif kind == "erlang":
        value = erlang_result(point.servers, point.load) if plain else None
    elif kind == "lu":  # Lu et al.'s approximation: JIQ, exp(1) servers, infinite buffers
        pol, ratio = make(point.policy, **opts), point_ratio(point)
        covered = plain and point.buffer is None and ratio is not None and lu_covers(pol)
        value = lu_result(pol, point.load, ratio, with_quantiles=False) if covered else None
    elif kind == "mean-field":
        pol = make(point.policy, **opts)
        value = None
        per_server = PER_SERVER_MEAN_FIELDS if point.buffer is None else ()  # infinite buffers
        if not (point.pools is not None and pol.routes_by_speed) and pol.mean_field_kind() in (
            ("generic", "closed-form") + (per_server if plain else ())
        ):
            value = mean_field(
                pol, point.load, point_ratio(point), with_quantiles=False, **_servers(point)
            )
    else:
        model = Model(point.policy, point.servers, point.dispatchers, **opts)
        value = solve_exact(model.replace(**_servers(point), pools=point.pools), point.load)
    return value


def refined_values(points: list[Point], cache: dict) -> list:
    """The 1/N-refined mean field of each point at its N (a MeanFieldResult), or None.

    None where the policy has no generic mean field (JIQ-Original, JIQ-Threshold)
    or the refinement is undefined there (JSQ-like routing, where the drift is
    not differentiable at the fixed point).
    """
    out = []
    for point in points:
        # the correction V does not depend on N: one solve per load, ratio and buffer
        key = ("refined",) + theory_key(point, "mean-field")[1:]
        if key not in cache:
            pol = make(point.policy, **dict(point.options))
            value = None
            plain = point.service is None and point.pools is None and point.arrivals is None
            if plain and pol.mean_field_kind() in (
                "generic",
                "closed-form",
            ):  # (r unused with one queue)
                value = refined_mean_field(
                    pol,
                    point.load,
                    point_ratio(point),
                    buffer=point.buffer,
                    n_servers=point.servers,
                )
            cache[key] = value
        out.append(None if cache[key] is None else cache[key].at(point.servers))
    return out


def theory_value(result, metric: str, index):
    if result is None:
        return None
    if split_pool_row_metric(metric) is not None:  # pool0_occupancy, pool1_response_quantile
        return pool_row_value(result, metric, index)
    if metric == "response_quantile":
        value = result.response_quantiles.get(index)
        return None if value is None else float(value)
    user = getattr(result, "user_metrics", None) or {}
    if metric in user:  # a user metric at a mean-field fixed point
        return user[metric]
    value = getattr(result, metric, None)
    if value is None:
        return None
    if index is None:
        return float(value)
    index = int(index)
    return float(value[index]) if index < len(value) else 0.0


def warmup_passed(res) -> int | None:
    """The warm-up diagnostic's verdict as a store value: 1 passed, 0 failed,
    ``None`` where it could not judge (too few batches)."""
    verdict = (res.diagnostics or {}).get("warmup_diagnostic", {}).get("passed")
    return None if verdict is None else int(bool(verdict))


def store_rows(
    point: Point, point_id: str, spec: GridSpec, res, theory, refined=None
) -> list[dict]:
    params = point.params()
    base = parameter_values(params)
    run = {
        "replicas": spec.run.replicas,
        "steps": res.settings["steps"],
        "warmup": res.settings["warmup"],
        "warmup_passed": warmup_passed(res),
        "seed": spec.run.seed,
    }
    metrics = spec.point_metrics(point)
    theory = at_fixed_point(theory, metrics, point.servers, point.dispatchers, point.load)
    rows = []
    for rec in res.records():
        metric, index = rec["metric"], rec["k"]
        rows.append(
            {
                "point_id": point_id,
                **base,
                "metric": metric,
                "k": index,
                "mean": rec["mean"],
                "ci95": rec["ci95"],
                "theory": theory_value(theory, metric, index),
                "refined": theory_value(refined, metric, index),
                **run,
            }
        )
    return rows
