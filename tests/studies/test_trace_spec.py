"""Arrivals from files in sweeps: the spec's ``arrivals`` axis, the store's column, exports,
the response-time law figure (``metric = "response_cdf"``) and sweeps/wang_trace.toml.

Fast but for one tiny grid through the engine (marked slow); the quick mode of
wang_trace.toml runs with every spec of sweeps/ in tests/studies/test_sweeps.py.
"""

import importlib.util
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from jaxqueue import WindowWarning
from jaxqueue.core.arrivals import parse_arrivals
from jaxqueue.studies.grids import export
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import SpecError, load_spec, parse_spec
from jaxqueue.studies.grids.store import COLUMNS, Store, StoreLayoutError
from jaxqueue.studies.plotting.figures import CDF_POINTS, cdf_quantiles, figure_series, summarize
from jaxqueue.studies.plotting.plots import plot_figure, plot_store

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"

SPEC = """\
[grid]
policy = ["jiq", "pod"]
n_servers = [100]
ratio = [10]
load = [0.5, 0.9]
arrivals = ["poisson", "data/trace.csv"]
[run]
replicas = 4
time = 50
theory = "mean-field"
"""


def _edit(text, old, new):
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _write_trace(path: Path, seed: int = 0, rows: int = 200) -> Path:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0, rows))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "time,service\n"
        + "".join(f"{t:.6f},{s:.6f}\n" for t, s in zip(times, rng.exponential(1.0, rows)))
    )
    return path


