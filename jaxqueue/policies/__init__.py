"""Load-balancing policies as small units, and their registry.

* :mod:`~jaxqueue.policies.base`: the draw/decide interface and what a policy declares;
* :mod:`~jaxqueue.policies.classic`: Random, JSQ, JSEW, Pod(d), I1F;
* :mod:`~jaxqueue.policies.jiq`: JIQ, JIQ-Pod(d), JIQ-SQ(d), idle-first-else-JSQ(d);
* :mod:`~jaxqueue.policies.per_server`: JIQ-Original and JIQ-Threshold(z);
* :mod:`~jaxqueue.policies.registry`: :func:`make`, :func:`available`, :func:`register`.
"""

from jaxqueue.policies.base import (
    MAX_PROBES,
    ClosedForm,
    Dispatchers,
    Draw,
    ListedServer,
    Policy,
    Route,
    Servers,
    View,
    level_of,
)
from jaxqueue.policies.classic import JSEW, JSQ, IdleOneFirst, PowerOfD, Random
from jaxqueue.policies.jiq import JIQ, JIQSQ, IdleFirst, JIQPod
from jaxqueue.policies.per_server import JIQOriginal, JIQThreshold
from jaxqueue.policies.references import REFERENCES
from jaxqueue.policies.registry import available, make, option_names, policy_class, register

__all__ = [
    "Policy",
    "ClosedForm",
    "Route",
    "View",
    "Draw",
    "Servers",
    "Dispatchers",
    "ListedServer",
    "level_of",
    "MAX_PROBES",
    "Random",
    "JSQ",
    "JSEW",
    "PowerOfD",
    "IdleOneFirst",
    "JIQ",
    "JIQPod",
    "JIQSQ",
    "IdleFirst",
    "JIQOriginal",
    "JIQThreshold",
    "REFERENCES",
    "available",
    "make",
    "option_names",
    "policy_class",
    "register",
]
