"""``plot``'s files and the figures' style: file types, folders, errors, --dpi, line names,
theory curves on a fine grid of loads, the dodge of overlapping markers at a shared x,
plain tick labels on short log axes and legends outside the data.

The store is written directly (no simulation): its theory is the mean field the sweep
would store, its means a fixed offset from it.
"""

import dataclasses
import json

import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.studies.grids.grid_theory import theory_value, theory_values
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.store import Store, parameter_values
from jaxqueue.studies.plotting.figure_spec import line_label, metric_label, policy_label
from jaxqueue.studies.plotting.figures import (
    CURVE_POINTS,
    Series,
    figure_caption,
    figure_series,
    store_spec,
    theory_curve,
)
from jaxqueue.studies.plotting.plot_axes import LEGEND_WIDTH, dodged_x

SPEC = """\
name = "tiny"
[grid]
policy = [{ name = "jiq-pod", d = 2 }, { name = "pod", d = 2 }]
n_servers = [100]
ratio = [10]
load = [0.5, 0.7, 0.9]
[run]
replicas = 4
time = 20
theory = "mean-field"

[[figure]]
name = "T"
metric = "mean_response_time"
x = "load"

[[figure]]
name = "s2"
metric = "tail"
k = 2
x = "load"
labels = { "pod" = "two choices" }
"""
MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-", ".svg": b"<?xml"}


