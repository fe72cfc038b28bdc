"""The Halfin-Whitt diffusion limit of idle-first-else-JSQ(d), integrated over many paths.

Eschenfeldt and Gamarnik's limit for JSQ, which Mukherjee et al. show is the
limit of every ``d``: a reflected two-dimensional SDE, integrated on the
device by Euler steps with the reflection sampled exactly within each step.
The equations, the scheme and its measured time-step error: docs/diffusion.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.results.estimates import Estimate, estimate

__all__ = [
    "DiffusionPaths",
    "StationaryMeans",
    "integrate",
    "diffusion_paths",
    "stationary_means",
    "linear_moments",
    "QUANTILES",
]

#: Quantiles reported by :func:`diffusion_paths` unless asked otherwise.
QUANTILES = (0.05, 0.5, 0.95)
#: The most steps :func:`stationary_means` takes (``(burn + span) / dt``).
MAX_STEPS = 1_000_000
#: The most times :func:`stationary_means` samples each path at over its span.
MAX_SAMPLES = 400
#: :func:`stationary_means` samples each path this often (or coarser, see ``MAX_SAMPLES``).
SAMPLE_EVERY = 0.1


@dataclasses.dataclass(frozen=True)
class DiffusionPaths:
    """The limiting diffusion over many paths, at given times.

    Attributes:
        times: float ``(T,)``.
        q1, q2: ``E[Q_1(t)]`` (``Q_1 <= 0``, minus the scaled idle count) and
            ``E[Q_2(t)]`` (servers with two tasks over ``sqrt(N)``), each an
            :class:`~jaxqueue.results.estimates.Estimate` ``(T,)`` across paths.
        quantiles: the levels of ``q1_quantiles`` and ``q2_quantiles``.
        q1_quantiles, q2_quantiles: float ``(len(quantiles), T)``, across paths.
        settings: ``beta``, the start, ``paths``, ``dt``, ``seed``, ``reflect``.
    """

    times: np.ndarray
    q1: Estimate
    q2: Estimate
    quantiles: tuple
    q1_quantiles: np.ndarray
    q2_quantiles: np.ndarray
    settings: dict


@dataclasses.dataclass(frozen=True)
class StationaryMeans:
    """The stationary means of the limit, from each path's long-run time average.

    Attributes:
        q1: ``E[Q_1]`` (``-beta`` exactly: docs/diffusion.md), an
            :class:`~jaxqueue.results.estimates.Estimate` across paths.
        q2: ``E[Q_2]`` (servers with two tasks over ``sqrt(N)``), likewise.
        times: the times each path's average is taken at (equally spaced
            over ``[burn, burn + span]``, on the ``dt`` grid).
        settings: ``beta``, ``paths``, ``dt``, ``burn``, ``span``, ``seed``.
    """

    q1: Estimate
    q2: Estimate
    times: tuple
    settings: dict


def _step(state, noise, beta, h, reflect):
    """One step from ``(q1, q2, u)``: Euler drift, reflection at 0 sampled exactly.

    With the drift frozen over the step, ``Q_1`` moves as a Brownian motion of
    variance 2 per unit time; given its end point, the maximum of its bridge is
    ``(a + b + sqrt((b - a)^2 + 4 h E)) / 2`` with ``E`` an Exp(1) draw, and
    the Skorokhod map at 0 pushes down by the part of that maximum above 0
    (times ``reflect``, 1 or 0).
    """
    q1, q2, u = state
    z, e = noise
    free = q1 + (-beta - q1 + q2) * h + jnp.sqrt(2.0 * h) * z
    top = 0.5 * (q1 + free + jnp.sqrt((free - q1) ** 2 + 4.0 * h * e))
    push = reflect * jnp.maximum(top, 0.0)
    return free - push, q2 + push - q2 * h, u + push


@functools.partial(jax.jit, static_argnames=("paths",))
def _run(key, start, counts, beta, h, reflect, *, paths: int):
    """Each path's ``(Q_1, Q_2, U_1)`` after ``cumsum(counts)`` steps: ``(T, 3, paths)``."""
    q1 = jnp.full((paths,), start[0], jnp.float32)
    q2 = jnp.full((paths,), start[1], jnp.float32)
    u = jnp.zeros((paths,), jnp.float32)

    def one(k, state):
        kz, ke = jax.random.split(jax.random.fold_in(key, k))
        noise = (jax.random.normal(kz, (paths,)), jax.random.exponential(ke, (paths,)))
        return _step(state, noise, beta, h, reflect)

    def interval(carry, n):
        done, state = carry
        state = jax.lax.fori_loop(done, done + n, one, state)
        return (done + n, state), jnp.stack(state)

    _, out = jax.lax.scan(interval, (jnp.int32(0), (q1, q2, u)), counts)
    return out


