"""A run's configuration in three frozen types: the model, its run options, the level bounds.

:class:`Model` (the system), :class:`RunOptions` (how a simulation runs it)
and :class:`Bounds` (the state's level bounds) hold values; every entry point
takes them, and checks them (:func:`split_keywords` turns keywords into them).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import textwrap
from typing import Any

__all__ = [
    "Model",
    "RunOptions",
    "Bounds",
    "MODEL_KEYS",
    "RUN_KEYS",
    "BOUND_KEYS",
    "split_keywords",
    "takes_options",
    "OPTION_FIELDS",
    "check_options",
    "options_from",
    "MODEL_OPTIONS",
    "unexpected_keyword",
    "DEFAULT_REPLICAS",
    "COMPARE_TIME",
    "COMPARE_WARMUP_TIME",
]


def _option(default, doc: str, **flag):
    """A field with its documentation (``metadata["doc"]``: the text every entry
    point that takes the option as a keyword shows for it, :func:`takes_options`)
    and its command-line flag (``metadata["flag"]``: ``add_argument``'s ``help``,
    ``type``, ``choices``; :func:`jaxqueue.cli.parser.add_option_flags`)."""
    metadata = {"doc": " ".join(doc.split())}
    if flag:
        metadata["flag"] = flag
    return dataclasses.field(default=default, metadata=metadata)


def _frozen(value):
    """Lists (of loads' run lengths, of pools) as tuples, so that the types hash."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


class _Config:
    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))

    def replace(self, **changes):
        """A copy with ``changes`` (field names, as for :func:`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    def keywords(self) -> dict:
        """The fields as keyword arguments of the entry points."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_namespace(cls, namespace, **given):
        """The fields ``namespace`` holds as attributes of their own names (the
        command line's parsed flags), with ``given`` over them; the others at
        their defaults. The command line builds its values so, naming no option."""
        names = [f.name for f in dataclasses.fields(cls)]
        found = {n: getattr(namespace, n) for n in names if hasattr(namespace, n)}
        return cls(**(found | given))


