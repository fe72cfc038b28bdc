"""Figures and exports of a result store: [[figure]] specs, series, plots, CSV/Parquet/xarray.

A synthetic store (rows written directly, no simulation) keeps these in the fast tier.
"""

import csv
import math

import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.studies.grids import export
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.store import COLUMNS, Store, parameter_values
from jaxqueue.studies.plotting.figures import figure_series, summarize

SPEC = """\
name = "figs"
[grid]
policy = ["jiq", { name = "pod", d = 2 }]
n_servers = [100, 400]
ratio = [10]
alpha = [0.5, 0.75]
[run]
replicas = 4
time = 20
theory = "mean-field"

[[figure]]
name = "T"
metric = "mean_response_time"
x = "n_servers"
panels = "alpha"
logx = true

[[figure]]
name = "s2"
metric = "tail"
k = 2
y_scale = "n_servers ** (1 - alpha)"
x = "n_servers"
series = ["policy"]
panels = "alpha"

[[figure]]
name = "tails"
metric = "tail"
x = "k"
where = { n_servers = 400, alpha = 0.5, k = [1, 2, 3] }
logy = true
"""


def _fake_rows(spec):
    """Rows of the store's layout with made-up values that are functions of the point."""
    rows = []
    for p in spec.points:
        params = p.params()
        base = {k: v for k, v in parameter_values(params).items() if k != "order"}
        base.update(order=None, point_id=p.point_id(), replicas=4, steps=100, warmup=10, seed=0)
        t = 1.0 / (1.0 - p.load) ** 0.1
        rows.append(
            {
                **base,
                "metric": "mean_response_time",
                "k": None,
                "mean": t,
                "ci95": 0.01,
                "theory": t * 1.02,
            }
        )
        for k in range(4):
            s = p.load**k
            rows.append({**base, "metric": "tail", "k": k, "mean": s, "ci95": 0.001, "theory": s})
        for q, v in ((0.5, 0.7), (0.99, 4.6)):
            rows.append(
                {
                    **base,
                    "metric": "response_quantile",
                    "k": q,
                    "mean": v,
                    "ci95": 0.1,
                    "theory": None,
                }
            )
    return rows


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    spec = parse_spec(SPEC)
    path = tmp_path_factory.mktemp("figs") / "figs.sqlite"
    with Store(path, spec.spec_hash(), spec.name, {"jaxqueue": "test"}, SPEC) as store:
        points = [(p.point_id(), p.params(), 0.0) for p in spec.points]
        store.commit_batch(0, points, _fake_rows(spec))
    return path


def test_figures_are_parsed_and_do_not_enter_the_hash():
    spec = parse_spec(SPEC)
    assert [f.name for f in spec.figures] == ["T", "s2", "tails"]
    bare = parse_spec(SPEC.split("[[figure]]")[0])
    assert bare.figures == () and bare.spec_hash() == spec.spec_hash()
    s2 = spec.figure("s2")
    assert s2.index == 2 and s2.panels == "alpha" and s2.series == ("policy",)
    assert s2.scale({"servers": 400, "alpha": 0.75}) == pytest.approx(400**0.25)  # a point's
    assert s2.scale({"n_servers": 400, "alpha": 0.75}) == pytest.approx(400**0.25)
    with pytest.raises(ValueError, match="figure='nope' is not in spec 'figs': its figures are T"):
        spec.figure("nope")


