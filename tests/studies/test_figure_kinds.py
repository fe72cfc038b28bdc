"""Figure kinds and metrics beyond the built-in ones: user metrics (``[metrics]``)
drawn like any scalar metric, with their mean-field value beside them, and
``kind = "exponent"``: a power law's exponent fitted across a parameter at each x,
with a reference line; and the sweep's warm-up warning, which advises only what
would change the verdict.

A synthetic store (rows written directly from exact power laws, no simulation) keeps
these in the fast tier: the fitted exponents are exact.
"""

import math

import numpy as np
import pytest

from jaxqueue.core.user_metrics import at_fixed_point
from jaxqueue.results.warmup import failure_message
from jaxqueue.studies.grids.grid import warmup_warning
from jaxqueue.studies.grids.grid_theory import theory_value, theory_values
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.store import Store, parameter_values
from jaxqueue.studies.plotting.figure_labels import theory_name
from jaxqueue.studies.plotting.figure_spec import FIGURE_KEYS, reference_line
from jaxqueue.studies.plotting.figures import figure_series, summarize, summary_text, theory_curve
from jaxqueue.studies.plotting.fits import power_law_fit

SPEC = """\
name = "kinds"
[grid]
policy = ["jsq"]
n_servers = [100, 1000, 10000]
buffer = [5]
alpha = [0.25, 0.5, 0.75, 1.0]
[run]
replicas = 8
time = 20
theory = "erlang"
[metrics]
excess = "maximum(sum(s[1:]) - 1, 0)"

[[figure]]
name = "fig1"
kind = "exponent"
metric = "occupancy"
k = 2
y_scale = "n_servers"
x = "alpha"
across = "n_servers"
reference = "alpha"
reference_range = [0.5, 1.0]
reference_label = "paper: alpha"

[[figure]]
name = "excess"
kind = "exponent"
metric = ["excess", "excess_per_arrival"]
x = "alpha"
across = "n_servers"
reference = "alpha - 1"

[[figure]]
name = "excess_values"
metric = "excess_per_arrival"
x = "n_servers"
logx = true
"""

#: Each row's half-width is this fraction of its mean.
SPREAD = 0.1


def _rows(spec):
    """Rows of exact power laws in N at each alpha: N x_2 = 3 N^alpha (none at
    alpha = 0.25: no server held two tasks), its theory N^(0.9 alpha), the excess
    N^(alpha - 1) and per arrival 2 N^(alpha - 1) (no theory)."""
    rows = []
    for p in spec.points:
        base = {k: v for k, v in parameter_values(p.params()).items() if k != "order"}
        base.update(order=None, point_id=p.point_id(), replicas=8, steps=100, warmup=10, seed=0)
        n, a = p.servers, p.alpha
        x2 = 0.0 if a == 0.25 else 3 * n ** (a - 1)
        for metric, k, mean, theory in (
            ("occupancy", 2, x2, n ** (0.9 * a - 1)),
            ("excess", -1, n ** (a - 1), None),
            ("excess_per_arrival", -1, 2 * n ** (a - 1), None),
        ):
            rows.append(
                {**base, "metric": metric, "k": k, "mean": mean, "ci95": SPREAD * mean}
                | {"theory": theory}
            )
    return rows


@pytest.fixture(scope="module")
def spec():
    return parse_spec(SPEC)


def test_exponent_figures_parse(spec):
    fig = spec.figure("fig1")
    assert (fig.kind, fig.x, fig.across, fig.index, fig.reference) == (
        "exponent",
        "alpha",
        "n_servers",
        2.0,
        "alpha",
    )
    assert fig.reference_range == (0.5, 1.0) and fig.reference_label == "paper: alpha"
    assert spec.figure("excess").metrics == ("excess", "excess_per_arrival")
    assert spec.figure("excess_values").kind == "values"
    x, y = reference_line(fig, [0.25, 1.0])
    np.testing.assert_array_equal(x, y)
    assert (x[0], x[-1]) == (0.5, 1.0)
    x, y = reference_line(spec.figure("excess"), [0.25, 1.0])  # no range: the x span
    assert (x[0], x[-1]) == (0.25, 1.0)
    np.testing.assert_allclose(y, x - 1, rtol=0, atol=1e-15)


