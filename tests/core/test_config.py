"""The frozen configuration types (jaxqueue.core.config): Model, RunOptions, Bounds.

Every entry point takes them, and its keywords are a thin layer over them:
the same run either way gives the same result, bit for bit; a field given
twice or unknown is a TypeError that names it, before anything compiles.
"""

import dataclasses
import inspect

import pytest

import jaxqueue as jq
from jaxqueue.core.config import BOUND_KEYS, MODEL_KEYS, RUN_KEYS, Bounds, Model, RunOptions
from jaxqueue.core.rng import BLOCK
from jaxqueue.exact import solve_exact
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.studies.grids.spec import parse_spec

#: One small run (a shape the suite compiles anyway: Pod(2), N = 10).
KW = dict(replicas=4, steps=4 * BLOCK, warmup=BLOCK, seed=3, init="empty", levels=12)


def test_types_are_frozen_hashable_and_lists_become_tuples():
    model = Model("pod", [10, 20], [1, 1], d=2, pools=[(0.5, 2.0), (0.5, 1.0)])
    assert model.n_servers == (10, 20) and model.pools == ((0.5, 2.0), (0.5, 1.0))
    assert hash(model) == hash(Model("pod", (10, 20), (1, 1), d=2, pools=((0.5, 2.0), (0.5, 1.0))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.d = 3
    assert model.replace(d=3).d == 3 and model.d == 2
    assert model.options() == {"d": 2} and Model("jiq-original", 10, order="fifo").options() == {
        "order": "fifo"
    }
    assert RunOptions(steps=[BLOCK, 2 * BLOCK]).steps == (BLOCK, 2 * BLOCK)
    assert Bounds(12).keywords() == {"levels": 12, "iqueue_levels": None}


def test_defaults_are_the_keyword_apis():
    """RunOptions() and Bounds() are what the keywords default to (api.simulate and the plan)."""
    shown = inspect.signature(jq.simulate).parameters
    for key in RUN_KEYS + BOUND_KEYS:
        default = getattr(RunOptions(), key) if key in RUN_KEYS else getattr(Bounds(), key)
        assert shown[key].default == default, key
        assert shown[key].kind is inspect.Parameter.KEYWORD_ONLY
    assert RunOptions().batches == runner.BATCHES
    sweep_keys = set(inspect.signature(jq.simulate).parameters)
    assert set(MODEL_KEYS) - {"policy", "n_servers", "n_dispatchers"} <= sweep_keys
    assert set(RUN_KEYS) | set(BOUND_KEYS) <= sweep_keys


def test_simulate_takes_a_model_and_gives_the_keywords_result():
    kw = dict(KW)
    levels = kw.pop("levels")
    by_keywords = jq.simulate("pod", 0.9, 10, d=2, levels=levels, **kw)
    model = Model("pod", 10, d=2)
    by_types = jq.simulate(model, 0.9, run=RunOptions(**kw), bounds=Bounds(levels))
    mixed = jq.simulate(model, 0.9, levels=levels, **kw)  # a Model with run keywords
    for res in (by_types, mixed):
        assert res.mean_response_time.mean == by_keywords.mean_response_time.mean
        assert (res.tail.mean == by_keywords.tail.mean).all()
    p = planner.plan(model, [0.9], run=RunOptions(**kw), bounds=Bounds(levels))
    assert p == planner.plan("pod", [0.9], 10, d=2, levels=levels, **kw)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda m: jq.simulate(m, 0.9, 10),
            r"simulate\(\): n_servers given beside a Model: set it in "
            r"the Model \(model.replace\(n_servers=...\)\)",
        ),
        (
            lambda m: jq.simulate(m, 0.9, d=3, buffer=4),
            r"simulate\(\): buffer, d given beside a Model",
        ),
        (
            lambda m: jq.simulate(m, 0.9, run=RunOptions(), replicas=8),
            r"simulate\(\): replicas given beside run=: set it in the RunOptions",
        ),
        (lambda m: jq.simulate(m, 0.9, bounds=Bounds(), levels=8), r"levels given beside bounds="),
        (lambda m: jq.simulate(m, 0.9, run={"replicas": 8}), r"run= takes a RunOptions, got dict"),
        (lambda m: jq.simulate("pod", 0.9), r"simulate\(\) needs n_servers \(or a Model"),
        (
            lambda m: jq.simulate("pod", 0.9, 10, step=5),
            r"simulate\(\) got an unexpected keyword argument 'step'; did you mean 'steps'\?",
        ),
        (
            lambda m: planner.plan(m, [0.9], replica=2),
            r"plan\(\) got an unexpected keyword "
            r"argument 'replica'; did you mean 'replicas'\?",
        ),
        (lambda m: planner.plan_model("pod", [0.9]), r"plan_model\(\) takes a Model, got str"),
        (lambda m: solve_exact(m, 0.5, d=2), r"solve_exact\(\): d given beside a Model"),
        (lambda m: jq.transient(m, 0.5, 10, times=[1.0]), r"transient\(\): n_servers given beside"),
    ],
)
def test_a_field_given_twice_or_unknown_is_named(call, message):
    with pytest.raises(TypeError, match=message):
        call(Model("pod", 10, d=2))


