"""The system's static configuration, its time scale, and input validation.

Everything that fixes an array shape or a branch lives in :class:`System`, a
frozen, hashable dataclass that ``jax.jit`` treats as static. What a sweep
varies or a gradient flows through (the load) is passed as an array.

The service rate is written here once (:data:`SERVICE_RATE`); the
uniformization constants (:func:`event_rate`, :func:`arrival_probability`,
:func:`steps_per_time_unit`) and the response-time scale derive from it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from jaxqueue.core.arrivals import MMPP, Profile, Trace
from jaxqueue.core.service import PhaseType, Pool, capacity, uniform_rate

__all__ = [
    "System",
    "check_int",
    "as_int",
    "is_real",
    "check_load",
    "check_distinct",
    "heavy_traffic_load",
    "halfin_whitt_load",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_SERVERS",
    "SERVICE_RATE",
    "event_rate",
    "arrival_probability",
    "steps_per_time_unit",
    "DEFAULT_WARMUP_TIME",
    "dispatchers_for_ratio",
]

#: Default warm-up of a run, in units of time at its (largest) load.
DEFAULT_WARMUP_TIME = 100.0

#: The largest seed: seeds are 63-bit, the key's two words its high and low 32 bits.
MAX_SEED = 2**63 - 1

#: Service rate of every server (tasks per unit time). Loads are per server and
#: in units of this rate, so ``lambda < 1`` is the stability condition.
SERVICE_RATE = 1.0


def event_rate(load, rate: float = SERVICE_RATE):
    """Uniformization rate per server: ``lambda + mu`` (arrivals plus a potential
    completion); ``rate`` is :attr:`System.service_rate` for other service laws."""
    return load + rate


def arrival_probability(load, rate: float = SERVICE_RATE):
    """Probability that a uniformized step is an arrival: ``lambda / (lambda + mu)``."""
    return load / event_rate(load, rate)


def steps_per_time_unit(n_servers: int, load: float, rate: float = SERVICE_RATE) -> float:
    """Uniformized steps per unit of time: ``N * (lambda + mu)``."""
    return n_servers * event_rate(load, rate)


#: Steps per replica: the host totals are int64 and the block index has 64
#: bits, so this is a guard against typing mistakes, not a ceiling of the engine.
MAX_STEPS = 2**62

#: Servers: the state holds counts of servers in int32 and draws a server
#: index exactly below ``2**31`` (:func:`jaxqueue.core.rng.uniform_index`).
MAX_SERVERS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class System:
    """Shape-defining settings of one simulated system.

    Attributes:
        n_servers: number of servers ``N`` (>= 1).
        n_dispatchers: number of dispatchers ``M`` (1 <= M <= N).
        buffer: places per server ``b`` (one in service, ``b - 1`` waiting), or
            ``None`` for infinite buffers.
        levels: the largest tracked queue length. Equals ``buffer`` for finite
            buffers; for infinite buffers an arrival that would pass it is an
            overflow, counted and reported (never clipped in silence).
        iqueue_levels: the largest tracked I-queue size (JIQ family with
            ``M > 1``; 0 otherwise). A server that would join a full I-queue is
            an overflow, counted and reported.
        service: the service law, ``None`` for exponential service of rate
            :data:`SERVICE_RATE` (a unit exponential law is stored as ``None``),
            or a :class:`~jaxqueue.core.service.PhaseType` law.
        pools: ``None`` (identical servers), or a tuple of
            :class:`~jaxqueue.core.service.Pool` (server count, speed, law;
            the counts sum to ``N``): heterogeneous servers.
        arrivals: ``None`` (Poisson arrivals at rate ``lambda N``), or a
            :class:`~jaxqueue.core.arrivals.Profile`,
            :class:`~jaxqueue.core.arrivals.MMPP` or
            :class:`~jaxqueue.core.arrivals.Trace` whose mean rate is scaled
            to ``lambda N`` (:mod:`jaxqueue.sim.source`).
    """

    n_servers: int
    n_dispatchers: int = 1
    buffer: int | None = None
    levels: int = 0
    iqueue_levels: int = 0
    service: PhaseType | None = None
    pools: tuple | None = None
    arrivals: Profile | MMPP | Trace | None = None

    def __post_init__(self):
        check_int("n_servers", self.n_servers, 1, MAX_SERVERS)
        check_int("n_dispatchers", self.n_dispatchers, 1, self.n_servers)
        if self.buffer is not None:
            check_int("buffer", self.buffer, 1, 10**6)
            if self.levels != self.buffer:
                raise ValueError(
                    f"levels={self.levels} must equal buffer={self.buffer} for finite buffers"
                )
        else:
            check_int("levels", self.levels, 1, 10**6)
        # (an I-queue lists at most N servers; a larger bound is only wasted room, and
        # a batch of replicas of several N shares the largest one's bound)
        check_int("iqueue_levels", self.iqueue_levels, 0, MAX_SERVERS)
        if self.service is not None:
            if not isinstance(self.service, PhaseType):
                raise TypeError(f"service must be a PhaseType or None, got {self.service!r}")
            if self.service.is_unit_exponential:
                object.__setattr__(self, "service", None)
        if self.pools is not None:
            pools = tuple(self.pools)
            if not pools or not all(isinstance(p, Pool) for p in pools):
                raise TypeError("pools must be a non-empty tuple of Pool")
            if sum(p.count for p in pools) != self.n_servers:
                raise ValueError(
                    f"the pools' server counts sum to {sum(p.count for p in pools)}, "
                    f"not n_servers={self.n_servers}"
                )
            object.__setattr__(self, "pools", pools)
        if self.arrivals is not None and not isinstance(self.arrivals, (Profile, MMPP, Trace)):
            raise TypeError(
                f"arrivals must be a Profile, MMPP, Trace or None, got {self.arrivals!r}"
            )

    @property
    def classes(self) -> bool:
        """Whether the state counts servers by class (phase-type service or pools)."""
        return self.service is not None or self.pools is not None

    @property
    def service_rate(self) -> float:
        """The uniformization rate of service per server (1 for unit exponential service)."""
        return uniform_rate(self.service, self.pools)

    @property
    def capacity(self) -> float:
        """Tasks per server per unit time the servers complete when all are busy (1 by default)."""
        return capacity(self.service, self.pools, self.n_servers)

    def step_rate(self, load: float) -> float:
        """Uniformized steps per server and unit time at load ``lambda``:
        ``lambda + gamma``; with a profile or an MMPP, ``lambda * peak + gamma``
        (plus the MMPP's modulation rate over ``N``); with a trace, the mean,
        ``lambda + gamma`` (its steps are not evenly spaced)."""
        src = self.arrivals
        if src is None or isinstance(src, Trace):
            return event_rate(load, self.service_rate)
        return load * src.peak + self.service_rate + src.extra_rate() / self.n_servers

    @property
    def ratio(self) -> float:
        """``r = N / M``."""
        return self.n_servers / self.n_dispatchers


def as_int(value):
    """A NumPy integer as a Python int (counts often come out of NumPy arrays);
    anything else as it is, for :func:`check_int` to judge."""
    return int(value) if isinstance(value, np.integer) else value


def check_int(name: str, value, lo: int, hi: int) -> int:
    """``value`` as a Python int, or an error naming ``name`` unless it is an
    integer (a Python or NumPy one, not a bool) with ``lo <= value <= hi``."""
    value = as_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} is out of range: need {lo} <= {name} <= {hi}")
    return value


def check_distinct(name: str, values) -> None:
    """Refuse a value given twice in ``values`` (loads: each load's replicas
    are the only sample of its result); entries that are not numbers are
    left to the checks of each value."""
    seen = set()
    for x in np.atleast_1d(np.asarray(values, dtype=object)).ravel():
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            continue
        if float(x) in seen:
            raise ValueError(
                f"{name} gives {float(x)!r} twice: give each once (for more of one "
                "load, raise replicas; for an independent repeat, another seed)"
            )
        seen.add(float(x))


def check_load(load: float, buffer: int | None, capacity: float = 1.0) -> float:
    """Validate the normalised arrival rate ``lambda``.

    Args:
        load: arrivals per server per unit time.
        buffer: ``None`` for infinite buffers (then ``load < capacity`` is required).
        capacity: tasks per server per unit time the servers can complete
            (:attr:`System.capacity`; 1 for identical servers of mean service 1).

    Returns:
        ``load`` as a Python float.
    """
    if not is_real(load):
        raise TypeError(f"load must be a real number, got {load!r}")
    value = float(load)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"load={load} is out of range: need load > 0")
    if buffer is None and capacity != 1.0 and value >= capacity:
        raise ValueError(
            f"load={load} is out of range: infinite buffers need load < {capacity:.6g}, the "
            "servers' capacity (tasks per server per unit time; the system is unstable "
            "otherwise); give a finite buffer or a smaller load"
        )
    if buffer is None and value >= 1.0 and capacity == 1.0:
        raise ValueError(
            f"load={load} is out of range: infinite buffers need 0 < load < 1 "
            "(the system is unstable otherwise); give a finite buffer for load >= 1"
        )
    if value > 1e6:
        raise ValueError(f"load={load} is out of range: need load <= 1e6")
    return value


def is_real(x) -> bool:
    """A real number: a Python or NumPy one, or a 0-d array of one; not a bool or a string."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        return False
    if isinstance(x, numbers.Real):
        return True
    try:
        return np.ndim(x) == 0 and np.asarray(x).dtype.kind in "iuf"
    except (TypeError, ValueError):
        return False


def heavy_traffic_load(n_servers: int, alpha: float) -> float:
    """``lambda = 1 - N**(-alpha)``, the heavy-traffic regime of Liu and Ying (0.5 <= alpha < 1)."""
    check_int("n_servers", n_servers, 2, MAX_SERVERS)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is out of range: need 0 < alpha <= 1")
    return 1.0 - n_servers ** (-float(alpha))


def dispatchers_for_ratio(n_servers: int, ratio: float, name: str = "n_servers") -> int:
    """``M = N / r``, which must be a whole number from 1 to ``N`` (``name``: how
    the caller calls ``N`` in its error)."""
    m = round(n_servers / ratio) if ratio >= 1 else 0
    if m < 1 or abs(n_servers / ratio - m) > 1e-9 * m:
        raise ValueError(
            f"ratio={ratio:g} does not split {name}={n_servers} into a whole number "
            f"of dispatchers: need {name} / ratio = an integer from 1 to {n_servers}"
        )
    return int(m)


def halfin_whitt_load(n_servers: int, beta: float) -> float:
    """``lambda = 1 - beta / sqrt(N)``, the Halfin-Whitt regime of Mukherjee et al."""
    check_int("n_servers", n_servers, 1, MAX_SERVERS)
    if not 0.0 < beta < math.sqrt(n_servers):
        raise ValueError(
            f"beta={beta} is out of range: need 0 < beta < sqrt(N) = {math.sqrt(n_servers):.4g}"
        )
    return 1.0 - beta / math.sqrt(n_servers)