def test_the_exponents_of_exact_power_laws_are_recovered(spec):
    rows = _rows(spec)
    (line,) = figure_series(rows, spec.figure("fig1"))
    np.testing.assert_array_equal(line.x, [0.5, 0.75, 1.0])  # no exponent at 0.25
    np.testing.assert_allclose(line.y, [0.5, 0.75, 1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(line.theory, 0.9 * line.x, rtol=0, atol=1e-12)
    assert np.isnan(line.refined).all()
    # every point's interval is SPREAD of its value: the weights are equal, and the
    # exponent's half-width t_7 / sqrt(sum w (log N - mean)^2) is SPREAD / (sqrt(2) ln 10)
    np.testing.assert_allclose(line.ci95, SPREAD / (math.sqrt(2) * math.log(10)), rtol=1e-12)
    assert len(line.point_ids) == 9 and line.name == "occupancy"
    fit = power_law_fit([100, 1000, 10000], [3 * n**0.75 for n in (100, 1000, 10000)])
    assert fit.slope == pytest.approx(line.y[1], abs=1e-12)
    (summary,) = summarize([line])
    assert summary["max_z"] == pytest.approx(0.1 / line.ci95[0], rel=1e-9)  # at alpha = 1


def test_user_metrics_are_drawn_like_scalar_metrics(spec):
    rows = _rows(spec)
    lines = figure_series(rows, spec.figure("excess"))
    assert [s.label for s in lines] == ["excess", "excess_per_arrival"]
    for s in lines:
        np.testing.assert_allclose(s.y, s.x - 1, rtol=0, atol=1e-12)
        assert np.isnan(s.theory).all()  # no theory in the store: none drawn
    values = figure_series(rows, spec.figure("excess_values"))
    assert [s.label for s in values] == ["alpha=0.25", "alpha=0.5", "alpha=0.75", "alpha=1"]
    np.testing.assert_allclose(values[1].y, 2 * values[1].x ** -0.5, rtol=1e-12)


@pytest.mark.slow
def test_figures_are_written_from_a_store(spec, tmp_path):
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure, plot_store

    path = tmp_path / "kinds.sqlite"
    with Store(path, spec.spec_hash(), spec.name, {"jaxqueue": "test"}, SPEC) as store:
        store.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], _rows(spec))
    (report,) = plot_store(path, "fig1", tmp_path / "fig1.png")
    assert (tmp_path / "fig1.png").read_bytes()[:4] == b"\x89PNG"
    assert report["points"] == 3 and report["max_relative_error"] == pytest.approx(1 / 9)
    ax = plot_figure(_rows(spec), spec.figure("fig1"), spec=spec)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "paper: alpha" in legend and "M/M/N (Erlang C)" in legend  # the spec's theory
    assert report["benchmark"] == "M/M/N (Erlang C)"  # a benchmark, not a prediction
    assert ax.get_ylabel() == "exponent fitted across servers $N$ (95% intervals)"


COUNTS = """
[[figure]]
name = "counts"
metric = "occupancy"
k = 2
y_scale = "n_servers"
x = "n_servers"
series = ["alpha"]
where = { alpha = [0.5, 1.0] }
logx = true
logy = true
"""


def test_the_m_m_n_queue_is_named_as_a_benchmark(spec):
    """With theory = "erlang" the lines are drawn against the M/M/N queue, which bounds
    any dispatching: the legend names it, and plot's report gives the ratio to it, not
    a "relative error" of thousands of percent as if the run had failed."""
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure

    counts = parse_spec(SPEC + COUNTS)
    lines = figure_series(_rows(counts), counts.figure("counts"))
    report = summarize(lines, counts.run.theory)
    assert report[1]["max_relative_error"] > 3.7  # 3 against N^-0.1: 375% and more
    texts = [summary_text(line) for line in report]
    assert (
        texts[1] == "ratio to the M/M/N (Erlang C) benchmark: 4.75 to 7.54 (largest at x = 10000)"
    )
    assert not any("error" in t for t in texts)
    ax = plot_figure(_rows(counts), counts.figure("counts"), spec=counts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [r"$\alpha = 0.5$", r"$\alpha = 1$", "M/M/N (Erlang C)"]
    assert theory_name("lu") == "Lu et al.'s approximation (reconstructed)"
    assert theory_name("mean-field") == theory_name("refined") == "mean field"


# fmt: off
ERRORS = [
    ('kind = "exponent"\nmetric = "occupancy"', 'kind = "exponents"  # <-\nmetric = "occupancy"',
     "kind must be one of 'values', 'exponent'"),
    ('across = "n_servers"\nreference = "alpha"\n', 'acros = "n_servers"  # <-\nreference = "alpha"\n',
     f"unknown key 'acros' in \\[\\[figure\\]\\]; valid: {', '.join(FIGURE_KEYS)}"),
    ('across = "n_servers"\nreference = "alpha"\n', 'across = "size"  # <-\nreference = "alpha"\n',
     "across='size' is not a parameter: use one of policy, n_servers"),
    ('reference = "alpha"\n', 'reference = "gamma"  # <-\n',
     "unknown name 'gamma'.*Allowed names: alpha;"),
    ("reference_range = [0.5, 1.0]", "reference_range = [1.0, 0.5]  # <-",
     "reference_range must be \\[low, high\\] with low < high"),
    ('metric = "excess_per_arrival"', 'metric = "excess_per_arival"  # <-',
     "metric='excess_per_arival' is not a metric: .*the spec's \\[metrics\\]: excess, "
     "excess_per_arrival"),
    ('metric = "excess_per_arrival"\nx = "n_servers"', 'metric = "excess"\nx = "n_servers"\n'
     'across = "alpha"  # <-', 'across applies to kind = "exponent" only'),
    ('reference = "alpha - 1"', 'baseline = "lu"  # <-',
     'baseline does not apply to kind = "exponent"; its keys: name, metric'),
    ('across = "n_servers"\nreference = "alpha - 1"',
     'across = "n_servers"  # <-\nseries = ["n_servers"]',
     "across='n_servers' is fitted in: not also panels or series"),
]
# fmt: on


@pytest.mark.parametrize("old,new,pattern", ERRORS)
def test_figure_kind_errors_name_the_valid_values(old, new, pattern):
    text = SPEC.replace(old, new, 1)
    assert text != SPEC
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "# <-" in row)
    with pytest.raises(SpecError, match=rf"^line {line}: .*{pattern}"):
        parse_spec(text)