@pytest.fixture
def spec_dir(tmp_path, monkeypatch):
    """A spec beside its data folder; the current directory is elsewhere."""
    folder = tmp_path / "specs"
    _write_trace(folder / "data" / "trace.csv")
    (folder / "s.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    return folder


# ---- the spec ------------------------------------------------------------------------


def test_arrivals_are_found_beside_the_spec_and_leave_other_ids_alone(spec_dir):
    spec = load_spec(spec_dir / "s.toml")
    assert len(spec.points) == 8
    traced = [p for p in spec.points if p.arrivals is not None]
    assert len(traced) == 4 and {p.arrivals for p in traced} == {"data/trace.csv"}
    source = spec.arrivals_file("data/trace.csv")
    assert source.path == str((spec_dir / "data" / "trace.csv").resolve())
    assert source.source.kind == "trace" and traced[0].source is source.source
    assert traced[0].params()["arrivals"] == "data/trace.csv"
    assert "arrivals=data/trace.csv" in traced[0].label()
    # "poisson" is the default: those points are those of a spec without the key
    plain = parse_spec(_edit(SPEC, 'arrivals = ["poisson", "data/trace.csv"]\n', ""))
    poisson = {p.point_id() for p in spec.points if p.arrivals is None}
    assert poisson == {p.point_id() for p in plain.points}
    assert not poisson & {p.point_id() for p in traced}
    assert "arrivals" not in plain.points[0].params()
    # the hash follows the file's bytes, not where the spec lies
    moved = spec_dir.parent / "moved"
    spec_dir.rename(moved)
    again = load_spec(moved / "s.toml")
    assert again.spec_hash() == spec.spec_hash() and again.points == spec.points
    _write_trace(moved / "data" / "trace.csv", seed=1)
    assert load_spec(moved / "s.toml").spec_hash() != spec.spec_hash()


@pytest.mark.parametrize(
    "value, error",
    [
        ('"data/nope.csv"', r"arrivals='data/nope\.csv': no such file .*nope\.csv"),
        ('"data/bad.csv"', r"arrivals='data/bad\.csv'.*column 'time' or 'timestamp'"),
        ("[3]", "arrivals must be a file path"),
    ],
)
def test_a_missing_or_bad_arrivals_file_fails_the_spec_at_its_key(spec_dir, value, error):
    (spec_dir / "data" / "bad.csv").write_text("when,service\n1,1\n")
    (spec_dir / "s.toml").write_text(_edit(SPEC, '["poisson", "data/trace.csv"]', value))
    with pytest.raises(SpecError, match=rf"s\.toml: line 6: {error}") as info:
        load_spec(spec_dir / "s.toml")
    assert info.value.line == 6


def test_without_its_folder_a_spec_is_drawn_but_not_run(spec_dir):
    spec = parse_spec(_edit(SPEC, "data/trace.csv", "data/elsewhere.csv"))  # not read
    assert {p.arrivals for p in spec.points} == {None, "data/elsewhere.csv"}
    with pytest.raises(ValueError, match="parsed without its folder.*load_spec"):
        spec.spec_hash()
    assert parse_spec(SPEC, base=spec_dir).spec_hash() == load_spec(spec_dir / "s.toml").spec_hash()


def test_arrivals_rule_out_theory_and_a_trace_rules_out_service_laws(spec_dir):
    only = _edit(SPEC, '["poisson", "data/trace.csv"]', '"data/trace.csv"')
    with pytest.raises(SpecError, match="theory='mean-field' needs a mean field.*Poisson") as info:
        parse_spec(only, base=spec_dir)
    assert info.value.line == 10
    parse_spec(_edit(only, '"mean-field"', '"none"'), base=spec_dir)
    for key in ('service = "erlang:2"', 'pools = "0.2:2,0.8:1"'):
        with pytest.raises(SpecError, match="is a trace.*identical exponential servers") as info:
            parse_spec(_edit(SPEC, "[run]", f"{key}\n[run]"), base=spec_dir)
        assert info.value.line == 6
    per_server = _edit(
        SPEC, '["jiq", "pod"]', '["jiq-original", { name = "jiq-threshold", z = 1 }]'
    )
    assert len(parse_spec(per_server, base=spec_dir).points) == 8


def test_a_rate_profile_is_uniformized_at_its_peak(spec_dir):
    (spec_dir / "data" / "day.csv").write_text("time,rate\n0,1\n1,3\n2,\n")  # peak 1.5 x mean
    spec = parse_spec(
        _edit(SPEC, '["poisson", "data/trace.csv"]', '["data/day.csv", "poisson"]'), base=spec_dir
    )
    p = next(p for p in spec.points if p.load == 0.9 and p.arrivals is not None)
    assert spec.run.steps_for(p) == math.ceil(50 * 100 * (0.9 * 1.5 + 1.0))
    trace = load_spec(spec_dir / "s.toml")
    q = next(p for p in trace.points if p.load == 0.9 and p.arrivals is not None)
    assert trace.run.steps_for(q) == math.ceil(50 * 100 * 1.9)  # a trace's mean step rate


# ---- the store and the exports --------------------------------------------------------


def _rows(spec, seen_of):
    """Store rows of every point: arrival_seen ``seen_of(point)`` (with theory only for
    Poisson points) and the response quantiles of that law."""
    from jaxqueue.results.response import erlang_mixture_quantile

    rows = []
    for p in spec.points:
        params = p.params()
        base = {
            k: params.get(k)
            for k in (
                "policy",
                "n_servers",
                "n_dispatchers",
                "ratio",
                "load",
                "alpha",
                "beta",
                "d",
                "z",
                "buffer",
                "service",
                "pools",
                "arrivals",
            )
        }
        base.update(order=None, point_id=p.point_id(), replicas=4, steps=100, warmup=10, seed=0)
        w = seen_of(p)
        theory = None if p.arrivals else w
        for k, v in enumerate(w):
            rows.append(
                {
                    **base,
                    "metric": "arrival_seen",
                    "k": k,
                    "mean": v,
                    "ci95": 1e-3,
                    "theory": None if theory is None else v,
                }
            )
        for q in (0.5, 0.9, 0.99, 0.999):
            t = float(erlang_mixture_quantile(w, q))
            rows.append(
                {
                    **base,
                    "metric": "response_quantile",
                    "k": q,
                    "mean": t,
                    "ci95": 0.01 * t,
                    "theory": None if theory is None else t,
                }
            )
        rows.append(
            {
                **base,
                "metric": "mean_response_time",
                "k": None,
                "mean": 1 / (1 - p.load),
                "ci95": 0.01,
                "theory": None,
            }
        )
    return rows


def _geometric(p):
    """M/M/1's law of the tasks an arrival finds (response time Exp(1 - load)),
    heavier under the trace."""
    rho = p.load if p.arrivals is None else (1 + p.load) / 2
    return (1 - rho) * rho ** np.arange(400)


def test_store_round_trip_with_arrivals_and_older_layouts_are_refused(spec_dir, tmp_path):
    spec = load_spec(spec_dir / "s.toml")
    path = tmp_path / "s.sqlite"
    rows = _rows(spec, _geometric)
    with Store(path, spec.spec_hash(), "s", {"jaxqueue": "test"}, spec.source_text) as store:
        store.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], rows)
    assert COLUMNS[COLUMNS.index("pools") + 1] == "arrivals"
    with Store.open_existing(path) as store:
        back = store.rows()
        assert store.export_csv(tmp_path / "s.csv") == len(rows)
    assert {r["arrivals"] for r in back} == {None, "data/trace.csv"}
    assert "arrivals" in (tmp_path / "s.csv").read_text().splitlines()[0].split(",")
    for version in ("3", "1"):
        with sqlite3.connect(path) as db:
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (version,))
        # export and plot cannot read another layout: said as such (not "not a store")
        with pytest.raises(StoreLayoutError, match=f"table layout {version}.*read layout 5 only"):
            Store.open_existing(path)


