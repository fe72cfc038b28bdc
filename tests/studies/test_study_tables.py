"""Sensitivity, Paired and SimulatedDesign follow the result conventions: a short repr (their printed
text), an HTML table, records, a pandas frame and an xarray Dataset, each carrying
the numbers the study holds (built here by hand, so nothing is simulated)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from jaxqueue.results.estimates import Estimate
from jaxqueue.studies.crn.design_sim import SimulatedDesign
from jaxqueue.studies.crn.paired import Paired
from jaxqueue.studies.crn.sensitivity import Sensitivity


def _sensitivity(richardson: bool = True) -> Sensitivity:
    d = {
        "mean_response_time": Estimate(4.31, 0.28, 16),
        "waiting_probability": Estimate(1.9, 0.1, 16),
    }
    half = {
        "mean_response_time": Estimate(4.2, 0.3, 16),
        "waiting_probability": Estimate(1.8, 0.2, 16),
    }
    ext = {
        "mean_response_time": Estimate(4.16, 0.4, 16),
        "waiting_probability": Estimate(1.77, 0.3, 16),
    }
    gap = {
        "mean_response_time": Estimate(0.11, 0.05, 16),
        "waiting_probability": Estimate(0.1, 0.2, 16),
    }
    return Sensitivity(
        parameter="load",
        value=0.7,
        h=0.01,
        derivatives=d,
        half_step=half if richardson else {},
        extrapolated=ext if richardson else {},
        gap=gap if richardson else {},
        curved=("mean_response_time",) if richardson else (),
        values=(0.69, 0.71),
        sides=(),
        settings={"policy": "pod", "policy_label": "Pod(2)", "n_servers": 3, "versions": {}},
    )


def _paired() -> Paired:
    return Paired(
        labels=("Pod(2) N=3 load=0.6", "Pod(2) N=3 load=0.7", "Pod(2) N=3 load=0.75"),
        differences=(
            {"mean_response_time": Estimate(0.19, 0.02, 16), "probe_rate": Estimate(0.2, 0.0, 16)},
            {"mean_response_time": Estimate(0.33, 0.03, 16), "probe_rate": Estimate(0.3, 0.0, 16)},
        ),
        unpaired=(
            {"mean_response_time": 0.1, "probe_rate": 0.0},
            {"mean_response_time": 0.12, "probe_rate": 0.0},
        ),
        correlation=(
            {"mean_response_time": 0.9, "probe_rate": math.nan},
            {"mean_response_time": 0.8, "probe_rate": math.nan},
        ),
        coupled=(
            {"mean_response_time": False, "probe_rate": False},
            {"mean_response_time": True, "probe_rate": False},
        ),
        results=(),
        settings={"replicas": 16, "paired_interval": "replicas"},
        pairs=(
            {"mean_response_time": 16, "probe_rate": 16},
            {"mean_response_time": 15, "probe_rate": 16},
        ),
    )


def test_sensitivity_records_frame_and_dataset():
    sens = _sensitivity()
    rows = sens.records()
    assert [r["metric"] for r in rows] == ["mean_response_time", "waiting_probability"]
    first = rows[0]
    assert (first["parameter"], first["value"], first["h"]) == ("load", 0.7, 0.01)
    assert (first["policy"], first["n_servers"]) == ("Pod(2)", 3)
    assert (first["derivative"], first["derivative_ci95"]) == (4.31, 0.28)
    assert (first["half_step"], first["half_step_ci95"]) == (4.2, 0.3)
    assert (first["extrapolated"], first["gap"], first["gap_ci95"]) == (4.16, 0.11, 0.05)
    assert first["curved"] is True and rows[1]["curved"] is False
    frame = sens.to_frame()
    assert frame.shape[0] == 2 and frame["derivative"].tolist() == [4.31, 1.9]
    ds = sens.to_xarray()
    assert list(ds["metric"].values) == ["mean_response_time", "waiting_probability"]
    np.testing.assert_array_equal(ds["half_step_ci95"].values, [0.3, 0.2])
    assert ds["curved"].values.tolist() == [True, False]
    assert ds.attrs["parameter"] == "load" and ds.attrs["h"] == 0.01
    # without the Richardson check the half step is absent: None in rows, NaN in the Dataset
    bare = _sensitivity(richardson=False)
    assert bare.records()[0]["half_step"] is None
    assert np.isnan(bare.to_xarray()["extrapolated"].values).all()


def test_sensitivity_repr_is_its_text_and_html_its_table():
    sens = _sensitivity()
    assert repr(sens) == str(sens)
    assert repr(sens).startswith("d/dload at load = 0.7 (h = 0.01; Pod(2), N = 3")
    assert len(repr(sens)) < 400  # not the dataclass's dump of every field
    html = sens._repr_html_()
    assert "<b>Sensitivity</b>" in html and "<th style='text-align:left'>half_step</th>" in html
    assert html.count("<tr>") == 3 and ">4.31<" in html and ">True<" in html
    assert "half_step" not in _sensitivity(richardson=False)._repr_html_()


def test_paired_records_frame_and_dataset():
    pr = _paired()
    rows = pr.records()
    assert len(rows) == 4
    assert rows[2] == {
        "reference": "Pod(2) N=3 load=0.6",
        "point": "Pod(2) N=3 load=0.75",
        "k": 2,
        "metric": "mean_response_time",
        "difference": 0.33,
        "ci95": 0.03,
        "unpaired_ci95": 0.12,
        "correlation": 0.8,
        "correlation_replicas": 15,
        "coupled": True,
    }
    assert math.isnan(rows[1]["correlation"]) and rows[1]["coupled"] is False
    frame = pr.to_frame()
    assert frame["difference"].tolist() == [0.19, 0.2, 0.33, 0.3]
    ds = pr.to_xarray()
    assert list(ds["point"].values) == ["Pod(2) N=3 load=0.7", "Pod(2) N=3 load=0.75"]
    np.testing.assert_array_equal(ds["difference"].values, [[0.19, 0.2], [0.33, 0.3]])
    np.testing.assert_array_equal(ds["correlation_replicas"].values, [[16, 16], [15, 16]])
    assert ds["coupled"].values.tolist() == [[False, False], [True, False]]
    assert ds.attrs["reference"] == "Pod(2) N=3 load=0.6"
    assert pr["mean_response_time", 2].mean == 0.33


def test_paired_repr_is_its_text_and_html_its_table():
    pr = _paired()
    assert repr(pr) == str(pr)
    assert repr(pr).startswith("differences from Pod(2) N=3 load=0.6 (common random numbers, 16")
    html = pr._repr_html_()
    assert "<b>Paired</b>" in html and html.count("<tr>") == 5
    assert ">0.33<" in html and ">-<" in html  # the probe rate's correlation: none


def _design() -> SimulatedDesign:
    return SimulatedDesign(
        metric="mean_response_time",
        target=3.0,
        load=0.83,
        check=Estimate(3.05, 0.04, 32),
        root=Estimate(0.828, 0.002, 32),
        slope=Estimate(21.0, 1.5, 32),
        mean_field=0.8346,
        steps=1_000_000,
        history=((0.8346, 3.2, 20.0, 16), (0.82, 2.9, 21.0, 32)),
        settings={"policy_label": "Pod(2)", "n_servers": 10, "versions": {}},
    )


def test_a_design_records_frame_dataset_and_repr():
    des = _design()
    rows = des.records()
    assert rows[1] == {
        "iteration": 1,
        "metric": "mean_response_time",
        "target": 3.0,
        "load": 0.82,
        "value": 2.9,
        "slope": 21.0,
        "replicas": 32,
    }
    assert des.to_frame()["value"].tolist() == [3.2, 2.9]
    ds = des.to_xarray()
    np.testing.assert_array_equal(ds["load"].values, [0.8346, 0.82])
    assert (ds.attrs["root"], ds.attrs["root_ci95"], ds.attrs["mean_field"]) == (
        0.828,
        0.002,
        0.8346,
    )
    assert (ds.attrs["check"], ds.attrs["check_ci95"], ds.attrs["load"]) == (3.05, 0.04, 0.83)
    assert (ds.attrs["metric"], ds.attrs["target"]) == ("mean_response_time", 3.0)
    np.testing.assert_array_equal(ds["replicas"].values, [16, 32])
    assert math.isnan(dataclasses.replace(des, mean_field=None).to_xarray().attrs["mean_field"])
    assert repr(des) == str(des)
    assert repr(des).startswith("largest load with mean_response_time <= 3: Pod(2), N = 10")
    assert len(repr(des)) < 400  # not the dataclass's dump of every field
    html = des._repr_html_()
    assert "<b>SimulatedDesign</b>" in html and html.count("<tr>") == 3 and ">2.9<" in html


def test_the_table_extras_are_named_when_missing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "xarray", None)  # an import of it fails
    with pytest.raises(ImportError, match=r"pip install 'jaxqueue\[xarray\]'"):
        _paired().to_xarray()
    with pytest.raises(ImportError, match=r"pip install 'jaxqueue\[xarray\]'"):
        _sensitivity().to_xarray()


def test_to_dict_holds_every_point_and_estimate():
    """The JSON form: each compared point its own coupling flags and intervals; a
    sensitivity's four tables under their names."""
    out = _paired().to_dict()
    assert out["reference"] == "Pod(2) N=3 load=0.6" and len(out["points"]) == 2
    second = out["points"][1]
    assert second["label"] == "Pod(2) N=3 load=0.75"
    assert second["coupled"] == {"mean_response_time": True, "probe_rate": False}
    assert out["points"][0]["coupled"] == {"mean_response_time": False, "probe_rate": False}
    assert second["differences"]["mean_response_time"]["mean"] == 0.33
    assert second["unpaired_ci95"]["mean_response_time"] == 0.12
    assert second["correlation"] == {"mean_response_time": 0.8, "probe_rate": None}
    assert second["correlation_replicas"]["mean_response_time"] == 15
    sens = _sensitivity().to_dict()
    assert (sens["parameter"], sens["value"], sens["h"]) == ("load", 0.7, 0.01)
    for table, mean in (("derivatives", 4.31), ("half_step", 4.2), ("extrapolated", 4.16)):
        assert sens[table]["mean_response_time"]["mean"] == mean, table
    assert sens["gap"]["waiting_probability"]["ci95"] == 0.2
    assert sens["curved"] == ["mean_response_time"] and sens["values"] == [0.69, 0.71]
    assert "versions" not in sens["settings"]


def test_a_paired_refusal_names_paired():
    import jaxqueue as jq

    with pytest.raises(
        TypeError, match=r"^paired\(\) got an unexpected keyword argument 'replicaz'"
    ):
        jq.paired("pod", [0.5, 0.6], 3, replicaz=4)