def _grid(times, dt) -> tuple[np.ndarray, np.ndarray]:
    """The times as an array and the steps between successive ones (times on the ``dt`` grid)."""
    t = np.asarray(times, np.float64).ravel()
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(np.diff(t) < 0):
        raise ValueError(f"times must be finite, >= 0 and non-decreasing, got {times!r}")
    if not (isinstance(dt, (int, float)) and math.isfinite(dt) and 0 < dt <= 0.5):
        raise ValueError(f"dt={dt!r} is out of range: need 0 < dt <= 0.5")
    k = np.rint(t / dt)
    if np.any(np.abs(k * dt - t) > 1e-9 * np.maximum(1.0, t)):
        raise ValueError(f"times must be multiples of dt={dt}, got {times!r}")
    k = k.astype(np.int64)
    return t, np.diff(k, prepend=0).astype(np.int32)


def integrate(
    beta: float,
    times: Sequence[float],
    *,
    start: tuple[float, float] = (0.0, 0.0),
    paths: int = 4096,
    dt: float = 0.01,
    seed: int = 0,
    reflect: bool = True,
) -> np.ndarray:
    """Each path of the limiting diffusion at ``times``: float64 ``(paths, T, 3)``.

    The last axis is ``(Q_1, Q_2, U_1)``: ``Q_1(t) = Q_1(0) + sqrt(2) W(t) -
    beta t + int_0^t (Q_2 - Q_1) ds - U_1(t) <= 0``, ``Q_2(t) = Q_2(0) + U_1(t)
    - int_0^t Q_2 ds``, ``U_1`` non-decreasing and growing only where ``Q_1 =
    0``. ``reflect=False`` drops ``U_1`` (a linear SDE with Gaussian
    marginals, :func:`linear_moments`), for checks.

    Args:
        beta: the Halfin-Whitt parameter (``lambda N = N - beta sqrt(N)``), > 0.
        times: non-decreasing times ``>= 0``, multiples of ``dt``.
        start: ``(Q_1(0), Q_2(0))``, ``Q_1(0) <= 0 <= Q_2(0)``.
        paths: independent paths.
        dt: the time step (its error: docs/diffusion.md).
        seed: the key; the same seed, paths and ``dt`` give the same paths.
        reflect: whether ``Q_1`` is reflected at 0.
    """
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta={beta!r} is out of range: need a number > 0")
    if not (start[0] <= 0.0 <= start[1]):
        raise ValueError(f"start={start!r} is out of range: need Q_1(0) <= 0 <= Q_2(0)")
    if isinstance(paths, bool) or not isinstance(paths, (int, np.integer)) or paths < 2:
        raise ValueError(f"paths={paths!r} is out of range: need an integer >= 2")
    _, counts = _grid(times, dt)
    out = _run(
        jax.random.PRNGKey(seed),
        jnp.asarray(start, jnp.float32),
        jnp.asarray(counts),
        jnp.float32(beta),
        jnp.float32(dt),
        jnp.float32(1.0 if reflect else 0.0),
        paths=int(paths),
    )
    return np.asarray(out, np.float64).transpose(2, 0, 1)


def diffusion_paths(
    beta: float,
    times: Sequence[float],
    *,
    start: tuple[float, float] = (0.0, 0.0),
    paths: int = 4096,
    dt: float = 0.01,
    seed: int = 0,
    reflect: bool = True,
    quantiles: Sequence[float] = QUANTILES,
) -> DiffusionPaths:
    """Means (with 95% intervals across paths) and quantiles of the diffusion at ``times``.

    Arguments as for :func:`integrate`; ``quantiles`` in ``[0, 1]``.
    """
    x = integrate(beta, times, start=start, paths=paths, dt=dt, seed=seed, reflect=reflect)
    levels = tuple(float(q) for q in quantiles)
    if any(not 0.0 <= q <= 1.0 for q in levels):
        raise ValueError(f"quantiles={quantiles!r} must lie in [0, 1]")
    return DiffusionPaths(
        times=np.asarray(times, np.float64).ravel(),
        q1=estimate(x[:, :, 0]),
        q2=estimate(x[:, :, 1]),
        quantiles=levels,
        q1_quantiles=np.quantile(x[:, :, 0], levels, axis=0),
        q2_quantiles=np.quantile(x[:, :, 1], levels, axis=0),
        settings={
            "beta": float(beta),
            "start": [float(start[0]), float(start[1])],
            "paths": int(paths),
            "dt": float(dt),
            "seed": int(seed),
            "reflect": bool(reflect),
        },
    )


