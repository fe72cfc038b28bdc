"""Exports of a result store: a pandas frame (:func:`to_frame`), Parquet
(:func:`export_parquet`), CSV (:func:`export_csv`), and an xarray Dataset with the grid's
axes as dimensions (:func:`to_dataset`, :func:`export_netcdf`).

The frame, Parquet and CSV carry the store's rows in one fixed schema whatever the store
holds (:data:`EXPORT_SCHEMA`: every column of :data:`~jaxqueue.studies.grids.store.COLUMNS`,
each of one type; ``k`` of a scalar metric is missing, not the store's -1), so the
exports of different stores combine. The Dataset's layout, the requested run lengths it
carries (:func:`requested_times`) and the extras each export needs: docs/sweeps.md
(Exports); the names and the encoding of an infinite buffer: docs/vocabulary.md. A file
is written whole or not at all (:func:`~jaxqueue.studies.grids.store.replacing`), and a
write's OSError (a full disk) names it.
"""

from __future__ import annotations

import csv
import json
import math
import warnings

import numpy as np

from jaxqueue.results.display import optional_import
from jaxqueue.studies.grids.store import COLUMNS, PARAMETER_COLUMNS, SCALAR_INDEX, replacing

__all__ = [
    "to_frame",
    "export_parquet",
    "export_csv",
    "parquet_schema",
    "requested_times",
    "to_dataset",
    "export_netcdf",
    "DIMENSIONS",
    "EXPORT_SCHEMA",
    "REQUESTED",
]

_INTEGER, _FLOAT, _STRING = "Int64", "float64", "string"
_COLUMN_TYPES = {
    "point_id": _STRING,
    "policy": _STRING,
    "n_servers": _INTEGER,
    "n_dispatchers": _INTEGER,
    "ratio": _FLOAT,
    "load": _FLOAT,
    "alpha": _FLOAT,
    "beta": _FLOAT,
    "d": _INTEGER,
    "z": _INTEGER,
    "order": _STRING,
    "buffer": _INTEGER,
    "service": _STRING,
    "pools": _STRING,
    "arrivals": _STRING,
    "metric": _STRING,
    "k": _FLOAT,
    "mean": _FLOAT,
    "ci95": _FLOAT,
    "theory": _FLOAT,
    "refined": _FLOAT,
    "replicas": _INTEGER,
    "steps": _INTEGER,
    "warmup": _INTEGER,
    "warmup_passed": _INTEGER,
    "seed": _INTEGER,
}
#: The schema of the frame, Parquet and CSV exports, the same for every store:
#: ``(column, pandas dtype)`` for each of :data:`~jaxqueue.studies.grids.store.COLUMNS`, in
#: order; ``"Int64"`` (pandas' nullable integers; Parquet int64), ``"float64"`` (Parquet
#: double) or ``"string"`` (Parquet string). Every column may be missing (null/NaN, an
#: empty CSV field): an unset parameter, an infinite buffer, no theory value, and ``k``
#: of a scalar metric (the store's table keeps -1 there).
EXPORT_SCHEMA = tuple((column, _COLUMN_TYPES[column]) for column in COLUMNS)
_ARROW_TYPES = {_INTEGER: "int64", _FLOAT: "float64", _STRING: "string"}
#: The requested run lengths of a point (:func:`requested_times`), in time units.
REQUESTED = ("time", "warmup_time")

#: Candidate dimensions of :func:`to_dataset`, in order.
DIMENSIONS = PARAMETER_COLUMNS
#: A finite stand-in for an infinite buffer while the Dataset is built (pandas
#: indexes drop NaN); the Dataset's ``buffer`` then holds NaN there.
_NO_BUFFER = -1.0
_INDEX_DIM = {
    "tail": "k",
    "occupancy": "k",
    "arrival_seen": "k",
    "iqueue_distribution": "iqueue_size",
    "response_quantile": "quantile",
}


def _need(module: str, extra: str):
    """The module, or a one-line ModuleNotFoundError naming the extra that installs it."""
    return optional_import(module, extra, "this export")


def _records(rows: list[dict]):
    """The rows as a pandas DataFrame of the store's columns, types as pandas infers them
    (what :func:`to_dataset` works on)."""
    pd = _need("pandas", "frames")
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


def to_frame(rows: list[dict]):
    """The rows as a pandas DataFrame of :data:`EXPORT_SCHEMA` (extra ``frames``): the
    store's columns, each of its fixed dtype, ``k`` NaN for a scalar metric."""
    frame = _records(rows).astype(dict(EXPORT_SCHEMA))
    frame["k"] = frame["k"].mask(frame["k"] == SCALAR_INDEX)
    return frame


def parquet_schema():
    """:data:`EXPORT_SCHEMA` as a ``pyarrow.Schema``, the schema of every Parquet export
    (extra ``parquet``)."""
    pa = _need("pyarrow", "parquet")
    return pa.schema([(c, getattr(pa, _ARROW_TYPES[t])()) for c, t in EXPORT_SCHEMA])


