"""The settings of the theory's solves as values: :class:`Newton`, :class:`Settle`,
:class:`LevelGrowth` and :class:`Solver`, which bundles them.

Frozen and checked where they are made; a field left at ``None`` takes the
solve's own default (the fixed points' and a periodic regime's differ). The
solves read them from the ``solver=`` they are given
(:func:`jaxqueue.theory.mean_field`, ``meanfield.fixed_point``,
``phases.fixed_point``, ``periodic.periodic_orbit``), so a new setting is a
field here, not a parameter of every solve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Newton", "Settle", "LevelGrowth", "Solver", "LEVEL_TOL", "NEWTON"]

#: Default tail mass at the bound below which the adaptive level count stops growing.
LEVEL_TOL = 1e-12
#: The fixed points' Newton by default: ``(tol, max_iter)`` (:class:`Newton`).
NEWTON = (1e-12, 50)


def _check_real(name: str, value, lo: float, hi: float, *, lo_open: bool = True) -> float:
    """``value`` as a float in ``(lo, hi)`` (``[lo, hi)`` with ``lo_open=False``), or a
    ValueError naming the setting and its range."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    x = float(value) if ok else math.nan
    if not (math.isfinite(x) and (x > lo if lo_open else x >= lo) and x < hi):
        left = "(" if lo_open else "["
        raise ValueError(
            f"{name}={value!r} is out of range: need a number in {left}{lo:g}, {hi:g})"
        )
    return x


@dataclass(frozen=True)
class Newton:
    """Newton's method on the fixed-point equations: stop at a residual (max-norm
    of the drift) below ``tol``, or after ``max_iter`` accepted steps (per level
    count), with the status ``MAX_ITERATIONS``. ``None`` takes the solve's
    default: ``1e-12`` and 50 for the fixed points, ``1e-10`` and 30 (Newton on
    the period map, tried where iterating the map contracts slowly; 0: iterate
    the map only) for a periodic regime."""

    tol: float | None = None
    max_iter: int | None = None

    def __post_init__(self):
        if self.tol is not None:
            object.__setattr__(self, "tol", _check_real("Newton.tol", self.tol, 0.0, 1.0))
        if self.max_iter is None:
            return
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)):
            raise ValueError(f"Newton.max_iter={self.max_iter!r} is not an integer")
        if not 0 <= self.max_iter <= 10**6:
            raise ValueError(f"Newton.max_iter={self.max_iter} is out of range: need 0..1000000")
        object.__setattr__(self, "max_iter", int(self.max_iter))

    def of(self, tol: float, max_iter: int) -> tuple[float, int]:
        """``(tol, max_iter)`` with the solve's defaults where this leaves them to it."""
        return (tol if self.tol is None else self.tol), (
            max_iter if self.max_iter is None else self.max_iter
        )


@dataclass(frozen=True)
class Settle:
    """The ODE run (RK4 from the empty system) that gives Newton its start.

    ``time``: how long it runs (0: Newton from the empty system); ``dt``: its
    step. ``None`` takes the model's default: 50 and 0.1 for exponential
    servers; 20, and about ``1.25 / (largest rate)`` (at most 0.1), by class.
    Where Newton then fails by class, the run goes on for ``4 * time`` and
    Newton starts again."""

    time: float | None = None
    dt: float | None = None

    def __post_init__(self):
        if self.time is not None:
            time = _check_real("Settle.time", self.time, 0.0, 1e9, lo_open=False)
            object.__setattr__(self, "time", time)
        if self.dt is not None:
            object.__setattr__(self, "dt", _check_real("Settle.dt", self.dt, 0.0, 10.0))

    def of(self, time: float, dt: float | None) -> tuple[float, float | None]:
        """``(time, dt)`` with the model's defaults where this leaves them to it."""
        return (time if self.time is None else self.time), (dt if self.dt is None else self.dt)


@dataclass(frozen=True)
class LevelGrowth:
    """The adaptive level count (infinite buffers): levels are added until the
    tail mass at the bound is at most ``tol`` (up to the model's cap, past
    which a warning says what is left out)."""

    tol: float = LEVEL_TOL

    def __post_init__(self):
        object.__setattr__(self, "tol", _check_real("LevelGrowth.tol", self.tol, 0.0, 1.0))


@dataclass(frozen=True)
class Solver:
    """The settings of a mean-field fixed point: its :class:`Newton`, its
    :class:`Settle` start and its :class:`LevelGrowth`. Where a ``solver=`` is
    taken, one part alone stands for a :class:`Solver` with the other parts at
    their defaults (:meth:`of`)."""

    newton: Newton = Newton()
    settle: Settle = Settle()
    levels: LevelGrowth = LevelGrowth()

    def __post_init__(self):
        for name, kind in (("newton", Newton), ("settle", Settle), ("levels", LevelGrowth)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(
                    f"Solver.{name} must be a {kind.__name__}, got {getattr(self, name)!r}"
                )

    @classmethod
    def of(cls, value) -> Solver:
        """``solver=`` as a :class:`Solver`: ``None`` (the defaults), a
        :class:`Solver`, or one of its parts (the others at their defaults)."""
        if value is None:
            return cls()
        if isinstance(value, Solver):
            return value
        for name, kind in (("newton", Newton), ("settle", Settle), ("levels", LevelGrowth)):
            if isinstance(value, kind):
                return cls(**{name: value})
        raise TypeError(
            f"solver={value!r} is not a solver setting: pass a Solver, Newton, Settle or "
            "LevelGrowth (jaxqueue.theory), or None for the defaults"
        )
