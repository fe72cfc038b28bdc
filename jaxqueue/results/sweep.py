"""The results of a sweep: a list of results, one per load, that also gives
one table for all loads (rows, a pandas frame, an xarray Dataset).
"""

from __future__ import annotations

import numpy as np

from jaxqueue.results.display import optional_import
from jaxqueue.results.schema import POOL_METRICS, split_pool_row_metric

__all__ = ["SweepResult", "dimension_of"]

#: The dimension of each indexed metric's rows in :meth:`SweepResult.to_xarray`.
DIMENSIONS = {
    "response_quantile": "quantile",
    "tail": "k",
    "occupancy": "k",
    "arrival_seen": "k",
    "iqueue_distribution": "iqueue_size",
    **{name: "pool" for name in POOL_METRICS},
}


def dimension_of(metric: str) -> str | None:
    """The index dimension of a :meth:`~jaxqueue.results.schema.Result.records`
    metric (``None`` for a scalar metric): ``k`` (the queue length),
    ``quantile``, ``pool`` or ``iqueue_size`` (as the store's Dataset,
    :func:`jaxqueue.studies.grids.export.to_dataset`)."""
    pool_row = split_pool_row_metric(metric)
    if pool_row is not None:  # pool0_occupancy by k, pool1_response_quantile by quantile
        return "k" if pool_row[0] == "occupancy" else "quantile"
    return DIMENSIONS.get(metric)


class SweepResult(list):
    """One result per load, in order (a list: index it, iterate it), and
    the whole sweep as one table: :meth:`records`, :meth:`to_frame` (with a
    ``load`` column) and :meth:`to_xarray` (``load`` a dimension)."""

    def records(self) -> list[dict]:
        """Every result's :meth:`~jaxqueue.results.schema.Result.records`, in
        load order; each row names its load (and size)."""
        return [row for res in self for row in res.records()]

    def to_frame(self):
        """:meth:`records` as one pandas DataFrame (extra ``frames``)."""
        pd = optional_import("pandas", "frames")
        return pd.DataFrame(self.records())

    def to_xarray(self):
        """The sweep as an xarray Dataset (extra ``xarray``): each metric a
        variable over ``load`` (and its index: ``k``, ``quantile``,
        ``pool``, ``iqueue_size``), its half-width beside it as
        ``{metric}_ci95``; ``n_servers`` and ``n_dispatchers`` are
        coordinates along ``load``. NaN where a load has no such entry."""
        xr = optional_import("xarray", "xarray")
        loads = [res.settings["load"] for res in self]
        values: dict[str, dict] = {}
        for j, res in enumerate(self):
            for row in res.records():
                per_index = values.setdefault(row["metric"], {})
                per_index.setdefault(row["k"], {})[j] = (row["mean"], row["ci95"])
        coords: dict[str, list] = {}
        for name, per_index in values.items():
            dim = dimension_of(name)
            if dim is not None:
                coords[dim] = sorted(set(coords.get(dim, [])) | set(per_index))
        data = {}
        for name, per_index in values.items():
            dim = dimension_of(name)
            index = coords[dim] if dim is not None else [None]
            table = np.full((2, len(self), len(index)), np.nan)
            for k, i in enumerate(index):
                for j, (mean, half) in per_index.get(i, {}).items():
                    table[:, j, k] = (mean, np.nan if half is None else half)
            dims = ("load",) if dim is None else ("load", dim)
            shape = (len(self),) if dim is None else (len(self), len(index))
            data[name] = (dims, table[0].reshape(shape))
            data[f"{name}_ci95"] = (dims, table[1].reshape(shape))
        along = {
            key: ("load", [res.settings.get(key) for res in self])
            for key in ("n_servers", "n_dispatchers")
        }
        ds = xr.Dataset(data, coords={"load": loads, **coords, **along})
        if self:
            first = self[0]
            ds.attrs.update(source=first.source, policy=str(first.settings.get("policy_label")))
        return ds

    def __repr__(self) -> str:
        return "\n\n".join(repr(res) for res in self) if self else "SweepResult([])"

    def _repr_html_(self) -> str:
        return "".join(res._repr_html_() for res in self)
