"""Results pleasant in Python: an Estimate's text, interval ends and arithmetic
with a number, the dict names, a result's short repr and HTML, the explicit
signatures of simulate and sweep, and a sweep as one frame.

One tiny sweep (JIQ, N = 20, M = 2, two loads, 4 replicas, 20 blocks) serves
the whole module; its warm-up diagnostic passes at both loads (fixed seed).
"""

from __future__ import annotations

import inspect
import json
import math
import sys

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.exact import solve_exact
from jaxqueue.results.display import format_metric
from jaxqueue.results.sweep import SweepResult
from jaxqueue.theory import mean_field

LOADS = [0.5, 0.8]


@pytest.fixture(scope="module")
def swept():
    return jq.simulate("jiq", LOADS, 20, 2, replicas=4, steps=20 * BLOCK, seed=1)


# --- Estimate -------------------------------------------------------------------------------


def test_an_estimate_formats_both_numbers_with_the_spec():
    est = jq.Estimate(1.44612, 0.02534, 8)
    assert f"{est:.3f}" == format(est, ".3f") == "1.446 ± 0.025"
    assert f"{est:.2e}" == "1.45e+00 ± 2.53e-02"
    # the default: the half-width to two significant digits, the mean to as many decimals
    assert str(est) == f"{est}" == "1.446 ± 0.025"
    assert str(jq.Estimate(12345.6, 230.0, 4)) == "12346 ± 230"
    assert str(jq.Estimate(1e-7, 1e-9, 4)) == "1e-07 ± 1e-09"
    assert str(jq.Estimate(0.5, math.nan, 1)) == "0.5 ± nan"


def test_ends_float_and_arithmetic_with_a_number():
    est = jq.Estimate(1.44612, 0.02534, 8)
    assert (est.lo, est.hi, float(est)) == (1.44612 - 0.02534, 1.44612 + 0.02534, 1.44612)
    # a shift keeps the half-width; a scale by c multiplies it by |c|; n stays
    for got, mean, half in [
        (est - 1.0, 1.44612 - 1.0, 0.02534),
        (1.0 - est, 1.0 - 1.44612, 0.02534),
        (est + 2, 1.44612 + 2, 0.02534),
        (2 * est, 2 * 1.44612, 2 * 0.02534),
        (est * -3.0, -3.0 * 1.44612, 3.0 * 0.02534),
        (np.float64(2.0) * est, 2 * 1.44612, 2 * 0.02534),
        (est / 2, 1.44612 / 2, 0.02534 / 2),
        (est / -4, 1.44612 / -4, 0.02534 / 4),
        (-est, -1.44612, 0.02534),
    ]:
        assert isinstance(got, jq.Estimate) and (got.mean, got.ci95, got.n) == (mean, half, 8)
    vec = jq.Estimate(np.array([1.0, 0.5]), np.array([0.0, 0.1]), 4)
    scaled = -2 * vec
    assert np.array_equal(scaled.mean, [-2.0, -1.0]) and np.array_equal(scaled.ci95, [0.0, 0.2])


def test_arithmetic_between_estimates_says_why_it_is_refused():
    a, b = jq.Estimate(1.0, 0.1, 8), jq.Estimate(0.5, 0.1, 8)
    for op in (lambda: a - b, lambda: a + b, lambda: a * b, lambda: a / b):
        with pytest.raises(TypeError, match="correlated.*paired replicas"):
            op()
    with pytest.raises(TypeError):
        a * np.array([1.0, 2.0])  # a plain number only
    with pytest.raises(TypeError):
        1.0 / a  # not a linear map: no exact interval


def test_to_dict_round_trips_and_the_older_names_still_work():
    one = jq.Estimate(1.25, 0.5, 4)
    assert one.to_dict() == one.to_json() == {"mean": 1.25, "ci95": 0.5, "n": 4}
    back = jq.Estimate.from_dict(json.loads(json.dumps(one.to_dict())))
    assert (back.mean, back.ci95, back.n) == (1.25, 0.5, 4)
    vec = jq.Estimate(np.array([1.0, math.nan]), np.array([0.1, math.nan]), np.array([4, 0]))
    data = json.loads(json.dumps(vec.to_dict()))
    assert data == {"mean": [1.0, None], "ci95": [0.1, None], "n": [4, 0]}
    for again in (jq.Estimate.from_dict(data), jq.Estimate.from_json(data)):
        assert np.array_equal(again.mean, vec.mean, equal_nan=True)
        assert np.array_equal(again.ci95, vec.ci95, equal_nan=True)
        assert np.array_equal(again.n, vec.n)