def _rows(spec):
    """Store rows of the spec's points: theory the mean field, means 1% above it."""
    rows = []
    for p, theory in zip(spec.points, theory_values(list(spec.points), "mean-field", {})):
        params = p.params()
        base = {
            k: parameter_values(params)[k]
            for k in ("policy", "n_servers", "n_dispatchers", "ratio", "load")
        }
        base.update(d=params["d"], point_id=p.point_id(), replicas=4, steps=100, seed=0)
        for metric, idx in (("mean_response_time", None), ("tail", 1), ("tail", 2)):
            value = theory_value(theory, metric, idx)
            row = {"metric": metric, "k": idx, "mean": 1.01 * value, "ci95": 0.001}
            rows.append({**base, **row, "theory": value})
    return rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(store path, spec, rows)`` of a tiny store, built once."""
    spec = parse_spec(SPEC)
    rows = _rows(spec)
    path = tmp_path_factory.mktemp("tiny") / "tiny.sqlite"
    with Store(path, spec.spec_hash(), spec.name, {"jaxqueue": "test"}, SPEC) as store:
        store.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], rows)
    return path, spec, rows


@pytest.mark.parametrize("suffix", [".png", pytest.param(".pdf", marks=pytest.mark.slow), ".svg"])
def test_one_figure_is_written_in_the_suffix_format(tiny, tmp_path, suffix):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"T{suffix}"
    assert cli_main(["plot", str(tiny[0]), "--figure", "T", "-o", str(out), "--json"]) == 0
    data = out.read_bytes()
    assert data.startswith(MAGIC[suffix]) and (suffix != ".svg" or b"<svg" in data[:2000])


def test_a_spec_of_one_figure_needs_no_figure_flag(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec_file = tmp_path / "one.toml"
    spec_file.write_text(SPEC.split('\n[[figure]]\nname = "s2"')[0], encoding="utf-8")
    out = tmp_path / "only.svg"
    assert cli_main(["plot", str(tiny[0]), "--spec", str(spec_file), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(MAGIC[".svg"])
    assert f"figure T ({out})" in capsys.readouterr().out


def test_a_folder_gets_one_png_per_figure(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "figs"
    assert cli_main(["plot", str(tiny[0]), "-o", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in folder.iterdir()) == ["T.png", "s2.png"]
    assert report["T"]["file"] == str(folder / "T.png") and len(report["s2"]["lines"]) == 2
    assert cli_main(["plot", str(tiny[0]), "--figure", "s2", "-o", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "s2.png").read_bytes().startswith(MAGIC[".png"])


def test_one_file_for_several_figures_is_an_error(tiny, tmp_path, capsys):
    assert cli_main(["plot", str(tiny[0]), "-o", str(tmp_path / "all.png")]) == 2
    err = capsys.readouterr().err
    assert "has 2 figures (T, s2)" in err and "--figure NAME" in err
    assert not (tmp_path / "all.png").exists()


def test_a_file_that_is_not_a_store_is_one_line(tmp_path, capsys):
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SPEC, encoding="utf-8")
    assert cli_main(["plot", str(spec_file), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec_file} is not a result store") and err.count("\n") == 1


def test_dpi_sets_the_png_size(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    widths = {}
    for dpi in (60, 120):
        out = tmp_path / f"T{dpi}.png"
        assert (
            cli_main(["plot", str(tiny[0]), "--figure", "T", "-o", str(out), "--dpi", str(dpi)])
            == 0
        )
        widths[dpi] = int.from_bytes(out.read_bytes()[16:20], "big")  # the IHDR width
    assert widths[120] == 2 * widths[60] == 2 * round(60 * (6.4 + LEGEND_WIDTH))  # and the legend
    assert cli_main(["plot", str(tiny[0]), "--figure", "T", "-o", "x.png", "--dpi", "0"]) == 2


def test_line_names_default_to_the_papers_and_the_labels_map_overrides(tiny):
    _, spec, rows = tiny
    assert [s.name for s in figure_series(rows, spec.figure("T"))] == ["JIQ-Pod(2)", "Pod(2)"]
    assert [(s.label, s.name) for s in figure_series(rows, spec.figure("s2"))] == [
        ("jiq-pod", "JIQ-Pod(2)"),  # d is 2 throughout: not a series key, and in the name
        ("pod", "two choices"),
    ]
    assert [policy_label(p) for p in ("jiq", "jsq", "i1f", "random")] == [
        "JIQ",
        "JSQ",
        "I1F",
        "Random",
    ]
    assert policy_label("jiq-original", d=1, z=1, order="fifo") == "JIQ-Original (FIFO, z=1)"
    assert line_label({"policy": "pod", "d": 2, "n_servers": 1000}) == "Pod(2) $N = 1000$"
    assert line_label({"policy": "jiq"}, "join_rate") == "JIQ join requests"
    assert metric_label("tail", 2.0) == r"$s_{2}$ (servers with $\geq 2$ tasks)"
    assert metric_label("waiting_probability") == r"$P(\mathrm{wait})$"
    assert metric_label("response_quantile", 0.99) == "99% quantile of the response time"


def test_labels_are_checked(tiny):
    _, _, rows = tiny
    spec = parse_spec(SPEC.replace('"pod" =', '"pod d=2" ='))
    with pytest.raises(ValueError, match=r"labels names 'pod d=2', not a line .* 'jiq-pod', 'pod'"):
        figure_series(rows, spec.figure("s2"))
    with pytest.raises(SpecError, match="labels must be an inline table"):
        parse_spec(SPEC.replace('labels = { "pod" = "two choices" }', 'labels = "pod"'))


def test_theory_is_a_curve_on_a_fine_grid_of_loads(tiny):
    _, spec, rows = tiny
    fig = spec.figure("s2")
    for s in figure_series(rows, fig):
        x, y = theory_curve(s, fig, spec)
        assert x.size >= CURVE_POINTS > s.x.size and np.isin(s.x, x).all()
        assert x[0] == s.x[0] and x[-1] == s.x[-1] and np.all(np.diff(x) > 0)
        np.testing.assert_array_equal(y[np.searchsorted(x, s.x)], s.theory)
    assert figure_caption(rows, figure_series(rows, fig)) == (
        "$N = 100$, 4 replicas per point, bars: 95% intervals"
    )
    # theory at the points only: another x axis, or a store whose theory is not this one
    by_servers = SPEC.replace('x = "load"\nlabels = { "pod" = "two choices" }', 'x = "n_servers"')
    by_servers = parse_spec(by_servers).figure("s2")
    assert all(theory_curve(s, by_servers, spec) is None for s in figure_series(rows, by_servers))
    other = [r | {"theory": r["theory"] * 1.5} for r in rows]
    assert all(theory_curve(s, fig, spec) is None for s in figure_series(other, fig))


def test_a_stores_mode_gives_its_points(tiny):
    _, spec, _ = tiny
    text = SPEC.replace("[[figure]]", "[quick]\nload = [0.6]\n\n[[figure]]", 1)
    quick = parse_spec(text, mode="quick")
    meta = {"spec_name": "tiny", "spec_hash": quick.spec_hash()}
    assert [p.load for p in store_spec(text, meta).points] == [0.6, 0.6]
    plain = store_spec(text, meta | {"spec_hash": "other"})  # no mode matches: no mode
    assert [p.load for p in plain.points] == [p.load for p in spec.points]


def test_plot_figure_draws_the_curve(tiny):
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_figure

    _, spec, rows = tiny
    ax = plot_figure(rows, spec.figure("T"), spec=spec)
    sizes = sorted(len(line.get_xdata()) for line in ax.get_lines())
    assert sum(n >= CURVE_POINTS for n in sizes) == 2  # a theory curve per line
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["JIQ-Pod(2)", "Pod(2)", "mean field"]  # the spec's theory, by name
    assert "theory" in [
        t.get_text() for t in plot_figure(rows, spec.figure("T")).get_legend().texts
    ]
    assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 8
    title = plot_figure(rows, spec.figure("T"), spec=spec, spec_name="x" * 200).get_title()
    assert title.count("\n") >= 2 and "4 replicas per point" in title.splitlines()[-1]
    math = "a $b = c$ " * 30
    title = plot_figure(rows, spec.figure("T"), spec=spec, spec_name=math).get_title()
    assert all(line.count("$") % 2 == 0 for line in title.splitlines())  # math on one line


def _line(x, y=None, ci=None):
    """A line at ``x`` with values ``y`` (default: ``x``) and half-widths ``ci`` (none)."""
    x = np.asarray(x, dtype=float)
    y = x if y is None else np.asarray(y, dtype=float)
    nan = np.full(x.size, np.nan)
    return Series(None, "line", "mean_response_time", x, y, nan if ci is None else ci, nan)


def test_overlapping_markers_at_a_shared_x_are_dodged():
    a, b, c = _line([0.5, 0.7, 0.9]), _line([0.5, 0.9]), _line([0.8])
    xa, xb, xc = dodged_x([a, b, c], dodge=0.01)  # a and b meet at 0.5 and 0.9: spread
    np.testing.assert_allclose(xa - a.x, [-0.002, 0.0, -0.002], atol=1e-15)  # 0.7 is its own
    np.testing.assert_allclose(xb - b.x, [0.002, 0.002], atol=1e-15)  # centred on the x
    np.testing.assert_array_equal(xc, c.x)  # no other line at 0.8
    assert all(np.array_equal(x, s.x) for x, s in zip(dodged_x([a, b], dodge=0), [a, b]))
    np.testing.assert_array_equal(dodged_x([a])[0], a.x)  # one line: nothing to dodge
    la, lb = dodged_x([_line([10.0, 1000.0]), _line([10.0, 1000.0])], logx=True, dodge=0.01)
    np.testing.assert_allclose(np.log10(lb) - np.log10(la), [0.02, 0.02])  # of 2 decades


def test_markers_apart_on_a_steep_curve_stay_on_their_x():
    """Two lines at the same loads: where their values are far apart (a steep curve, a
    log axis) each marker is at its true load; where their intervals meet, they move."""
    x = [0.5, 0.7, 0.9]
    low = _line(x, [1e-5, 1e-3, 0.10], ci=np.array([1e-6, 1e-4, 0.02]))
    high = _line(x, [1e-3, 1e-1, 0.11], ci=np.array([1e-4, 1e-2, 0.02]))
    xl, xh = dodged_x([low, high], dodge=0.01, logy=True)
    np.testing.assert_array_equal(xl[:2], x[:2])  # two decades apart: not moved
    np.testing.assert_array_equal(xh[:2], x[:2])
    assert xl[2] < 0.9 < xh[2]  # 0.10 +- 0.02 and 0.11 +- 0.02 overlap: spread
    # intervals that do not meet, but markers that would (within a marker's size)
    near = _line(x, [1.0, 2.0, 3.0]), _line(x, [1.001, 5.0, 3.5])
    moved = [m - np.asarray(x) for m in dodged_x(list(near), dodge=0.01)]
    assert moved[0][0] < 0 < moved[1][0] and moved[0][1] == moved[1][1] == moved[0][2] == 0


def _tick_texts(axis) -> list[str]:
    """The texts of the labelled ticks of ``axis`` inside its limits."""
    low, high = sorted(axis.get_view_interval())
    return [
        t.get_text()
        for t, v in zip(axis.get_ticklabels(), axis.get_ticklocs())
        if low <= v <= high and t.get_text()
    ]


@pytest.mark.parametrize(
    "low,high,want",
    [
        (30.0, 100.0, ["30", "50", "100"]),  # not 3x10^1, 4x10^1, 6x10^1, 10^2
        (1.0, 2.0, ["1", "1.5", "2"]),  # not 10^0, 2x10^0
        (0.03, 0.9, ["0.05", "0.1", "0.2", "0.5"]),
    ],
)
def test_short_log_axes_have_plain_tick_labels(low, high, want):
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_series

    line = _line([low, high], [low, high], ci=np.zeros(2))
    ax = plot_series([line], logx=True, logy=True, theory=False)
    ax.figure.draw_without_rendering()
    for axis in (ax.xaxis, ax.yaxis):
        texts = _tick_texts(axis)
        assert set(want) <= set(texts) and not any("times" in t or "^" in t for t in texts)


def test_long_log_axes_keep_powers_of_ten():
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_series

    line = _line([100.0, 100000.0], [1e-4, 1.0], ci=np.zeros(2))
    ax = plot_series([line], logx=True, logy=True, theory=False)
    ax.figure.draw_without_rendering()
    assert _tick_texts(ax.xaxis) == [f"$\\mathdefault{{10^{{{k}}}}}$" for k in (2, 3, 4, 5)]
    assert "$\\mathdefault{10^{-2}}$" in _tick_texts(ax.yaxis)


def _outside(ax) -> bool:
    """Whether ``ax``'s legend lies wholly right of its axes (clear of the data)."""
    ax.figure.draw_without_rendering()
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    return legend.x0 >= frame.x1


