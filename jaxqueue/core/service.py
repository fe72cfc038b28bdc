"""Service-time laws: phase-type distributions (:class:`PhaseType`).

The helpers scale a law to mean 1, so ``lambda`` stays the load
(docs/simulation.md, "Service laws and server pools").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings

import numpy as np

__all__ = [
    "PhaseType",
    "Pool",
    "MAX_PHASES",
    "uniform_rate",
    "capacity",
    "parse_pools",
    "pool_shares",
    "make_pools",
    "realized_pools",
    "PoolRoundingWarning",
    "pool_laws",
    "as_law",
    "exponential",
    "erlang",
    "hyperexponential",
    "fit_two_moments",
    "parse_service",
    "mph1_mean_response_time",
]

#: Most phases a service law may have (the state holds ``levels x phases`` counts).
MAX_PHASES = 16


@dataclasses.dataclass(frozen=True)
class PhaseType:
    """A phase-type service law ``PH(alpha, S)`` (hashable: a static setting).

    Attributes:
        alpha: the initial phase probabilities (sum to 1: no atom at zero).
        generator: the sub-generator ``S`` as a tuple of rows.
        label: a short name (``"erlang:3"``); recorded with results.
    """

    alpha: tuple
    generator: tuple
    label: str = "ph"

    def __post_init__(self):
        try:
            a = np.asarray(self.alpha, np.float64)
            s = np.asarray(self.generator, np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                "alpha and generator must be numbers: a vector and a square matrix"
            ) from None
        if a.ndim != 1 or not 1 <= a.size <= MAX_PHASES:
            raise ValueError(
                f"alpha must be a vector of 1 to {MAX_PHASES} probabilities, got shape {a.shape}"
            )
        if s.shape != (a.size, a.size):
            raise ValueError(
                f"the sub-generator S must be {a.size} x {a.size} (one row per phase of alpha), "
                f"got shape {s.shape}"
            )
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(s))):
            raise ValueError("alpha and S must be finite")
        if np.any(a < 0) or abs(a.sum() - 1.0) > 1e-9:
            raise ValueError(
                f"alpha must be probabilities summing to 1, got {a.tolist()} (sum {a.sum():.12g})"
            )
        off = s - np.diag(np.diag(s))
        if np.any(off < 0):
            raise ValueError("S is not a sub-generator: its off-diagonal rates must be >= 0")
        if np.any(np.diag(s) >= 0):
            raise ValueError("S is not a sub-generator: its diagonal must be negative")
        if np.any(s.sum(axis=1) > 1e-12 * np.abs(np.diag(s))):
            raise ValueError("S is not a sub-generator: each row must sum to <= 0 (exit rate >= 0)")
        # every phase reachable from alpha must lead to an exit: -S is then a nonsingular M-matrix
        try:
            green = np.linalg.inv(-s)
        except np.linalg.LinAlgError:
            raise ValueError(
                "S is singular: some phase never completes (no path to an exit)"
            ) from None
        if np.any(green < -1e-12) or not np.all(np.isfinite(green)):
            raise ValueError("S is not a sub-generator of a transient chain: (-S)^-1 is not >= 0")
        object.__setattr__(self, "alpha", tuple(float(x) for x in a))
        object.__setattr__(self, "generator", tuple(tuple(float(x) for x in row) for row in s))

    # -- numbers --------------------------------------------------------------
    @property
    def n_phases(self) -> int:
        return len(self.alpha)

    @property
    def matrix(self) -> np.ndarray:
        """``S`` as a float64 array."""
        return np.asarray(self.generator, np.float64)

    @property
    def exit_rates(self) -> np.ndarray:
        """``s = -S 1``: each phase's completion rate."""
        return -self.matrix.sum(axis=1)

    @property
    def rate(self) -> float:
        """``gamma = max_p -S[p][p]``, the uniformization rate per busy server."""
        return float(np.max(-np.diag(self.matrix)))

    def moment(self, k: int) -> float:
        """``E[X^k] = k! alpha (-S)^-k 1``."""
        green = np.linalg.inv(-self.matrix)
        v = np.asarray(self.alpha)
        for _ in range(k):
            v = v @ green
        return float(math.factorial(k) * v.sum())

    @property
    def mean(self) -> float:
        return self.moment(1)

    @property
    def scv(self) -> float:
        """Squared coefficient of variation ``Var X / (E X)^2``."""
        m = self.mean
        return self.moment(2) / (m * m) - 1.0

    def in_service_mix(self) -> np.ndarray:
        """The phase of the task in service at a random busy moment: ``alpha (-S)^-1``, normalized."""
        v = np.asarray(self.alpha) @ np.linalg.inv(-self.matrix)
        return v / v.sum()

    def cdf(self, t) -> np.ndarray:
        """``P(X <= t) = 1 - alpha exp(S t) 1`` (``t >= 0``, array-like), by
        uniformization: ``exp(S t) = sum_n Poisson(gamma t; n) P^n`` with
        ``P = I + S / gamma``, summed until the Poisson tail is below 1e-15."""
        t = np.atleast_1d(np.asarray(t, np.float64))
        g = self.rate
        step = np.eye(self.n_phases) + self.matrix / g
        out = np.empty_like(t)
        for i, ti in enumerate(t):
            x = g * max(ti, 0.0)
            v = np.asarray(self.alpha)
            logw, total, mass = -x, 0.0, 0.0
            n = 0
            while True:
                w = math.exp(logw)
                total += w * v.sum()
                mass += w
                n += 1
                if (n > x and 1.0 - mass < 1e-15) or n > 10_000 + 10 * x:
                    break
                v = v @ step
                logw += math.log(x) - math.log(n) if x > 0 else -math.inf
            out[i] = 1.0 - total
        return np.clip(out, 0.0, 1.0)

    def scaled(self, mean: float = 1.0) -> PhaseType:
        """The same shape with the given mean (rates multiplied by ``self.mean / mean``)."""
        if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean > 0):
            raise ValueError(f"mean={mean!r} is out of range: need mean > 0")
        f = self.mean / float(mean)
        return PhaseType(
            self.alpha, tuple(tuple(x * f for x in row) for row in self.generator), self.label
        )

    @property
    def is_unit_exponential(self) -> bool:
        """One phase of rate 1: the model every policy's theory is written for."""
        return self.n_phases == 1 and self.generator[0][0] == -1.0

    def to_dict(self) -> dict:
        """A JSON-ready record (what ``ph:FILE.json`` reads back)."""
        return {
            "label": self.label,
            "alpha": list(self.alpha),
            "S": [list(r) for r in self.generator],
            "mean": self.mean,
            "scv": self.scv,
        }


