"""The registry knows everything about every policy: a new policy that forgets a path fails here.

For each name in ``jaxqueue.available()``: a simulator path, a mean-field path
(or an explicit reason for none), an exact-CTMC rule, a docstring naming its
paper, a level bound, and a command-line name with a flag for every option.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import _parser
from jaxqueue.core.system import System
from jaxqueue.exact import RULES
from jaxqueue.policies import REFERENCES, option_names
from jaxqueue.policies.base import ENGINES
from jaxqueue.theory.generic import meanfield

NAMES = jq.available()


def test_registry_lists_every_policy_of_the_papers():
    assert set(NAMES) == {
        "random",
        "jsq",
        "pod",
        "i1f",
        "jiq",
        "jiq-pod",
        "jiq-sq",
        "idle-first",
        "jiq-original",
        "jiq-threshold",
        "jsew",
    }


@pytest.mark.parametrize("name", NAMES)
def test_policy_declares_every_path(name):
    policy = jq.make(name)
    cls = type(policy)
    assert policy.name == name and jq.make(policy) is policy
    # simulator path
    assert policy.engine in ENGINES
    if policy.engine == "occupancy":
        system = System(
            10, 1 if policy.single_dispatcher else 2, None, 8, 4 if policy.uses_iqueues else 0
        )
        policy.validate(system)
        assert policy.route_words(system) >= 0 and len(policy.draws(system)) >= 1
    else:
        assert isinstance(policy.threshold, int) and isinstance(policy.delete_requests, bool)
    # mean-field path, or an explicit "no mean field"
    kind = policy.mean_field_kind()
    assert kind in ("closed-form", "generic", "none", "tagged-server", "composition")
    if kind == "none":
        assert policy.no_mean_field and len(policy.no_mean_field) > 20
        with pytest.raises(NotImplementedError, match="no mean field"):
            theory.mean_field(name, 0.5, 2.0)
    elif kind in ("tagged-server", "composition"):
        mf = theory.mean_field(name, 0.5, 2.0)
        assert mf.diagnostics["busy_fraction_error"] < 1e-12
    elif kind == "closed-form":
        mf = theory.mean_field(name, 0.5, 2.0)
        assert 1.0 <= mf.mean_response_time <= 2.0 and mf.source == "mean-field"
    else:  # the generic drift traces (solved in test_meanfield; no compile here)
        limit = meanfield.limit_system(policy, 2.0, 8, 6)
        x = jax.ShapeDtypeStruct((limit.levels + limit.iqueue_levels,), jnp.float32)
        out = jax.eval_shape(lambda y: meanfield.drift(y, 0.5, 2.0, policy, limit), x)
        assert out.shape == x.shape
    # exact CTMC path
    rule, opts = policy.exact_rule()
    assert rule in RULES and set(opts) <= {"d", "z", "order"}
    # a paper: known references, cited in the docstring by authors and id
    assert cls.__doc__ and policy.references
    for key in policy.references:
        short, full = REFERENCES[key]
        assert short.split()[0] in cls.__doc__, (name, key)
    assert any(
        venue in cls.__doc__ for venue in ("arXiv:", "Lu et al.", "IEEE", "Operations Research")
    )
    # a level bound
    d, with_p0 = policy.tail_bound()
    assert d >= 1 and isinstance(with_p0, bool)
    # a command-line name, and a flag for each option
    for cmd in ("simulate", "theory", "exact"):
        argv = [cmd, "--policy", name, "--load", "0.5", "--servers", "4"]
        argv = argv if cmd != "theory" else argv[:-2]
        value = {"order": "fifo"}
        for opt in option_names(name):
            argv += [f"--{opt}", value.get(opt, "1")]
        args = _parser().parse_args(argv)
        assert args.policy == name
        assert all(getattr(args, opt) == (value.get(opt, 1)) for opt in option_names(name))


@pytest.mark.parametrize("name", NAMES)
def test_options_are_never_dropped(name):
    taken = set(option_names(name))
    for opt in {"d", "z"} - taken:
        with pytest.raises(ValueError, match=f"takes no option {opt}"):
            jq.make(name, **{opt: 2})
    policy = jq.make(name)
    with pytest.raises(ValueError, match="disagree"):
        jq.make(policy, d=99, z=99)
    assert set(policy.options()) == taken
    assert all(f.name in taken for f in dataclasses.fields(policy) if f.init)


@pytest.mark.slow
def test_defaults_agree_across_simulator_theory_and_exact():
    from jaxqueue.exact import solve_exact

    assert jq.make("pod").options() == {"d": 2}
    assert theory.mean_field("pod", 0.7).settings["options"] == {"d": 2}
    assert solve_exact("pod", 0.7, 3).settings["options"] == {"d": 2}
    pod2 = theory.mean_field("pod", 0.7, d=2).mean_response_time
    assert theory.mean_field("pod", 0.7).mean_response_time == pod2
    assert theory.mean_field("random", 0.7).mean_response_time > pod2


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: " + ", ".join(NAMES)):
        jq.make("jsqq")


def test_idle_else_random_is_declared_by_idle_first_with_one_probe_only():
    """The declaration the level bounds read (runs/bounds.py tested an isinstance before)."""
    from jaxqueue.policies import available, make

    assert make("idle-first", d=1).idle_else_random()
    assert not make("idle-first", d=2).idle_else_random()
    others = [n for n in available() if n != "idle-first"]
    assert not any(make(n).idle_else_random() for n in others)