def test_legends_are_outside_the_data(tiny):
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import plot_cdf, plot_figure, plot_series

    _, spec, rows = tiny
    assert _outside(plot_figure(rows, spec.figure("T"), spec=spec))
    assert _outside(plot_series([_line([0.5, 0.9])]))
    t = np.linspace(0.0, 5.0, 11)
    law = Series(
        None, "jiq", "response_cdf", t, 1 - np.exp(-t), np.full(11, np.nan), 1 - np.exp(-t)
    )
    assert _outside(plot_cdf([law]))


def test_a_panel_is_one_value_and_its_fields_by_name_draw_the_same():
    """``Panel(...)`` and its fields by name draw the same axes (scales, texts, the
    legend's theory entry); a name that is not a field is refused."""
    pytest.importorskip("matplotlib")
    from jaxqueue.studies.plotting.plots import Panel, plot_series

    line = _line([0.5, 0.9], [1.2, 2.5], ci=np.full(2, 0.1))
    line = dataclasses.replace(line, theory=np.array([1.25, 2.4]))  # a theory line to name
    look = Panel(logy=True, title="T", xlabel="load", theory_label="mean field")
    by_value = plot_series([line], panel=look)
    by_name = plot_series([line], logy=True, title="T", xlabel="load", theory_label="mean field")
    for ax in (by_value, by_name):
        assert ax.get_yscale() == "log" and ax.get_xscale() == "linear"
        assert ax.get_title() == "T" and ax.get_xlabel() == "load"
    legend_texts = [t.get_text() for t in by_value.get_legend().get_texts()]
    assert legend_texts == [t.get_text() for t in by_name.get_legend().get_texts()]
    assert "mean field" in legend_texts
    assert plot_series([line], panel=look, logy=False).get_yscale() == "linear"  # by name over it
    with pytest.raises(TypeError, match="'logz' is not a field of Panel"):
        plot_series([line], logz=True)