def test_a_vector_estimate_stays_readable():
    mean = np.linspace(1.0, 0.0, 40)
    vec = jq.Estimate(mean, np.full(40, 0.01), 4)
    text = str(vec)
    assert text.startswith("[1.000 ± 0.010, 0.974 ± 0.010, ") and ", ..., " in text
    assert text.count("±") == 6 and len(text) < 200
    assert f"{vec:.1f}".startswith("[1.0 ± 0.0, ")
    shown = repr(vec)
    assert shown.startswith("Estimate(shape=(40,), mean=[") and "..." in shown and len(shown) < 250
    assert repr(jq.Estimate(1.5, 0.25, 4)) == "Estimate(mean=1.5, ci95=0.25, n=4)"


# --- results --------------------------------------------------------------------------------


def test_a_results_repr_is_the_short_table(swept):
    res = swept[0]
    text = repr(res)
    assert len(text) < 1500, len(text)
    first = text.splitlines()[0]
    assert first.startswith("SimulationResult: jiq  N=20  M=2  load=0.5  ")
    assert "replicas=4" in first
    line = f"  {'mean_response_time':24s} {format_metric(res.mean_response_time)}"
    assert line in text.splitlines() and "±" in line
    assert "response p99 " in text and "warm-up diagnostic       passed" in text
    page = res._repr_html_()
    assert page.startswith("<table>") and page.endswith("</table>")
    assert "<td style='text-align:left'>mean_response_time</td>" in page
    assert format_metric(res.mean_response_time) in page


def test_mean_field_and_exact_results_have_the_short_repr_too():
    exact = solve_exact("jiq", 0.6, 4, 2, buffer=3)
    text = repr(exact)
    assert text.startswith("ExactResult: jiq  N=4  M=2  load=0.6  buffer=3  (")
    assert f"  {'p0':24s} {exact.p0:.6g}" in text.splitlines() and len(text) < 1500
    mf = mean_field("pod", 0.9, d=2)
    text = repr(mf)
    assert text.startswith("MeanFieldResult: pod(d=2)  load=0.9") and len(text) < 1500
    assert "<caption" in mf._repr_html_() and "<caption" in exact._repr_html_()


def test_simulate_and_sweep_have_explicit_keywords():
    sim, swp = inspect.signature(jq.simulate), inspect.signature(jq.sweep)
    keywords = {
        name: p.default
        for name, p in swp.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert {"replicas", "steps", "warmup", "seed", "init", "backend", "time"} <= set(keywords)
    assert keywords["replicas"] == 32 and keywords["init"] == "auto"
    for name, default in keywords.items():
        par = sim.parameters[name]
        assert par.kind is inspect.Parameter.KEYWORD_ONLY and par.default == default, name
    for sig in (sim, swp):  # every option shown by name (generated from the fields); none hidden
        var = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert var == []
    with pytest.raises(TypeError, match=r"simulate\(\) got .* 'replica'; did you mean 'replicas'"):
        jq.simulate("pod", [0.5], 10, replica=2)


def test_a_sweep_is_a_list_and_one_frame(swept):
    assert isinstance(swept, SweepResult) and isinstance(swept, list) and len(swept) == 2
    assert [r.settings["load"] for r in swept] == LOADS
    assert swept.records() == swept[0].records() + swept[1].records()
    frame = swept.to_frame()
    assert len(frame) == len(swept.records()) and sorted(set(frame["load"])) == LOADS
    row = frame[(frame["load"] == 0.8) & (frame["metric"] == "mean_response_time")]
    assert row["mean"].item() == swept[1].mean_response_time.mean
    assert "jiq  N=20  M=2  load=0.8" in repr(swept) and swept._repr_html_().count("<table>") == 2


def test_a_sweep_as_an_xarray_dataset(swept, monkeypatch):
    pytest.importorskip("xarray")
    ds = swept.to_xarray()
    assert list(ds["load"].values) == LOADS and list(ds["n_servers"].values) == [20, 20]
    assert ds["mean_queue_length"].dims == ("load",)
    assert ds["mean_queue_length_ci95"].values[1] == swept[1].mean_queue_length.ci95
    assert ds["tail"].dims == ("load", "k")
    assert ds["tail"].sel(load=0.5).values[1] == swept[0].tail.mean[1]
    assert ds["response_quantile"].sel(load=0.8, quantile=0.99).item() == (
        swept[1].response_quantiles[0.99].mean
    )
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(ImportError, match=r"jaxqueue\[xarray\]"):
        swept.to_xarray()
