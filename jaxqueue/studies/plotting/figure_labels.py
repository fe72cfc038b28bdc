"""Display names of figures: axis labels of parameters and metrics, policies' names
with their options, and the names of a figure's lines.
"""

from __future__ import annotations

__all__ = [
    "AXIS_LABELS",
    "POLICY_NAMES",
    "PARAMETER_DEFAULTS",
    "axis_label",
    "metric_label",
    "policy_label",
    "line_label",
    "panel_label",
    "THEORY_NAMES",
    "BENCHMARK_THEORIES",
    "theory_name",
    "zero_note",
]

#: What a missing service law, pools or arrivals value means.
PARAMETER_DEFAULTS = {"service": "exp", "pools": "identical", "arrivals": "poisson"}

#: Axis labels of parameters and metrics (mathtext where a symbol reads better).
AXIS_LABELS = {
    "load": r"load $\lambda$",
    "n_servers": "servers $N$",
    "ratio": "$r = N / M$",
    "n_dispatchers": "dispatchers $M$",
    "alpha": r"$\alpha$",
    "beta": r"$\beta$",
    "buffer": "buffer $b$",
    "d": "$d$",
    "z": "$z$",
    "k": "$k$",
    "mean_response_time": "mean response time $T$",
    "waiting_probability": r"$P(\mathrm{wait})$",
    "blocking_probability": r"$P(\mathrm{blocked})$",
    "busy_routing_probability": r"$P(\mathrm{sent\ to\ a\ busy\ server})$",
    "mean_queue_length": "mean tasks per server",
    "p0": "$p_0$",
    "join_rate": "join requests per server per unit time",
    "delete_rate": "delete requests per server per unit time",
    "probe_rate": "probes per server per unit time",
    "stale_fraction": "stale picks",
    "tail": r"$s_k$ (servers with $\geq k$ tasks)",
    "occupancy": "servers with exactly $k$ tasks",
    "arrival_seen": "arrivals that find $k$ tasks",
    "iqueue_distribution": "I-queues of size $k$",
    "response_quantile": "response-time quantile",
    "time": "response time $t$",
    "response_cdf": r"$P(T \leq t)$",
}
#: What a spec's ``theory`` is called in a figure's legend and in ``plot``'s report.
THEORY_NAMES = {
    "mean-field": "mean field",
    "refined": "mean field",
    "exact": "exact Markov chain",
    "erlang": "M/M/N (Erlang C)",
    "lu": "Lu et al.'s approximation (reconstructed)",
}
#: Theories that are a benchmark for the policies, not a prediction of them: the M/M/N
#: queue (one shared queue) bounds what any dispatching achieves.
BENCHMARK_THEORIES = ("erlang",)
#: Metrics at one index ``k`` (``index = k``): their symbol, then what it counts.
_AT_INDEX = {
    "tail": ("s", r"servers with $\geq {k}$ tasks"),
    "occupancy": ("x", "servers with {k} tasks"),
    "arrival_seen": ("w", "arrivals that find {k} tasks"),
    "iqueue_distribution": ("q", "I-queues of size {k}"),
}
#: Display names of the policies; ``{d}`` and ``{z}`` are their options.
POLICY_NAMES = {
    "jiq": "JIQ",
    "jiq-pod": "JIQ-Pod({d})",
    "pod": "Pod({d})",
    "jsq": "JSQ",
    "i1f": "I1F",
    "idle-first": "Idle-first({d})",
    "jiq-sq": "JIQ-SQ({d})",
    "jiq-threshold": "JIQ-Threshold({z})",
    "jiq-original": "JIQ-Original",
    "jsew": "JSEW",
    "random": "Random",
}
#: How a line names a parameter other than the policy and its options.
_LINE_NAMES = {
    "n_servers": "N",
    "n_dispatchers": "M",
    "ratio": "r",
    "buffer": "b",
    "load": r"\lambda",
    "alpha": r"\alpha",
    "beta": r"\beta",
}


def axis_label(key: str) -> str:
    """The axis label of a parameter or metric name."""
    return AXIS_LABELS.get(key, key)


def metric_label(metric: str, index: float | None = None) -> str:
    """The axis label of a metric at ``index`` (``$s_2$ (servers with >= 2 tasks)``,
    ``99% quantile of the response time``), or of the metric alone."""
    if index is None:
        return axis_label(metric)
    if metric == "response_quantile":
        return f"{100 * index:g}% quantile of the response time"
    if metric in _AT_INDEX:
        symbol, text = _AT_INDEX[metric]
        return f"${symbol}_{{{index:g}}}$ ({text.format(k=f'{index:g}')})"
    return f"{axis_label(metric)} at {index:g}"


def policy_label(policy: str, d=None, z=None, order=None) -> str:
    """A policy's display name with its options: ``JIQ-Pod(2)``, ``JIQ-Original (FIFO, z=1)``."""
    name = POLICY_NAMES.get(policy)
    if name is None:
        return " ".join([policy] + [f"{k}={v}" for k, v in (("d", d), ("z", z)) if v is not None])
    if ("{d}" in name and d is None) or ("{z}" in name and z is None):
        return name.split("(")[0]
    name = name.format(d=d, z=z)
    if policy == "jiq-original":
        extra = [str(order).upper() if order in ("fifo", "lifo") else order]
        extra += [
            f"{k}={v}" for k, v, plain in (("z", z, 0), ("d", d, 1)) if v not in (None, plain)
        ]
        extra = [e for e in extra if e]
        name += f" ({', '.join(extra)})" if extra else ""
    return name


def line_label(params: dict, metric: str | None = None) -> str:
    """A line's display name from the parameters that tell it apart (``params``: the
    series' parameters with the policy's options where the line has one policy), and
    its metric where the figure draws several."""
    parts = []
    if "policy" in params:
        parts.append(
            policy_label(params["policy"], params.get("d"), params.get("z"), params.get("order"))
        )
    for key, value in params.items():
        if key in ("policy", "d", "z", "order") and "policy" in params:
            continue
        if key in ("service", "pools", "arrivals"):
            parts.append(f"{key} {value if value is not None else PARAMETER_DEFAULTS[key]}")
        elif key == "buffer" and value is None:
            parts.append("$b = \\infty$")
        elif value is not None:
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(f"${_LINE_NAMES.get(key, key)} = {shown}$")
    if metric is not None:
        parts.append(axis_label(metric).split(" per ")[0])
    return " ".join(parts)


def panel_label(key: str, value) -> str:
    r"""A panel's title (mathtext): ``$\alpha = 0.5$``, ``JIQ``; ``$\alpha = \infty$``
    where the value is None and the parameter has no default."""
    return line_label({key: value}) or f"${_LINE_NAMES.get(key, key)} = \\infty$"


def theory_name(theory: str | None) -> str:
    """A spec's ``theory`` as the legend names it: ``"mean field"``, ``"M/M/N (Erlang C)"``;
    ``"theory"`` where the spec is not known."""
    return THEORY_NAMES.get(theory, "theory")


def zero_note(name: str, metric: str) -> str:
    """Why a line that is 0 at every point is not drawn: ``JIQ-Original: no delete
    requests`` (a line named after its metric), else ``Pod(2): 0 at every point``."""
    what = axis_label(metric).split(" per ")[0]
    if what != axis_label(metric) and name.endswith(what):
        who = name[: -len(what)].strip()
        return f"{who}: no {what}" if who else f"no {what}"
    return f"{name}: 0 at every point"