@pytest.mark.slow
def test_exports_put_arrivals_on_an_axis(spec_dir):
    pytest.importorskip("xarray")
    spec = load_spec(spec_dir / "s.toml")
    rows = _rows(spec, _geometric)
    assert list(export.to_frame(rows).columns) == list(COLUMNS)
    ds = export.to_dataset(rows)
    assert list(ds["arrivals"].values) == ["data/trace.csv", "poisson"]
    t = ds["mean_response_time"].sel(policy="pod(d=2)", arrivals="poisson", load=0.9)
    assert float(t) == pytest.approx(10.0)


# ---- the response-time law figure ---------------------------------------------------------

CDF_FIGURE = """
[[figure]]
name = "law"
metric = "response_cdf"
where = { load = 0.9 }
"""


def test_response_cdf_is_the_erlang_mixture_of_arrival_seen(spec_dir, tmp_path):
    spec = load_spec(spec_dir / "s.toml")
    text = SPEC + CDF_FIGURE
    fig = parse_spec(text).figure("law")
    assert fig.x == "time" and fig.metrics == ("response_cdf",)
    rows = _rows(spec, _geometric)
    lines = figure_series(rows, fig)
    assert [s.label for s in lines] == [
        "jiq arrivals=data/trace.csv",
        "jiq arrivals=poisson",
        "pod d=2 arrivals=data/trace.csv",
        "pod d=2 arrivals=poisson",
    ]
    for s in lines:  # M/M/1: P(T <= t) = 1 - exp(-(1 - rho) t)
        rho = 0.9 if s.label.endswith("poisson") else 0.95
        assert s.x.size == CDF_POINTS and s.x[0] == 0.0
        assert np.allclose(s.y, 1 - np.exp(-(1 - rho) * s.x), atol=1e-9)
        assert np.isnan(s.ci95).all() and np.isnan(s.refined).all()
        assert np.isnan(s.theory).all() == (rho == 0.95)
    # the time axis ends at the largest p99.9 of the curves: -log(0.001) / 0.05
    assert lines[0].x[-1] == pytest.approx(math.log(1000) / 0.05, rel=1e-6)
    marks = cdf_quantiles(rows, fig)
    assert [m.label for m in marks] == [s.label for s in lines]
    assert list(marks[1].x) == [0.5, 0.9, 0.99, 0.999]
    assert marks[1].y[0] == pytest.approx(math.log(2) / 0.1)
    summary = summarize(marks)
    assert summary[1]["max_relative_error"] == pytest.approx(0.0, abs=1e-12)
    assert summary[0]["max_relative_error"] is None  # no theory under the trace
    ax = plot_figure(rows, fig)
    assert len(ax.get_lines()) >= 6  # 4 laws and 2 theory curves, then the quantiles
    # through the store, from its spec text (its arrivals file is not read there)
    store = tmp_path / "law.sqlite"
    with Store(store, spec.spec_hash(), "s", {"jaxqueue": "test"}, text) as s:
        s.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], rows)
    report = plot_store(store, "law", tmp_path / "law.png")
    assert (tmp_path / "law.png").read_bytes()[:4] == b"\x89PNG" and len(report) == 4


def test_response_cdf_needs_one_point_per_curve_and_exponential_servers(spec_dir):
    spec = load_spec(spec_dir / "s.toml")
    rows = _rows(spec, _geometric)
    fig = parse_spec(_edit(SPEC + CDF_FIGURE, "where = { load = 0.9 }\n", 'series = "policy"\n'))
    with pytest.raises(
        ValueError,
        match=r"curve is one point, and series \['policy'\] put 4 "
        "points on the curve 'jiq'",
    ):
        figure_series(rows, fig.figure("law"))
    panels = parse_spec(_edit(SPEC + CDF_FIGURE, "where = { load = 0.9 }", 'panels = "load"'))
    assert len(figure_series(rows, panels.figure("law"))) == 8
    erlang = [{**r, "service": "erlang:2"} for r in rows]
    with pytest.raises(ValueError, match="exp\\(1\\) service on identical servers"):
        figure_series(erlang, parse_spec(SPEC + CDF_FIGURE).figure("law"))


