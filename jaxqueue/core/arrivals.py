"""Arrival processes beyond a constant Poisson rate: rate profiles, MMPPs and traces.

Rates are relative: a run at load ``lambda`` scales a source to the mean
arrival rate ``lambda * N``. :func:`parse_arrivals` reads them from files
(docs/simulation.md, "Time-varying and trace-driven arrivals").
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable

import numpy as np

__all__ = [
    "Profile",
    "MMPP",
    "Trace",
    "parse_arrivals",
    "as_arrivals",
    "MAX_SEGMENTS",
    "MAX_MMPP_STATES",
    "GAP_LIMIT",
]

#: Most segments of a profile (each is a constant in the compiled step).
MAX_SEGMENTS = 100_000

#: Most states of an MMPP's modulating chain.
MAX_MMPP_STATES = 16

#: The largest exponential gap one step can draw, in units of the mean gap
#: (a 32-bit word gives ``-log(2**-33)``): a step passes at most
#: ``1 + GAP_LIMIT / (shortest segment in steps)`` segment ends.
GAP_LIMIT = 33 * math.log(2)


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    return h.hexdigest()[:16]


def _finite(name: str, values) -> np.ndarray:
    try:
        x = np.asarray(values, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers, got {values!r}") from None
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty list of numbers")
    if not np.all(np.isfinite(x)):
        raise ValueError(
            f"{name} must be finite numbers (entry {int(np.argmin(np.isfinite(x)))} is not)"
        )
    return x


@dataclasses.dataclass(frozen=True)
class Profile:
    """A periodic piecewise-constant arrival-rate profile (hashable: a static setting).

    Attributes:
        times: segment starts ``0 = t_0 < t_1 < ... < t_m``; the last is the
            end of the period (after it the profile starts over).
        rates: the relative rate of each segment (``rates[i]`` on ``[t_i,
            t_{i+1})``, ``>= 0``, not all 0); one entry per time, the last
            (at the end of the period) is ignored and may be ``None``.
        label: a short name, recorded with results.
    """

    times: tuple
    rates: tuple
    label: str = "profile"

    kind = "profile"

    def __post_init__(self):
        t = _finite("profile times", self.times)
        rates = list(self.rates)
        if len(rates) != t.size:
            raise ValueError(f"profile: {t.size} times but {len(rates)} rates (give one per time)")
        r = _finite("profile rates", rates[:-1]) if t.size > 1 else np.zeros(0)
        last = rates[-1] if rates else None
        if last is not None and not (
            isinstance(last, (int, float, np.floating, np.integer))
            and math.isfinite(last)
            and last >= 0
        ):  # ignored, but a value that is no rate is a mistake in the file: said, not dropped
            raise ValueError(
                f"profile: the last row's rate ({last}) is not a rate >= 0; that row marks "
                "the end of the period and its rate is ignored: leave it empty or give one"
            )
        if t.size < 2:
            raise ValueError(
                "profile: give at least two times (a segment start and the period's end)"
            )
        if t[0] != 0:
            raise ValueError(f"profile: the first time must be 0, got {t[0]}")
        if np.any(np.diff(t) <= 0):
            i = int(np.argmin(np.diff(t) > 0))
            raise ValueError(f"profile: times must increase (row {i + 1}: {t[i]} then {t[i + 1]})")
        if r.size > MAX_SEGMENTS:
            raise ValueError(f"profile: {r.size} segments; at most {MAX_SEGMENTS}")
        if np.any(r < 0) or not np.any(r > 0):
            raise ValueError("profile: rates must be >= 0 and not all 0")
        object.__setattr__(self, "times", tuple(float(x) for x in t))
        object.__setattr__(self, "rates", tuple(float(x) for x in r) + (None,))

    @classmethod
    def from_function(
        cls, fn: Callable[[float], float], period: float, points: int, label: str = "profile"
    ) -> Profile:
        """A profile sampled from ``fn(t)`` at the midpoints of ``points`` equal
        segments of ``[0, period)``."""
        if not (isinstance(period, (int, float)) and period > 0 and math.isfinite(period)):
            raise ValueError(f"period must be a positive number, got {period!r}")
        if not isinstance(points, int) or not 1 <= points <= MAX_SEGMENTS:
            raise ValueError(f"points must be an int in [1, {MAX_SEGMENTS}], got {points!r}")
        edges = np.linspace(0.0, float(period), points + 1)
        rates = [float(fn(0.5 * (a + b))) for a, b in zip(edges[:-1], edges[1:])]
        return cls(tuple(edges), tuple(rates) + (None,), label)

    @property
    def durations(self) -> np.ndarray:
        return np.diff(np.asarray(self.times))

    @property
    def period(self) -> float:
        return self.times[-1]

    @property
    def shape(self) -> np.ndarray:
        """Each segment's rate over the time-mean rate (time mean 1)."""
        r = np.asarray(self.rates[:-1], np.float64)
        return r / (np.sum(r * self.durations) / self.period)

    @property
    def peak(self) -> float:
        """The largest rate over the mean rate."""
        return float(self.shape.max())

    def extra_rate(self) -> float:
        """Rate of non-arrival candidate events the source adds (none)."""
        return 0.0

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "segments": len(self.rates) - 1,
            "period": self.period,
            "peak": self.peak,
            "digest": _digest(self.times, self.rates[:-1]),
        }