@dataclasses.dataclass(frozen=True)
class Model(_Config):
    """The system: policy, sizes, buffer, service law, pools, arrivals.

    Attributes:
        policy: a registered policy name or a :class:`~jaxqueue.policies.Policy`.
        n_servers: ``N``; a simulation may give one per load (a sequence).
        n_dispatchers: ``M`` (one per load where ``n_servers`` is a sequence).
        d, z, order: the policy's options (None: its default).
        buffer: places per server, or None for infinite buffers (a
            simulation may give one finite buffer per load).
        service: the service law (None: exponential with mean 1).
        pools: server pools (None: identical servers).
        arrivals: an arrival source (None: Poisson).
    """

    policy: Any
    n_servers: Any
    n_dispatchers: Any = 1
    d: int | None = _option(
        None,
        """probes (``pod``, ``jiq-pod``, ``jiq-sq``, ``idle-first``; ``jiq-original``'s
        join-SQ(d) variant), where the policy takes them (default: the policy's own,
        2; ``jiq-original`` 1); an option the policy does not take is an error.""",
        type=int,
        help="probes d (pod, jiq-pod, jiq-sq, idle-first; jiq-original's join-SQ(d) variant)",
    )
    z: int | None = _option(
        None,
        """threshold (``jiq-threshold``, default 1; ``jiq-original``'s threshold
        variant, default 0); an error for any other policy.""",
        type=int,
        help="threshold z (jiq-threshold, jiq-original's threshold variant)",
    )
    order: str | None = _option(
        None,
        """``jiq-original``'s pick order, ``"random"`` (default) or ``"fifo"``; an
        error for any other policy.""",
        choices=("random", "fifo"),
        help="I-queue pick order (jiq-original; default random)",
    )
    buffer: int | None = _option(
        None,
        """places per server ``b``, or None for infinite buffers; a simulation may
        give one finite buffer per load (a list): each replica blocks at its own,
        and each result has its own levels.""",
        type=int,
        help="places per server b (default: infinite)",
    )
    service: Any = _option(
        None,
        """the service law: ``None`` (exponential, mean 1), a
        :class:`~jaxqueue.core.service.PhaseType` (:mod:`jaxqueue.core.service`
        builds Erlang, hyperexponential and two-moment fits) or its command-line
        form (``"erlang:3"``, ``"hyperexp:4"``, ``"fit:0.5"``, ``"ph:FILE.json"``).
        Covers the exchangeable policies (not ``jiq-original``,
        ``jiq-threshold``).""",
        help='service law: exp (default), erlang:K, hyperexp:SCV, fit:SCV (two-moment fit) or ph:FILE.json ({"alpha": [...], "S": [[...]]}); mean 1',
    )
    pools: Any = _option(
        None,
        """heterogeneous servers: ``(fraction, speed)`` pairs, the command-line
        form ``"0.2:2,0.8:1"``, or :class:`~jaxqueue.core.service.Pool` objects
        with their own laws; the fractions of ``N`` are rounded to whole
        servers. A server of speed ``v`` serves at ``v`` times the law's rates;
        the policies see queue lengths only. Stability needs the load below the
        capacity ``sum_i fraction_i speed_i / mean_i``; results then have the
        metrics by pool (docs/simulation.md).""",
        help="heterogeneous servers: FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1",
    )
    arrivals: Any = _option(
        None,
        """``None`` (Poisson arrivals at rate ``load * N``), a file (a CSV rate
        profile ``time,rate``, a CSV trace ``time[,service]``, whose service
        column is only recorded as ``mean_service``, or an MMPP JSON file), or a
        :class:`~jaxqueue.core.arrivals.Profile`,
        :class:`~jaxqueue.core.arrivals.MMPP` or
        :class:`~jaxqueue.core.arrivals.Trace`; its rates are scaled so that the
        mean arrival rate is ``load * N`` (a profile's peak may pass the
        capacity). A trace needs identical exponential servers.""",
        help='time-varying arrivals: a CSV rate profile (header time,rate), a CSV trace of arrival times (header time[,service]; a service column is not simulated: the servers stay exponential, and it is only recorded, as mean_service) or an MMPP JSON file ({"generator": [[...]], "rates": [...]}); scaled to mean load --load',
    )

    def options(self) -> dict:
        """The policy options given (``d``, ``z``, ``order``), for :func:`jaxqueue.make`."""
        return {k: v for k in ("d", "z", "order") if (v := getattr(self, k)) is not None}


#: Independent replicas per load by default, wherever a run is made (the API,
#: the command line, ``compare``, ``transient``).
DEFAULT_REPLICAS = 32
#: ``compare``'s run (Python and the command line): time units measured at the
#: largest load, and the warm-up from the mean-field state before them.
COMPARE_TIME, COMPARE_WARMUP_TIME = 300.0, 50.0