def export_parquet(rows: list[dict], path) -> int:
    """Write the rows as a Parquet file of :func:`parquet_schema` (extra ``parquet``);
    returns the row count. Files of different stores concatenate
    (``pyarrow.concat_tables``, ``pandas.concat``)."""
    pa = _need("pyarrow", "parquet")
    import pyarrow.parquet as pq

    frame = to_frame(rows)
    table = pa.Table.from_pandas(frame, schema=parquet_schema(), preserve_index=False)
    with replacing(path) as tmp:
        pq.write_table(table, tmp)
    return len(frame)


def _csv_value(column: str, value) -> str | int | float:
    """A value as :func:`export_csv` writes it: empty when missing (``k`` of a scalar
    metric too), else of its column's type."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    kind = _COLUMN_TYPES[column]
    if column == "k" and float(value) == SCALAR_INDEX:
        return ""
    return int(value) if kind == _INTEGER else float(value) if kind == _FLOAT else str(value)


def export_csv(rows: list[dict], path) -> int:
    """Write the rows as CSV of :data:`EXPORT_SCHEMA` (a header of the columns; a missing
    value, ``k`` of a scalar metric included, is an empty field) to ``path``, a file name
    (replaced whole: :func:`~jaxqueue.studies.grids.store.replacing`) or an open text stream;
    returns the row count. Needs no extra."""

    def write(f):
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([_csv_value(c, r.get(c)) for c in COLUMNS])

    if hasattr(path, "write"):
        write(path)
    else:
        with replacing(path) as tmp, open(tmp, "w", newline="") as f:
            write(f)
    return len(rows)


def requested_times(meta: dict | None, point_ids=None) -> dict:
    """The run lengths the spec asked for, per point: ``{point_id: (time, warmup_time)}``
    in time units (None where the spec gives ``steps`` or ``warmup`` instead), or ``{}``
    where they cannot be recovered for sure.

    A store records the measured steps, not the requested time; they are read from the
    spec text its meta keeps (``spec_text``), parsed in each mode (none, ``[quick]``,
    ``[gpu]``, ``[cpu]``), and taken from the mode whose hash is the store's
    (``spec_hash``), which also proves the text is the spec that ran. A spec with
    arrivals files cannot be hashed from its text alone: its times are taken only if
    every mode that holds all of ``point_ids`` gives them the same times.

    Args:
        meta: the store's meta (:meth:`~jaxqueue.studies.grids.store.Store.meta`).
        point_ids: the store's point ids (only for a spec with arrivals files).
    """
    meta = meta or {}
    text, want = meta.get("spec_text"), meta.get("spec_hash")
    if not text or not want:
        return {}
    from jaxqueue.studies.grids.spec import MODES, parse_spec  # (imports JAX: only when asked)

    unverified = []
    for mode in (None, *MODES):
        try:
            with warnings.catch_warnings():  # (an old spelling's warning: not the export's)
                warnings.simplefilter("ignore")
                spec = parse_spec(text, name=meta.get("spec_name"), mode=mode)
        except (ValueError, TypeError):  # a mode the spec lacks; a text this version refuses
            continue
        try:
            same = spec.spec_hash() == want
        except ValueError:  # its arrivals files were not read (no folder): no hash
            unverified.append(spec)
            continue
        if same:
            return _times(spec)
    if point_ids is None or not unverified:
        return {}
    ids = set(point_ids)
    found = [{p: t[p] for p in ids} for t in map(_times, unverified) if ids <= set(t)]
    return found[0] if found and all(t == found[0] for t in found[1:]) else {}


def _times(spec) -> dict:
    """``{point_id: (time, warmup_time)}`` of a parsed spec (None: not given in time)."""
    out = {}
    for point in spec.points:
        pair = []
        for key in REQUESTED:
            try:
                units = spec.run.time_units(key, point)
            except ValueError:  # an expression that does not hold at the point
                units = None
            pair.append(None if units is None else float(units))
        out[point.point_id()] = tuple(pair)
    return out


def _dimensions(frame) -> tuple[list[str], list[str]]:
    """The dimensions, and the parameters that vary but follow others (coordinates)."""
    skip = {
        "n_dispatchers" if frame["ratio"].nunique() <= frame["n_dispatchers"].nunique() else "ratio"
    }
    if frame["alpha"].notna().any() or frame["beta"].notna().any():
        skip.add("load")
    for key in ("d", "z", "order"):  # an option fixed per policy goes into the policy's name
        if frame.groupby("policy")[key].nunique(dropna=False).max() <= 1:
            skip.add(key)
    dims = [k for k in DIMENSIONS if k not in skip and frame[k].nunique(dropna=False) > 1]
    coords = [
        k
        for k in ("ratio", "n_dispatchers", "load")
        if k in skip and frame[k].nunique(dropna=False) > 1
    ]
    return dims, coords


def _policy_names(frame, dims: list[str]):
    """``pod(d=2)`` for a policy whose options are not dimensions; the name otherwise."""

    def name(row):
        opts = [
            f"{k}={row[k]}" for k in ("d", "z", "order") if k not in dims and row[k] not in (-1, "")
        ]
        return f"{row['policy']}({','.join(opts)})" if opts else row["policy"]

    return frame.apply(name, axis=1)


def to_dataset(rows: list[dict], meta: dict | None = None):
    """The rows as an xarray Dataset with the grid's axes as dimensions (extra ``xarray``).

    Args:
        rows: store rows (:meth:`~jaxqueue.studies.grids.store.Store.rows`).
        meta: the store's meta (:meth:`~jaxqueue.studies.grids.store.Store.meta`),
            recorded in the attributes (spec name, hash and versions), and the
            source of the requested ``time`` and ``warmup_time``
            (:func:`requested_times`): attributes when one value holds for every
            point, else coordinates over the dimensions they vary with.
    """
    xr = _need("xarray", "xarray")
    frame = _records(rows)
    frame["buffer"] = frame["buffer"].astype("float64").fillna(_NO_BUFFER)
    for key in ("d", "z"):
        frame[key] = frame[key].fillna(-1).astype("int64")
    frame["order"] = frame["order"].fillna("")
    frame["service"] = frame["service"].fillna("exp")
    frame["pools"] = frame["pools"].fillna("")
    frame["arrivals"] = frame["arrivals"].fillna("poisson")
    dims, coords = _dimensions(frame)
    frame["policy"] = _policy_names(frame, dims)
    requested = requested_times(meta, frame["point_id"].unique()) if meta else {}
    constant = {}
    for i, key in enumerate(REQUESTED):  # the spec's time and warmup_time, where recovered
        values = frame["point_id"].map(lambda pid, i=i: requested.get(pid, (None, None))[i])
        values = values.astype("float64")
        if values.isna().all():
            continue
        frame[key] = values
        if values.nunique(dropna=False) == 1:
            constant[key] = float(values.iloc[0])
        else:
            coords.append(key)
    parts = []
    for metric, group in frame.groupby("metric", sort=True):
        extra = _INDEX_DIM.get(metric)
        g = group.copy()
        index = dims + ([extra] if extra else [])
        if extra:
            g[extra] = g["k"].astype("float64" if extra == "quantile" else "int64")
        g = g.drop_duplicates(subset=index)
        cols = g.set_index(index)[["mean", "ci95", "theory", "refined"]]
        cols = cols.rename(
            columns={
                "mean": metric,
                "ci95": f"{metric}_ci95",
                "theory": f"{metric}_theory",
                "refined": f"{metric}_refined",
            }
        )
        parts.append(xr.Dataset.from_dataframe(cols.astype("float64")))
    ds = xr.merge(parts, join="outer", compat="no_conflicts") if parts else xr.Dataset()
    for key in coords:  # a parameter that follows some dimensions (M from N and r, ...)
        over = list(dims)
        for dim in dims:  # keep only the dimensions it depends on
            rest = [d for d in over if d != dim]
            if rest and frame.groupby(rest)[key].nunique(dropna=False).max() <= 1:
                over = rest
        values = frame.drop_duplicates(subset=over).set_index(over)[key]
        ds = ds.assign_coords({key: xr.DataArray.from_series(values)})
    attrs = {}
    for key in DIMENSIONS + ("replicas", "steps", "warmup", "seed"):
        if key not in dims and key not in coords and frame[key].nunique(dropna=False) == 1:
            value = frame[key].iloc[0]
            if key == "buffer":
                value = np.nan if value == _NO_BUFFER else value
            elif value is None or value != value:
                value = "none"
            attrs[key] = value
    attrs.update(constant)
    if constant or any(key in coords for key in REQUESTED):
        attrs["requested_time"] = (
            "time and warmup_time: the run lengths the spec asked for, in time units; "
            "steps and warmup: the steps run (in whole blocks)"
        )
    attrs["missing_option"] = "-1 on d and z, '' on order: the policy does not take it"
    attrs["buffer_nan"] = "NaN on buffer means an infinite buffer"
    if "buffer" in ds.coords:
        ds = ds.assign_coords(buffer=ds["buffer"].where(ds["buffer"] != _NO_BUFFER))
    if meta:
        attrs.update(
            spec_name=meta.get("spec_name", ""),
            spec_hash=meta.get("spec_hash", ""),
            versions=json.dumps(meta.get("versions", {}), sort_keys=True),
            versions_accepted=json.dumps(meta.get("versions_accepted", []), sort_keys=True),
        )
    ds.attrs.update({k: (v.item() if hasattr(v, "item") else v) for k, v in attrs.items()})
    return ds


def export_netcdf(rows: list[dict], path, meta: dict | None = None) -> int:
    """Write :func:`to_dataset` as netCDF (engine h5netcdf; extra ``xarray``); returns rows."""
    _need("h5netcdf", "xarray")
    ds = to_dataset(rows, meta)
    with replacing(path) as tmp:
        ds.to_netcdf(tmp, engine="h5netcdf")
    return len(rows)
