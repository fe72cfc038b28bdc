"""The reachable states of an exact chain: breadth-first enumeration of its
generator and rewards (:func:`enumerate_states`), and a rough count for
budgeting (:func:`estimate_states`).
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.exact.markov import rule_policy

__all__ = ["SparseRewards", "enumerate_states", "estimate_states"]


def estimate_states(rule, n, m, z, bound, symmetry, order="random", n_phases=1, pools=None):
    """Rough count of reachable states of ``rule`` with queue bound ``bound`` (for budgeting).

    ``rule``: a policy or its name (:func:`~jaxqueue.exact.markov.rule_policy`,
    with ``z`` and ``order``); each server's entry takes
    ``Policy.exact_server_types`` values. ``n_phases``: phases of the service
    law. ``pools``: ``None``, or ``(count, n_phases)`` per pool: the servers
    of different pools are told apart, so the count is about the product over
    the pools of the count of a system of ``count`` servers (``n_phases`` is
    then not used). Exact for the policies without I-queues; for the JIQ
    family it is not divided by ``M!`` with pools, and overestimates the
    count, by 10-50% with ``M = 2`` and about twice with ``M = 3`` in the
    cases tried.
    """
    policy = rule_policy(rule, z=z, order=order)
    if pools is not None:
        est = 1
        for count, ph in pools:
            t = policy.exact_server_types(bound, m, ph)
            est *= t**count if not symmetry else math.comb(t + count - 1, count)
        return est
    t = policy.exact_server_types(bound, m, n_phases)
    if not symmetry:
        return t**n
    est = math.comb(t + n - 1, n)
    if policy.uses_iqueues:
        est //= math.factorial(m)
    if policy.fifo:  # the orders of a full I-queue
        est *= math.factorial(-(-n // m))
    return est


class SparseRewards:
    """Per-state reward vectors in coordinate form: state ``rows[i]`` earns
    ``vals[i]`` in entry ``cols[i]`` (what :func:`enumerate_states` returns for
    a chain with ``sparse_rewards``, whose reward vectors are long and mostly 0).

    ``pi @ rewards`` gives the expected reward vector, as for a dense
    ``(S, n_rewards)`` array.
    """

    __array_ufunc__ = None  # ``pi @ self`` calls __rmatmul__

    def __init__(self, rows, cols, vals, n_states, n_rewards):
        self.rows = np.asarray(rows, dtype=np.int64)
        self.cols = np.asarray(cols, dtype=np.int64)
        self.vals = np.asarray(vals, dtype=np.float64)
        self.shape = (n_states, n_rewards)

    def __rmatmul__(self, pi):
        pi = np.asarray(pi, dtype=np.float64)
        return np.bincount(self.cols, weights=pi[self.rows] * self.vals, minlength=self.shape[1])

    def toarray(self):
        out = np.zeros(self.shape)
        np.add.at(out, (self.rows, self.cols), self.vals)
        return out


def enumerate_states(chain, max_states):
    """Breadth-first search from the empty system.

    Returns:
        ``(states, rows, cols, vals, rewards)``: the state keys (state 0 is the
        empty system), the transitions ``rows[i] -> cols[i]`` at rate
        ``vals[i]`` (int64, int64, float64; no self-loops), and the per-state
        reward vectors ``(S, chain.n_rewards)`` (event rates, see
        :data:`N_FIXED_REWARDS`): a float64 array, or a :class:`SparseRewards`
        for a chain with ``sparse_rewards`` (:class:`PhaseChain`).

    Raises:
        ValueError: more than ``max_states`` reachable states.
    """
    init = chain.initial()
    index = {init: 0}
    states = [init]
    rows, cols, vals, rewards = [], [], [], []
    sparse = chain.sparse_rewards
    r_rows, r_cols, r_vals = [], [], []
    ptr = 0
    while ptr < len(states):
        out, rew = chain.expand(states[ptr])
        for t, rate in out.items():
            k = index.get(t)
            if k is None:
                k = len(states)
                if k >= max_states:
                    raise ValueError(
                        f"more than max_states={max_states} reachable states; use a smaller "
                        "n_servers, n_dispatchers, buffer or queue_bound, or raise max_states"
                    )
                index[t] = k
                states.append(t)
            rows.append(ptr)
            cols.append(k)
            vals.append(rate)
        if sparse:
            r_rows.extend([ptr] * len(rew))
            r_cols.extend(rew.keys())
            r_vals.extend(rew.values())
        else:
            rewards.append(rew)
        ptr += 1
    if sparse:
        rewards = SparseRewards(r_rows, r_cols, r_vals, len(states), chain.n_rewards)
    return (
        states,
        np.asarray(rows, dtype=np.int64),
        np.asarray(cols, dtype=np.int64),
        np.asarray(vals, dtype=np.float64),
        rewards if sparse else np.asarray(rewards),
    )
