"""Grid-experiment specs: the TOML file of ``jaxqueue sweep SPEC.toml``.

::

    name = "wang-fig4"          # optional; default: the file stem
    [grid]
    policy = ["jiq", { name = "jiq-pod", d = [2, 3] }, "pod"]
    servers = [1000]
    ratio = [10]                # or dispatchers = [100]; neither: one dispatcher
    load = [0.5, 0.7, 0.9]      # or alpha = [...] (1 - N**-alpha), beta = [...] (1 - beta/sqrt(N))
    buffer = [0]                # optional; 0 or "inf": infinite (the default)
    d = [2]                     # optional, for every policy (likewise z)
    service = ["exp", "erlang:4", "hyperexp:4"]   # optional: service laws (default exp)
    pools = ["0.2:2,0.8:1"]     # optional: server pools FRACTION:SPEED,... (default: identical)
    arrivals = ["data/trace.csv"]   # optional: arrival files, relative to the spec's folder
    [run]
    replicas = 16
    time = 300                  # measured time units, or steps = ...
    warmup_time = 50            # or warmup = steps; default 100 time units
    seed = 0
    init = "mean-field"         # "empty" (default) or "mean-field"
    theory = "mean-field"       # "mean-field" (where the policy has one), "refined", "exact", "none"
    [quick]                     # overrides for --quick: any key of [grid] or [run]
    servers = [100]
    [gpu]                       # overrides for --gpu (a mode sized to fill a GPU), likewise
    replicas = 4096
    [[figure]]                  # any number; see jaxqueue.studies.figures
    name = "response_time"
    metric = "mean_response_time"

A scalar stands for a one-element list. A key of a mode's table ([quick] or
[gpu], :data:`MODES`) replaces its whole group of alternatives (``steps`` there
drops ``time``; ``alpha`` drops ``load``); a mode is another spec, with a hash
of its own. The [gpu] mode of a spec that a GPU suits runs many replicas over
short windows from the mean-field start (the warm-up diagnostic guards the
bias), so that a program's lockstep batch fills the device.
Everything is checked here, before anything compiles: a :class:`SpecError`
names the line of the offending key and the valid range. A point has a stable
id and its own random stream (:meth:`Point.seed_word`), so its result does not
depend on which points share its batch or on the order of the grid.

``arrivals`` names files of :func:`jaxqueue.core.arrivals.parse_arrivals`
(a rate profile, a Markov-modulated source or a trace; ``"poisson"`` is the
default, Poisson arrivals). A point keeps the path as written, so its id does
not depend on where the spec lies; the file is found relative to the spec's
folder (:func:`load_spec`, or ``base`` of :func:`parse_spec`) and read when
the spec is parsed, and its sha256 enters the spec's hash: a store is not
resumed with other data under the same name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
from pathlib import Path

from jaxqueue.core.arrivals import parse_arrivals
from jaxqueue.core.config import Model
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import capacity, make_pools, parse_service, uniform_rate
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME,
    MAX_SERVERS,
    MAX_STEPS,
    System,
    check_int,
    check_load,
    dispatchers_for_ratio,
    halfin_whitt_load,
    heavy_traffic_load,
)
from jaxqueue.policies.registry import make, option_names, policy_class
from jaxqueue.studies.figures import FigureSpec, check_expression, evaluate_expression, parse_figure

try:
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None

__all__ = [
    "SpecError",
    "Point",
    "RunSettings",
    "GridSpec",
    "ArrivalsFile",
    "load_spec",
    "parse_spec",
    "GRID_KEYS",
    "RUN_KEYS",
    "INITS",
    "THEORIES",
    "DEFAULT_WARMUP_TIME",
    "MAX_WARMUP_RATIO",
    "EXACT_MAX_STATES",
    "MODES",
]

GRID_KEYS = (
    "policy",
    "servers",
    "ratio",
    "dispatchers",
    "load",
    "alpha",
    "beta",
    "buffer",
    "d",
    "z",
    "order",
    "service",
    "pools",
    "arrivals",
)
#: Policy options a [grid] list may give for every policy (each must take it).
SHARED_OPTIONS = ("d", "z", "order")
RUN_KEYS = ("replicas", "time", "steps", "warmup_time", "warmup", "seed", "init", "theory")
INITS = ("empty", "mean-field", "auto")
THEORIES = ("mean-field", "refined", "exact", "none")
#: The warm-up may be at most this many times the measured part.
MAX_WARMUP_RATIO = 10
#: State budget of theory = "exact" (the ``max_states`` default of ``solve_exact``).
EXACT_MAX_STATES = 200_000
#: The modes a spec may define: a table of overrides each, chosen by ``--quick`` or ``--gpu``.
MODES = ("quick", "gpu")
_TOP_KEYS = ("name", "grid", "run", *MODES, "figure")
_GROUPS = (
    ("ratio", "dispatchers"),
    ("load", "alpha", "beta"),
    ("time", "steps"),
    ("warmup_time", "warmup"),
)
_HEADER = re.compile(r"""^\s*\[\s*["']?([\w.-]+)["']?\s*\]""")
_ARRAY = re.compile(r"""^\s*\[\[\s*["']?([\w.-]+)["']?\s*\]\]""")
_KEY = re.compile(r"""^\s*["']?([\w.-]+)["']?\s*=""")


class SpecError(ValueError):
    """An invalid spec; the message starts with ``line N:`` when the line is known (``.line``)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


def _canonical(obj) -> str:
    """Compact JSON with sorted keys and floats rounded to 12 significant digits."""

    def norm(x):
        if isinstance(x, float):
            return float(f"{x:.12g}")
        if isinstance(x, dict):
            return {str(k): norm(v) for k, v in x.items()}
        return [norm(v) for v in x] if isinstance(x, (list, tuple)) else x

    return json.dumps(norm(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a grid: a policy with its options in one system at one load.

    Attributes:
        policy: the registered policy name.
        options: all the policy's options (defaults included) as sorted ``(key, value)`` pairs.
        servers: ``N``.
        dispatchers: ``M``.
        buffer: places per server, or ``None`` for infinite buffers.
        load: ``lambda``, arrivals per server per unit time.
        alpha: the exponent the load came from (``1 - N**-alpha``), or None.
        beta: the Halfin-Whitt parameter the load came from (``1 - beta/sqrt(N)``), or None.
        service: the service law's command-line form (``"erlang:4"``), or None
            for exponential service.
        pools: the server pools' command-line form (``"0.2:2,0.8:1"``), or None.
        arrivals: the arrivals file as the spec writes it (``"data/trace.csv"``),
            or None for Poisson arrivals.
        source: the parsed arrivals file (not part of the point's identity; None
            with Poisson arrivals, or when the spec's files were not read): it
            sets the steps per time unit.
    """

    policy: str
    options: tuple
    servers: int
    dispatchers: int
    buffer: int | None
    load: float
    alpha: float | None = None
    beta: float | None = None
    service: str | None = None
    pools: str | None = None
    arrivals: str | None = None
    source: object = dataclasses.field(default=None, compare=False, repr=False)

    def params(self) -> dict:
        """The point as a plain dict, with ``ratio`` and ``d``, ``z`` (None if not options).

        ``order`` is there only for a policy that takes it (JIQ-Original), and
        ``service``, ``pools`` and ``arrivals`` only where given, so the ids of
        other points do not depend on them.
        """
        opts = dict(self.options)
        return {
            "policy": self.policy,
            "options": opts,
            "servers": self.servers,
            "dispatchers": self.dispatchers,
            "ratio": self.servers / self.dispatchers,
            "buffer": self.buffer,
            "load": self.load,
            "alpha": self.alpha,
            "beta": self.beta,
            "d": opts.get("d"),
            "z": opts.get("z"),
            **({"order": opts["order"]} if "order" in opts else {}),
            **({"service": self.service} if self.service is not None else {}),
            **({"pools": self.pools} if self.pools is not None else {}),
            **({"arrivals": self.arrivals} if self.arrivals is not None else {}),
        }

    def law(self):
        """The service law (a PhaseType), or None for exponential service."""
        return None if self.service is None else parse_service(self.service)

    def pool_set(self):
        """The pools as :class:`~jaxqueue.core.service.Pool` objects, or None."""
        return make_pools(self.pools, self.servers)

    def rate(self) -> float:
        """The uniformization rate of service (1 for identical exponential servers)."""
        return uniform_rate(self.law(), self.pool_set())

    def system(self) -> System:
        """The point's servers, service and arrivals (what fixes its step rate)."""
        return System(
            self.servers, levels=1, service=self.law(), pools=self.pool_set(), arrivals=self.source
        )

    def steps_per_time_unit(self) -> float:
        """Uniformized steps per unit time: ``N (load + rate)``, more with a rate
        profile or an MMPP, uniformized at their peak (:meth:`System.step_rate`)."""
        return self.servers * self.system().step_rate(self.load)

    def point_id(self) -> str:
        """The first 16 hex digits of the sha256 of the canonical JSON of :meth:`params`."""
        return hashlib.sha256(_canonical(self.params()).encode()).hexdigest()[:16]

    def seed_word(self, seed: int) -> int:
        """A 31-bit integer from the sha256 of ``"<point_id>:<seed>"``: the point's stream."""
        digest = hashlib.sha256(f"{self.point_id()}:{int(seed)}".encode()).digest()
        return int.from_bytes(digest[:4], "big") >> 1

    def label(self) -> str:
        """A short display name, e.g. ``pod(d=2) N=100 M=1 buffer=inf load=0.9``."""
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        text = f"{self.policy}({opts})" if opts else self.policy
        text += f" N={self.servers} M={self.dispatchers} buffer={self.buffer or 'inf'}"
        text += f" load={self.load:.6g}"
        for key in ("alpha", "beta"):
            text += f" {key}={getattr(self, key):g}" if getattr(self, key) is not None else ""
        for key in ("service", "pools", "arrivals"):
            text += f" {key}={getattr(self, key)}" if getattr(self, key) is not None else ""
        return text


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How every point of a grid is run (checked by :func:`parse_spec`).

    Attributes:
        replicas: independent replicas per point (>= 2).
        time: measured time units at each point's load, or None (then ``steps``);
            a number, or an expression of the point's parameters such as
            ``"200 * servers ** (2 * alpha - 1)"`` (see :meth:`time_units`).
        steps: measured steps per replica, or None (then ``time``).
        warmup_time: discarded time units (a number or an expression, as
            ``time``), or None (then ``warmup``).
        warmup: discarded steps per replica, or None (then ``warmup_time``).
        seed: the run's seed; a point's stream comes from :meth:`Point.seed_word`.
        init: ``"empty"`` or ``"mean-field"``.
        theory: ``"mean-field"``, ``"refined"`` (the mean field, and beside it
            the 1/N-refined mean field at the point's N where the policy has a
            generic mean field), ``"exact"`` or ``"none"``.
    """

    replicas: int
    time: float | str | None = None
    steps: int | None = None
    warmup_time: float | str | None = DEFAULT_WARMUP_TIME
    warmup: int | None = None
    seed: int = 0
    init: str = "empty"
    theory: str = "none"

    def __post_init__(self):
        if (self.time is None) == (self.steps is None) or (
            (self.warmup_time is None) == (self.warmup is None)
        ):
            raise SpecError("RunSettings needs one of time / steps and one of warmup_time / warmup")

    def time_units(self, key: str, point: Point) -> float | None:
        """``time`` or ``warmup_time`` (``key``) at ``point``: its number, or its expression's value.

        Raises:
            SpecError: if an expression is not finite, or negative (or zero for ``time``),
                at ``point`` (e.g. it names ``alpha`` and the point has a plain load).
        """
        value = getattr(self, key)
        if not isinstance(value, str):
            return value
        try:
            units = evaluate_expression(value, point.params())
        except ValueError as err:
            raise SpecError(f"{key} at {point.label()}: {err}") from None
        if not math.isfinite(units) or units < 0 or (units == 0 and key == "time"):
            need = ">= 0" if key == "warmup_time" else "> 0"
            raise SpecError(
                f"{key}={value!r} is {units:g} at {point.label()}, out of range: "
                f"need a finite value {need} (a parameter it names may be unset)"
            )
        return units

    def _steps(self, key: str, count, point: Point) -> int:
        units = self.time_units(key, point)
        per = point.steps_per_time_unit()
        n = count if units is None else math.ceil(units * per)
        if n > MAX_STEPS:
            raise SpecError(
                f"{key}={units:g} is {n} steps per replica at {point.label()}, out "
                f"of range: need at most {MAX_STEPS}; run more replicas instead"
            )
        return n

    def steps_for(self, point: Point) -> int:
        """Measured steps per replica at ``point``: ``ceil(time * N * (load + rate))`` (more
        with a rate profile or an MMPP: :meth:`Point.steps_per_time_unit`) or ``steps``."""
        return self._steps("time", self.steps, point)

    def warmup_for(self, point: Point) -> int:
        """Warm-up steps per replica at ``point``, from ``warmup_time`` or ``warmup``."""
        return self._steps("warmup_time", self.warmup, point)


@dataclasses.dataclass(frozen=True)
class ArrivalsFile:
    """An ``arrivals`` file of a spec, found and read when the spec was parsed.

    Attributes:
        text: the path as the spec writes it (what points carry).
        path: the absolute path it was found at (what the runner reads).
        sha256: the digest of the file's bytes (part of the spec's hash).
        source: the parsed :class:`~jaxqueue.core.arrivals.Profile`,
            :class:`~jaxqueue.core.arrivals.MMPP` or :class:`~jaxqueue.core.arrivals.Trace`.
    """

    text: str
    path: str
    sha256: str
    source: object


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """A parsed, validated spec.

    Attributes:
        name: the ``name`` key, else the file stem.
        points: the grid in the spec's order: policy outermost, then servers, ratio or
            dispatchers, buffer, the policy's options (by key), load/alpha/beta innermost.
        run: the :class:`RunSettings`.
        source_text: the spec file's text.
        figures: the :class:`~jaxqueue.studies.figures.FigureSpec` of each ``[[figure]]``
            (not part of the hash: figures change no result).
        arrivals: the :class:`ArrivalsFile` of each ``arrivals`` value; empty when
            the spec was parsed without its folder (then its files were not
            read, and a spec with arrivals can be drawn but not run).
    """

    name: str
    points: tuple
    run: RunSettings
    source_text: str = dataclasses.field(default="", repr=False)
    figures: tuple = ()
    arrivals: tuple = ()

    def model(self, point: Point) -> Model:
        """The :class:`~jaxqueue.core.config.Model` of one of the spec's points
        (its arrivals file as the path it was found at; see :meth:`arrivals_file`)."""
        arrivals = None if point.arrivals is None else self.arrivals_file(point.arrivals).path
        return Model(
            point.policy,
            point.servers,
            point.dispatchers,
            buffer=point.buffer,
            service=point.service,
            pools=point.pools,
            arrivals=arrivals,
            **dict(point.options),
        )

    def arrivals_file(self, text: str) -> ArrivalsFile:
        """The :class:`ArrivalsFile` of an ``arrivals`` value of the spec."""
        for source in self.arrivals:
            if source.text == text:
                return source
        raise ValueError(
            f"spec {self.name!r} was parsed without its folder, so its arrivals "
            f"file {text!r} was not read: load it with load_spec(path) or "
            "parse_spec(text, base=FOLDER)"
        )

    def figure(self, name: str) -> FigureSpec:
        """The ``[[figure]]`` named ``name``."""
        for fig in self.figures:
            if fig.name == name:
                return fig
        names = ", ".join(f.name for f in self.figures) or "none"
        raise ValueError(f"figure={name!r} is not in spec {self.name!r}: its figures are {names}")

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of the resolved points and run settings.

        Comments, layout, the name, the order of the grid (points are sorted by id, as
        results do not depend on it) and spellings of one value (``300`` or ``300.0``,
        ``0`` or ``"inf"``, a default written out) do not change it; any other change does,
        and so does a change of the bytes of an ``arrivals`` file.
        """
        points = sorted((p.params() for p in self.points), key=_canonical)
        payload = {"points": points, "run": dataclasses.asdict(self.run)}
        texts = sorted({p.arrivals for p in self.points if p.arrivals is not None})
        if texts:  # only then: the hashes of specs without arrivals are unchanged
            payload["arrivals"] = {t: self.arrivals_file(t).sha256 for t in texts}
        return hashlib.sha256(_canonical(payload).encode()).hexdigest()


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _int(name: str, lo: int, hi: int):
    return lambda value: check_int(name, value, lo, hi) or value


def _span(name: str, zero: bool):
    def check(value):
        if isinstance(value, str):  # checked per point by RunSettings.time_units
            return check_expression(value, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"{name} must be a finite number or an expression string, got {value!r}"
            )
        if _number(name, value) < 0 or (value == 0 and not zero):
            need = f"{name} {'>=' if zero else '>'} 0"
            raise ValueError(f"{name}={value} is out of range: need {need}")
        return float(value)

    return check


def _choice(name: str, valid: tuple):
    def check(value):
        if value not in valid:
            raise ValueError(f"{name}={value!r} is not valid: use one of {str(valid)[1:-1]}")
        return value

    return check


def _service(value):
    """A service law's command-line form, checked; ``"exp"`` is None (the default law)."""
    if not isinstance(value, str):
        raise TypeError(f"service must be a string such as 'erlang:4', got {value!r}")
    law = parse_service(value)
    return None if law.is_unit_exponential else value


def _pools_text(value):
    """Server pools ``"F1:S1,F2:S2"``, checked for form (counts are checked per N)."""
    if not isinstance(value, str):
        raise TypeError(f"pools must be a string such as '0.2:2,0.8:1', got {value!r}")
    make_pools(value, 10**6)  # the fractions and speeds; per-N counts at each point
    return value


def _arrivals_text(value):
    """An ``arrivals`` value: a file path as written; ``"poisson"`` is None (the default)."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(
            f"arrivals must be a file path such as 'data/trace.csv' (or 'poisson'), got {value!r}"
        )
    return None if value == "poisson" else value


def _read_arrivals(text: str, base) -> ArrivalsFile:
    """Find an ``arrivals`` file relative to ``base`` and parse it (errors: ValueError)."""
    path = Path(base, os.path.expanduser(text)).resolve()
    try:
        if not path.is_file():
            raise ValueError(f"no such file {path}")
        source = parse_arrivals(str(path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, ValueError) as err:
        raise ValueError(f"arrivals={text!r}: {err}") from None
    return ArrivalsFile(text, str(path), digest, source)


def _buffer(value):
    if value == "inf" or (not isinstance(value, bool) and value in (0, math.inf)):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(
            f"buffer={value} is out of range: need 1 <= buffer <= 10**6, or 0 or "
            '"inf" for infinite buffers'
        )
    return check_int("buffer", value, 1, 10**6) or value


class _Parser:
    """The TOML data, a mode's overrides, and the line of every key in the source text."""

    def __init__(self, text: str, mode: str | None):
        self.rows, self.keys, self.starts, table = text.splitlines(), {}, set(), ""
        arrays: dict[str, int] = {}  # [[name]] -> how many so far; the i-th is table "name#i"
        for i, row in enumerate(self.rows, 1):
            if m := _ARRAY.match(row):
                arrays[m.group(1)] = arrays.get(m.group(1), -1) + 1
                table = f"{m.group(1)}#{arrays[m.group(1)]}"
                self.keys.setdefault((table, ""), i)
                self.starts.add(i)
            elif m := _HEADER.match(row) or _KEY.match(row):
                table = m.group(1) if m.re is _HEADER else table
                self.keys.setdefault((table, "" if m.re is _HEADER else m.group(1)), i)
                self.starts.add(i)
        try:
            self.data = _toml.loads(text)
        except _toml.TOMLDecodeError as err:
            m = re.search(r"line (\d+)", str(err))
            raise SpecError(f"not valid TOML: {err}", int(m.group(1)) if m else None) from None
        self.vals = {}  # part -> {key: (value, the table it came from)}
        for key, value in self.data.items():
            if key not in _TOP_KEYS:
                self.fail("", key, f"unknown key or table {key!r}; valid: {', '.join(_TOP_KEYS)}")
            if key == "figure":
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    self.fail("", key, "figures are tables: write [[figure]] above each")
            elif key != "name" and not isinstance(value, dict):
                self.fail("", key, f"{key} must be a table ([{key}]), got {value!r}")
        parts = (
            ("grid", GRID_KEYS),
            ("run", RUN_KEYS),
            *((m, GRID_KEYS + RUN_KEYS) for m in MODES),
        )
        for part, valid in parts:
            if part not in MODES and part not in self.data:
                raise SpecError(f"the spec has no [{part}] table", len(self.rows) or 1)
            for key in self.data.get(part, {}):
                if key not in valid:
                    self.fail(
                        part, key, f"unknown key {key!r} in [{part}]; valid: {', '.join(valid)}"
                    )
            self.vals[part] = {k: (v, part) for k, v in self.data.get(part, {}).items()}
        if mode is not None and mode not in self.data:
            raise SpecError(f"--{mode} needs a [{mode}] table (any key of [grid] or [run])", 1)
        for key, value in self.data.get(mode, {}).items() if mode else ():
            part = self.vals["grid" if key in GRID_KEYS else "run"]
            for other in itertools.chain(*(g for g in _GROUPS if key in g)):
                part.pop(other, None)
            part[key] = (value, mode)

    def line(self, part: str, key: str) -> int:
        """The line of ``key`` in the table it came from, else of that table, else 1."""
        table = self.vals.get(part, {}).get(key, (None, part))[1]
        keys = self.keys
        return (
            keys.get((table, key))
            or keys.get(("", f"{table}.{key}"))
            or keys.get((table or key, ""))
            or keys.get(("", table))
            or 1
        )

    def entry(self, start: int, name: str, nth: int) -> int:
        """The line of the ``nth`` string ``name`` (from 0) in the value of the key at ``start``."""
        token, found = re.compile(rf"""["']{re.escape(name)}["']"""), []
        for i in range(start, len(self.rows) + 1):
            if i > start and i in self.starts:
                break
            found += [i] * len(token.findall(self.rows[i - 1]))
        return found[min(nth, len(found) - 1)] if found else start

    def fail(self, part: str, key: str, message: str):
        raise SpecError(message, self.line(part, key))

    def has(self, part: str, key: str) -> bool:
        return key in self.vals[part]

    def get(self, part: str, key: str, default=None):
        return self.vals[part].get(key, (default,))[0]

    def one_of(self, part: str, group: tuple, required: bool):
        given = [k for k in group if self.has(part, k)]
        if len(given) > 1:
            self.fail(
                part,
                max(given, key=lambda k: self.line(part, k)),
                f"[{part}] gives {' and '.join(given)}: give only one of {' / '.join(group)}",
            )
        if required and not given:
            self.fail(part, group[0], f"[{part}] needs one of {' / '.join(group)}")
        return given[0] if given else None

    def axis(self, key: str, check) -> list:
        """The checked values of a list key of [grid] (a scalar is a one-element list)."""
        raw, out = self.get("grid", key), []
        for value in raw if isinstance(raw, list) else [raw]:
            try:
                checked = check(value)
            except (TypeError, ValueError) as err:
                self.fail("grid", key, str(err))
            if checked in out:
                self.fail(
                    "grid", key, f"{key} lists {value!r} twice (or two values that mean the same)"
                )
            out.append(checked)
        return out or self.fail("grid", key, f"{key} is empty: give at least one value")

    def scalar(self, key: str, check, default):
        try:
            return check(self.get("run", key)) if self.has("run", key) else default
        except (TypeError, ValueError) as err:
            self.fail("run", key, str(err))

    def policies(self) -> list:
        """``(name, {option: [values]}, {option or "policy": line})`` per policy entry."""
        if not self.has("grid", "policy"):
            self.fail("grid", "policy", "[grid] needs policy = [...]")
        start, entries = self.line("grid", "policy"), []
        shared = {k: self.axis(k, lambda v: v) for k in SHARED_OPTIONS if self.has("grid", k)}
        for entry in self.axis("policy", lambda v: v):
            table = dict(entry) if isinstance(entry, dict) else {"name": entry}
            name = table.pop("name", None)
            if not isinstance(name, str):
                self.fail(
                    "grid",
                    "policy",
                    "a policy is a name or an inline table of a name and "
                    f'options, e.g. {{ name = "pod", d = [2, 3] }}; got {entry!r}',
                )
            line = self.entry(start, name, [e[0] for e in entries].count(name))
            try:
                takes = option_names(policy_class(name))
            except ValueError as err:
                raise SpecError(str(err), line) from None
            opts, lines = {}, {"policy": line}
            for key in [*table, *shared]:
                lines[key] = line if key in table else self.line("grid", key)
                if key not in takes:
                    raise SpecError(
                        f"policy {name!r} takes no option {key}; its options: "
                        f"{', '.join(takes) or 'none'}",
                        lines[key],
                    )
                if key in table and key in shared:
                    self.fail("grid", key, f"{key} is given both in [grid] and for policy {name!r}")
                values = shared.get(key) or _as_list(table[key])
                if not values or len(set(map(repr, values))) < len(values):
                    raise SpecError(f"{name}: option {key} is empty or repeats a value", line)
                opts[key] = values
            entries.append((name, opts, lines))
        return entries

    def dispatchers(self, n: int) -> list:
        key = self.one_of("grid", ("ratio", "dispatchers"), required=False)
        if key == "dispatchers":
            return self.axis(key, _int("dispatchers", 1, n))

        def from_ratio(ratio):
            return dispatchers_for_ratio(n, _number("ratio", ratio), "servers")

        return self.axis(key, from_ratio) if key else [1]

    def loads(self, key: str, n: int, buffer, cap: float = 1.0) -> list:
        """``(load, alpha, beta)`` per value of the load axis at ``n`` servers
        (``cap``: the servers' capacity, for the stability check)."""

        def check(value):
            x = _number(key, value)
            if key == "load":
                return check_load(value, buffer, cap), None, None
            try:
                form = heavy_traffic_load if key == "alpha" else halfin_whitt_load
                lam = check_load(form(n, value), buffer, cap)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{key}={value} at servers={n}: {err}") from None
            return lam, (x if key == "alpha" else None), (x if key == "beta" else None)

        return self.axis(key, check)

    def resolve(self, name, opts, lines, n, m, buffer, run: RunSettings):
        """Build and validate the Policy of one grid cell (errors name the line of the cause)."""
        try:
            pol = make(name, **opts)
            pol.validate(System(n, m, buffer, buffer or 1, 0))
        except (TypeError, ValueError) as err:
            what = re.match(r"^(\w+)(?:=| must)", str(err))
            line = lines.get(what.group(1) if what else "") or lines["policy"]
            if what and what.group(1) == "n_dispatchers" and m > 1:
                line = self.line("grid", self.one_of("grid", ("ratio", "dispatchers"), False))
            raise SpecError(f"{name} at servers={n}, dispatchers={m}: {err}", line) from None
        if run.init == "mean-field" and pol.mean_field_kind() == "none":
            self.fail(
                "run",
                "init",
                f"init='mean-field' needs a mean field, and {name!r} has "
                f'none ({pol.no_mean_field}); use init = "empty" or split the grid',
            )
        if run.theory == "exact":
            from jaxqueue.exact.chain import estimate_states  # numpy only

            try:
                rule, options = pol.exact_rule()
            except NotImplementedError as err:
                self.fail("run", "theory", f"theory='exact': {err}")
            bound = buffer or 4
            states = (
                math.inf
                if n > 100
                else estimate_states(
                    rule, n, m, options.get("z", 0), bound, True, options.get("order", "random")
                )
            )
            if states > EXACT_MAX_STATES:
                self.fail(
                    "run",
                    "theory",
                    f"theory='exact' is for small systems: {pol.label()} "
                    f"with N={n}, M={m} and queue bound {bound} has about {states:.3g} "
                    f'states, more than {EXACT_MAX_STATES}; use "mean-field" or "none"',
                )
        return pol

    def figures(self) -> tuple:
        """The checked ``[[figure]]`` tables (:func:`~jaxqueue.studies.figures.parse_figure`)."""
        out, names = [], set()
        for i, table in enumerate(self.data.get("figure", [])):
            part = f"figure#{i}"

            def fail(key, message, part=part):
                line = self.keys.get((part, key)) or self.keys.get((part, ""), 1)
                raise SpecError(message, line)

            fig = parse_figure(table, fail)
            if fig.name in names:
                fail("name", f"two figures are named {fig.name!r}")
            names.add(fig.name)
            out.append(fig)
        return tuple(out)

    def run(self) -> RunSettings:
        if not self.has("run", "replicas"):
            self.fail("run", "replicas", "[run] needs replicas = (an int >= 2)")
        self.one_of("run", ("time", "steps"), required=True)
        warm = self.one_of("run", ("warmup_time", "warmup"), required=False)
        return RunSettings(
            replicas=self.scalar("replicas", _int("replicas", 2, 10**8), None),
            time=self.scalar("time", _span("time", zero=False), None),
            steps=self.scalar("steps", _int("steps", 1, MAX_STEPS), None),
            warmup_time=self.scalar(
                "warmup_time",
                _span("warmup_time", zero=True),
                None if warm else DEFAULT_WARMUP_TIME,
            ),
            warmup=self.scalar("warmup", _int("warmup", 0, MAX_STEPS), None),
            seed=self.scalar("seed", _int("seed", 0, 2**63 - 1), 0),
            init=self.scalar("init", _choice("init", INITS), "empty"),
            theory=self.scalar("theory", _choice("theory", THEORIES), "none"),
        )

    def check_steps(self, run: RunSettings, point: Point) -> None:
        measure = "time" if run.steps is None else "steps"
        try:
            steps, warm = run.steps_for(point), run.warmup_for(point)
        except SpecError as err:
            self.fail("run", str(err).split("=")[0], str(err))
        per = point.steps_per_time_unit()
        if warm > MAX_WARMUP_RATIO * steps:
            self.fail(
                "run",
                measure,
                f"a run too short for its warm-up: the warm-up is {warm} "
                f"steps ({warm / per:.4g} time units) and the measured part {steps} steps "
                f"({steps / per:.4g} time units) at {point.label()}; need warm-up <= "
                f"{MAX_WARMUP_RATIO} x measured part",
            )
        if (-(-steps // BLOCK) - (-warm // BLOCK)) * BLOCK > MAX_STEPS:
            self.fail(
                "run",
                measure,
                f"steps + warmup = {steps + warm} at {point.label()} is out "
                f"of range: need at most {MAX_STEPS} per replica; run more replicas instead",
            )


def _same_point(point: Point, other: Point, line: int) -> tuple[str, str | None]:
    """Why ``point`` is refused, and the [grid] key to point at (None: the
    policy's line): the same as ``other`` (from ``line``), or apart only
    past the 12 significant digits of a point's id."""
    if point == other:
        return f"duplicate point {point.label()} (also from line {line})", None
    a, b = point.params(), other.params()
    keys = [k for k in sorted(a) if a[k] != b.get(k)]
    apart = ", ".join(f"{k}={b[k]!r} and {k}={a[k]!r}" for k in keys)
    given = next((k for k in keys if k in ("alpha", "beta")), keys[0])  # load follows alpha, beta
    return (
        f"{apart} agree to 12 significant digits, so they would be one point "
        f"({point.label()}, one id): give values apart within 12 digits",
        given if given in GRID_KEYS else None,
    )


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def parse_spec(
    text: str, name: str | None = None, quick: bool = False, base=None, mode: str | None = None
) -> GridSpec:
    """Parse and check the text of a spec.

    Args:
        text: the TOML text.
        name: the name when the spec has no ``name`` key (default ``"spec"``).
        quick: apply the [quick] overrides (the same as ``mode="quick"``).
        base: the folder that relative ``arrivals`` paths start from (the
            spec file's; :func:`load_spec` passes it). None: ``arrivals`` files
            are not read, which is enough to draw a store's figures (a store
            keeps the spec's text, not its folder) but not to run the spec.
        mode: apply the overrides of this mode's table, one of :data:`MODES`
            (None: the spec as its [grid] and [run] tables give it).

    Returns:
        The :class:`GridSpec`.

    Raises:
        SpecError: anything invalid; the message names the line and the valid range.
        ImportError: Python 3.10 without ``tomli``.
    """
    if _toml is None:
        raise ImportError("reading spec files on Python 3.10 needs tomli: pip install tomli")
    p = _Parser(text, _mode(mode, quick))
    spec_name = p.data.get("name", name if name is not None else "spec")
    if (
        not isinstance(spec_name, str)
        or not spec_name.strip()
        or "/" in spec_name
        or not spec_name.isprintable()
    ):
        p.fail(
            "",
            "name",
            f"name must be a non-empty string without '/' or control characters, got {spec_name!r}",
        )
    run = p.run()
    policies = p.policies()
    if not p.has("grid", "servers"):
        p.fail("grid", "servers", "[grid] needs servers = [...]")
    servers = p.axis("servers", _int("servers", 1, MAX_SERVERS))
    dispatchers = {n: p.dispatchers(n) for n in servers}
    buffers = p.axis("buffer", _buffer) if p.has("grid", "buffer") else [None]
    key = p.one_of("grid", ("load", "alpha", "beta"), required=True)
    services = p.axis("service", _service) if p.has("grid", "service") else [None]
    pool_texts = p.axis("pools", _pools_text) if p.has("grid", "pools") else [None]
    arrival_texts = p.axis("arrivals", _arrivals_text) if p.has("grid", "arrivals") else [None]
    sources = {}  # arrivals value -> ArrivalsFile; the files are read only with a base
    for arr in arrival_texts if base is not None else ():
        if arr is not None:
            try:
                sources[arr] = _read_arrivals(arr, base)
            except ValueError as err:
                p.fail("grid", "arrivals", str(err))
    caps, loads = {}, {}
    for n, law, pools in itertools.product(servers, services, pool_texts):
        try:
            caps[n, law, pools] = capacity(law and parse_service(law), make_pools(pools, n), n)
        except (TypeError, ValueError) as err:
            p.fail("grid", "pools", f"pools={pools!r} at servers={n}: {err}")
    for (n, _law, _pools), cap in caps.items():
        for b in buffers:
            loads.setdefault((n, b, cap), p.loads(key, n, b, cap))
    points, seen, with_mean_field = [], {}, False
    for policy, opts, lines in policies:
        for n in servers:
            for m, b, law, pools, arr in itertools.product(
                dispatchers[n], buffers, services, pool_texts, arrival_texts
            ):
                src = sources[arr].source if arr in sources else None
                if src is not None and src.kind == "trace" and (law or pools):
                    p.fail(
                        "grid",
                        "arrivals",
                        f"arrivals={arr!r} is a trace, and a trace run "
                        "estimates the response time from the queue lengths arrivals find, "
                        "which needs identical exponential servers: give service or pools, "
                        "or a trace, not both",
                    )
                for combo in itertools.product(*(opts[k] for k in sorted(opts))):
                    given = dict(zip(sorted(opts), combo, strict=True))
                    pol = p.resolve(policy, given, lines, n, m, b, run)
                    if pol.per_server and (law or pools):
                        p.fail(
                            "grid",
                            "service" if law else "pools",
                            f"{policy} steps on per-server lists: service laws and pools "
                            "cover the exchangeable policies only",
                        )
                    # a mean field follows Poisson arrivals, and a rate profile (its
                    # periodic regime); a file not read (no base folder) may be a profile
                    with_mean_field |= pol.mean_field_kind() != "none" and (
                        arr is None
                        or (
                            run.theory == "mean-field"
                            and (src is None or src.kind == "profile")
                            and pol.mean_field_kind() in ("generic", "closed-form")
                        )
                    )
                    options = tuple(sorted(pol.options().items()))
                    for lam, alpha, beta in loads[n, b, caps[n, law, pools]]:
                        point = Point(
                            policy, options, n, m, b, lam, alpha, beta, law, pools, arr, src
                        )
                        pid = point.point_id()
                        if pid in seen:
                            message, key = _same_point(point, *seen[pid])
                            raise SpecError(
                                message, p.line("grid", key) if key else lines["policy"]
                            )
                        seen[pid] = (point, lines["policy"])
                        p.check_steps(run, point)
                        points.append(point)
    if run.theory in ("mean-field", "refined") and not with_mean_field:
        p.fail(
            "run",
            "theory",
            f"theory={run.theory!r} needs a mean field, and no policy of "
            'the grid has one for Poisson arrivals (nor, with theory = "mean-field", for '
            'a rate profile); use theory = "none" (a point without '
            "one gets no theory value)",
        )
    return GridSpec(spec_name, tuple(points), run, text, p.figures(), tuple(sources.values()))


def _mode(mode: str | None, quick: bool) -> str | None:
    if quick and mode not in (None, "quick"):
        raise ValueError(f"quick=True and mode={mode!r}: give one mode")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid: use one of {', '.join(MODES)} or None")
    return "quick" if quick else mode


def load_spec(path, quick: bool = False, mode: str | None = None) -> GridSpec:
    """Read and check a spec file (see :func:`parse_spec`); errors start with the path.

    ``arrivals`` paths are relative to the file's folder.
    """
    path = Path(path)
    try:
        return parse_spec(
            path.read_text(encoding="utf-8"),
            name=path.stem,
            quick=quick,
            base=path.parent,
            mode=mode,
        )
    except SpecError as err:
        new = SpecError(f"{path}: {err}")
        new.line = err.line
        raise new from None