@pytest.mark.parametrize(
    "old, new, error",
    [
        ('metric = "response_cdf"', 'metric = ["response_cdf", "p0"]', "drawn alone"),
        ('metric = "response_cdf"', 'metric = "response_cdf"\nx = "load"', 'x = "time"'),
        ('metric = "response_cdf"', 'metric = "response_cdf"\nk = 2', "k does not apply"),
        (
            'metric = "response_cdf"',
            'metric = "response_cdf"\ny_scale = "servers"',
            "y_scale does not apply",
        ),
        ("where = { load = 0.9 }", "where = { k = [1, 2] }", "where cannot filter k"),
        ('metric = "response_cdf"', 'metric = "p0"\nx = "time"', "x='time' is not a parameter"),
    ],
)
def test_response_cdf_figure_errors(old, new, error):
    with pytest.raises(SpecError, match=error):
        parse_spec(_edit(SPEC + CDF_FIGURE, old, new))


# ---- sweeps/wang_trace.toml and its trace ---------------------------------------------------


def test_the_bursty_trace_script_writes_a_trace_like_the_committed_one(tmp_path, monkeypatch):
    """Its statistics, not its bytes: numpy's generators may change their streams between
    versions (the committed file is what numpy 2.4 writes)."""
    spec = importlib.util.spec_from_file_location(
        "make_bursty_trace", SWEEPS / "make_bursty_trace.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "OUT", tmp_path / "data" / "bursty_trace.csv")
    script.main()
    committed = SWEEPS / "data" / "bursty_trace.csv"
    assert committed.stat().st_size < 1_000_000
    for path in (script.OUT, committed):
        trace = parse_arrivals(str(path))
        assert trace.kind == "trace" and trace.arrivals == script.ROWS
        assert 1.4 < trace.scv < 3.2 and abs(trace.service.mean() - 1) < 0.03  # (2.3 in law)


def test_wang_trace_spec():
    full, quick = load_spec(SWEEPS / "wang_trace.toml"), load_spec(SWEEPS / "wang_trace.toml", True)
    for spec in (full, quick):
        assert {p.arrivals for p in spec.points} == {"data/bursty_trace.csv"}
        assert {p.policy for p in spec.points} == {
            "jiq-original",
            "jiq",
            "jiq-pod",
            "jiq-threshold",
            "jiq-sq",
            "pod",
        }
        assert {p.servers / p.dispatchers for p in spec.points} == {10}
        assert 0.88 in {p.load for p in spec.points} and spec.run.theory == "none"
        assert [f.name for f in spec.figures] == ["fig9", "fig10"]
    trace = full.arrivals_file("data/bursty_trace.csv").source
    assert trace.kind == "trace" and trace.service is not None and 2.0 < trace.scv < 2.3
    assert {round(p.load, 2) for p in full.points} >= {0.58, 0.96}
    assert full.points[0].servers == 1000 and len(quick.points) < len(full.points)


@pytest.mark.slow
def test_a_grid_with_a_trace_runs_and_draws_its_law(spec_dir, tmp_path):
    text = _edit(SPEC, '["jiq", "pod"]', '["pod"]').replace("n_servers = [100]", "n_servers = [20]")
    text = _edit(text, "time = 50", "time = 5\nwarmup_time = 2") + CDF_FIGURE
    (spec_dir / "s.toml").write_text(text)
    spec = load_spec(spec_dir / "s.toml")
    store = tmp_path / "run.sqlite"
    with pytest.warns(WindowWarning, match="at 4 of 4 points"):  # time = 5 at N = 20: 1 block
        assert run_grid(spec, store) == 4
    with Store.open_existing(store) as s:
        rows = s.rows()
    t = {(r["arrivals"], r["load"]): r for r in rows if r["metric"] == "mean_response_time"}
    assert set(t) == {(a, x) for a in (None, "data/trace.csv") for x in (0.5, 0.9)}
    for (arrivals, _), r in t.items():
        assert r["mean"] > 1.0 and (r["theory"] is None) == (arrivals is not None)
    tails = [r for r in rows if r["metric"] == "tail" and r["arrivals"] is not None]
    assert tails and all(r["mean"] is not None for r in tails)  # time averages over candidates
    report = plot_store(store, "law", tmp_path / "law.png")
    assert [line["label"] for line in report] == ["arrivals=data/trace.csv", "arrivals=poisson"]
    assert report[1]["max_relative_error"] is not None and report[0]["max_relative_error"] is None