# -- constructors -----------------------------------------------------------


def _positive(name, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}={value!r} is out of range: need {name} > 0")
    return v


def exponential(mean: float = 1.0) -> PhaseType:
    """Exponential service with the given mean."""
    mean = _positive("mean", mean)
    return PhaseType((1.0,), ((-1.0 / mean,),), "exp")


def erlang(k: int, mean: float = 1.0) -> PhaseType:
    """Erlang-``k`` (``k`` phases of rate ``k / mean``; SCV ``1 / k``)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_PHASES:
        raise ValueError(f"k={k!r} is out of range: need an int 1 <= k <= {MAX_PHASES}")
    mean = _positive("mean", mean)
    r = k / mean
    s = tuple(
        tuple(-r if j == i else (r if j == i + 1 else 0.0) for j in range(k)) for i in range(k)
    )
    return PhaseType((1.0,) + (0.0,) * (k - 1), s, f"erlang:{k}")


def hyperexponential(scv: float, mean: float = 1.0) -> PhaseType:
    """Two-phase hyperexponential with balanced means and the given SCV (``>= 1``).

    Phase ``i`` is taken with probability ``p_i`` and has rate ``2 p_i / mean``,
    ``p_1 = (1 + sqrt((scv - 1) / (scv + 1))) / 2``; ``scv = 1`` is exponential.
    """
    scv, mean = _positive("scv", scv), _positive("mean", mean)
    if scv < 1.0:
        raise ValueError(
            f"scv={scv} is out of range: a hyperexponential needs scv >= 1 (use fit_two_moments)"
        )
    if scv == 1.0:
        return dataclasses.replace(exponential(mean), label="hyperexp:1")
    p = 0.5 * (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0)))
    r1, r2 = 2.0 * p / mean, 2.0 * (1.0 - p) / mean
    return PhaseType((p, 1.0 - p), ((-r1, 0.0), (0.0, -r2)), f"hyperexp:{scv:g}")


def fit_two_moments(mean: float, scv: float) -> PhaseType:
    """A phase-type law with the given mean and SCV.

    ``scv >= 1``: the balanced-means hyperexponential. ``scv < 1``: a mixture
    of Erlang-``(k-1)`` and Erlang-``k`` with a common rate, ``1/k <= scv <
    1/(k-1)`` (Tijms, "A First Course in Stochastic Models", 2003, sec. 2.3),
    which needs ``k <= MAX_PHASES`` phases (``scv >= 1 / MAX_PHASES``).
    """
    mean, scv = _positive("mean", mean), _positive("scv", scv)
    if scv >= 1.0:
        return dataclasses.replace(hyperexponential(scv, mean), label=f"fit:{scv:g}")
    k = math.ceil(1.0 / scv - 1e-12)
    if k > MAX_PHASES:
        raise ValueError(
            f"scv={scv} is out of range: need scv >= 1/{MAX_PHASES} (at most {MAX_PHASES} phases)"
        )
    if abs(k * scv - 1.0) < 1e-12:
        return dataclasses.replace(erlang(k, mean), label=f"fit:{scv:g}")
    p = (k * scv - math.sqrt(k * (1.0 + scv) - k * k * scv)) / (1.0 + scv)
    r = (k - p) / mean
    # phases 0..k-1 in sequence; after phase k-2 the task leaves with probability p
    s = np.zeros((k, k))
    for i in range(k):
        s[i, i] = -r
        if i + 1 < k:
            s[i, i + 1] = r * (1.0 - p) if i == k - 2 else r
    alpha = (1.0,) + (0.0,) * (k - 1)
    return PhaseType(alpha, tuple(map(tuple, s)), f"fit:{scv:g}")


#: The largest ``ph:`` file read (a law of a few hundred phases is far smaller).
MAX_PH_BYTES = 1 << 20


def _read_ph(text: str, path: str):
    """The JSON of a ``ph:`` file: a regular file of at most :data:`MAX_PH_BYTES`
    (a FIFO or a device would hang or fill memory), errors naming the file."""
    if not os.path.exists(path):
        raise ValueError(f"service={text!r}: no such file {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"service={text!r}: {path!r} is not a regular file")
    if os.path.getsize(path) > MAX_PH_BYTES:
        raise ValueError(
            f"service={text!r}: {path!r} has {os.path.getsize(path)} bytes, more than the "
            f"{MAX_PH_BYTES} a phase-type file may have"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"service={text!r}: {path!r} is not readable JSON ({err})") from None


def parse_service(text: str) -> PhaseType:
    """A service law from its command-line form.

    ``exp``, ``erlang:K``, ``hyperexp:SCV``, ``fit:SCV`` (two-moment fit), or
    ``ph:FILE.json``, a file ``{"alpha": [...], "S": [[...], ...]}`` with an
    optional ``"mean"`` (default 1; ``"mean": null`` keeps the file's own
    rates). All but the last have mean 1.
    """
    if not isinstance(text, str):
        raise TypeError(f"service must be a string such as 'erlang:3', got {text!r}")
    kind, _, arg = text.partition(":")
    try:
        if kind == "exp" and not arg:
            return exponential()
        if kind == "erlang":
            return erlang(int(arg))
        if kind == "hyperexp":
            return hyperexponential(float(arg))
        if kind == "fit":
            return fit_two_moments(1.0, float(arg))
    except ValueError as err:
        raise ValueError(f"service={text!r}: {err}") from None
    if kind == "ph" and arg:
        spec = _read_ph(text, arg)
        if not isinstance(spec, dict) or "alpha" not in spec or "S" not in spec:
            raise ValueError(f"service={text!r}: the file must hold an object with 'alpha' and 'S'")
        law = PhaseType(tuple(spec["alpha"]), tuple(map(tuple, spec["S"])), spec.get("label", "ph"))
        mean = spec.get("mean", 1.0)
        return law if mean is None else law.scaled(mean)
    raise ValueError(
        f"service={text!r} is not valid: use exp, erlang:K, hyperexp:SCV, fit:SCV or ph:FILE.json"
    )


@dataclasses.dataclass(frozen=True)
class Pool:
    """A pool of identical servers: how many, their speed, their service law.

    A server of speed ``v`` completes a task of law ``L`` in ``L / v``: its
    rates are ``v`` times the law's. ``law=None`` is the system's law.
    """

    count: int
    speed: float = 1.0
    law: PhaseType | None = None

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"a pool's count={self.count!r} is out of range: need an int >= 1")
        speed = _positive("speed", self.speed)
        object.__setattr__(self, "speed", speed)
        if self.law is not None and not isinstance(self.law, PhaseType):
            raise TypeError(f"a pool's law must be a PhaseType or None, got {self.law!r}")


def _law(law: PhaseType | None) -> PhaseType:
    return exponential() if law is None else law


def pool_laws(pools, service: PhaseType | None = None) -> tuple:
    """Each pool's completion time at one of its servers: ``PH(alpha, speed S)``
    of the pool's law, or else of ``service`` (``None``: exp(1))."""
    out = []
    for p in pools:
        x = p.law or _law(service)
        if p.speed != 1.0:
            x = PhaseType(
                x.alpha, tuple(tuple(p.speed * float(y) for y in row) for row in x.matrix), x.label
            )
        out.append(x)
    return tuple(out)


