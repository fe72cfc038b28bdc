"""One vocabulary across the API, the command line, specs and exports (docs/vocabulary.md).

A test per rule: the names of every export and frame, the encoding of an
infinite buffer, metrics that do not apply as None, ``--load`` one or many,
one default of replicas, and the earlier spellings (``jq.sweep``,
``--loads``, ``servers`` in specs, ``"index"`` in figures) still read with a
DeprecationWarning and the same numbers.
"""

import csv
import inspect
import io
import json
import math
import sqlite3

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import main as cli_main
from jaxqueue.cli.parser import build_parser
from jaxqueue.core.config import DEFAULT_REPLICAS, RunOptions
from jaxqueue.exact import solve_exact
from jaxqueue.results.display import format_metric
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.results.sweep import SweepResult
from jaxqueue.studies.compare import compare
from jaxqueue.studies.grids import export
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import parse_spec
from jaxqueue.studies.grids.store import COLUMNS, Store, parameter_values

#: A grid of two sizes, an infinite and a finite buffer (parsed, never run but
#: in the resume test: one server, random routing, a few blocks).
SPEC = """\
name = "vocabulary"
[grid]
policy = ["random"]
n_servers = [1, 2]
buffer = [0, 3]
load = [0.5]
[run]
replicas = 2
steps = 512
warmup = 256
seed = 1
init = "empty"
theory = "none"
[[figure]]
name = "tail"
metric = "tail"
x = "k"
series = ["n_servers"]
where = { k = [1, 2] }
"""


def _rows(spec):
    """Store rows of every point with made-up values: a scalar and a tail."""
    rows = []
    for p in spec.points:
        base = {**parameter_values(p.params()), "point_id": p.point_id(), "replicas": 2}
        rows.append({**base, "metric": "mean_response_time", "k": None, "mean": 1.5, "ci95": 0.1})
        rows += [{**base, "metric": "tail", "k": k, "mean": 0.5**k, "ci95": 0.01} for k in range(3)]
    return rows


@pytest.fixture
def store(tmp_path):
    spec = parse_spec(SPEC)
    path = tmp_path / "v.sqlite"
    with Store(path, spec.spec_hash(), spec.name, {"v": "1"}) as s:
        s.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], _rows(spec))
    return path


def test_one_name_for_the_size_and_the_index_in_every_export(store, tmp_path):
    """``n_servers``, ``n_dispatchers`` and ``k`` in the store's rows, its CSV,
    Parquet and netCDF, a result's records and frame, and a sweep's Dataset."""
    names = {"n_servers", "n_dispatchers", "k"}
    assert names <= set(COLUMNS) and not {"servers", "dispatchers", "idx", "index"} & set(COLUMNS)
    with Store.open_existing(store) as s:
        rows, meta = s.rows(), s.meta()
        s.export_csv(tmp_path / "rows.csv")
    assert all(names <= set(r) for r in rows)
    with open(tmp_path / "rows.csv", newline="") as f:
        assert names <= set(next(csv.reader(f)))
    pd = pytest.importorskip("pandas")
    assert names <= set(export.to_frame(rows).columns)
    pytest.importorskip("xarray")
    ds = export.to_dataset(rows, meta)
    assert {"n_servers", "k"} <= set(ds.dims) and "servers" not in ds.dims
    mf = theory.mean_field("pod", 0.8, d=2)
    assert all("k" in r and "index" not in r for r in mf.records())
    frame = mf.to_frame()
    assert isinstance(frame, pd.DataFrame) and "k" in frame.columns


def test_an_infinite_buffer_is_missing_never_zero(store, tmp_path):
    """None in Python and JSON, empty in CSV, null in Parquet, NaN on the
    netCDF coordinate (with an attribute saying so): never 0."""
    with Store.open_existing(store) as s:
        rows, text = s.rows(), io.StringIO()
        s.export_csv(text)
    assert {r["buffer"] for r in rows} == {None, 3}
    csv_buffers = {r["buffer"] for r in csv.DictReader(io.StringIO(text.getvalue()))}
    assert csv_buffers == {"", "3"}
    mf = theory.mean_field("pod", 0.8, d=2)
    assert mf.settings["buffer"] is None
    assert json.loads(json.dumps(mf.to_dict()))["settings"]["buffer"] is None
    pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    export.export_parquet(rows, tmp_path / "rows.parquet")
    buffers = pd.read_parquet(tmp_path / "rows.parquet")["buffer"]
    assert buffers.isna().sum() == sum(r["buffer"] is None for r in rows) and 0 not in set(buffers)
    pytest.importorskip("xarray")
    ds = export.to_dataset(rows)
    values = ds["buffer"].values
    assert ds["buffer"].dtype.kind == "f" and 0 not in values
    assert np.isnan(values).sum() == 1 and set(values[~np.isnan(values)]) == {3.0}
    assert "NaN" in ds.attrs["buffer_nan"]
    one = export.to_dataset([r for r in rows if r["buffer"] is None])
    assert math.isnan(one.attrs["buffer"])  # a constant buffer is an attribute, NaN too


