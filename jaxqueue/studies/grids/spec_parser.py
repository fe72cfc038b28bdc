"""Reading a spec's TOML: the line of every key, a mode's overrides, and the checks of
each value (:class:`SpecParser`), so that an error names the line of its cause.

What a spec may hold: docs/sweeps.md (The spec).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
import warnings

from jaxqueue.core.expressions import compile_expression
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME,
    MAX_STEPS,
    System,
    check_load,
    dispatchers_for_ratio,
    halfin_whitt_load,
    heavy_traffic_load,
)
from jaxqueue.core.user_metrics import STATE_NAMES, user_metrics
from jaxqueue.policies.registry import make, option_names, policy_class
from jaxqueue.runs.arguments import RESERVED_METRIC_NAMES
from jaxqueue.studies.grids import spec_values
from jaxqueue.studies.grids.points import METRIC_PARAMETERS, Point, RunSettings, SpecError
from jaxqueue.studies.grids.spec_values import (
    D_NAMES,
    arrivals_text,
    buffer_value,
    d_at,
    int_check,
    number,
    pools_text,
    read_arrivals,
    service_value,
)
from jaxqueue.studies.grids.spec_values import choice as _choice
from jaxqueue.studies.grids.spec_values import span as _span
from jaxqueue.studies.grids.store import POINT_KEYS
from jaxqueue.studies.plotting.figure_spec import parse_figure

try:
    import tomllib as toml
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as toml
    except ModuleNotFoundError:
        toml = None

__all__ = [
    "SpecParser",
    "toml",
    "GRID_KEYS",
    "RUN_KEYS",
    "SHARED_OPTIONS",
    "INITS",
    "THEORIES",
    "MAX_WARMUP_RATIO",
    "EXACT_MAX_STATES",
    "MODES",
    "as_list",
    "number",
    "int_check",
    "read_arrivals",
    "buffer_value",
    "service_value",
    "pools_text",
    "arrivals_text",
]

#: The keys of ``[grid]``: a point's parameters.
GRID_KEYS = POINT_KEYS
#: Policy options a [grid] list may give for every policy (each must take it).
SHARED_OPTIONS = ("d", "z", "order")
#: The keys of ``[run]``: the fields of :class:`RunSettings`.
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunSettings))
INITS = ("empty", "mean-field", "auto")
THEORIES = ("mean-field", "refined", "exact", "erlang", "lu", "none")
#: How each ``[run]`` key's value is checked (one per field of :class:`RunSettings`).
_RUN_CHECKS = {
    "replicas": int_check("replicas", 2, 10**8),
    "time": _span("time", zero=False),
    "steps": int_check("steps", 1, MAX_STEPS),
    "warmup_time": _span("warmup_time", zero=True),
    "warmup": int_check("warmup", 0, MAX_STEPS),
    "seed": int_check("seed", 0, 2**63 - 1),
    "init": _choice("init", INITS),
    "theory": _choice("theory", THEORIES),
    "sensitivity": spec_values.sensitivity_value,
    "paired": spec_values.paired_value,
    "levels": int_check("levels", 1, 10**6),
}
#: The warm-up may be at most this many times the measured part.
MAX_WARMUP_RATIO = 10
#: State budget of theory = "exact" (the ``max_states`` default of ``solve_exact``).
EXACT_MAX_STATES = 200_000
#: The modes a spec may define: a table of overrides each, chosen by ``--quick``,
#: ``--gpu`` or ``--cpu`` (paper scale within a few hours on two CPU cores).
MODES = ("quick", "gpu", "cpu")
_TOP_KEYS = ("name", "grid", "run", *MODES, "figure", "metrics")
_GROUPS = (
    ("ratio", "dispatchers"),
    ("load", "alpha", "beta"),
    ("time", "steps"),
    ("warmup_time", "warmup"),
)
#: The size keys of [grid] and the modes as written (``n_servers``,
#: ``n_dispatchers``: the names of every export) and as the points hold them;
#: ``servers`` and ``dispatchers``, the names of earlier releases, are still
#: read, with a DeprecationWarning.
SIZE_KEYS = {"n_servers": "servers", "n_dispatchers": "dispatchers"}
_HEADER = re.compile(r"""^\s*\[\s*["']?([\w.-]+)["']?\s*\]""")
_ARRAY = re.compile(r"""^\s*\[\[\s*["']?([\w.-]+)["']?\s*\]\]""")
_KEY = re.compile(r"""^\s*["']?([\w.-]+)["']?\s*=""")


def _written(keys) -> list[str]:
    """``keys`` as a spec writes them (:data:`SIZE_KEYS`: ``n_servers``)."""
    spelled = {point: spec for spec, point in SIZE_KEYS.items()}
    return [spelled.get(k, k) for k in keys]


def _did_you_mean(name: str, valid) -> str:
    """``"; did you mean 'X'?"`` for the closest valid name, or nothing."""
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class SpecParser:
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
            self.data = toml.loads(text)
        except toml.TOMLDecodeError as err:
            m = re.search(r"line (\d+)", str(err))
            raise SpecError(f"not valid TOML: {err}", int(m.group(1)) if m else None) from None
        for part in ("grid", *MODES):
            if isinstance(self.data.get(part), dict):
                self.data[part] = self._size_keys(part, self.data[part])
        self.vals = {}  # part -> {key: (value, the table it came from)}
        for key, value in self.data.items():
            if key not in _TOP_KEYS:
                self.fail(
                    "",
                    key,
                    f"unknown key or table {key!r}; valid: {', '.join(_TOP_KEYS)}"
                    + _did_you_mean(key, _TOP_KEYS),
                )
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
                        part,
                        key,
                        f"unknown key {key!r} in [{part}]; valid: {', '.join(_written(valid))}"
                        + _did_you_mean(key, _written(valid)),
                    )
            self.vals[part] = {k: (v, part) for k, v in self.data.get(part, {}).items()}
        if mode is not None and mode not in self.data:
            raise SpecError(f"--{mode} needs a [{mode}] table (any key of [grid] or [run])", 1)
        for key, value in self.data.get(mode, {}).items() if mode else ():
            part = self.vals["grid" if key in GRID_KEYS else "run"]
            for other in itertools.chain(*(g for g in _GROUPS if key in g)):
                part.pop(other, None)
            part[key] = (value, mode)

    def _size_keys(self, part: str, table: dict) -> dict:
        """``table`` with :data:`SIZE_KEYS` read as the points name them (a
        DeprecationWarning for an earlier name; both names of one key: an error)."""
        out = {}
        for key, value in table.items():
            name = SIZE_KEYS.get(key, key)
            if key in SIZE_KEYS.values():
                warnings.warn(
                    f"[{part}] {key} is deprecated: write n_{key}", DeprecationWarning, stacklevel=4
                )
            elif key in SIZE_KEYS:
                self.keys.setdefault((part, name), self.keys.get((part, key)))
            if name in out:
                raise SpecError(
                    f"[{part}] gives n_{name} and {name}: write n_{name} alone",
                    self.keys.get((part, key)),
                )
            out[name] = value
        return out

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
        raw, out, seen = self.get("grid", key), [], set()
        for value in raw if isinstance(raw, list) else [raw]:
            try:
                checked = check(value)
            except (TypeError, ValueError) as err:
                self.fail("grid", key, str(err))
            # a set where the values hash (a list's lookup made 10^4 loads take seconds)
            hashable = not isinstance(checked, (dict, list))
            if checked in (seen if hashable else out):
                self.fail(
                    "grid", key, f"{key} lists {value!r} twice (or two values that mean the same)"
                )
            if hashable:
                seen.add(checked)
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
        start, entries, given = self.line("grid", "policy"), [], []
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
            line = self.entry(start, name, given.count(name))
            given.append(name)
            try:
                name = policy_class(name).name  # in any case: JIQ-Pod is jiq-pod
            except ValueError as err:
                raise SpecError(str(err), line) from None
            takes = option_names(name)
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
                values = shared.get(key) or as_list(table[key])
                if not values or len(set(map(repr, values))) < len(values):
                    raise SpecError(f"{name}: option {key} is empty or repeats a value", line)
                for text in [v for v in values if isinstance(v, str)] if key == "d" else ():
                    try:  # an expression of N (alpha, beta), evaluated per point by resolve
                        compile_expression(text, D_NAMES)
                    except ValueError as err:
                        raise SpecError(f"{name}: option d: {err}", lines[key]) from None
                opts[key] = values
            entries.append((name, opts, lines))
        return entries

    def dispatchers(self, n: int) -> list:
        key = self.one_of("grid", ("ratio", "dispatchers"), required=False)
        if key == "dispatchers":
            return self.axis(key, int_check("dispatchers", 1, n))

        def from_ratio(ratio):
            return dispatchers_for_ratio(n, number("ratio", ratio), "servers")

        return self.axis(key, from_ratio) if key else [1]

    def loads(self, key: str, n: int, buffer, cap: float = 1.0) -> list:
        """``(load, alpha, beta)`` per value of the load axis at ``n`` servers
        (``cap``: the servers' capacity, for the stability check)."""

        def check(value):
            x = number(key, value)
            if key == "load":
                return check_load(value, buffer, cap), None, None
            try:
                form = heavy_traffic_load if key == "alpha" else halfin_whitt_load
                lam = check_load(form(n, value), buffer, cap)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{key}={value} at servers={n}: {err}") from None
            return lam, (x if key == "alpha" else None), (x if key == "beta" else None)

        return self.axis(key, check)

    def resolve(self, name, opts, lines, n, m, buffer, run: RunSettings, alpha=None, beta=None):
        """Build and validate the Policy of one grid cell (errors name the line of the cause);
        a ``d`` given as an expression is evaluated at ``n`` (``alpha``, ``beta``), and
        a clipped value is reported by a warning."""
        if isinstance(opts.get("d"), str):
            try:
                d, note = d_at(opts["d"], n, alpha, beta)
            except ValueError as err:
                raise SpecError(f"{name} at servers={n}: {err}", lines["d"]) from None
            if note:
                warnings.warn(f"{name} at servers={n}: {note}", stacklevel=2)
            opts = {**opts, "d": d}
        try:
            pol = make(name, **opts)
            pol.validate(System(n, m, buffer, buffer or 1, 0))
        except (TypeError, ValueError) as err:
            what = re.match(r"^(\w+)(?:=| must)", str(err))
            line = lines.get(what.group(1) if what else "") or lines["policy"]
            if what and what.group(1) == "n_dispatchers" and m > 1:
                line = self.line("grid", self.one_of("grid", ("ratio", "dispatchers"), False))
            raise SpecError(f"{name} at servers={n}, dispatchers={m}: {err}", line) from None
        if (missing := spec_values.sensitivity_missing(run.sensitivity, alpha, beta)) is not None:
            self.fail("run", "sensitivity", missing)
        if run.init == "mean-field" and pol.mean_field_kind() == "none":
            self.fail(
                "run",
                "init",
                f"init='mean-field' needs a mean field, and {name!r} has "
                f'none ({pol.no_mean_field}); use init = "empty" or split the grid',
            )
        if run.theory == "exact":
            # deferred for import time only: importing jaxqueue.exact loads SciPy's sparse
            # solvers (0.45 s measured), which no spec but theory = "exact" needs
            from jaxqueue.exact.chain import estimate_states

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
        """The checked ``[[figure]]`` tables (:func:`~jaxqueue.studies.plotting.figures.parse_figure`)."""
        out, names = [], set()
        for i, table in enumerate(self.data.get("figure", [])):
            part = f"figure#{i}"

            def fail(key, message, part=part):
                line = self.keys.get((part, key)) or self.keys.get((part, ""), 1)
                raise SpecError(message, line)

            user = tuple(self.data.get("metrics", {}))
            derived = spec_values.derived_names(self.run(), user)
            fig = parse_figure(table, fail, user, derived)
            if fig.name in names:
                fail("name", f"two figures are named {fig.name!r}")
            names.add(fig.name)
            out.append(fig)
        return tuple(out)

    def metrics(self) -> tuple:
        """The ``[metrics]`` table, ``name = "expression"``, checked (user metrics)."""
        names = STATE_NAMES + METRIC_PARAMETERS
        for name, text in self.data.get("metrics", {}).items():
            if not isinstance(text, str):
                self.fail("metrics", name, f"metric {name} must be an expression string")
            try:
                user_metrics({name: text}, dict.fromkeys(names), RESERVED_METRIC_NAMES)
            except ValueError as err:
                self.fail("metrics", name, str(err))
        return tuple(self.data.get("metrics", {}).items())

    def run(self) -> RunSettings:
        if not self.has("run", "replicas"):
            self.fail("run", "replicas", "[run] needs replicas = (an int >= 2)")
        self.one_of("run", ("time", "steps"), required=True)
        warm = self.one_of("run", ("warmup_time", "warmup"), required=False)
        defaults = {"replicas": None, "warmup_time": None if warm else DEFAULT_WARMUP_TIME}
        return RunSettings(
            **{
                f.name: self.scalar(f.name, _RUN_CHECKS[f.name], defaults.get(f.name, f.default))
                for f in dataclasses.fields(RunSettings)
            }
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


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]