def uniform_rate(service: PhaseType | None, pools=None) -> float:
    """The largest total event rate of a busy server: the uniformization rate of service."""
    if pools is None:
        return 1.0 if service is None else service.rate
    return max(p.speed * _law(p.law or service).rate for p in pools)


def capacity(service: PhaseType | None, pools, n_servers: int) -> float:
    """Tasks per server per unit time completed when every server is busy:
    ``sum_i count_i speed_i / mean_i / N``."""
    if pools is None:
        return 1.0 if service is None else 1.0 / service.mean
    return sum(p.count * p.speed / _law(p.law or service).mean for p in pools) / n_servers


def parse_pools(text: str) -> tuple:
    """``"F1:S1,F2:S2,..."`` as ``((fraction, speed), ...)`` (fractions sum to 1)."""
    out = []
    for part in str(text).split(","):
        frac, sep, speed = part.partition(":")
        try:
            out.append((float(frac), float(speed)))
        except ValueError:
            raise ValueError(
                f"pools={text!r} is not valid: use FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1"
            ) from None
        if not sep:
            raise ValueError(
                f"pools={text!r} is not valid: use FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1"
            )
    return tuple(out)


def pool_shares(pools) -> tuple | None:
    """Pools as ``(fraction, speed, law)`` triples, as the limit ``N -> infinity`` sees them.

    Accepts what :func:`make_pools` does: ``"F1:S1,F2:S2"``, ``(fraction,
    speed)`` pairs (``law`` None: the system's) or :class:`Pool` objects
    (their fractions are ``count / sum of counts``). ``None`` stays ``None``.
    """
    if pools is None:
        return None
    if isinstance(pools, str):
        pools = parse_pools(pools)
    pools = tuple(pools)
    if not pools:
        raise ValueError("pools is empty: give (fraction, speed) pairs or leave it None")
    if all(isinstance(p, Pool) for p in pools):
        total = sum(p.count for p in pools)
        return tuple((p.count / total, p.speed, p.law) for p in pools)
    try:
        fracs = np.array([float(f) for f, _ in pools])
        speeds = [float(v) for _, v in pools]
    except (TypeError, ValueError):
        raise ValueError(
            "pools must be (fraction, speed) pairs, e.g. [(0.2, 2.0), (0.8, 1.0)]"
        ) from None
    if not np.all(fracs > 0) or abs(fracs.sum() - 1.0) > 1e-9:
        raise ValueError(f"pools: the fractions {fracs.tolist()} must be > 0 and sum to 1")
    return tuple((float(f), _positive("speed", v), None) for f, v in zip(fracs, speeds))


