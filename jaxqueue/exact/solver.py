"""Exact stationary metrics of a small system: :func:`solve_exact`.

Checks every input (:mod:`~jaxqueue.exact.inputs`), builds the policy's chain
(:mod:`~jaxqueue.exact.chain`), solves it (:mod:`~jaxqueue.exact.linalg`),
grows the truncation of infinite buffers until the mass cut off is below
``tol``, and reports (:mod:`~jaxqueue.exact.metrics`). The model, the
derivations and the costs: docs/exact.md.
"""

from __future__ import annotations

import math
import warnings

from jaxqueue.core.config import Model, check_options, split_keywords, takes_options
from jaxqueue.core.service import exponential
from jaxqueue.exact import linalg
from jaxqueue.exact.chain import Chain, PhaseChain, enumerate_states, estimate_states
from jaxqueue.exact.inputs import Inputs, at_least, resolve
from jaxqueue.exact.metrics import chain_metrics, exact_result
from jaxqueue.exact.result import ExactResult
from jaxqueue.policies.base import Policy

__all__ = ["solve_exact", "REFUSED_MASS"]


def _solve_bounded(inputs: Inputs, cap, symmetry, max_states):
    """Solve the chain with queues bounded by ``cap``: ``(metrics, diagnostics)``
    of :func:`~jaxqueue.exact.metrics.chain_metrics`, in the time unit of the
    chain's rates (the mean service time for exp(1) service)."""
    rule, n, m, lam = inputs.rule, inputs.n, inputs.m, inputs.load
    opts = inputs.options
    d, z = opts.get("d", 1), opts.get("z", 0)
    law = inputs.law if inputs.phases or inputs.pools is not None else None
    if inputs.pools is not None:
        chain = PhaseChain(rule, n, m, lam, d, z, cap, symmetry, law or exponential(), inputs.pools)
    elif law is None:
        chain = Chain(rule, n, m, lam, d, z, cap, symmetry, order=opts.get("order", "random"))
    else:
        chain = PhaseChain(rule, n, m, lam, d, z, cap, symmetry, law)
    states, rows, cols, vals, rewards = enumerate_states(chain, max_states)
    linalg.check_irreducible(len(states), rows, cols)
    pi = linalg.stationary(len(states), rows, cols, vals)
    decoded = [chain.decode(s) for s in states]
    return chain_metrics(chain, decoded, pi, rewards, lam, inputs.buffer, law, inputs.pools)


def _estimate(inputs: Inputs, bound, symmetry):
    """The rough state count of :func:`~jaxqueue.exact.chain.estimate_states` at ``bound``."""
    opts, law, pools = inputs.options, inputs.law, inputs.pools
    n_phases = law.n_phases if inputs.phases else 1
    pool_phases = None
    if pools is not None:
        pool_phases = [(p.count, (p.law or law or exponential()).n_phases) for p in pools]
    return estimate_states(
        inputs.rule,
        inputs.n,
        inputs.m,
        opts.get("z", 0),
        bound,
        symmetry,
        opts.get("order", "random"),
        n_phases,
        pool_phases,
    )


#: An automatic bound that leaves more than this mass at the bound is refused, not warned of.
REFUSED_MASS = 1e-4


