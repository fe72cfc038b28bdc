"""A transient result's short repr and notebook table; what a missing optional
package says (the extra to install)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.results.estimates import Estimate
from jaxqueue.results.sweep import SweepResult
from jaxqueue.sim.transient import TransientResult

SETTINGS = dict(
    policy="jiq",
    policy_label="jiq",
    n_servers=20,
    n_dispatchers=2,
    load=0.9,
    buffer=None,
    replicas=8,
    init="empty",
    start_load=None,
    warmup_time=None,
)


def _transient(n_times: int, **settings) -> TransientResult:
    """A result as a transient run returns it, with made-up numbers (nothing is run)."""
    t = np.linspace(0.0, 10.0, n_times)
    rise = 1.0 - np.exp(-t)

    def est(mean):
        return Estimate(mean, np.full_like(mean, 0.01), 8)

    levels = np.stack([np.ones_like(t), rise, rise**2], axis=1)
    return TransientResult(
        times=t,
        tail=est(levels),
        idle_fraction=est(1.0 - rise),
        mean_queue_length=est(rise + rise**2),
        p0=est(rise / 4),
        settings={**SETTINGS, **settings},
    )


def test_a_transient_results_repr_is_a_short_table_by_time():
    text = repr(_transient(5))
    lines = text.splitlines()
    assert lines[0] == (
        "TransientResult: jiq  N=20  M=2  load=0.9  buffer=None  replicas=8  start=empty"
    )
    assert lines[1].startswith("5 times in [0, 10]: mean ± 95% CI half-width")
    assert lines[2].split() == ["time", "idle", "fraction", "mean", "queue", "length", "p0"]
    assert lines[3].split() == "0 1.000 ± 0.010 0.000 ± 0.010 0.000 ± 0.010".split()
    assert len(lines) == 3 + 5 and "array" not in text  # no arrays: the tail stays in the field


def test_a_long_transient_shows_its_first_and_last_times():
    res = _transient(40, start_load=0.5, warmup_time=20.0)
    lines = repr(res).splitlines()
    assert "load=0.5 -> 0.9" in lines[0] and "step after warmup_time=20.0" in lines[0]
    assert lines[3].split()[0] == "0" and lines[-1].split()[0] == "10"
    assert lines[3 + 5].split() == ["..."] * 4 and len(lines) == 3 + 11
    page = res._repr_html_()
    assert page.startswith("<table><caption") and page.count("<tr>") == 1 + 11
    assert "load=0.5 -&gt; 0.9" in page


def test_without_pandas_to_frame_names_the_extra(monkeypatch):
    res = jq.theory.mean_field("random", 0.5)
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'jaxqueue\[frames\]'"):
        res.to_frame()
    with pytest.raises(ImportError, match=r"pip install 'jaxqueue\[frames\]'"):
        SweepResult([res]).to_frame()


def test_without_xarray_to_xarray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxqueue\[xarray\]'"):
        SweepResult([jq.theory.mean_field("random", 0.5)]).to_xarray()
