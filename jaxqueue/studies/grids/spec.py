"""Grid-experiment specs: the TOML file of ``jaxqueue sweep SPEC.toml``, read and checked
into a :class:`GridSpec` of points (:func:`load_spec`, :func:`parse_spec`).

Everything is checked before anything compiles, and an error names the line of its
cause. What a spec holds, its modes and arrivals files: docs/sweeps.md (The spec).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from jaxqueue.core.service import capacity, make_pools, parse_service
from jaxqueue.core.system import DEFAULT_WARMUP_TIME, MAX_SERVERS
from jaxqueue.studies.grids.points import ArrivalsFile, GridSpec, Point, RunSettings, SpecError
from jaxqueue.studies.grids.spec_parser import (
    EXACT_MAX_STATES,
    GRID_KEYS,
    INITS,
    MAX_WARMUP_RATIO,
    MODES,
    RUN_KEYS,
    THEORIES,
    SpecParser,
    arrivals_text,
    buffer_value,
    int_check,
    pools_text,
    read_arrivals,
    service_value,
    toml,
)

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
    if toml is None:
        raise ImportError("reading spec files on Python 3.10 needs tomli: pip install tomli")
    p = SpecParser(text, _mode(mode, quick))
    spec_name = _spec_name(p, name)
    run = p.run()
    policies = p.policies()
    axes = _axes(p, base)
    points, with_mean_field = _points(p, policies, axes, run)
    if run.theory in ("mean-field", "refined") and not with_mean_field:
        p.fail(
            "run",
            "theory",
            f"theory={run.theory!r} needs a mean field, and no policy of "
            'the grid has one for Poisson arrivals (nor, with theory = "mean-field", for '
            'a rate profile); use theory = "none" (a point without '
            "one gets no theory value)",
        )
    sources = tuple(axes.sources.values())
    services = tuple(axes.service_files.values())
    return GridSpec(
        spec_name, tuple(points), run, text, p.figures(), sources, p.metrics(), services
    )


def _spec_name(p: SpecParser, name: str | None) -> str:
    """The ``name`` key, else ``name``, else ``"spec"``: checked."""
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
    return spec_name


@dataclasses.dataclass
class _Axes:
    """The checked axes of [grid] but the policies: ``dispatchers`` per N, ``sources``
    (arrivals value -> ArrivalsFile), ``caps`` (the capacity per N, law and pools) and
    ``loads`` (``(load, alpha, beta)`` each, per N, buffer and capacity)."""

    servers: list
    dispatchers: dict
    buffers: list
    services: list
    pool_texts: list
    arrival_texts: list
    sources: dict
    caps: dict
    loads: dict
    service_files: dict = dataclasses.field(default_factory=dict)


def _axes(p: SpecParser, base) -> _Axes:
    """Read and check the axes, in the order their errors are reported."""
    if not p.has("grid", "servers"):
        p.fail("grid", "servers", "[grid] needs n_servers = [...]")
    servers = p.axis("servers", int_check("servers", 1, MAX_SERVERS))
    dispatchers = {n: p.dispatchers(n) for n in servers}
    buffers = p.axis("buffer", buffer_value) if p.has("grid", "buffer") else [None]
    key = p.one_of("grid", ("load", "alpha", "beta"), required=True)
    services, service_files = [None], {}
    if p.has("grid", "service"):
        services = []
        for law in p.axis("service", lambda value: service_value(value, base)):
            if isinstance(law, tuple):  # a ph: file: what runs is the resolved path
                text, law, digest = law
                service_files[law] = (text, digest)
            services.append(law)
    pool_texts = p.axis("pools", pools_text) if p.has("grid", "pools") else [None]
    arrival_texts = p.axis("arrivals", arrivals_text) if p.has("grid", "arrivals") else [None]
    sources = {}  # arrivals value -> ArrivalsFile; the files are read only with a base
    for arr in arrival_texts if base is not None else ():
        if arr is not None:
            try:
                sources[arr] = read_arrivals(arr, base)
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
    return _Axes(
        servers,
        dispatchers,
        buffers,
        services,
        pool_texts,
        arrival_texts,
        sources,
        caps,
        loads,
        service_files,
    )


def _points(p: SpecParser, policies: list, axes: _Axes, run: RunSettings) -> tuple[list, bool]:
    """The grid's points in the spec's order, and whether any has a mean field."""
    points, seen, with_mean_field = [], {}, False
    for policy, opts, lines in policies:
        for n in axes.servers:
            for m, b, law, pools, arr in itertools.product(
                axes.dispatchers[n],
                axes.buffers,
                axes.services,
                axes.pool_texts,
                axes.arrival_texts,
            ):
                src = axes.sources[arr].source if arr in axes.sources else None
                if src is not None and src.kind == "trace" and (law or pools):
                    p.fail(
                        "grid",
                        "arrivals",
                        f"arrivals={arr!r} is a trace, and a trace run "
                        "estimates the response time from the queue lengths arrivals find, "
                        "which needs identical exponential servers: give service or pools, "
                        "or a trace, not both",
                    )
                loads = axes.loads[n, b, axes.caps[n, law, pools]]
                for combo in itertools.product(*(opts[k] for k in sorted(opts))):
                    given = dict(zip(sorted(opts), combo, strict=True))
                    pol = p.resolve(policy, given, lines, n, m, b, run, *loads[0][1:])
                    if pol.per_server and (law or pools):
                        p.fail(
                            "grid",
                            "service" if law else "pools",
                            f"{policy} steps on per-server lists: service laws and pools "
                            "cover the exchangeable policies only",
                        )
                    with_mean_field |= _has_mean_field(pol, arr, src, run)
                    for lam, alpha, beta in loads:
                        if isinstance(given.get("d"), str):  # d of N, alpha, beta: per point
                            pol = p.resolve(policy, given, lines, n, m, b, run, alpha, beta)
                        options = tuple(sorted(pol.options().items()))
                        written = axes.service_files.get(law, (law,))[0]
                        point = Point(
                            policy, options, n, m, b, lam, alpha, beta, law, pools, arr, src
                        )
                        if written != law:  # a ph: file: its id keeps the spec's spelling
                            point = dataclasses.replace(point, service_as_written=written)
                        _add_point(p, point, lines, seen, run)
                        points.append(point)
    return points, with_mean_field


def _has_mean_field(pol, arr, src, run: RunSettings) -> bool:
    """Whether a cell has a theory value: a mean field follows Poisson arrivals, and a
    rate profile (its periodic regime); a file not read (no base folder) may be a profile."""
    return pol.mean_field_kind() != "none" and (
        arr is None
        or (
            run.theory == "mean-field"
            and (src is None or src.kind == "profile")
            and pol.mean_field_kind() in ("generic", "closed-form")
        )
    )


def _add_point(p: SpecParser, point: Point, lines: dict, seen: dict, run: RunSettings) -> None:
    """Check a new point: not the same as one before it (by id), and its run lengths."""
    pid = point.point_id()
    if pid in seen:
        message, key = _same_point(point, *seen[pid])
        raise SpecError(message, p.line("grid", key) if key else lines["policy"])
    seen[pid] = (point, lines["policy"])
    p.check_steps(run, point)


def _mode(mode: str | None, quick: bool) -> str | None:
    if quick and mode not in (None, "quick"):
        raise ValueError(f"quick=True and mode={mode!r}: give one mode")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode={mode!r} is not valid: use one of {', '.join(MODES)} or None")
    return "quick" if quick else mode


def load_spec(path, quick: bool = False, mode: str | None = None) -> GridSpec:
    """Read and check a spec file (see :func:`parse_spec`); errors start with the path.

    ``arrivals`` paths are relative to the file's folder. The file must be a regular
    file of UTF-8 text, of at most 1 MiB.
    """
    path = Path(path)
    limit = 1 << 20  # bytes: a FIFO or a device would hang or fill memory, so is refused
    try:
        if path.exists() and not path.is_file():
            raise SpecError("not a regular file: give a spec file (NAME.toml)")
        if path.exists() and path.stat().st_size > limit:
            raise SpecError(
                f"{path.stat().st_size} bytes, more than the {limit} a spec file may have"
            )
        with open(path, encoding="utf-8") as f:  # (a missing file: FileNotFoundError, named)
            text = f.read(limit + 1)
        if len(text) > limit:  # (it grew)
            raise SpecError(f"more than the {limit} bytes a spec file may have")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text ({err})") from None
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None
    try:
        return parse_spec(
            text,
            name=path.stem,
            quick=quick,
            base=path.parent,
            mode=mode,
        )
    except SpecError as err:
        new = SpecError(f"{path}: {err}")
        new.line = err.line
        raise new from None