def test_metrics_that_do_not_apply_are_none_in_every_source():
    """Pod's I-queue messages and an infinite buffer's blocking are None (mean
    field and exact alike); they print as nothing or ``-``, and JSON null."""
    for res in (theory.mean_field("pod", 0.8, d=2), solve_exact("pod", 0.7, 2, d=2)):
        assert res.p0 is None and res.join_rate is None and res.delete_rate is None
        assert res.blocking_probability is None and res.probe_rate is not None
        assert {"join_rate", "delete_rate", "blocking_probability"}.isdisjoint(res.scalar_metrics())
        assert "join_rate" not in repr(res) and "blocking_probability" not in repr(res)
        out = json.loads(json.dumps(res.to_dict()))
        assert out["join_rate"] is None and out["blocking_probability"] is None
    jiq = solve_exact("jiq", 0.7, 2, 2)
    assert jiq.join_rate > 0 and jiq.delete_rate > 0 and jiq.blocking_probability is None
    finite = solve_exact("pod", 1.2, 2, d=2, buffer=3)
    assert finite.blocking_probability > 0 and finite.join_rate is None
    assert format_metric(None) == "-"


def test_load_takes_one_or_many_and_loads_is_a_deprecated_spelling(capsys):
    """``--load`` in simulate and compare: one value, comma-separated, or the
    flag repeated; ``--loads`` does the same and says it is deprecated;
    transient's ``--load`` is one load."""
    parse = build_parser().parse_args
    common = ["--policy", "pod", "--servers", "10"]
    assert parse(["simulate", *common, "--load", "0.7"]).loads == [0.7]
    assert parse(["simulate", *common, "--load", "0.5,0.7", "--load", "0.9"]).loads == [
        0.5,
        0.7,
        0.9,
    ]
    assert parse(["compare", "--load", "0.5,0.9"]).loads == [0.5, 0.9]
    assert list(parse(["compare"]).loads) == [0.5, 0.7, 0.9, 0.95, 0.98]
    assert "deprecated" not in capsys.readouterr().err
    assert parse(["compare", "--loads", "0.5,0.9"]).loads == [0.5, 0.9]
    assert "--loads is deprecated: use --load" in capsys.readouterr().err
    assert parse(["transient", *common, "--load", "0.7"]).load == 0.7
    with pytest.raises(SystemExit):
        parse(["transient", *common, "--load", "0.5,0.7"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parse(["compare", "--help"])
    assert "--loads" not in capsys.readouterr().out  # (not shown: read, and said so)


def test_one_default_of_replicas_everywhere():
    parse = build_parser().parse_args
    assert DEFAULT_REPLICAS == RunOptions().replicas
    assert inspect.signature(jq.simulate).parameters["replicas"].default == DEFAULT_REPLICAS
    assert inspect.signature(jq.transient).parameters["replicas"].default == DEFAULT_REPLICAS
    assert inspect.signature(compare).parameters["replicas"].default == DEFAULT_REPLICAS
    sim = ["simulate", "--policy", "pod", "--servers", "10", "--load", "0.5"]
    assert parse(sim).replicas == parse(["compare"]).replicas == DEFAULT_REPLICAS
    assert parse(["transient", *sim[1:]]).replicas == DEFAULT_REPLICAS


def test_earlier_spellings_in_specs_warn_and_mean_the_same():
    """``servers``/``dispatchers`` in [grid] and ``"servers"``, ``"index"``,
    ``index = ...`` in a figure: a DeprecationWarning each, the same spec."""
    new = parse_spec(SPEC)
    old_text = (
        SPEC.replace("n_servers = [1, 2]", "servers = [1, 2]")
        .replace('x = "k"', 'x = "index"')
        .replace('series = ["n_servers"]', 'series = ["servers"]')
        .replace("where = { k = [1, 2] }", "where = { index = [1, 2] }")
    )
    with pytest.warns(DeprecationWarning) as seen:
        old = parse_spec(old_text)
    said = " ".join(str(w.message) for w in seen)
    assert "write n_servers" in said and '"index" is deprecated, write "k"' in said
    assert old.spec_hash() == new.spec_hash() and old.figures == new.figures
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="n_servers and serv"):
        parse_spec(SPEC.replace("n_servers = [1, 2]", "n_servers = [1, 2]\nservers = [3]"))
    at = SPEC.replace('x = "k"\n', "index = 2\n").replace("where = { k = [1, 2] }\n", "")
    with pytest.warns(DeprecationWarning, match='"index" is deprecated'):
        assert parse_spec(at).figures[0].index == 2


@pytest.mark.slow
def test_sweep_is_a_deprecated_alias_of_simulate_with_a_list_of_loads():
    """``jq.sweep`` warns ("use jq.simulate with a list of loads") and returns
    what ``jq.simulate`` returns for the list, bit for bit; a list of one load
    is the one-load result in a SweepResult."""
    kw = dict(replicas=2, steps=1024, warmup=256, seed=3)
    many = jq.simulate("random", [0.5, 0.8], 4, **kw)
    with pytest.warns(DeprecationWarning, match="use jq.simulate with a list of loads"):
        old = jq.sweep("random", [0.5, 0.8], 4, **kw)  # the same compiled program
    assert isinstance(many, SweepResult) and len(many) == 2
    strip = ("wall_seconds",)

    def numbers(res):
        out = res.to_dict()
        out["settings"] = {k: v for k, v in out["settings"].items() if k not in strip}
        return out

    assert [numbers(r) for r in many] == [numbers(r) for r in old]
    one = jq.simulate("random", 0.5, 4, **kw)
    assert isinstance(one, SimulationResult)
    listed = jq.simulate("random", np.array([0.5]), 4, **kw)
    assert isinstance(listed, SweepResult) and numbers(listed[0]) == numbers(one)


@pytest.mark.slow
def test_simulate_on_the_command_line_takes_several_loads(capsys):
    args = ["simulate", "--policy", "random", "--servers", "4"]  # the programs above
    args += ["--replicas", "2", "--steps", "1024", "--warmup", "256", "--seed", "3"]
    assert cli_main([*args, "--load", "0.5,0.8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["loads"] == [0.5, 0.8] and len(out["results"]) == 2
    assert cli_main([*args, "--load", "0.5", "--json"]) == 0  # the first load's streams
    one = json.loads(capsys.readouterr().out)
    assert one["mean_response_time"] == out["results"][0]["mean_response_time"]
    assert cli_main([*args, "--load", "0.5", "--load", "0.8"]) == 0
    assert capsys.readouterr().out.count("random  N=4  M=1") == 2


@pytest.mark.slow
def test_a_store_of_the_earlier_column_names_resumes(tmp_path):
    """The store's table keeps the layout of earlier releases (columns
    ``servers``, ``dispatchers``, ``idx``): a sweep interrupted in such a store
    resumes to the rows of an uninterrupted one, read with the new names."""
    text = SPEC.replace("n_servers = [1, 2]", "n_servers = [1]").replace("[0, 3]", "[3]")
    spec = parse_spec(text.replace("load = [0.5]", "load = [0.5, 0.6]"))  # one compiled shape
    full, cut = tmp_path / "full.sqlite", tmp_path / "cut.sqlite"
    log = io.StringIO()
    assert run_grid(spec, full, batch_points=1, log=log) == 2
    assert run_grid(spec, cut, batch_points=1, log=log) == 2
    with sqlite3.connect(cut) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(results)")]
        assert {"servers", "dispatchers", "idx"} <= set(columns)
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("5",)
        (gone,) = db.execute("SELECT point_id FROM points WHERE batch = 1").fetchone()
        db.execute("DELETE FROM results WHERE point_id = ?", (gone,))
        db.execute("DELETE FROM points WHERE point_id = ?", (gone,))
    assert run_grid(spec, cut, batch_points=1, log=log) == 1
    with Store.open_existing(full) as a, Store.open_existing(cut) as b:
        rows_a, rows_b = a.rows(), b.rows()
    assert rows_a == rows_b and {"n_servers", "k"} <= set(rows_b[0])
