"""Bounded work, said before it is done, and user metrics that say what they are.

* ``simulate`` (the command and ``jq.simulate``) estimates a run's replica-steps, its
  time on 2 CPU cores (the measured rates ``sweep --plan`` uses) and the memory of its
  replica state before anything compiles, and says so in one line when the run is
  large (past a day: how to make it smaller); a small run says nothing new.
* ``sweep --plan`` prints the replica-state memory of its largest batch.
* A user metric that is infinite or undefined in visited states is reported as such
  (inf or NaN, not the mean of the samples left), with one line naming it.
* A bad ``--metric`` or ``[metrics]`` entry is one line naming the metric and what is
  allowed, before anything compiles.
"""

import json
import warnings

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import api
from jaxqueue.cli import main as cli_main
from jaxqueue.core.progress import duration
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.user_metrics import UserMetricWarning
from jaxqueue.policies import make
from jaxqueue.results.simulation import user_metric_samples
from jaxqueue.runs import estimates, planner
from jaxqueue.runs.estimates import (
    CPU_RATES,
    RunEstimate,
    RunSizeWarning,
    size_note,
    size_text,
)
from jaxqueue.sim import runner
from jaxqueue.studies.grids import batching
from jaxqueue.studies.grids.spec import load_spec

#: A small run: N = 10, four replicas of a few blocks (a second or two to compile and run).
SMALL = ["--policy", "jsq", "--servers", "10", "--load", "0.5", "--replicas", "4"]
SMALL += ["--steps", "1024", "--warmup", "256", "--levels", "8"]
GUARD = "guard the expression where it is undefined, e.g. where(s[3] > 0, 1/s[3], 0) for 1/s[3]"


class _Stopped(RuntimeError):
    """Raised where a run would start: what came before it is what the test reads."""


@pytest.fixture
def no_run(monkeypatch):
    """``jq.simulate`` (and the command) plan, then stop where the run would start; the
    host's memory is not asked (a large plan is not refused on a small machine)."""

    def stop(*args, **kwargs):
        raise _Stopped("stopped before the run")

    monkeypatch.setattr(api.runner, "run", stop)
    monkeypatch.setattr(planner, "host_memory", lambda: None)


@pytest.fixture
def no_compile(monkeypatch):
    """Every error below comes before anything steps (or compiles) a replica."""

    def no_steps(*args, **kwargs):
        raise AssertionError("the check must come before any compilation")

    monkeypatch.setattr(runner, "run_blocks", no_steps)


# -- a run's size, said before it runs ---------------------------------------------------


def test_a_small_run_says_nothing_new(capsys):
    """The typical run (and a guarded metric) prints nothing on stderr and warns of nothing."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = jq.simulate(
            "jsq",
            0.5,
            10,
            replicas=4,
            steps=1024,
            warmup=256,
            levels=8,
            metrics={"busy": "s[1]", "guarded": "where(s[3] > 0, 1/s[3], 0)"},
        )
    assert [str(w.message) for w in seen] == []
    assert np.isfinite(res.user_metrics["guarded"].mean)
    assert cli_main(["simulate", *SMALL, "--metric", "busy=s[1]"]) == 0
    assert capsys.readouterr().err == ""


def test_a_large_run_says_its_size_before_it_runs(no_run):
    """Pod(2) at N = 1000, 10^5 replicas of 10^4 time units: 1.9e12 replica-steps, hours
    on 2 CPU cores by the measured rates; the replica state is (levels + 1) int32 words
    and two of the (absent) I-queues' a replica."""
    with pytest.warns(RunSizeWarning) as said, pytest.raises(_Stopped):
        jq.simulate("pod", 0.9, 1000, replicas=10**5, time=1e4)
    plan = planner.plan("pod", [0.9], 1000, replicas=10, time=1e4)  # (the same sizes)
    steps = (plan.warmup_blocks + plan.measure_blocks) * BLOCK
    levels = plan.system.levels
    seconds = steps * 10**5 / (CPU_RATES["plain"] * min(1.0, 12 / levels)) + CPU_RATES["compile_s"]
    state = 10**5 * 4 * (levels + 1 + 2)
    assert len(said) == 1
    assert str(said[0].message) == (
        f"a large run: {10**5 * steps:.3g} replica-steps ({10**5} replicas x {steps} steps, "
        f"warm-up included), about {duration(seconds)} on 2 CPU cores by the measured "
        f"rates, {size_text(state)} of replica state"
    )
    assert said[0].filename == __file__  # pointed at the caller of jq.simulate