@dataclasses.dataclass(frozen=True)
class RunOptions(_Config):
    """How a simulation runs a model (the arguments of :func:`jaxqueue.simulate`).

    Attributes:
        replicas: independent replicas per load.
        steps, time: the measured window per replica, in steps or in time
            units (one of them; one per load as a sequence).
        warmup, warmup_time: the warm-up, likewise (``warmup="auto"``:
            extended while the warm-up diagnostic fails).
        seed: the run's seed (keys by position).
        init: ``"auto"``, ``"empty"``, ``"mean-field"`` or an occupancy.
        interval: ``"auto"``, ``"replicas"`` or ``"batch-means"``.
        batches: batches of the measured window.
        backend: ``"auto"``, ``"xla"``, ``"registers"`` or ``"pallas"``.
        devices: the devices to spread replicas over (None: JAX's).
        on_overflow: ``"raise"`` or ``"report"``.
        metrics: user-defined metrics, ``{name: expression or function}``
            (:mod:`jaxqueue.core.user_metrics`), or None.
    """

    replicas: int = _option(
        DEFAULT_REPLICAS,
        "independent replicas per load.",
        type=int,
        help=f"independent replicas (per load; default {DEFAULT_REPLICAS})",
    )
    steps: Any = _option(
        None,
        """measured uniformized steps per replica (rounded up to whole blocks of
        256; the result records the steps run). Default: ``time`` if given, else
        1,000,000 (whatever ``N``: about 526 time units at ``N = 1000``,
        ``lambda = 0.9``, but 5 at ``N = 10^5``). One per load (a list): each
        load measures its own window, the batch stepping to the longest.""",
    )
    time: Any = _option(
        None,
        """the measured window in time units (mean service times) instead of
        ``steps``: ``steps = ceil(time * N * rate)``, ``rate`` the uniformized
        steps per server per time unit at the largest load (``lambda + 1`` for
        exponential service; the peak rate of a profile or an MMPP). Smaller
        loads step at the same count, so their windows are a little longer
        (``settings["time_measured"]`` records each); rounded up to whole blocks,
        with a :class:`~jaxqueue.runs.planner.WindowWarning` past 10% beyond
        ``time``.""",
    )
    warmup: Any = _option(
        None,
        """discarded uniformized steps per replica before measuring (one per load,
        a list, as ``steps``); default: 100 units of time at the largest load.
        ``"auto"`` starts with the default and, while the warm-up diagnostic of
        the measured window fails (:mod:`jaxqueue.results.warmup`), turns the
        window into warm-up and measures a new one, at most
        :data:`~jaxqueue.sim.runner.MAX_EXTENSIONS` times.""",
    )
    warmup_time: Any = _option(
        None,
        """the warm-up in time units instead of ``warmup`` (converted as
        ``time``; not with ``warmup="auto"``).""",
    )
    seed: int = _option(
        0,
        """the run's integer seed; replica ``i`` of load ``j`` uses the stream of
        global replica ``j * replicas + i``. Runs meant as independent trials
        need different seeds.""",
        type=int,
        help="the random seed (default 0); the same seed gives the same numbers",
    )
    init: Any = _option(
        "auto",
        """``"auto"`` (the mean-field state where the policy has a mean field and
        ``N >= 100``, else empty, with a :class:`jaxqueue.StartWarning` where the
        mean field cannot be solved), ``"empty"``, ``"mean-field"`` or an
        occupancy array. The mean-field state sets the queue lengths and, for the
        JIQ family with several dispatchers, the I-queue sizes (with a service
        law or pools, each server's class too).""",
        choices=("auto", "empty", "mean-field"),
        help="start (default auto: the mean-field occupancy where one exists)",
    )
    interval: str = _option(
        "auto",
        """how the 95% intervals are made: ``"replicas"`` (across replicas),
        ``"batch-means"`` (from each replica's ``batches`` batch means) or
        ``"auto"`` (batch means with at most
        :data:`~jaxqueue.sim.runner.BATCH_MEANS_REPLICAS` replicas).""",
        choices=("auto", "replicas", "batch-means"),
        help="95%% intervals across replicas or from batch means (default auto: batch means with at most 10 replicas)",
    )
    batches: int = _option(
        20,
        """batches of the measured window (fewer when the window has fewer blocks
        of 256 steps); they also feed the warm-up diagnostic.""",
        type=int,
        help="batches of the measured window (1 to 10000, default 20; intervals from batch means need at least 2)",
    )
    backend: str = _option(
        "auto",
        """what steps the replicas: ``"auto"`` (the Pallas kernel on a GPU where it
        covers the run and its step fits in registers, else ``"xla"``),
        ``"xla"`` (the vmapped engine), ``"pallas"`` (the kernel; interpreted off
        a GPU, for checking) or ``"registers"`` (the kernel's layout in plain
        XLA). Every backend gives bit-identical results; one that does not cover
        the run warns (:class:`jaxqueue.BackendWarning`) and runs on ``"xla"``.""",
        choices=("auto", "xla", "registers", "pallas"),
        help="what steps the replicas: auto (the Pallas kernel on a GPU where its step fits in registers, else xla), xla, pallas (interpreted off a GPU, for checking) or registers (the kernel's layout in plain XLA); results are bit-identical",
    )
    devices: Any = _option(
        None, "devices to spread replicas over (default: all of the default backend's)."
    )
    on_overflow: str = _option(
        "raise",
        """``"raise"`` fails the run with advice if a queue or I-queue passes its
        bound; ``"report"`` returns the result with the ``overflow`` counts in
        its diagnostics.""",
    )
    metrics: Any = _option(
        None,
        """user-defined metrics, ``{name: expression or function}``: each a JAX
        function of a :class:`~jaxqueue.core.user_metrics.MetricState` or an
        expression over its fields (``"sum(s[1:])"``); results hold each one's
        time average and its average over accepted arrivals (``name_per_arrival``)
        with intervals (docs/metrics.md). Runs on ``"xla"``.""",
    )


