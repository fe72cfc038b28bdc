"""One export schema across stores (jaxqueue.studies.grids.export.EXPORT_SCHEMA): the frame,
Parquet and CSV of any store have every column, each of one type, and ``k`` of a scalar
metric is missing in all three (the store's table keeps -1); and the requested run
lengths a Dataset recovers from the store's spec text.

Two tiny stores, rows written directly (no simulation): one of Pod(2) at a finite buffer
with theory values, one of JIQ with most columns empty.
"""

import csv
import io
import math

import pytest

from jaxqueue.studies.grids import export
from jaxqueue.studies.grids.spec import parse_spec
from jaxqueue.studies.grids.store import COLUMNS, SCALAR_INDEX, Store, parameter_values

POD = """\
name = "pod"
[grid]
policy = [{ name = "pod", d = 2 }]
n_servers = [10, 20]
buffer = [5]
load = [0.5, 0.8]
[run]
replicas = 4
time = 100
warmup_time = 20
theory = "mean-field"
[quick]
time = 10
warmup_time = 2
"""

JIQ = """\
name = "jiq"
[grid]
policy = ["jiq"]
n_servers = [100]
ratio = [10]
alpha = [0.5, 0.75]
[run]
replicas = 4
time = "10 * n_servers ** alpha"
"""

STEPS = """\
name = "steps"
[grid]
policy = ["random"]
n_servers = [4]
load = [0.5]
[run]
replicas = 2
steps = 512
warmup = 256
"""

INTEGER = {"d", "z", "buffer", "n_servers", "n_dispatchers", "replicas", "steps", "warmup"}
INTEGER |= {"warmup_passed", "seed"}
FLOAT = {"load", "alpha", "beta", "ratio", "k", "mean", "ci95", "theory", "refined"}


def _rows(spec, full: bool) -> list[dict]:
    """A scalar, a tail by k and a quantile per point; ``full``: every column set."""
    rows = []
    for p in spec.points:
        base = {**parameter_values(p.params()), "point_id": p.point_id(), "replicas": 4}
        if full:
            base.update(steps=1000, warmup=200, warmup_passed=1, seed=0)
        theory = 1.25 if full else None
        rows.append({**base, "metric": "mean_response_time", "k": None, "mean": 1.2, "ci95": 0.1,
                     "theory": theory})  # fmt: skip
        rows += [{**base, "metric": "tail", "k": k, "mean": 0.5**k, "ci95": 0.01} for k in range(3)]
        rows.append({**base, "metric": "response_quantile", "k": 0.99, "mean": 4.5, "ci95": 0.2})
    return rows


def _store(path, text, full, mode=None):
    spec = parse_spec(text, mode=mode)
    with Store(path, spec.spec_hash(), spec.name, {"jaxqueue": "test"}, text) as s:
        s.commit_batch(0, [(p.point_id(), p.params(), 0.0) for p in spec.points], _rows(spec, full))
    with Store.open_existing(path) as s:
        return s.rows(), s.meta()


@pytest.fixture
def stores(tmp_path):
    return {
        "pod": _store(tmp_path / "pod.sqlite", POD, full=True),
        "jiq": _store(tmp_path / "jiq.sqlite", JIQ, full=False),
    }


def test_the_schema_is_every_store_column_with_one_type():
    assert [c for c, _ in export.EXPORT_SCHEMA] == list(COLUMNS)
    types = dict(export.EXPORT_SCHEMA)
    assert {c for c, t in types.items() if t == "Int64"} == INTEGER
    assert {c for c, t in types.items() if t == "float64"} == FLOAT
    assert {c for c, t in types.items() if t == "string"} == set(COLUMNS) - INTEGER - FLOAT