def test_a_metric_not_declared_says_where_to_declare_it():
    text = SPEC.split("[metrics]")[0] + '[[figure]]\nname = "f"\nmetric = "excess"\n'
    with pytest.raises(SpecError, match="a name the spec's \\[metrics\\] declares \\(none here\\)"):
        parse_spec(text)


POD = """\
name = "pod_user"
[grid]
policy = [{ name = "pod", d = 2 }]
n_servers = [1000]
load = [0.5, 0.7, 0.9]
[run]
replicas = 4
time = 20
theory = "mean-field"
[metrics]
s2 = "s[2]"
[[figure]]
name = "s2"
metric = "s2"
x = "load"
"""


def test_a_user_metric_has_the_mean_field_beside_it_on_a_fine_curve():
    """Pod(2)'s mean field has s_2 = lambda^3: the user metric ``s[2]`` at each fixed
    point is the stored theory, and the fine curve passes through it."""
    spec = parse_spec(POD)
    rows = []
    for p, res in zip(spec.points, theory_values(list(spec.points), "mean-field", {})):
        at = at_fixed_point(res, spec.point_metrics(p), p.servers, p.dispatchers, p.load)
        value = theory_value(at, "s2", None)
        rows.append(
            {
                "point_id": p.point_id(),
                **{k: v for k, v in parameter_values(p.params()).items() if k != "order"},
                "metric": "s2",
                "k": -1,
                "mean": value,
                "ci95": 0.01,
                "theory": value,
                "replicas": 4,
            }
        )
    (line,) = figure_series(rows, spec.figure("s2"))
    np.testing.assert_allclose(line.theory, line.x**3, rtol=1e-6)
    loads, curve = theory_curve(line, spec.figure("s2"), spec)
    assert loads.size > 60
    np.testing.assert_allclose(curve, loads**3, rtol=1e-6)


def test_the_sweep_advises_only_what_would_change_the_verdict():
    spec = parse_spec(SPEC)
    failed = [p for p in spec.points if p.servers == 1000][:2]
    text = warmup_warning(spec, failed, 12)
    assert "failed at 2 of the 12 points run (policy=jsq n_servers=1000 load=" in text
    assert "servers=1000" not in text.replace("n_servers=1000", "")
    assert "(warmup_time in [run])" in text and "(time in [run])" in text
    assert 'init = "mean-field"' in text  # it started empty, and JSQ has a mean field
    started = parse_spec(SPEC.replace('theory = "erlang"', 'init = "mean-field"'))
    text = warmup_warning(started, failed, 12)
    assert "init" not in text and "(warmup_time in [run])" in text
    steps = parse_spec(SPEC.replace("time = 20", "steps = 5120\nwarmup = 512"))
    text = warmup_warning(steps, failed * 2, 12)
    assert "(warmup in [run])" in text and "(steps in [run])" in text and "and 1 more" in text


def test_a_run_that_started_at_the_mean_field_is_not_told_to():
    diag = {"passed": False, "batches": 20, "mser_truncation": 3, "half_drift": 0.5}
    diag["half_drift_ci99"] = 0.2
    assert failure_message(diag, 0.9, 100, init="empty") == failure_message(diag, 0.9, 100)
    text = failure_message(diag, 0.9, 100, init="mean-field")
    assert (
        "init" not in text and "(warmup= or warmup_time=) or the window (steps= or time=)" in text
    )
    after = failure_message({**diag, "auto": True}, 0.9, init="mean-field", spelling="cli")
    assert "--init" not in after and "(--steps or --time)" in after