def _number(name: str, value, low: float, *, closed: bool, high: float = math.inf) -> float:
    """``value`` as a float, or a one-line ValueError naming ``name`` and its range."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (value >= low if closed else value > low)
    if not ok or value > high:
        need = f"{'>=' if closed else '>'} {low:g}" + ("" if high == math.inf else f", <= {high:g}")
        raise ValueError(f"{name}={value!r} is out of range: need a finite number {need}")
    return float(value)


def _sample_times(dt: float, burn: float, span: float) -> tuple:
    """Equally spaced times from ``burn`` (rounded up to the ``dt`` grid) over ``span``:
    every :data:`SAMPLE_EVERY` time units or coarser, at most ``MAX_SAMPLES + 1`` times."""
    first = math.ceil(burn / dt - 1e-9)
    steps = max(1, round(span / dt))
    every = max(1, round(SAMPLE_EVERY / dt), math.ceil(steps / MAX_SAMPLES))
    if first + steps > MAX_STEPS:
        raise ValueError(
            f"(burn + span) / dt = {first + steps} steps is out of range: need at most "
            f"{MAX_STEPS} (a larger dt, or a shorter burn or span)"
        )
    return tuple(dt * (first + every * i) for i in range(steps // every + 1))


def stationary_means(
    beta: float,
    *,
    paths: int = 4096,
    dt: float = 0.01,
    burn: float | None = None,
    span: float | None = None,
    seed: int = 0,
) -> StationaryMeans:
    """The stationary ``E[Q_1]`` and ``E[Q_2]`` of the limit, with 95% intervals across paths.

    Each path starts at ``(0, 0)`` (:func:`integrate`); its time average over
    ``[burn, burn + span]`` (sampled every 0.1 time units, or at most
    ``MAX_SAMPLES + 1`` times) is one sample, and the estimate is their mean
    with its Student-t half-width. The limit relaxes in a time of order
    ``1 / beta^2`` (about 5, 16 and 60 time units at ``beta`` = 1, 0.5 and
    0.25), so ``burn`` defaults to ``10 / min(beta, 1)^2`` and ``span`` to
    three times that. The errors (the step's bias, the burn-in's) and the
    values: docs/diffusion.md. Cached per arguments: figures call it.

    Args:
        beta: the Halfin-Whitt parameter, > 0.
        paths: independent paths, >= 2.
        dt: the time step, in (0, 0.5].
        burn: the time each path runs before its average starts, >= 0.
        span: the length of the average, >= ``dt``.
        seed: the key, an integer >= 0.
    """
    beta = _number("beta", beta, 0.0, closed=False)
    if isinstance(paths, bool) or not isinstance(paths, (int, np.integer)) or paths < 2:
        raise ValueError(f"paths={paths!r} is out of range: need an integer >= 2")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} is out of range: need an integer in [0, 2^32)")
    dt = _number("dt", dt, 0.0, closed=False, high=0.5)
    default = 10.0 / min(beta, 1.0) ** 2
    burn = default if burn is None else _number("burn", burn, 0.0, closed=True)
    span = 3.0 * default if span is None else _number("span", span, dt, closed=True)
    return _stationary(beta, int(paths), dt, burn, span, int(seed))


@functools.lru_cache(maxsize=64)
def _stationary(beta, paths, dt, burn, span, seed) -> StationaryMeans:
    """:func:`stationary_means` of checked arguments (cached)."""
    times = _sample_times(dt, burn, span)
    x = integrate(beta, times, paths=paths, dt=dt, seed=seed)
    settings = {"beta": beta, "paths": paths, "dt": dt, "burn": burn, "span": span, "seed": seed}
    return StationaryMeans(
        q1=estimate(x[:, :, 0].mean(axis=1)),
        q2=estimate(x[:, :, 1].mean(axis=1)),
        times=times,
        settings=settings,
    )


def linear_moments(beta: float, times, start=(0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, variance)`` of ``Q_1(t)`` without reflection, in closed form.

    Then ``Q_2(t) = Q_2(0) e^{-t}`` and ``Q_1`` is Gaussian: ``dm = (-beta - m
    + Q_2(0) e^{-t}) dt`` gives ``m(t) = -beta (1 - e^{-t}) + (Q_1(0) + Q_2(0)
    t) e^{-t}``, and ``dv = (2 - 2 v) dt`` gives ``v(t) = 1 - e^{-2t}``.
    """
    t = np.asarray(times, np.float64)
    e = np.exp(-t)
    return -beta * (1.0 - e) + (start[0] + start[1] * t) * e, -np.expm1(-2.0 * t)
