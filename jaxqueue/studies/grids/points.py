"""The points of a grid experiment and how they run: :class:`Point`, :class:`RunSettings`,
:class:`ArrivalsFile` and the parsed :class:`GridSpec` (read by :mod:`jaxqueue.studies.grids.spec`).

A point has a stable id and its own random stream (docs/sweeps.md, Point ids and streams).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from jaxqueue.core.config import Model, RunOptions
from jaxqueue.core.service import make_pools, parse_service, uniform_rate
from jaxqueue.core.system import DEFAULT_WARMUP_TIME, MAX_STEPS, System
from jaxqueue.core.user_metrics import user_metrics
from jaxqueue.studies.plotting.figure_spec import FigureSpec, evaluate_expression

__all__ = [
    "SpecError",
    "Point",
    "RunSettings",
    "ArrivalsFile",
    "GridSpec",
    "canonical",
    "METRIC_PARAMETERS",
    "paired_word",
]

#: The point parameters a ``[metrics]`` expression may read besides the state
#: (whose ``N``, ``M`` and ``load`` are the point's own).
METRIC_PARAMETERS = ("ratio", "alpha", "beta", "buffer", "d", "z")


class SpecError(ValueError):
    """An invalid spec; the message starts with ``line N:`` when the line is known (``.line``)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


def canonical(obj) -> str:
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
        service_as_written: a ``ph:`` law's form as the spec writes it, where
            ``service`` holds the file's absolute path (what runs): the point's id
            and its store rows use the spelling, the spec's hash the file's bytes.
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
    service_as_written: str | None = dataclasses.field(default=None, compare=False, repr=False)

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
            **({"service": self.service_as_written or self.service} if self.service else {}),
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
        return hashlib.sha256(canonical(self.params()).encode()).hexdigest()[:16]

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
            generic mean field), ``"exact"``, ``"erlang"`` (the M/M/N queue of the
            point's N and load) or ``"none"``.
        sensitivity: the parameters every point's scalar metrics are differentiated
            in (``"load"``, ``"alpha"``, ``"beta"``; docs/sweeps.md, Sensitivities).
        paired: every point draws from one stream (:meth:`stream_for`), so that
            differences between points are paired.
        levels: the largest tracked queue length of the points with infinite
            buffers (None: sized from the mean field, as ``simulate --levels``);
            a queue that would pass it stops the sweep with advice, nothing is
            clipped. For a policy whose mean-field bound is far too wide (idle-first
            d = 1 in the Halfin-Whitt regime: 9572 levels at N = 25600, where queues
            stay short), a tight bound makes each step cheap.
    """

    replicas: int
    time: float | str | None = None
    steps: int | None = None
    warmup_time: float | str | None = DEFAULT_WARMUP_TIME
    warmup: int | None = None
    seed: int = 0
    init: str = "empty"
    theory: str = "none"
    sensitivity: tuple = ()
    paired: bool = False
    levels: int | None = None

    def __post_init__(self):
        if (self.time is None) == (self.steps is None) or (
            (self.warmup_time is None) == (self.warmup is None)
        ):
            raise SpecError("RunSettings needs one of time / steps and one of warmup_time / warmup")

    def stream_for(self, point: Point) -> int:
        """The stream ``point`` draws from: its own (:meth:`Point.seed_word`), or
        with ``paired`` the spec's one (:func:`paired_word`)."""
        return paired_word(self.seed) if self.paired else point.seed_word(self.seed)

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

    def options_for(self, points: list, devices=None, metrics=None) -> RunOptions:
        """The run options of ``points`` run together (a batch: their own steps and
        warm-up each, in order) or of one point (a list of one: its steps and warm-up
        as numbers), with replica intervals, on ``devices``, measuring ``metrics``."""
        steps = [self.steps_for(p) for p in points]
        warmup = [self.warmup_for(p) for p in points]
        one = len(points) == 1
        return RunOptions(
            replicas=self.replicas,
            steps=steps[0] if one else steps,
            warmup=warmup[0] if one else warmup,
            seed=self.seed,
            init=self.init,
            interval="replicas",
            devices=devices,
            metrics=metrics,
        )


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
        figures: the :class:`~jaxqueue.studies.plotting.figures.FigureSpec` of each ``[[figure]]``
            (not part of the hash: figures change no result).
        arrivals: the :class:`ArrivalsFile` of each ``arrivals`` value; empty when
            the spec was parsed without its folder (then its files were not
            read, and a spec with arrivals can be drawn but not run).
        metrics: the ``[metrics]`` table as ``(name, expression)`` pairs (user metrics).
        services: ``(text, sha256)`` of each ``ph:`` service file, the form as the
            spec writes it and the digest of the file's bytes.
    """

    name: str
    points: tuple
    run: RunSettings
    source_text: str = dataclasses.field(default="", repr=False)
    figures: tuple = ()
    arrivals: tuple = ()
    metrics: tuple = ()
    services: tuple = ()

    def point_metrics(self, point: Point) -> tuple:
        """The user metrics of ``point``: the ``[metrics]`` expressions with the point's
        parameters (:data:`METRIC_PARAMETERS`) bound (a parameter it lacks stays unbound:
        running the point then says so)."""
        params = point.params()
        known = {k: params.get(k) for k in METRIC_PARAMETERS}
        return user_metrics(dict(self.metrics), parameters=known)

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
        and so does a change of the ``[metrics]`` table or of the bytes of an
        ``arrivals`` or ``ph:`` service file.
        """
        points = sorted((p.params() for p in self.points), key=canonical)
        run = dataclasses.asdict(self.run)
        for key, default in (("sensitivity", ()), ("paired", False), ("levels", None)):
            if run[key] == default:  # unset: the hashes of specs without them are unchanged
                del run[key]
        payload = {"points": points, "run": run}
        texts = sorted({p.arrivals for p in self.points if p.arrivals is not None})
        if texts:  # only then: the hashes of specs without arrivals are unchanged
            payload["arrivals"] = {t: self.arrivals_file(t).sha256 for t in texts}
        # each only where given: the hashes of specs without them are unchanged
        if self.metrics:
            payload["metrics"] = dict(self.metrics)
        if self.services:
            payload["services"] = dict(self.services)
        return hashlib.sha256(canonical(payload).encode()).hexdigest()


def paired_word(seed: int) -> int:
    """The one stream of every point of a paired spec: a 31-bit integer from the
    sha256 of ``"paired:<seed>"`` (unpaired points draw from ``Point.seed_word``)."""
    digest = hashlib.sha256(f"paired:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1