@dataclasses.dataclass(frozen=True)
class MMPP:
    """A Markov-modulated Poisson source (hashable: a static setting).

    Attributes:
        generator: the modulating chain's generator ``Q`` (rows sum to 0,
            off-diagonal ``>= 0``), in units of the mean service time;
            irreducible, so the source has one stationary law ``pi``.
        rates: the relative arrival rate in each state (``>= 0``, not all 0;
            scaled so that ``pi . rates`` is the load).
        label: a short name, recorded with results.
    """

    generator: tuple
    rates: tuple
    label: str = "mmpp"

    kind = "mmpp"

    def __post_init__(self):
        r = _finite("mmpp rates", self.rates)
        m = r.size
        if m > MAX_MMPP_STATES:
            raise ValueError(f"mmpp: {m} states; at most {MAX_MMPP_STATES}")
        try:
            q = np.asarray(self.generator, np.float64)
        except (TypeError, ValueError):
            raise ValueError("mmpp: the generator must be a square matrix of numbers") from None
        if q.shape != (m, m):
            raise ValueError(
                f"mmpp: the generator must be {m} x {m} (one row per rate), got shape {q.shape}"
            )
        if not np.all(np.isfinite(q)):
            raise ValueError("mmpp: the generator must be finite")
        off = q - np.diag(np.diag(q))
        if np.any(off < 0):
            raise ValueError("mmpp: the generator's off-diagonal entries must be >= 0")
        if np.max(np.abs(q.sum(axis=1))) > 1e-9 * max(1.0, np.abs(q).max()):
            raise ValueError("mmpp: the generator's rows must sum to 0")
        if np.any(r < 0) or not np.any(r > 0):
            raise ValueError("mmpp: rates must be >= 0 and not all 0")
        q = off - np.diag(off.sum(axis=1))  # exact zero row sums
        reach = (off > 0) | np.eye(m, dtype=bool)
        for _ in range(m):
            reach = reach | ((reach.astype(int) @ reach.astype(int)) > 0)
        if not reach.all():
            raise ValueError(
                "mmpp: the modulating chain must be irreducible (every state reachable from every other)"
            )
        object.__setattr__(self, "generator", tuple(tuple(float(x) for x in row) for row in q))
        object.__setattr__(self, "rates", tuple(float(x) for x in r))

    @property
    def matrix(self) -> np.ndarray:
        return np.asarray(self.generator, np.float64)

    @property
    def stationary(self) -> np.ndarray:
        """The modulating chain's stationary law ``pi``."""
        q = self.matrix
        m = q.shape[0]
        a = np.vstack([q.T, np.ones((1, m))])
        b = np.concatenate([np.zeros(m), [1.0]])
        pi = np.linalg.lstsq(a, b, rcond=None)[0]
        return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()

    @property
    def shape(self) -> np.ndarray:
        """Each state's rate over the mean rate (``pi . shape = 1``)."""
        r = np.asarray(self.rates, np.float64)
        return r / float(self.stationary @ r)

    @property
    def peak(self) -> float:
        return float(self.shape.max())

    def extra_rate(self) -> float:
        """Rate of the modulating chain's candidate events: its largest exit rate."""
        return float(max(-np.diag(self.matrix).min(), 0.0))

    def jump_table(self) -> np.ndarray:
        """The uniformized jump matrix ``I + Q / q`` (rows are laws)."""
        q = self.extra_rate()
        m = self.matrix.shape[0]
        return np.eye(m) if q == 0 else np.eye(m) + self.matrix / q

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "states": len(self.rates),
            "peak": self.peak,
            "digest": _digest(self.matrix.ravel(), self.rates),
        }


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """Arrival times read from a trace (hashable by content: a static setting).

    Attributes:
        times: the arrival times, non-decreasing (any unit, any origin).
        service: each task's service time in the same unit, or None; only
            :meth:`natural_load` uses it (the simulated servers keep their
            exponential law).
        label: a short name, recorded with results.
    """

    times: np.ndarray
    service: np.ndarray | None = None
    label: str = "trace"

    kind = "trace"

    def __post_init__(self):
        t = _finite("trace times", self.times)
        if t.size < 2:
            raise ValueError("trace: give at least two arrival times")
        if np.any(np.diff(t) < 0):
            i = int(np.argmin(np.diff(t) >= 0))
            raise ValueError(
                f"trace: arrival times must not decrease (row {i + 1}: {t[i]} then {t[i + 1]})"
            )
        if t[-1] == t[0]:
            raise ValueError("trace: all arrivals at one time; the trace has no rate")
        t.setflags(write=False)
        object.__setattr__(self, "times", t)
        if self.service is not None:
            s = _finite("trace service times", self.service)
            if s.size != t.size:
                raise ValueError(f"trace: {t.size} times but {s.size} service times")
            if np.any(s <= 0):
                raise ValueError("trace: service times must be > 0")
            s.setflags(write=False)
            object.__setattr__(self, "service", s)
        object.__setattr__(self, "_key", _digest(t, [] if self.service is None else self.service))

    def __hash__(self):
        return hash((self.kind, self._key, self.label))

    def __eq__(self, other):
        return isinstance(other, Trace) and (self._key, self.label) == (other._key, other.label)

    @property
    def gaps(self) -> np.ndarray:
        """The gap before each arrival over the mean gap (mean 1): the first
        arrival's gap is the wrap from the end of the trace, one mean gap."""
        t = self.times
        mean = (t[-1] - t[0]) / (t.size - 1)
        return np.concatenate([[1.0], np.diff(t) / mean])

    @property
    def arrivals(self) -> int:
        return int(self.times.size)

    @property
    def scv(self) -> float:
        """The squared coefficient of variation of the gaps (1 for Poisson)."""
        g = np.diff(self.times)
        return float(g.var() / g.mean() ** 2)

    def natural_load(self, n_servers: int) -> float | None:
        """The trace's own load on ``n_servers`` servers (mean service time
        over ``n_servers`` mean gaps), or None without service times."""
        if self.service is None:
            return None
        mean_gap = (self.times[-1] - self.times[0]) / (self.times.size - 1)
        return float(self.service.mean() / mean_gap / n_servers)

    @property
    def peak(self) -> float:
        return 1.0

    def extra_rate(self) -> float:
        return 0.0

    def to_dict(self) -> dict:
        out = {
            "kind": self.kind,
            "label": self.label,
            "arrivals": self.arrivals,
            "scv": self.scv,
            "digest": self._key,
        }
        if self.service is not None:
            out["mean_service"] = float(self.service.mean())
        return out