# fmt: off
FIGURE_ERRORS = [
    ('metric = "mean_response_time"', 'metric = "latency"  # <-', "metric='latency' is not a metric"),
    ('metric = "mean_response_time"', 'metric = "poolA_occupancy"  # <-',
     "metric='poolA_occupancy' is not a metric: .*poolI_occupancy, poolI_response_quantile"),
    ('x = "n_servers"', 'x = "size"  # <-', "x='size' is not a parameter"),
    ("logx = true", 'logx = "yes"  # <-', "logx must be true or false"),
    ("k = 2", "k = -1  # <-", "k=-1 is out of range"),
    ('y_scale = "n_servers ** (1 - alpha)"', 'y_scale = "servers ** gamma"  # <-',
     "y_scale='servers \\*\\* gamma' names gamma"),
    ('y_scale = "n_servers ** (1 - alpha)"', 'y_scale = "servers % 2"  # <-', "y_scale='servers % 2': an expression allows"),
    # an integer power of integers once computed without bound (sweep --plan never returned)
    ('y_scale = "n_servers ** (1 - alpha)"', 'y_scale = "10 ** 10 ** 10"  # <-',
     "y_scale='10 \\*\\* 10 \\*\\* 10' overflows a float"),
    ('series = ["policy"]', 'series = ["policy", "n_servers"]  # <-',
     "series must not repeat x or panels"),
    ('name = "tails"', 'name = "T"  # <-', "two figures are named 'T'"),
    ('name = "tails"', 'nam = "tails"  # <-', "unknown key 'nam' in \\[\\[figure\\]\\]"),
    ('metric = "tail"\nx = "k"', 'metric = "tail"  # <-\nx = "load"',
     "metric 'tail' is a vector"),
]
# fmt: on


@pytest.mark.parametrize("old,new,pattern", FIGURE_ERRORS)
def test_figure_errors_name_their_line(old, new, pattern):
    text = SPEC.replace(old, new, 1) if old != 'name = "tails"' else SPEC.replace(old, new)
    assert text != SPEC
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "# <-" in row)
    with pytest.raises(SpecError, match=rf"^line {line}: .*{pattern}"):
        parse_spec(text)


def test_series_group_sort_and_scale(store_path):
    spec = parse_spec(SPEC)
    with Store.open_existing(store_path) as store:
        rows, meta = store.rows(), store.meta()
    assert meta["spec_text"] == SPEC and meta["spec_name"] == "figs"
    series = figure_series(rows, spec.figure("s2"))
    assert [(s.panel, s.label) for s in series] == [
        (0.5, "jiq"),
        (0.5, "pod"),
        (0.75, "jiq"),
        (0.75, "pod"),
    ]
    for s in series:
        np.testing.assert_array_equal(s.x, [100.0, 400.0])
        loads = 1 - s.x**-s.panel
        np.testing.assert_allclose(s.y, loads**2 * s.x ** (1 - s.panel), rtol=1e-12)
        np.testing.assert_allclose(s.ci95, 0.001 * s.x ** (1 - s.panel), rtol=1e-12)
    tails = figure_series(rows, spec.figure("tails"))
    assert [s.label for s in tails] == ["jiq", "pod d=2"]  # d varies: a default series key
    np.testing.assert_array_equal(tails[0].x, [1.0, 2.0, 3.0])
    lines = summarize(figure_series(rows, spec.figure("T")))
    assert len(lines) == 4 and all(line["points"] == 2 for line in lines)
    for line in lines:  # theory is 1.02 x the mean: relative error 1/1.02 - 1
        assert line["max_relative_error"] == pytest.approx(0.02 / 1.02, rel=1e-9)
        assert line["max_z"] > 1


def test_no_matching_rows_is_an_error(store_path):
    spec = parse_spec(SPEC.replace("where = { n_servers = 400,", "where = { n_servers = 999,"))
    with Store.open_existing(store_path) as store:
        rows = store.rows()
    with pytest.raises(ValueError, match="figure 'tails': no rows match"):
        figure_series(rows, spec.figure("tails"))