def make_pools(pools, n_servers: int) -> tuple | None:
    """Pools as a tuple of :class:`Pool` with server counts (``None``: identical servers).

    Accepts ``"F1:S1,F2:S2"``, ``(fraction, speed)`` pairs (fractions of
    ``n_servers``, rounded to whole servers by largest remainders; every pool
    needs at least one) or :class:`Pool` objects (counts summing to ``n_servers``).
    """
    if pools is not None and not isinstance(pools, str):
        pools = tuple(pools)
    shares = pool_shares(pools)
    if shares is None:
        return None
    if all(isinstance(p, Pool) for p in pools):
        if sum(p.count for p in pools) != n_servers:
            raise ValueError(
                f"pools hold {sum(p.count for p in pools)} servers, not n_servers={n_servers}"
            )
        return tuple(pools)
    fracs = np.array([f for f, _, _ in shares])
    raw = fracs * n_servers
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: n_servers - counts.sum()]] += 1
    if np.any(counts < 1):
        raise ValueError(
            f"pools: fractions {fracs.tolist()} of n_servers={n_servers} leave a pool without servers"
        )
    return tuple(Pool(int(c), v) for c, (_, v, _) in zip(counts, shares))


class PoolRoundingWarning(UserWarning):
    """Pools given as fractions of ``N`` that are not whole numbers of servers:
    the system of ``N`` servers (and the theory put beside it) has the rounded
    fractions, not the nominal ones."""