#: The largest arrivals file read, in bytes (a FIFO or a device is refused too: either
#: would hang or fill memory).
MAX_ARRIVALS_BYTES = 256 << 20


def _check_file(path: str) -> None:
    """Refuse an arrivals file that is missing, not a regular file, or too large."""
    if not os.path.exists(path):
        raise ValueError(f"arrivals={path!r}: no such file")
    if not os.path.isfile(path):
        raise ValueError(f"arrivals={path!r}: not a regular file: give a CSV or JSON file")
    size = os.path.getsize(path)
    if size > MAX_ARRIVALS_BYTES:
        raise ValueError(
            f"arrivals={path!r}: {size} bytes, more than the {MAX_ARRIVALS_BYTES} an "
            "arrivals file may have"
        )


def _read_csv(path: str) -> tuple[list[str], list[list[str]]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # (a spreadsheet's BOM)
            rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    except UnicodeDecodeError as err:
        raise ValueError(f"arrivals={path!r}: not UTF-8 text ({err})") from None
    except csv.Error as err:
        raise ValueError(f"arrivals={path!r}: not a CSV file ({err})") from None
    if not rows:
        raise ValueError(f"arrivals={path!r}: the file is empty")
    header = [c.strip().lower() for c in rows[0]]
    return header, rows[1:]


def _column(path, header, rows, names, optional=False, blank_last=False):
    for name in names:
        if name in header:
            j = header.index(name)
            out = []
            for i, r in enumerate(rows):
                cell = r[j].strip() if j < len(r) else ""
                if cell == "" and blank_last and i == len(rows) - 1:
                    out.append(None)
                    continue
                try:
                    out.append(float(cell))
                except ValueError:
                    raise ValueError(
                        f"arrivals={path!r}: row {i + 2} column {name!r} is not a number: {cell!r}"
                    ) from None
            return out
    if optional:
        return None
    raise ValueError(
        f"arrivals={path!r}: the header needs a column {' or '.join(map(repr, names))}"
    )


def parse_arrivals(text: str):
    """An arrival source from a file: a CSV rate profile (header ``time,rate``),
    a CSV trace (``time`` or ``timestamp``, optional ``service``) or an MMPP
    JSON file (``{"generator": [[...]], "rates": [...]}``)."""
    if not isinstance(text, str):
        raise TypeError(f"arrivals must be a file name, got {text!r}")
    _check_file(text)
    label = os.path.splitext(os.path.basename(text))[0]
    if text.lower().endswith(".json"):
        with open(text, encoding="utf-8-sig") as f:
            try:
                spec = json.load(f)
            except UnicodeDecodeError as err:
                raise ValueError(f"arrivals={text!r}: not UTF-8 text ({err})") from None
            except json.JSONDecodeError as err:
                raise ValueError(f"arrivals={text!r}: not valid JSON ({err})") from None
        if not isinstance(spec, dict) or "generator" not in spec or "rates" not in spec:
            raise ValueError(
                f"arrivals={text!r}: an MMPP file holds an object with 'generator' and 'rates'"
            )
        try:
            return MMPP(tuple(map(tuple, spec["generator"])), tuple(spec["rates"]), label)
        except (TypeError, ValueError) as err:
            raise ValueError(f"arrivals={text!r}: {err}") from None
    header, rows = _read_csv(text)
    try:
        if "rate" in header:
            times = _column(text, header, rows, ("time",))
            rates = _column(text, header, rows, ("rate",), blank_last=True)
            return Profile(tuple(times), tuple(rates), label)
        times = _column(text, header, rows, ("time", "timestamp"))
        service = _column(text, header, rows, ("service",), optional=True)
        return Trace(np.asarray(times), None if service is None else np.asarray(service), label)
    except ValueError as err:
        msg = str(err)
        raise ValueError(
            msg if msg.startswith("arrivals=") else f"arrivals={text!r}: {msg}"
        ) from None


def as_arrivals(arrivals):
    """``None`` (Poisson arrivals), a file name (:func:`parse_arrivals`) or a
    :class:`Profile`, :class:`MMPP` or :class:`Trace`."""
    if arrivals is None or isinstance(arrivals, (Profile, MMPP, Trace)):
        return arrivals
    if isinstance(arrivals, (str, os.PathLike)):
        return parse_arrivals(os.fspath(arrivals))
    raise TypeError(
        f"arrivals must be None, a file name, or a Profile, MMPP or Trace; got {arrivals!r}"
    )