def test_parquet_of_two_stores_concatenate(stores, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pd = pytest.importorskip("pandas")
    arrow = {"Int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    constant = pa.schema([(c, arrow[t]) for c, t in export.EXPORT_SCHEMA])
    assert export.parquet_schema() == constant
    tables = []
    for name, (rows, _) in stores.items():
        assert export.export_parquet(rows, tmp_path / f"{name}.parquet") == len(rows)
        table = pq.read_table(tmp_path / f"{name}.parquet")
        assert table.schema.remove_metadata() == constant  # columns, types, order
        tables.append(table)
    both = pa.concat_tables(tables)  # (ArrowInvalid when a store's empty column was null)
    assert both.num_rows == sum(len(rows) for rows, _ in stores.values())
    assert both.schema.remove_metadata() == constant
    frame = pd.concat([pd.read_parquet(tmp_path / f"{n}.parquet") for n in stores])
    assert {c: str(frame[c].dtype) for c in COLUMNS} == dict(export.EXPORT_SCHEMA)
    empty = tmp_path / "empty.parquet"  # a store without rows: the same schema
    assert export.export_parquet([], empty) == 0
    assert pq.read_schema(empty).remove_metadata() == constant


def test_frames_have_the_schema_and_concatenate(stores):
    pd = pytest.importorskip("pandas")
    frames = [export.to_frame(rows) for rows, _ in stores.values()]
    for frame in frames:
        assert list(frame.columns) == list(COLUMNS)
        assert {c: str(frame[c].dtype) for c in COLUMNS} == dict(export.EXPORT_SCHEMA)
    both = pd.concat(frames, ignore_index=True)
    assert {c: str(both[c].dtype) for c in COLUMNS} == dict(export.EXPORT_SCHEMA)
    jiq = frames[1]
    assert jiq["d"].isna().all() and jiq["buffer"].isna().all() and jiq["theory"].isna().all()
    assert frames[0]["d"].tolist() == [2] * len(frames[0]) and frames[0]["buffer"].eq(5).all()


def test_k_of_a_scalar_is_missing_in_csv_parquet_and_frames(stores, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    rows, _ = stores["pod"]
    scalar = [r["metric"] == "mean_response_time" for r in rows]
    assert {r["k"] for r, s in zip(rows, scalar) if s} == {SCALAR_INDEX}  # the store's -1
    text = io.StringIO()
    assert export.export_csv(rows, text) == len(rows)
    from_csv = list(csv.DictReader(io.StringIO(text.getvalue())))
    assert list(from_csv[0]) == list(COLUMNS)
    export.export_parquet(rows, tmp_path / "pod.parquet")
    parquet = pd.read_parquet(tmp_path / "pod.parquet")
    frame = export.to_frame(rows)
    for r, c, p, f, s in zip(rows, from_csv, parquet["k"], frame["k"], scalar):
        if s:
            assert c["k"] == "" and pd.isna(p) and math.isnan(f)
        else:
            assert float(c["k"]) == p == f == r["k"]
    assert parquet["k"].isna().tolist() == scalar == frame["k"].isna().tolist()
    # the CSV's other fields: empty where missing, integers as integers
    first = from_csv[0]
    assert first["d"] == "2" and first["buffer"] == "5" and first["alpha"] == ""
    export.export_csv(rows, tmp_path / "pod.csv")
    assert (tmp_path / "pod.csv").read_bytes().decode() == text.getvalue()


def test_csv_file_is_written_whole_and_named_on_error(stores, tmp_path):
    rows, _ = stores["jiq"]
    with pytest.raises(OSError, match="nowhere"):
        export.export_csv(rows, tmp_path / "nowhere" / "rows.csv")
    out = tmp_path / "rows.csv"
    out.write_text("old")
    assert export.export_csv(rows, out) == len(rows)
    assert out.read_text().startswith("point_id,policy,")


def test_requested_times_from_the_spec_that_ran(tmp_path):
    rows, meta = _store(tmp_path / "pod.sqlite", POD, full=True)
    ids = {r["point_id"] for r in rows}
    times = export.requested_times(meta)
    assert set(times) == ids and set(times.values()) == {(100.0, 20.0)}
    _, quick = _store(tmp_path / "quick.sqlite", POD, full=True, mode="quick")
    assert set(export.requested_times(quick).values()) == {(10.0, 2.0)}  # its mode's hash
    _, jiq = _store(tmp_path / "jiq.sqlite", JIQ, full=False)
    spec = parse_spec(JIQ)
    got = export.requested_times(jiq)
    for p in spec.points:  # an expression: per point; warm-up: the default
        assert got[p.point_id()][0] == pytest.approx(10 * 100**p.alpha)
        assert got[p.point_id()][1] == spec.run.warmup_time
    _, steps = _store(tmp_path / "steps.sqlite", STEPS, full=True)
    assert set(export.requested_times(steps).values()) == {(None, None)}
    # a text that is not the spec that ran (another hash), or none: nothing, not a guess
    assert export.requested_times({**meta, "spec_text": POD.replace("100", "200")}) == {}
    assert export.requested_times({**meta, "spec_text": None}) == {}
    assert export.requested_times(None) == {}


def test_the_dataset_carries_the_requested_times(tmp_path):
    pytest.importorskip("xarray")
    rows, meta = _store(tmp_path / "pod.sqlite", POD, full=True)
    ds = export.to_dataset(rows, meta)
    assert ds.attrs["time"] == 100.0 and ds.attrs["warmup_time"] == 20.0
    assert ds.attrs["steps"] == 1000 and "steps run" in ds.attrs["requested_time"]
    assert "time" not in export.to_dataset(rows).attrs  # without the meta: not known
    rows, meta = _store(tmp_path / "jiq.sqlite", JIQ, full=False)
    ds = export.to_dataset(rows, meta)
    assert ds["time"].dims == ("alpha",) and "time" not in ds.attrs  # 10 N ** alpha
    assert ds["time"].sel(alpha=0.75) == pytest.approx(10 * 100**0.75)
    assert ds.attrs["warmup_time"] == parse_spec(JIQ).run.warmup_time
