"""One vocabulary for results: simulation, mean field and exact CTMC.

Every result has the same metric names, ``None`` where a metric does not apply,
quantiles as ``{q: value}``, a ``source``, ``settings`` and ``diagnostics``;
:meth:`Result.to_dict` writes an estimate and a value alike as
``{"mean", "ci95", "n"}`` (docs/model.md).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import numpy as np

from jaxqueue.results.display import html_table, optional_import, text_table
from jaxqueue.results.estimates import Estimate, entries, json_number

__all__ = [
    "Result",
    "SCALAR_METRICS",
    "VECTOR_METRICS",
    "POOL_METRICS",
    "METRICS",
    "QUANTILES",
    "QUANTILE_NAMES",
    "POOL_QUANTILE_NAMES",
    "SOURCES",
    "POOL_ROW_METRICS",
    "pool_row_metric",
    "split_pool_row_metric",
    "pool_row_value",
]

#: Scalar metrics, per server and per unit time where a rate.
SCALAR_METRICS = (
    "mean_queue_length",  # mean tasks per server, sum_{i>=1} s_i
    "mean_response_time",  # mean sojourn time of accepted tasks
    "waiting_probability",  # P(an accepted task finds its server busy)
    "blocking_probability",  # P(an arrival is blocked); None with infinite buffers
    # P(an arrival is sent to a busy server), blocked ones included: Liu and
    # Ying's p_W (blocking + (1 - blocking) * waiting)
    "busy_routing_probability",
    "p0",  # fraction of empty I-queues (JIQ family; None otherwise)
    "join_rate",  # join-I-queue requests per server per unit time (JIQ family; None otherwise)
    "delete_rate",  # delete requests per server per unit time (JIQ family; None otherwise)
    "probe_rate",  # probe messages per server per unit time
    "stale_fraction",  # JIQ-Original: fraction of arrivals sent to a busy listed server
)
#: Vector metrics, indexed by queue length ``k = 0..levels`` (I-queue size for
#: ``iqueue_distribution``).
VECTOR_METRICS = ("tail", "occupancy", "arrival_seen", "iqueue_distribution")
#: Metrics of server pools, indexed by pool (in the order given); ``None``
#: for a system without pools.
POOL_METRICS = (
    "pool_arrival_share",  # fraction of the accepted tasks sent to the pool
    "pool_utilization",  # fraction of the pool's servers that are busy
    "pool_mean_queue_length",  # mean tasks per server of the pool
    "pool_mean_response_time",  # mean response time of the tasks sent to the pool
    "pool_waiting_probability",  # P(a task sent to the pool finds its server busy)
)
METRICS = SCALAR_METRICS + VECTOR_METRICS + POOL_METRICS
#: Response-time quantile levels reported by every source.
QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: The quantiles by name, where a metric is asked for by name
#: (:meth:`Result.metric`): ``p50``, ``p90``, ``p99``, ``p99.9``.
QUANTILE_NAMES = tuple(f"p{100 * q:g}" for q in QUANTILES)
#: Each pool's quantiles by name (:meth:`Result.metric`): ``pool_p50`` ... ``pool_p99.9``.
POOL_QUANTILE_NAMES = tuple(f"pool_{name}" for name in QUANTILE_NAMES)
SOURCES = ("simulation", "mean-field", "exact")

#: What a pool's row of :meth:`Result.records` is named after, for the pool
#: metrics with two indices: ``pool_occupancy`` (index ``k``) and
#: ``pool_response_quantiles`` (index ``q``).
POOL_ROW_METRICS = ("occupancy", "response_quantile")
_POOL_ROW = re.compile(r"^pool(\d+)_(occupancy|response_quantile)$")


def pool_row_metric(what: str, pool: int) -> str:
    """The metric name of pool ``pool``'s rows of ``what`` (:data:`POOL_ROW_METRICS`):
    ``pool0_occupancy``, ``pool1_response_quantile``."""
    return f"pool{pool}_{what}"


def split_pool_row_metric(name: str):
    """``(what, pool)`` of a :func:`pool_row_metric` name, or ``None``."""
    m = _POOL_ROW.match(name) if isinstance(name, str) else None
    return None if m is None else (m.group(2), int(m.group(1)))


def pool_row_value(result, name: str, index):
    """The value of a mean-field or exact result's :func:`pool_row_metric`
    row at ``index`` (``None`` where the result has no such pool or value)."""
    what, pool = split_pool_row_metric(name)
    if what == "occupancy":
        table = result.pool_occupancy
        if table is None or pool >= len(table):
            return None
        row = np.asarray(table)[pool]
        return float(row[int(index)]) if int(index) < row.size else 0.0
    values = (result.pool_response_quantiles or {}).get(index)
    return None if values is None or pool >= len(values) else float(np.asarray(values)[pool])


# Settings copied into every row of Result.records(), where present.
_ROW_SETTINGS = ("policy", "policy_label", "n_servers", "n_dispatchers", "ratio", "load", "buffer")


def metric_json(value):
    """``{"mean", "ci95", "n"}`` for an Estimate or a plain value (``ci95`` and ``n``
    ``None``); ``None`` for a missing metric."""
    if value is None:
        return None
    if isinstance(value, Estimate):
        return value.to_dict()
    return {"mean": json_number(value), "ci95": None, "n": None}


def _json_setting(x):
    if isinstance(x, dict):
        return {str(k): _json_setting(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_setting(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_number(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return json_number(x)
    return x


def _is_number(x) -> bool:
    """A plain number (a theory's or an exact chain's value), not an Estimate or None."""
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class Result:
    """Metrics of one configuration, from one source (see the module docstring).

    Attributes:
        tail: ``s_i``, the fraction of servers with at least ``i`` tasks, ``i = 0..levels``.
        occupancy: fraction of servers with exactly ``k`` tasks.
        arrival_seen: law of the tasks an accepted arrival finds at its server;
            the response time is the Erlang mixture with these weights.
        iqueue_distribution: fraction of I-queues listing exactly ``j``
            servers (JIQ family, else None; the simulator of the exchangeable
            policies measures it with several dispatchers only, as with one
            it is the law of the number of idle servers).
        mean_queue_length, mean_response_time, waiting_probability,
        blocking_probability, busy_routing_probability, p0, join_rate, delete_rate, probe_rate,
        stale_fraction: see :data:`SCALAR_METRICS`; ``None`` where they do
        not apply (set so here for every source: ``blocking_probability``
        with an infinite buffer, ``join_rate`` and ``delete_rate`` where
        ``p0`` is None, a policy without I-queues). A source that gives
        ``busy_routing_probability`` as None gets it from the identity
        ``blocking + (1 - blocking) * waiting`` where both are numbers.
        response_quantiles: ``{q: value}`` for ``q`` in :data:`QUANTILES`.
        pool_arrival_share, pool_utilization, pool_mean_queue_length,
        pool_mean_response_time, pool_waiting_probability: with server pools,
        one value per pool (:data:`POOL_METRICS`); else None.
        pool_occupancy: with server pools, ``(pools, levels + 1)``: row ``i``
            the fraction of pool ``i``'s servers with exactly ``k`` tasks; else None.
        pool_response_quantiles: with server pools, ``{q: value per pool}``
            for ``q`` in :data:`QUANTILES`: the response-time quantiles of the
            tasks sent to each pool; else None.
        user_metrics: user-defined metrics by name (:mod:`jaxqueue.core.user_metrics`):
            each ``name`` (its time average) and ``name_per_arrival`` (its
            average over accepted arrivals); empty without.
        settings: what produced the result: at least ``policy``,
            ``policy_label``, ``options`` and ``load``.
        diagnostics: the source's own accuracy report.
    """

    source: ClassVar[str] = ""

    tail: Any
    occupancy: Any
    arrival_seen: Any
    iqueue_distribution: Any = None
    mean_queue_length: Any
    mean_response_time: Any
    waiting_probability: Any
    blocking_probability: Any
    busy_routing_probability: Any = None
    p0: Any = None
    join_rate: Any
    delete_rate: Any
    probe_rate: Any
    stale_fraction: Any = None
    response_quantiles: dict
    pool_arrival_share: Any = None
    pool_utilization: Any = None
    pool_mean_queue_length: Any = None
    pool_mean_response_time: Any = None
    pool_waiting_probability: Any = None
    pool_occupancy: Any = None
    pool_response_quantiles: dict | None = None
    user_metrics: dict = dataclasses.field(default_factory=dict)
    settings: dict
    diagnostics: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        # The metrics that do not apply are None, whatever the source computed:
        # blocking with infinite buffers, I-queue messages without I-queues.
        if "buffer" in self.settings and self.settings["buffer"] is None:
            object.__setattr__(self, "blocking_probability", None)
        if self.busy_routing_probability is None and _is_number(self.waiting_probability):
            blocked = self.blocking_probability
            blocked = 0.0 if blocked is None else blocked
            if _is_number(blocked):
                routed = float(blocked + (1.0 - blocked) * self.waiting_probability)
                object.__setattr__(self, "busy_routing_probability", routed)
        if self.p0 is None:
            object.__setattr__(self, "join_rate", None)
            object.__setattr__(self, "delete_rate", None)

    def __init_subclass__(cls, **kwargs):
        # Every source's repr is the short table: placed in the subclass's own
        # namespace, it is kept by the dataclass decorator that follows.
        super().__init_subclass__(**kwargs)
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Result.__repr__

    def __repr__(self) -> str:
        """The policy, the size, the load and the scalar metrics with their
        intervals (:func:`jaxqueue.results.display.text_table`); the arrays
        are in the fields and :meth:`to_dict`."""
        return text_table(self)

    def _repr_html_(self) -> str:
        return html_table(self)

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: settings and diagnostics by name.
        if name.startswith("_"):
            raise AttributeError(name)
        for part in ("settings", "diagnostics"):
            values = self.__dict__.get(part) or {}
            if name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def metric(self, name: str):
        """One metric by name: a scalar metric (:data:`SCALAR_METRICS`) or a
        response-time quantile (:data:`QUANTILE_NAMES`, ``"p99"``), an
        Estimate or a float; or a pool metric (:data:`POOL_METRICS`) or a
        pool's quantile (:data:`POOL_QUANTILE_NAMES`, ``"pool_p99"``), one
        value per pool. ``None`` where it does not apply."""
        if name in QUANTILE_NAMES:
            return self.response_quantiles.get(QUANTILES[QUANTILE_NAMES.index(name)])
        if name in self.user_metrics:
            return self.user_metrics[name]
        if name in POOL_QUANTILE_NAMES:
            by_pool = self.pool_response_quantiles
            return (
                None if by_pool is None else by_pool.get(QUANTILES[POOL_QUANTILE_NAMES.index(name)])
            )
        if name not in SCALAR_METRICS + POOL_METRICS:
            valid = ", ".join(SCALAR_METRICS + QUANTILE_NAMES + POOL_METRICS + POOL_QUANTILE_NAMES)
            raise ValueError(f"metric={name!r} is not one of {valid}")
        return getattr(self, name)

    def scalar_metrics(self) -> dict:
        """The scalar metrics that apply, by name (missing ones left out), then the user metrics."""
        out = {k: getattr(self, k) for k in SCALAR_METRICS if getattr(self, k) is not None}
        return out | self.user_metrics

    def to_dict(self) -> dict:
        """A JSON-serialisable dict with the same keys for every source.

        Each metric is ``{"mean": ..., "ci95": ..., "n": ...}`` (lists for
        vector metrics; :meth:`~jaxqueue.results.estimates.Estimate.to_dict`)
        or ``None`` where it does not apply; ``response_quantiles``
        maps ``"0.99"`` etc. to the same form.
        """
        out: dict[str, Any] = {
            name: metric_json(getattr(self, name)) for name in METRICS + ("pool_occupancy",)
        }
        out["response_quantiles"] = {
            str(q): metric_json(v) for q, v in sorted(self.response_quantiles.items())
        }
        by_pool = self.pool_response_quantiles
        out["pool_response_quantiles"] = (
            None
            if by_pool is None
            else {str(q): metric_json(v) for q, v in sorted(by_pool.items())}
        )
        out["user_metrics"] = {k: metric_json(v) for k, v in self.user_metrics.items()}
        out["source"] = self.source
        out["settings"] = _json_setting(self.settings)
        out["diagnostics"] = _json_setting(self.diagnostics)
        return out

    def records(self) -> list[dict]:
        """A flat table: one row per metric (and per index ``k`` for vector
        metrics and quantiles; the pool for :data:`POOL_METRICS`); ``k`` is
        ``None`` for a scalar metric, the quantile level ``q`` for a quantile.
        ``pool_occupancy`` and ``pool_response_quantiles`` have two indices:
        their rows name the pool in the metric (:func:`pool_row_metric`:
        ``pool0_occupancy`` with ``k`` the level, ``pool1_response_quantile``
        with ``k`` the quantile level)."""
        base = {"source": self.source}
        base.update({k: self.settings[k] for k in _ROW_SETTINGS if k in self.settings})

        def row(metric, index, value):
            if isinstance(value, Estimate):
                mean, half = value.mean, value.ci95
            else:
                mean, half = value, None
            return {
                **base,
                "metric": metric,
                "k": index,
                "mean": _scalar(mean),
                "ci95": None if half is None else _scalar(half),
            }

        rows = [row(name, None, v) for name, v in self.scalar_metrics().items()]
        for q, v in sorted(self.response_quantiles.items()):
            rows.append(row("response_quantile", q, v))
        for name in VECTOR_METRICS + POOL_METRICS:
            v = getattr(self, name)
            if v is not None:
                rows += [row(name, i, x) for i, x in enumerate(entries(v))]
        if self.pool_occupancy is not None:
            for i, per_pool in enumerate(entries(self.pool_occupancy)):
                name = pool_row_metric("occupancy", i)
                rows += [row(name, k, x) for k, x in enumerate(entries(per_pool))]
        for q, v in sorted((self.pool_response_quantiles or {}).items()):
            rows += [
                row(pool_row_metric("response_quantile", i), q, x) for i, x in enumerate(entries(v))
            ]
        return rows

    def to_frame(self):
        """The :meth:`records` as a pandas DataFrame (extra ``frames``)."""
        return optional_import("pandas", "frames", "to_frame").DataFrame(self.records())


def _scalar(x):
    return None if x is None else float(x)
