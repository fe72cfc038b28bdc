"""Exports of a result store beyond CSV: a pandas frame (:func:`to_frame`), Parquet, and an
xarray Dataset with the grid's axes as dimensions (:func:`to_dataset`, :func:`export_netcdf`).

All carry the store's rows (:data:`~jaxqueue.studies.store.COLUMNS`) unchanged; the
Dataset's layout and the extras each needs: docs/sweeps.md (Exports); the names and the
encoding of an infinite buffer: docs/vocabulary.md. A file is written whole or not at all
(:func:`~jaxqueue.studies.store.replacing`), and a write's OSError (a full disk) names it.
"""

from __future__ import annotations

import json

import numpy as np

from jaxqueue.studies.store import COLUMNS, replacing

__all__ = ["to_frame", "export_parquet", "to_dataset", "export_netcdf", "DIMENSIONS"]

#: Candidate dimensions of :func:`to_dataset`, in order.
DIMENSIONS = (
    "policy",
    "n_servers",
    "ratio",
    "n_dispatchers",
    "buffer",
    "load",
    "alpha",
    "beta",
    "d",
    "z",
    "order",
    "service",
    "pools",
    "arrivals",
)
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
    try:
        return __import__(module)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"this export needs {module}: pip install 'jaxqueue[{extra}]'"
        ) from None


def to_frame(rows: list[dict]):
    """The rows as a pandas DataFrame with the store's columns (extra ``frames``)."""
    pd = _need("pandas", "frames")
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


def export_parquet(rows: list[dict], path) -> int:
    """Write the rows as a Parquet file (extra ``parquet``); returns the row count."""
    _need("pyarrow", "parquet")
    frame = to_frame(rows)
    with replacing(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return len(frame)


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
        rows: store rows (:meth:`~jaxqueue.studies.store.Store.rows`).
        meta: the store's meta (:meth:`~jaxqueue.studies.store.Store.meta`),
            recorded in the attributes (spec name, hash and versions).
    """
    xr = _need("xarray", "xarray")
    frame = to_frame(rows)
    frame["buffer"] = frame["buffer"].astype("float64").fillna(_NO_BUFFER)
    for key in ("d", "z"):
        frame[key] = frame[key].fillna(-1).astype("int64")
    frame["order"] = frame["order"].fillna("")
    frame["service"] = frame["service"].fillna("exp")
    frame["pools"] = frame["pools"].fillna("")
    frame["arrivals"] = frame["arrivals"].fillna("poisson")
    dims, coords = _dimensions(frame)
    frame["policy"] = _policy_names(frame, dims)
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
