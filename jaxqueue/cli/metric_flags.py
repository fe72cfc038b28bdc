"""The ``--metric`` flags: user metrics ``NAME=EXPR`` on ``simulate`` and ``compare``
(and ``compare``'s choice of the metric its table shows)."""

from __future__ import annotations

import argparse

from jaxqueue.results.schema import (
    POOL_METRICS,
    POOL_QUANTILE_NAMES,
    QUANTILE_NAMES,
    SCALAR_METRICS,
)

__all__ = ["add_user_metrics", "add_compare_metric"]

_HELP = (
    "a user metric NAME=EXPR (repeatable): its time average and its average over "
    "accepted arrivals (NAME_per_arrival) of an expression of the occupancy: s (tail "
    "fractions, s[0] = 1), q (exactly k), N, M, load, iq (I-queues), e.g. "
    "'sum(s[1:])'; docs/metrics.md"
)
#: The built-in metrics ``compare`` can put side by side.
_BUILT_IN = SCALAR_METRICS + QUANTILE_NAMES + POOL_METRICS + POOL_QUANTILE_NAMES


def _metric(text: str) -> tuple[str, str]:
    """A ``--metric NAME=EXPR`` definition as ``(name, expression)``. An empty expression
    passes: the run's check of the metrics refuses it in one line that names it."""
    name, sep, expr = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=EXPR (e.g. busy='s[1]' or gap='maximum(sum(s[1:]) - 1, 0)')"
        )
    return name.strip(), expr.strip()


def _add_once(parser, given: list, pair: tuple[str, str]) -> list:
    """``given`` with ``pair`` appended; a parser error where its name is defined already
    (the last would otherwise win in silence)."""
    name, expr = pair
    for other, before in given:
        if other == name:
            parser.error(
                f"argument --metric: {name!r} is defined twice ({before!r} and {expr!r}): "
                "give each metric its own name"
            )
    return [*given, pair]


class _UserMetric(argparse.Action):
    """``--metric NAME=EXPR``, repeatable, into ``metrics``: each name once."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, _add_once(parser, given, values))


class _MetricChoice(argparse.Action):
    """``compare --metric``: a built-in metric for the table, or a user metric
    ``NAME=EXPR`` (repeatable, into ``metrics``), shown unless a built-in one is named."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "metrics", None) or []
        if "=" in values:
            try:
                pair = _metric(values)
            except argparse.ArgumentTypeError as err:
                parser.error(f"argument --metric: {err}")
            given = namespace.metrics = _add_once(parser, given, pair)
            if not getattr(namespace, "metric_named", False):
                namespace.metric = given[0][0]
            return
        if values not in _BUILT_IN:
            parser.error(
                f"argument --metric: invalid choice: {values!r} (choose from "
                f"{', '.join(_BUILT_IN)}; or define one, NAME=EXPR)"
            )
        namespace.metric, namespace.metric_named = values, True


def add_user_metrics(p: argparse.ArgumentParser, more_help: str = "") -> None:
    """``--metric NAME=EXPR`` (repeatable) into ``args.metrics``: ``(name, expression)`` pairs."""
    p.add_argument(
        "--metric",
        dest="metrics",
        action=_UserMetric,
        type=_metric,
        default=None,
        metavar="NAME=EXPR",
        help=_HELP + more_help,
    )


def add_compare_metric(p: argparse.ArgumentParser) -> None:
    """``compare --metric``: the metric the table shows, or a user metric's definition."""
    p.add_argument(
        "--metric",
        default="mean_response_time",
        action=_MetricChoice,
        metavar="METRIC or NAME=EXPR",
        help="what the table puts side by side (default mean_response_time; "
        "p50 to p99.9: response-time quantiles; pool_*: a row per pool, "
        "with --pools, pool_p50 to pool_p99.9 each pool's quantiles); --json "
        "has every metric. Or " + _HELP + "; the table shows the first "
        "unless a built-in metric is named, and the mean field's value is the "
        "metric at its fixed point",
    )
    p.set_defaults(metrics=None)