@pytest.mark.filterwarnings("always::jaxqueue.runs.estimates.RunSizeWarning")
def test_past_a_day_it_says_how_to_make_it_smaller(no_run, capsys):
    """10^6 replicas of 10^4 time units: about two days; the command names its flags."""
    with pytest.warns(RunSizeWarning, match="more than a day") as said, pytest.raises(_Stopped):
        jq.simulate("pod", 0.9, 1000, replicas=10**6, time=1e4)
    text = str(said[0].message)
    assert "(1.85 days) on 2 CPU cores by the measured rates" in text, text
    assert text.endswith(
        "make it smaller with fewer replicas (replicas=), a shorter window "
        "(time= or steps=), or run it on a GPU"
    ), text
    argv = ["simulate", "--policy", "pod", "--servers", "1000", "--load", "0.9"]
    assert cli_main([*argv, "--replicas", "1000000", "--time", "10000"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: this run is estimated at more than a day: 1.92e+13 ")
    assert err[0].endswith(
        "fewer replicas (--replicas), a shorter window (--time or --steps), or run it on a GPU"
    )
    assert err[1:] == ["error: stopped before the run"]


def test_what_a_run_is_said_to_cost():
    """The thresholds: ten minutes on 2 CPU cores, 1 GiB of state; a GPU run is said by
    its memory alone (the time estimate is the CPU's)."""
    assert size_note(RunEstimate(128, 10**6, estimates.NOTE_SECONDS, 10**6)) is None
    slow = RunEstimate(128, 10**6, estimates.NOTE_SECONDS + 1, 10**6)
    assert size_note(slow).startswith("a large run: 1.28e+08 replica-steps (128 replicas x")
    assert size_note(slow, on_cpu=False) is None
    big = RunEstimate(10**7, 256, 30.0, 2**31)
    assert size_note(big) == (
        "a large run: 2.56e+09 replica-steps (10000000 replicas x 256 steps, warm-up "
        "included), about 30 s on 2 CPU cores by the measured rates, 2.0 GiB of replica "
        "state; fewer replicas (replicas=) take less memory"
    )
    assert "CPU" not in size_note(big, on_cpu=False)
    assert "(--replicas)" in size_note(big, spelling="cli")
    assert [size_text(b) for b in (512, 3 * 2**10, 42 * 2**20, 1.25 * 2**30)] == [
        "512 B",
        "3.0 KiB",
        "42 MiB",
        "1.2 GiB",
    ]


def test_the_memory_is_the_state_layout():
    """Queues, I-queue tails and their listed servers, classes, per-server lists, a clock."""
    jiq = planner.plan("jiq", [0.9], 100, 10, replicas=2, steps=256, levels=20, iqueue_levels=12)
    assert estimates.state_array_bytes(jiq.system, jiq.policy, 3) == 3 * 4 * (21 + 2 * 13)
    per = planner.plan("jiq-original", [0.9], 100, 10, replicas=2, steps=256)
    s = per.system
    words = s.levels + 1 + 2 * (s.iqueue_levels + 1) + 2 * 100 + 10 * (s.iqueue_levels + 2)
    assert estimates.state_array_bytes(s, per.policy) == 4 * words


def test_simulate_and_sweep_plan_share_the_measured_rates():
    assert batching.CPU_RATES is estimates.CPU_RATES
    assert batching.LATENCY_REPLICAS is estimates.LATENCY_REPLICAS


SPEC = """name = "sizes"
[grid]
policy = ["pod", "jiq"]
n_servers = [100]
n_dispatchers = [10]
load = [0.5, 0.9]
[run]
replicas = 4
steps = 1024
warmup = 256
"""


def test_sweep_plan_prints_the_memory_of_its_largest_batch(tmp_path, capsys):
    spec = tmp_path / "sizes.toml"
    spec.write_text(SPEC)
    store = str(tmp_path / "sizes.sqlite")
    assert cli_main(["sweep", str(spec), "--plan", "--store", store, "--json"]) == 0
    groups = {g["policy"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    spec_ = load_spec(str(spec))
    for points in batching.shape_groups(spec_).values():
        pol = make(points[0].policy, **dict(points[0].options))
        levels, iq = batching.group_bounds(points)
        group = groups[pol.label()]
        words = levels + 1 + 2 * ((iq or 0) + 1)
        assert group["batch_replicas"] == 8  # both loads in one batch of 4 replicas each
        assert group["batch_state_bytes"] == group["batch_replicas"] * 4 * words, pol.label()
    assert cli_main(["sweep", str(spec), "--plan", "--store", store]) == 0
    jiq = groups["jiq"]
    assert (
        f"largest batch: 8 replicas of jiq, about {size_text(jiq['batch_state_bytes'])} of "
        "replica state" in capsys.readouterr().out.splitlines()
    )


# -- user metrics infinite or undefined in visited states --------------------------------


def _sums(time_sums, arrival_sums, accepted):
    """Window sums of one user metric over replicas (:func:`user_metric_samples`' input)."""
    return {
        "steps": np.full(len(time_sums), 100),
        "seen": np.stack([np.asarray(accepted), np.zeros(len(accepted))], axis=1),
        "user": np.stack([time_sums, arrival_sums], axis=1)[:, :, None],
    }


def test_a_metric_undefined_in_some_replicas_is_not_their_mean_without_them():
    """Two replicas never visited the state where ``x`` is undefined: the average is still
    undefined (NaN in every sample), not the mean of those two; one line says so."""
    sums = _sums([np.nan, 20.0, 30.0], [5.0, 6.0, 7.0], [10, 10, 10])
    with pytest.warns(UserMetricWarning) as said:
        out = user_metric_samples(sums, [("x", "x_per_arrival")])
    assert np.all(np.isnan(out["x"])) and np.allclose(out["x_per_arrival"], [0.5, 0.6, 0.7])
    assert [str(w.message) for w in said] == [
        f"metric 'x' is infinite or undefined in some visited states: its time average (x) "
        f"is nan; {GUARD}"
    ]
    with pytest.warns(UserMetricWarning, match=r"its per-arrival average \(x_per_arrival\) is inf"):
        out = user_metric_samples(
            _sums([1.0, 2.0], [np.inf, 3.0], [4, 4]), [("x", "x_per_arrival")]
        )
    assert np.all(out["x_per_arrival"] == np.inf)
    with pytest.warns(UserMetricWarning, match=r"\(x\) is nan"):  # +inf and -inf: undefined
        out = user_metric_samples(
            _sums([np.inf, -np.inf], [1.0, 1.0], [4, 4]), [("x", "x_per_arrival")]
        )
    assert np.all(np.isnan(out["x"]))


def test_a_window_without_arrivals_is_not_an_undefined_metric():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = user_metric_samples(_sums([1.0, 2.0], [0.0, 3.0], [0, 4]), [("x", "x_per_arrival")])
    assert np.isnan(out["x_per_arrival"][0]) and out["x_per_arrival"][1] == 0.75


@pytest.mark.filterwarnings("default::jaxqueue.core.user_metrics.UserMetricWarning")
def test_the_command_says_which_metric_was_undefined(capsys):
    """``1/s[3]`` at load 0.5 and N = 10: s[3] = 0 nearly always; its averages are NaN
    and one line on stderr names it; the other metrics stand."""
    argv = ["simulate", *SMALL, "--metric", "x=1/s[3]", "--metric", "ok=s[1]"]
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "warning: metric 'x' is infinite or undefined in some visited states: its time "
        f"average (x) is nan and its per-arrival average (x_per_arrival) is nan; {GUARD}"
    ]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["x"] == ["nan"] and rows["x_per_arrival"] == ["nan"]
    assert rows["ok"][1] == "±"


# -- bad metrics: one line, naming the metric and what it may be -------------------------


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("", "error: metric 'x': an expression must be a non-empty string, not ''"),
        (
            "s[999]",
            "error: metric 'x': expression 's[999]': the subscript s[999] is out of range: s "
            "has 9 entries here, need 0 <= k <= 8 (or -9 <= k <= -1, from the end); a larger "
            "levels tracks longer queues",
        ),
        (
            "s[1:]",
            "error: metric 'x' must give a scalar (one number), not an array of shape (8,): "
            "reduce it with sum(), max() or min(), or take one entry (s[1])",
        ),
        (
            "N[0]",
            "error: metric 'x' ('N[0]') cannot be evaluated: Too many indices: array is "
            "0-dimensional, but 1 were indexed (s and q have 9 entries (s[0] to s[8]); N, M "
            "and load are numbers; a metric gives one number)",
        ),
        ("min(s[1:0])", "error: metric 'x' ('min(s[1:0])') cannot be evaluated: zero-size"),
        ("iq[1]", "error: metric 'x' reads iq, but jsq has no I-queues: it may read s, q, N, M"),
        ("s[N]", "error: metric 'x': expression 's[N]': subscripts and slice bounds must be"),
    ],
)
def test_a_bad_metric_is_one_line_before_anything_compiles(no_compile, capsys, expr, says):
    assert cli_main(["simulate", *SMALL, "--metric", f"x={expr}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says), err


@pytest.mark.parametrize(
    ("expr", "plan", "says"),
    [
        ("s[1:]", False, "error: metric 'x' must give a scalar (one number)"),
        ("s[999]", False, "error: metric 'x': expression 's[999]': the subscript s[999] is out"),
        ("iq[1]", True, "error: metric 'x' reads iq, but pod(d=2) has no I-queues"),
    ],
)
def test_a_bad_spec_metric_is_one_line_before_anything_compiles(
    no_compile, tmp_path, capsys, expr, plan, says
):
    """``iq`` without I-queues is refused for the whole grid (``--plan`` too); what needs
    the level bounds at the batch's plan, before it compiles."""
    spec = tmp_path / "bad.toml"
    spec.write_text(SPEC + f'[metrics]\nx = "{expr}"\n')
    argv = ["sweep", str(spec), "--store", str(tmp_path / "bad.sqlite")]
    assert cli_main(argv + (["--plan"] if plan else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says), err


def test_an_empty_metric_is_named_in_python_too():
    with pytest.raises(ValueError, match=r"^metric 'x': an expression must be a non-empty"):
        jq.simulate("jsq", 0.5, 10, replicas=2, steps=256, metrics={"x": " "})