def test_points_that_failed_their_warm_up_are_drawn_hollow(store_path):
    """A store row with warmup_passed = 0 is a hollow marker, named in the legend;
    a line without such rows has none."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from jaxqueue.studies.plotting.plots import plot_series

    spec = parse_spec(SPEC)
    with Store.open_existing(store_path) as store:
        rows = store.rows()
    first = next(r for r in rows if r["metric"] == "mean_response_time")
    marked = [{**r, "warmup_passed": 0} if r["point_id"] == first["point_id"] else r for r in rows]
    series = figure_series(marked, spec.figure("T"))
    flags = {s.label: s.passed.tolist() for s in series if s.panel == first["alpha"]}
    failed = [(label, i) for label, f in flags.items() for i, ok in enumerate(f) if not ok]
    assert len(failed) == 1 and all(all(s.passed) for s in figure_series(rows, spec.figure("T")))
    ax = Figure().add_subplot()
    plot_series(series, ax)
    hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert len(hollow) == 1 and len(hollow[0].get_xdata()) == 1
    assert "warm-up diagnostic failed (hollow)" in [t.get_text() for t in ax.get_legend().texts]
    ax = Figure().add_subplot()
    plot_series(figure_series(rows, spec.figure("T")), ax)
    assert not [ln for ln in ax.lines if ln.get_markerfacecolor() == "white"]


@pytest.mark.slow
def test_plot_command_writes_every_figure(store_path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli_main(["plot", str(store_path), "-o", str(tmp_path / "all")]) == 0
    for name in ("T", "s2", "tails"):
        png = tmp_path / "all" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    out = capsys.readouterr().out
    assert "figure T" in out and "max relative error 1.96%" in out
    assert (
        cli_main(
            ["plot", str(store_path), "--figure", "s2", "-o", str(tmp_path / "s2.png"), "--json"]
        )
        == 0
    )
    import json

    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["s2"] and len(report["s2"]["lines"]) == 4
    assert cli_main(["plot", str(store_path), "--figure", "nope", "-o", "x.png"]) == 2


def test_plot_functions_take_and_return_axes(store_path):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from jaxqueue.studies.plotting.plots import plot_figure, plot_series

    spec = parse_spec(SPEC)
    with Store.open_existing(store_path) as store:
        rows = store.rows()
    ax = Figure().add_subplot()
    assert plot_series(figure_series(rows, spec.figure("tails")), ax, logy=True) is ax
    assert ax.get_yscale() == "log" and len(ax.lines) >= 2
    axes = Figure().subplots(1, 2)
    got = plot_figure(rows, spec.figure("T"), axes)
    assert list(got) == list(axes) and got[0].get_xscale() == "log"
    with pytest.raises(ValueError, match="has 2 panels, got 1 axes"):
        plot_figure(rows, spec.figure("T"), Figure().add_subplot())


@pytest.mark.slow
def test_csv_parquet_and_xarray_exports_agree(store_path, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    out = {k: tmp_path / f"rows.{k}" for k in ("csv", "parquet", "nc")}
    assert (
        cli_main(
            [
                "export",
                str(store_path),
                "--csv",
                str(out["csv"]),
                "--parquet",
                str(out["parquet"]),
                "--netcdf",
                str(out["nc"]),
            ]
        )
        == 0
    )
    with Store.open_existing(store_path) as store:
        rows = store.rows()
    with open(out["csv"], newline="") as f:
        from_csv = list(csv.DictReader(f))
    assert list(from_csv[0]) == list(COLUMNS) and len(from_csv) == len(rows)
    frame = pd.read_parquet(out["parquet"])
    assert list(frame.columns) == list(COLUMNS) and len(frame) == len(rows)
    for r, c, (_, p) in zip(rows, from_csv, frame.iterrows()):
        assert c["point_id"] == p["point_id"] == r["point_id"] and c["metric"] == p["metric"]
        assert float(c["mean"]) == p["mean"] == r["mean"]
        theory = r["theory"]
        assert (c["theory"] == "") == (theory is None) == (p["theory"] != p["theory"])
    ds = xr.open_dataset(out["nc"], engine="h5netcdf")
    assert set(ds["mean_response_time"].dims) == {"policy", "n_servers", "alpha"}
    assert set(ds["tail"].dims) == {"policy", "n_servers", "alpha", "k"}
    assert set(ds["response_quantile"].dims) == {"policy", "n_servers", "alpha", "quantile"}
    assert ds.attrs["spec_name"] == "figs" and ds.attrs["ratio"] == 10.0
    assert ds["load"].dims == ("n_servers", "alpha")  # load follows N and alpha
    assert ds["n_dispatchers"].dims == ("n_servers",) and list(ds["n_dispatchers"]) == [10, 40]
    assert list(ds["policy"].values) == ["jiq", "pod(d=2)"]  # d is fixed per policy
    for r in rows:
        name = r["policy"] if r["d"] is None else f"{r['policy']}(d={r['d']})"
        at = {"policy": name, "n_servers": r["n_servers"], "alpha": r["alpha"]}
        if r["metric"] == "tail":
            at["k"] = int(r["k"])
        elif r["metric"] == "response_quantile":
            at["quantile"] = r["k"]
        assert float(ds[r["metric"]].sel(at)) == r["mean"]
        assert float(ds[f"{r['metric']}_ci95"].sel(at)) == r["ci95"]
        theory = float(ds[f"{r['metric']}_theory"].sel(at))
        assert math.isnan(theory) if r["theory"] is None else theory == r["theory"]
    ds.close()
    assert math.isnan(export.to_dataset(rows).attrs["buffer"])  # infinite buffers: NaN


def test_export_needs_a_format(store_path):
    assert cli_main(["export", str(store_path)]) == 2


def _rows_and_spec(store_path):
    with Store.open_existing(store_path) as store:
        return store.rows(), parse_spec(SPEC)


def test_panels_have_mathtext_titles_and_share_one_legend(store_path):
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure

    rows, spec = _rows_and_spec(store_path)
    axes = plot_figure(rows, spec.figure("T"))
    assert [a.get_title() for a in axes] == [r"$\alpha = 0.5$", r"$\alpha = 0.75$"]
    assert "$N = 100$" not in axes[0].figure.get_suptitle()  # N varies: a range
    assert r"$100 \leq N \leq 400$" in axes[0].figure.get_suptitle()
    assert axes[0].get_legend() is None  # one legend, right of the last panel
    legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert legend == ["JIQ", "Pod(2)", "theory"]


def test_one_panel_has_no_panel_title(store_path):
    """A figure with panels that has one panel value is titled as a figure without
    panels; the value goes into the caption under the title."""
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure

    rows, _ = _rows_and_spec(store_path)
    one = parse_spec(
        SPEC.replace('panels = "alpha"\nlogx', 'panels = "alpha"\nwhere = { alpha = 0.5 }\nlogx')
    )
    (ax,) = plot_figure(rows, one.figure("T"))
    title = ax.get_title().splitlines()
    assert title[0] == "T" and title[1].startswith(r"$\alpha = 0.5$, $100 \leq N \leq 400$")
    assert ax.figure.get_suptitle() == ""


REQUESTS = """
[[figure]]
name = "requests"
metric = ["join_rate", "delete_rate"]
x = "n_servers"
series = ["policy"]
where = { alpha = 0.5 }
"""


def test_a_line_that_is_zero_throughout_is_left_out_and_named(store_path):
    """JIQ sends no delete requests here: its line (0 at every point, 0-wide intervals,
    no theory) is not drawn as a flat line at 0; the caption says why."""
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure

    rows, _ = _rows_and_spec(store_path)
    spec = parse_spec(SPEC + REQUESTS)
    base = [r for r in rows if r["metric"] == "mean_response_time"]
    extra = []
    for r in base:
        for metric in ("join_rate", "delete_rate"):
            zero = metric == "delete_rate" and r["policy"] == "jiq"
            value = 0.0 if zero else 0.1 * r["n_servers"] ** 0.1
            theory = None if zero else value
            extra.append({**r, "metric": metric, "mean": value, "ci95": 0.0 if zero else 0.01})
            extra[-1]["theory"] = theory
    ax = plot_figure(rows + extra, spec.figure("requests"))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "JIQ delete requests" not in legend and "JIQ join requests" in legend
    assert ax.get_title().splitlines()[-1] == "not drawn: JIQ: no delete requests"
    assert len(ax.containers) == 3  # the other three lines' markers
    series = figure_series(rows + extra, spec.figure("requests"))
    assert len(series) == 4  # plot's report still lists it


def test_the_report_of_a_benchmark_is_a_ratio_not_an_error(store_path):
    from jaxqueue.studies.plotting.figures import summary_text

    rows, spec = _rows_and_spec(store_path)
    lines = figure_series(rows, spec.figure("T"))
    plain = summarize(lines, "mean-field")
    assert summary_text(plain[0]).startswith("max relative error 1.96% at x = ")
    bench = summarize(lines, "erlang")
    assert bench[0]["max_relative_error"] == plain[0]["max_relative_error"]  # kept in --json
    text = summary_text(bench[0])
    assert text == "ratio to the M/M/N (Erlang C) benchmark: 0.98 (largest at x = 100)"
    assert "error" not in text
