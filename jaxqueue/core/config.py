"""A run's configuration in three frozen types: the model, its run options, the level bounds.

:class:`Model` (the system), :class:`RunOptions` (how a simulation runs it)
and :class:`Bounds` (the state's level bounds) hold values; every entry point
takes them, and checks them (:func:`split_keywords` turns keywords into them).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

__all__ = [
    "Model",
    "RunOptions",
    "Bounds",
    "MODEL_KEYS",
    "RUN_KEYS",
    "BOUND_KEYS",
    "split_keywords",
    "unexpected_keyword",
    "DEFAULT_REPLICAS",
    "COMPARE_TIME",
    "COMPARE_WARMUP_TIME",
]


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
    d: int | None = None
    z: int | None = None
    order: str | None = None
    buffer: int | None = None
    service: Any = None
    pools: Any = None
    arrivals: Any = None

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

    replicas: int = DEFAULT_REPLICAS
    steps: Any = None
    time: Any = None
    warmup: Any = None
    warmup_time: Any = None
    seed: int = 0
    init: Any = "auto"
    interval: str = "auto"
    batches: int = 20
    backend: str = "auto"
    devices: Any = None
    on_overflow: str = "raise"
    metrics: Any = None


@dataclasses.dataclass(frozen=True)
class Bounds(_Config):
    """The simulator's level bounds (None: sized from the mean field).

    Attributes:
        levels: the queue-length bound ``L``: a queue passing it is an overflow.
        iqueue_levels: the I-queue bound of the JIQ family with ``M > 1``.
    """

    levels: int | None = None
    iqueue_levels: int | None = None


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