@dataclasses.dataclass(frozen=True)
class Bounds(_Config):
    """The simulator's level bounds (None: sized from the mean field).

    Attributes:
        levels: the queue-length bound ``L``: a queue passing it is an overflow.
        iqueue_levels: the I-queue bound of the JIQ family with ``M > 1``.
    """

    levels: int | None = _option(
        None,
        """the largest tracked queue length (infinite buffers); default from the
        mean-field tail of the largest load.""",
        type=int,
        help="largest tracked queue length",
    )
    iqueue_levels: int | None = _option(
        None,
        "the largest tracked I-queue size (the JIQ family with ``M > 1``).",
        type=int,
        help="largest tracked I-queue size",
    )


MODEL_KEYS = tuple(f.name for f in dataclasses.fields(Model))
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunOptions))
BOUND_KEYS = tuple(f.name for f in dataclasses.fields(Bounds))


def split_keywords(
    policy,
    n_servers,
    n_dispatchers,
    keywords: dict,
    run=None,
    bounds=None,
    *,
    where: str,
    run_keys=RUN_KEYS,
) -> tuple[Model, RunOptions, Bounds]:
    """The three types from an entry point's arguments: ``policy`` is a name,
    a Policy or a :class:`Model`; ``keywords`` are model, run and bound
    fields; ``run`` and ``bounds`` are given types or None.

    A field given twice (a Model and ``n_servers`` or ``d``, ``run=`` and
    ``replicas``) is a ``TypeError`` that names it, as is an unknown one;
    ``where`` names the function in the messages. ``run_keys`` are the run
    fields the entry point takes.
    """
    unknown = sorted(set(keywords) - set(MODEL_KEYS) - set(run_keys) - set(BOUND_KEYS))
    if unknown:
        raise unexpected_keyword(where, unknown[0], MODEL_KEYS + tuple(run_keys) + BOUND_KEYS)
    given = {k: v for k, v in keywords.items() if k in MODEL_KEYS}
    if isinstance(policy, Model):
        twice = sorted(k for k in given) + (["n_servers"] if n_servers is not None else [])
        if n_dispatchers not in (None, 1):
            twice.append("n_dispatchers")
        if twice:
            raise TypeError(
                f"{where}(): {', '.join(twice)} given beside a Model: set "
                f"{'it' if len(twice) == 1 else 'them'} in the Model "
                f"(model.replace({twice[0]}=...))"
            )
        model = policy
    else:
        if n_servers is None:
            raise TypeError(f"{where}() needs n_servers (or a Model as its first argument)")
        model = Model(policy, n_servers, 1 if n_dispatchers is None else n_dispatchers, **given)
    model = model.replace()  # lists as tuples
    return (
        model,
        _merged(RunOptions, run, keywords, run_keys, "run", where),
        _merged(Bounds, bounds, keywords, BOUND_KEYS, "bounds", where),
    )