def realized_pools(
    pools, n_servers: int, *, warn: bool = True, stacklevel: int = 2
) -> tuple | None:
    """The pools a system of ``n_servers`` has: :func:`make_pools`, whose
    rounding to whole servers the simulator applies, as :class:`Pool` objects.

    Theory put beside a simulation of ``N`` servers takes these (their
    fractions are ``count / N``), not the nominal fractions, which are those
    of the limit ``N -> infinity``. With ``warn``, a
    :class:`PoolRoundingWarning` names the nominal and the realized fractions
    where the rounding moves one.
    """
    if pools is not None and not isinstance(pools, str):
        pools = tuple(pools)
    made = make_pools(pools, n_servers)
    if made is None or not warn:
        return made
    nominal = [f for f, _, _ in pool_shares(pools)]
    realized = [p.count / n_servers for p in made]
    if any(abs(a - b) > 1e-9 for a, b in zip(nominal, realized)):
        fmt = lambda xs: ", ".join(format(x, ".6g") for x in xs)  # noqa: E731
        warnings.warn(
            f"pools: the fractions {fmt(nominal)} of n_servers={n_servers} are not whole "
            f"servers; rounded to {', '.join(str(p.count) for p in made)} servers, the "
            f"fractions {fmt(realized)} are simulated and the theory beside the simulation "
            "is for those",
            PoolRoundingWarning,
            stacklevel=stacklevel + 1,
        )
    return made


def as_law(service) -> PhaseType | None:
    """``service`` as a :class:`PhaseType`: ``None`` stays ``None`` (exponential
    service), a string goes through :func:`parse_service` (whose errors name
    ``service``); anything else is a TypeError naming ``service``."""
    if service is None or isinstance(service, PhaseType):
        return service
    if isinstance(service, str):
        return parse_service(service)
    raise TypeError(
        f"service must be None, a PhaseType or a string such as 'erlang:3', got {service!r}"
    )


def mph1_mean_response_time(load: float, law: PhaseType) -> float:
    """Mean response time of the M/PH/1 queue (Pollaczek-Khinchine):
    ``E[S] + lambda E[S^2] / (2 (1 - rho))``, ``rho = lambda E[S] < 1``."""
    rho = load * law.mean
    if not 0 <= rho < 1:
        raise ValueError(f"load * mean = {rho} is out of range: the M/PH/1 queue needs rho < 1")
    return law.mean + load * law.moment(2) / (2.0 * (1.0 - rho))
