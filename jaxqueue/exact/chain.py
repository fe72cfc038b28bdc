"""The per-server Markov chains of the exact solver, in one place: the chain
with exp(1) service (:mod:`~jaxqueue.exact.markov`), with phase-type service
and pools (:mod:`~jaxqueue.exact.phases`), their enumeration
(:mod:`~jaxqueue.exact.states`), and the rules the registered policies name.
The model, the symmetry lumping and the state counts: docs/exact.md.
"""

from __future__ import annotations

from jaxqueue.exact.markov import Chain, rule_policy
from jaxqueue.exact.phases import PhaseChain
from jaxqueue.exact.states import SparseRewards, enumerate_states, estimate_states
from jaxqueue.policies.registry import available, make

__all__ = [
    "RULES",
    "JIQ_FAMILY",
    "PHASE_RULES",
    "Chain",
    "PhaseChain",
    "SparseRewards",
    "estimate_states",
    "enumerate_states",
    "rule_policy",
    "exact_rules",
]


def exact_rules() -> dict:
    """``{rule: policy}``: the exact rules the registered policies name now,
    each run by the registered policy of that name (:func:`rule_policy`)."""
    named = {}
    for name in available():
        try:
            rule, _ = make(name).exact_rule()
        except NotImplementedError:
            continue
        named.setdefault(rule, rule_policy(rule))
    return named


_NAMED = exact_rules()
#: The exact rules (``Policy.exact_rule()`` names one of them), at import.
RULES = tuple(sorted(_NAMED))
#: The rules whose dispatchers keep I-queues.
JIQ_FAMILY = frozenset(rule for rule, p in _NAMED.items() if p.uses_iqueues)
#: The rules with a phase-type chain (:class:`~jaxqueue.exact.phases.PhaseChain`).
PHASE_RULES = tuple(rule for rule, p in _NAMED.items() if p.exact_phases)