def unexpected_keyword(where: str, name: str, valid) -> TypeError:
    """The error for an unknown keyword ``name`` of ``where()``, with the closest valid one."""
    close = difflib.get_close_matches(name, sorted(valid), n=1)
    return TypeError(
        f"{where}() got an unexpected keyword argument {name!r}"
        + (f"; did you mean {close[0]!r}?" if close else "")
    )


def _merged(cls, given, keywords: dict, keys, name: str, where: str):
    fields = {k: keywords[k] for k in keys if k in keywords}
    if given is None:
        return cls(**fields)
    if not isinstance(given, cls):
        raise TypeError(f"{where}(): {name}= takes a {cls.__name__}, got {type(given).__name__}")
    if fields:
        raise TypeError(
            f"{where}(): {', '.join(sorted(fields))} given beside {name}=: set "
            f"{'it' if len(fields) == 1 else 'them'} in the {cls.__name__}"
        )
    return given


#: The model's fields an entry point takes as keywords (its first arguments
#: are the policy and the sizes).
MODEL_OPTIONS = tuple(k for k in MODEL_KEYS if k not in ("policy", "n_servers", "n_dispatchers"))

#: Every option's field by name (its documentation and its flag in ``metadata``).
OPTION_FIELDS = {f.name: f for cls in (Model, RunOptions, Bounds) for f in dataclasses.fields(cls)}
#: The line of an entry point's docstring that :func:`takes_options` replaces.
OPTIONS_MARKER = "<options>"


def takes_options(*names: str, also: tuple = ()):
    """An entry point that takes options as ``**options``, declared once as fields.

    The decorated function's signature (``inspect.signature``, ``help()``)
    shows ``names`` (fields of :class:`Model`, :class:`RunOptions` and
    :class:`Bounds`) as keyword-only parameters with the fields' defaults, and
    the line ``<options>`` of its docstring becomes their documentation, from
    the fields' ``metadata["doc"]``; ``also``, dataclasses of its own settings
    (a sensitivity's ``Step``), shows their fields first in the same way. The
    function receives only the options given; it refuses others with
    :func:`check_options` (or :func:`split_keywords`, which does).
    """
    unknown = [n for n in names if n not in OPTION_FIELDS]
    if unknown:
        raise ValueError(f"takes_options: {unknown} are not fields of Model, RunOptions, Bounds")
    fields = {f.name: f for cls in also for f in dataclasses.fields(cls)}
    fields.update((n, OPTION_FIELDS[n]) for n in names)

    def decorate(fn):
        sig = inspect.signature(fn)
        kept = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        shown = [
            inspect.Parameter(
                n, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
            )
            for n, f in fields.items()
        ]
        fn.__signature__ = sig.replace(parameters=kept + shown)
        fn.option_names = tuple(names)
        if fn.__doc__ and f"        {OPTIONS_MARKER}\n" in fn.__doc__:
            fn.__doc__ = fn.__doc__.replace(f"        {OPTIONS_MARKER}\n", _option_docs(fields))
        return fn

    return decorate


def _option_docs(fields: dict) -> str:
    """The docstring entries of ``fields`` (8 spaces, continuation 12, 88 wide)."""
    out = []
    for n, f in fields.items():
        text = f"{n}: {f.metadata.get('doc', '')}"
        out.append(textwrap.fill(text, 88, initial_indent=" " * 8, subsequent_indent=" " * 12))
    return "\n".join(out) + "\n"


def check_options(where: str, options: dict, fn) -> None:
    """A TypeError for a keyword ``fn`` (decorated by :func:`takes_options`) does
    not take, naming the closest it does."""
    valid = list(fn.option_names) + [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    for name in options:
        if name not in fn.option_names:
            raise unexpected_keyword(where, name, valid)


def options_from(namespace, names, **given) -> dict:
    """The options ``names`` (an entry point's ``option_names``, from
    :func:`takes_options`) that ``namespace`` holds as attributes of their own
    names and not ``None`` (the command line's parsed flags), with ``given``
    over them: the command line passes its flags on naming no option."""
    found = {n: getattr(namespace, n, None) for n in names}
    return {k: v for k, v in found.items() if v is not None} | given