def test_exact_and_transient_take_a_model():
    model = Model("jiq", 4, 2, buffer=3)
    assert solve_exact(model, 0.6).p0 == solve_exact("jiq", 0.6, 4, 2, buffer=3).p0
    with pytest.raises(ValueError, match="solve_exact: the model has arrivals"):
        solve_exact(model.replace(arrivals="day.csv"), 0.6)
    kw = dict(times=[0.5, 2.0], replicas=4, seed=1, levels=12)
    by_types = jq.transient(
        Model("pod", 10, d=2), 0.8, bounds=Bounds(12), times=kw["times"], replicas=4, seed=1
    )
    by_keywords = jq.transient("pod", 0.8, 10, d=2, **kw)
    assert (by_types.tail.mean == by_keywords.tail.mean).all()
    with pytest.raises(ValueError, match="transient: the model has arrivals"):
        jq.transient(Model("pod", 10, arrivals="day.csv"), 0.8, times=[1.0])


def test_a_spec_point_has_its_model():
    spec = parse_spec(
        '[grid]\npolicy = [{ name = "jiq-pod", d = 3 }]\nn_servers = [100]\n'
        "ratio = [10]\nload = [0.9]\nbuffer = [5]\n[run]\nreplicas = 4\ntime = 10\n"
    )
    (point,) = spec.points
    assert spec.model(point) == Model("jiq-pod", 100, 10, d=3, buffer=5)


def test_values_from_the_command_lines_flags():
    """``from_namespace`` takes the fields a namespace has under their own names, the
    given ones over them, the rest at their defaults; the simulate command's flags
    give every run option it has a flag for."""
    import argparse

    from jaxqueue.cli.parser import build_parser

    ns = argparse.Namespace(replicas=4, seed=2, steps=None, servers=10, metrics=["x=s[1]"])
    assert RunOptions.from_namespace(ns, metrics=None) == RunOptions(replicas=4, seed=2)
    args = build_parser().parse_args(
        ["simulate", "--policy", "pod", "--servers", "10", "--load", "0.5", "--replicas", "8"]
        + ["--seed", "3", "--interval", "batch-means", "--backend", "xla", "--init", "empty"]
    )
    run = RunOptions.from_namespace(args, metrics=None)
    assert (run.replicas, run.seed, run.interval, run.backend, run.init) == (
        8,
        3,
        "batch-means",
        "xla",
        "empty",
    )
    assert Bounds.from_namespace(args) == Bounds()


def test_an_option_is_declared_once_and_shown_where_it_is_taken():
    """The keywords of simulate are generated from the fields: each field's
    documentation appears in simulate's docstring (and sweep's signature is
    simulate's); a keyword given at its default beside ``run=`` still counts
    as given (only what the caller passes is an option)."""
    doc = jq.simulate.__doc__
    assert "<options>" not in doc
    for f in dataclasses.fields(RunOptions) + dataclasses.fields(Bounds):
        words = " ".join(f.metadata["doc"].split()[:6])
        assert f"{f.name}: {words}" in " ".join(doc.split()), f.name
    assert (
        list(inspect.signature(jq.sweep).parameters)[4:]
        == list(inspect.signature(jq.simulate).parameters)[4:]
    )
    with pytest.raises(TypeError, match="replicas given beside run="):
        jq.simulate("pod", 0.9, 10, run=RunOptions(), replicas=RunOptions().replicas)
    with pytest.raises(TypeError, match="unexpected keyword argument 'replica'; did you mean"):
        jq.simulate("pod", 0.9, 10, replica=4)


def test_every_entry_point_shows_its_options_documented():
    """Each entry point that takes options as fields shows every one in its
    signature and its docstring (no marker left), and every option field has
    its documentation."""
    from jaxqueue import theory
    from jaxqueue.studies.compare import compare

    for f in (
        dataclasses.fields(Model) + dataclasses.fields(RunOptions) + dataclasses.fields(Bounds)
    ):
        if f.name not in ("policy", "n_servers", "n_dispatchers"):
            assert len(f.metadata.get("doc", "")) > 20, f.name
    entries = (jq.simulate, jq.transient, compare, solve_exact, theory.mean_field)
    entries += (theory.fixed_point, theory.transient, theory.refined_mean_field)
    for fn in entries:
        doc, shown = " ".join(fn.__doc__.split()), inspect.signature(fn).parameters
        assert "<options>" not in doc, fn.__name__
        for name in fn.option_names:
            assert shown[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn.__name__, name)
            assert f"{name}: " in doc, (fn.__name__, name)