def _search_bound(solve, estimate, tol, budget, z):
    """Grow the queue bound until the mass at the bound is ``<= tol``, within ``budget`` states.

    Args:
        solve: ``bound -> (metrics, diagnostics)``.
        estimate: ``bound -> rough state count`` (:func:`~jaxqueue.exact.chain.estimate_states`).
        tol: target truncated mass.
        budget: state budget (counts are extrapolated from the last solve).
        z: the threshold (the first bound is above it).

    Returns:
        ``(bound, metrics, diagnostics, reached)``: the last solve, and whether
        it reached ``tol``.
    """

    def largest_bound(b0, n0):
        e0 = estimate(b0)
        b = b0
        while n0 * estimate(b + 1) / e0 <= budget:
            b += 1
            if b >= 1_000_000:
                break
        return b

    bound = max(8, z + 2)
    while bound > 1 and estimate(bound) > budget:
        bound -= 1
    history = []
    for _ in range(12):
        metrics, diag = solve(bound)
        solved = bound
        mass = diag["truncated_mass"]
        if mass <= tol:
            return solved, metrics, diag, True
        # The mass at the bound decays about geometrically in the bound:
        # extrapolate, with the decay rate from the last two solves, or at
        # first from the middle of the tail (its last steps are bent by the bound).
        history.append((bound, mass))
        if len(history) >= 2 and history[-2][1] > mass > 0:
            (b1, m1), (b2, m2) = history[-2:]
            ratio = (m2 / m1) ** (1.0 / (b2 - b1))
        else:
            s = metrics["tail"]
            lo, hi = max(1, bound // 2), bound - 1
            ratio = (s[hi] / s[lo]) ** (1.0 / (hi - lo)) if hi > lo and s[hi] > 0 else 0.5
        ratio = min(max(ratio, 1e-6), 0.999)
        extra = math.ceil(math.log(tol / mass) / math.log(ratio)) + 2
        new = min(largest_bound(bound, diag["n_states"]), bound + max(2, extra))
        if new <= bound:
            break
        bound = new
    return solved, metrics, diag, False


@takes_options("d", "z", "order", "buffer", "service", "pools")
def solve_exact(
    policy: str | Policy | Model,
    load: float,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    queue_bound: int | None = None,
    symmetry: bool = True,
    tol: float = 1e-9,
    max_states: int = 200_000,
    default_max_states: int = 20_000,
    **options,
) -> ExactResult:
    """Exact stationary metrics of a small system, by solving its Markov chain.

    Args:
        policy: a registered policy name (:func:`jaxqueue.policies.available`)
            or a :class:`~jaxqueue.policies.Policy`; resolved with
            ``make(policy, d=d, z=z, order=order)``. Its ``exact_rule()`` names
            the chain. Or a :class:`~jaxqueue.core.config.Model`, which then
            holds the sizes, ``d``, ``z``, ``order``, ``buffer``, ``service``
            and ``pools`` (Poisson arrivals; giving one of them beside it is
            an error).
        load: ``lambda > 0``, arrivals per server per unit time; ``< 1`` when
            ``buffer`` is ``None`` (with a service law or pools: below the
            capacity, ``1 / mean`` or :func:`~jaxqueue.core.service.capacity`).
        n_servers: ``N >= 1``.
        n_dispatchers: ``1 <= M <= N``.
        queue_bound: truncation level for infinite buffers (``>= 1``); by
            default chosen so that ``truncated_mass <= tol`` within
            ``default_max_states`` states (a warning says if it cannot).
        <options>
            In the exact chain: ``d`` probes of ``pod``, ``jiq-pod``,
            ``idle-first`` (``1 <= d <= N``) or sampled I-queues of
            ``jiq-sq``, ``jiq-original`` (``1 <= d <= M``); a service law
            other than exp(1) or pools solve the phase-type chain
            (:class:`~jaxqueue.exact.chain.PhaseChain`), for the policies of
            :data:`~jaxqueue.exact.chain.PHASE_RULES` (not ``jiq-original``,
            ``jiq-threshold``); infinite buffers then need the load below
            the capacity. Times are in the unit of the law's rates; the law
            is recorded as ``settings["service"]`` and the pools as
            ``settings["pools"]`` (a list of ``{"servers", "speed",
            "service"}``), with the pools' metrics (docs/exact.md).
        symmetry: lump states by server and dispatcher relabelling (exact).
        tol: target truncated mass when ``queue_bound`` is chosen here.
        max_states: hard cap on the reachable state count.
        default_max_states: state budget of the automatic ``queue_bound``.

    Returns:
        :class:`~jaxqueue.exact.result.ExactResult`.

    Raises:
        ValueError: a parameter out of range (the message names it and the
            valid range), an unknown policy, an option the policy does not
            take, an invalid service law or one the policy does not take,
            invalid pools or pools for a policy that does not take them, a
            load at or above the capacity with infinite buffers, or too many
            states. Raised before any work, but for the state count.
        TypeError: a count that is not an int, a load that is not a number,
            a service that is not None, a PhaseType or a string, pools that
            are not a string or a sequence.

        RuntimeError: the automatic ``queue_bound`` leaves more than
            :data:`REFUSED_MASS` at the bound within ``default_max_states`` states.

    Warns:
        UserWarning: the automatic ``queue_bound`` could not reach ``tol``
            within ``default_max_states`` states, but the mass at it is at most
            :data:`REFUSED_MASS` (the result is returned, with its ``truncated_mass``).

    Example:
        >>> res = solve_exact("jiq", 0.6, 4, 2, queue_bound=10)
        >>> res.n_states, round(res.p0, 4)
        (1068, 0.4648)
        >>> res = solve_exact("jsq", 0.5, 1, queue_bound=40)
        >>> round(res.mean_response_time, 6)  # M/M/1: 1 / (1 - lambda)
        2.0
        >>> res = solve_exact("random", 0.5, 1, service="erlang:2")
        >>> round(res.mean_response_time, 6)  # M/E2/1, Pollaczek-Khinchine: 1 + 0.5 * 1.5 / 1
        1.75
    """
    check_options("solve_exact", options, solve_exact)
    model = split_keywords(
        policy, n_servers, n_dispatchers, options, where="solve_exact", run_keys=()
    )[0]
    if model.arrivals is not None:
        raise ValueError(
            "solve_exact: the model has arrivals, and the exact chain is that of "
            "Poisson arrivals; use arrivals=None"
        )
    inputs = resolve(model, load, queue_bound)
    max_states = at_least("max_states", max_states, 1)
    default_max_states = at_least("default_max_states", default_max_states, 1)
    if not (isinstance(tol, (int, float)) and 0.0 < tol < 1.0):
        raise ValueError(f"tol={tol!r} is out of range: need 0 < tol < 1")
    if inputs.buffer is not None or inputs.queue_bound is not None:
        return _solve_fixed(inputs, symmetry, max_states)

    bound, metrics, diag, reached = _search_bound(
        lambda cap: _solve_bounded(inputs, cap, symmetry, max_states),
        lambda b: _estimate(inputs, b, symmetry),
        tol,
        min(max_states, default_max_states),
        inputs.options.get("z", 0),
    )
    if not reached:
        _short_of_tol(inputs, diag, tol, bound, default_max_states)
    return exact_result(inputs, bound, symmetry, metrics, diag)


def _solve_fixed(inputs: Inputs, symmetry, max_states):
    """The solve at the buffer or the given queue bound."""
    buffer = inputs.buffer
    cap = buffer if buffer is not None else inputs.queue_bound
    # refused before the enumeration (which takes minutes past 10^5 states): the estimate
    # over m! (it does not divide out the relabelling of dispatchers) is below the count
    count = _estimate(inputs, cap, symmetry)
    if count // math.factorial(inputs.m) > max_states:
        raise ValueError(
            f"{'buffer' if buffer is not None else 'queue_bound'}={cap}: about "
            f"{count:.3g} reachable states, more than max_states={max_states}; "
            "use a smaller n_servers, n_dispatchers, buffer or queue_bound, "
            "or raise max_states"
        )
    return exact_result(inputs, cap, symmetry, *_solve_bounded(inputs, cap, symmetry, max_states))


def _short_of_tol(inputs: Inputs, diag, tol, bound, default_max_states):
    """Refuse (RuntimeError) or warn of an automatic bound that did not reach ``tol``."""
    what = (
        f"solve_exact({inputs.policy.label()!r}, load={inputs.load}, N={inputs.n}, "
        f"M={inputs.m}): truncated_mass={diag['truncated_mass']:.3g} > tol={tol:g} at "
        f"queue_bound={bound}, the largest within default_max_states={default_max_states}"
    )
    if diag["truncated_mass"] > REFUSED_MASS:
        raise RuntimeError(
            f"{what}: more than {REFUSED_MASS:g} of the mass is cut off, so this is no exact "
            "answer; use fewer servers, a finite buffer, or pass queue_bound (and "
            "max_states) explicitly to solve the truncated chain anyway"
        )
    warnings.warn(
        f"{what}; pass queue_bound (and max_states) explicitly to go further", stacklevel=3
    )
