"""What a run will cost, said before it runs: its replica-steps, its time on 2 CPU
cores by measured rates, and the memory of its replica state.

:data:`CPU_RATES` are the rates ``sweep --plan`` estimates a grid's time by
(:func:`jaxqueue.studies.grids.batching.cpu_seconds`); :func:`estimate_run` applies them to
one run, and :func:`size_note` says what a large one costs (:class:`RunSizeWarning`,
from :func:`jaxqueue.runs.planner.plan_model`, before the simulator compiles).
"""

from __future__ import annotations

from typing import NamedTuple

from jaxqueue.core.classes import class_table
from jaxqueue.core.progress import duration
from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy

__all__ = [
    "CPU_RATES",
    "LATENCY_REPLICAS",
    "cpu_rate",
    "cpu_time",
    "state_array_bytes",
    "size_text",
    "RunEstimate",
    "RunSizeWarning",
    "estimate_run",
    "size_note",
    "NOTE_SECONDS",
    "NOTE_BYTES",
    "DAY_SECONDS",
    "SPELLINGS",
]

#: Replicas below which a batch's step takes about as long as with this many:
#: on 2 CPU cores a step of 16 to 64 replicas takes the same time (Pod(2), N =
#: 1000: 9.6e6, 2.2e7 and 3.6e7 replica-steps/s at 16, 32 and 64 replicas,
#: 7.6e7 at 256); a GPU wants 2^15 threads in flight.
LATENCY_REPLICAS = {"cpu": 128, "gpu": 2**15}

#: What the CPU time estimates assume, measured on 2 CPU cores through the
#: command line (docs/performance.md; N = 1000, load 0.9, 10^4 replicas):
#: replica-steps a second of an exchangeable policy without I-queues (Pod(2)
#: 1.2e8), with I-queues (JIQ at r = 10: 3.3e7), with a service law or pools
#: (Pod(2) 3.3e7, JIQ 1.7e7: ``classes``, a factor), an arrival source
#: (``source``, a factor: Pod(2) 5.5e7 with a profile), a per-server policy
#: (JIQ-Original at r = 10); a batch narrower than ``LATENCY_REPLICAS["cpu"]``
#: replicas takes as long as one that wide; and a compile of each program (2 to
#: 10 s). The rates hold at the level bounds they were measured at (``levels``:
#: 12 without I-queues, 32 with); a step costs in proportion to the levels past
#: them (idle-first d = 1 in the Halfin-Whitt regime, sized at 9572 levels from
#: its mean field, ran 2.7e5 replica-steps a second at 32 replicas).
CPU_RATES = {
    "plain": 1.2e8,
    "iqueues": 3.3e7,
    "per_server": 1.0e7,
    "classes": 0.3,
    "source": 0.45,
    "compile_s": 5.0,
    "levels": 12,
    "levels_iqueues": 32,
}

#: A run estimated past this many seconds on 2 CPU cores, or past
#: :data:`NOTE_BYTES` of replica state, says so (:func:`size_note`); past
#: :data:`DAY_SECONDS` it says how to make it smaller.
NOTE_SECONDS = 600.0
NOTE_BYTES = 2**30
DAY_SECONDS = 86_400.0

#: The parameters :func:`size_note` names, as the Python API and the command line spell them.
SPELLINGS = {
    "python": ("replicas=", "time= or steps="),
    "cli": ("--replicas", "--time or --steps"),
}


class RunSizeWarning(UserWarning):
    """A run estimated to take long or much memory (:func:`size_note`), said before it runs."""


def cpu_rate(
    pol: Policy, n_dispatchers: int, levels: int, classes: bool = False, source: bool = False
) -> float:
    """Replica-steps a second on 2 CPU cores (:data:`CPU_RATES`) of ``pol`` with
    ``n_dispatchers`` dispatchers at a level bound ``levels``, with server
    classes (a service law or pools) and an arrival source where said."""
    reference = CPU_RATES["levels"]
    if pol.per_server:
        rate = CPU_RATES["per_server"]
    elif pol.uses_iqueues and n_dispatchers > 1:
        rate, reference = CPU_RATES["iqueues"], CPU_RATES["levels_iqueues"]
    else:
        rate = CPU_RATES["plain"]
    rate *= min(1.0, reference / max(levels, 1))
    if classes:
        rate *= CPU_RATES["classes"]
    if source:
        rate *= CPU_RATES["source"]
    return rate


def cpu_time(steps: float, width: int, rate: float) -> float:
    """Seconds on 2 CPU cores of ``steps`` steps of a batch of ``width`` replicas (at
    least ``LATENCY_REPLICAS["cpu"]`` wide) at ``rate`` replica-steps a second, plus
    one compile."""
    return steps * max(width, LATENCY_REPLICAS["cpu"]) / rate + CPU_RATES["compile_s"]


def state_array_bytes(system: System, pol: Policy, replicas: int = 1) -> int:
    """Bytes of the Markov state of ``replicas`` replicas (:class:`~jaxqueue.sim.state.Core`,
    4-byte words): the tail (``levels + 1``), the I-queue tail and its listed servers
    (``iqueue_levels + 1`` each), the class counts (``(levels + 1) x classes``) with a
    service law or pools, the per-server lists (queue and place of each server, each
    dispatcher's list and size) and an arrival source's clock."""
    levels, iq = system.levels + 1, system.iqueue_levels + 1
    words = levels + 2 * iq
    if system.classes:
        words += levels * class_table(system).n_classes
    if pol.per_server:
        n, m = system.n_servers, system.n_dispatchers
        words += 2 * n + m * (system.iqueue_levels + 2)
    if system.arrivals is not None:
        words += 3
    return 4 * words * replicas


def size_text(nbytes: float) -> str:
    """``"512 B"``, ``"3.1 KiB"``, ``"42 MiB"``, ``"1.2 GiB"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.1f} {unit}" if value < 9.95 else f"{value:.0f} {unit}"
    return f"{int(nbytes)} B"


class RunEstimate(NamedTuple):
    """A run's size (:func:`estimate_run`)."""

    replicas: int  # every load's together: the batch's width
    steps: int  # per replica, the warm-up included (not its 'auto' extensions)
    cpu_seconds: float  # on 2 CPU cores by :data:`CPU_RATES`, one compile included
    state_bytes: int  # the replicas' Markov state (:func:`state_array_bytes`)

    @property
    def replica_steps(self) -> int:
        return self.replicas * self.steps


def estimate_run(system: System, pol: Policy, replicas: int, steps: int) -> RunEstimate:
    """The size of a run of ``replicas`` replicas (all loads) of ``steps`` steps each."""
    rate = cpu_rate(
        pol, system.n_dispatchers, system.levels, system.classes, system.arrivals is not None
    )
    return RunEstimate(
        replicas,
        steps,
        cpu_time(steps, replicas, rate),
        state_array_bytes(system, pol, replicas),
    )


def size_note(est: RunEstimate, on_cpu: bool = True, spelling: str = "python") -> str | None:
    """What to say of a run's size before it runs, or None for a run of at most
    :data:`NOTE_SECONDS` on 2 CPU cores and :data:`NOTE_BYTES` of state (said on a
    GPU by its memory alone: the time estimate is the CPU's). Past :data:`DAY_SECONDS`,
    how to make it smaller (the parameters as ``spelling`` spells them, :data:`SPELLINGS`)."""
    slow = on_cpu and est.cpu_seconds > NOTE_SECONDS
    if not slow and est.state_bytes <= NOTE_BYTES:
        return None
    replicas, window = SPELLINGS[spelling]
    text = (
        f"{est.replica_steps:.3g} replica-steps ({est.replicas} replicas x {est.steps} steps, "
        f"warm-up included)"
    )
    if on_cpu:
        days = est.cpu_seconds / DAY_SECONDS
        text += f", about {duration(est.cpu_seconds)}" + (f" ({days:.3g} days)" if days > 1 else "")
        text += " on 2 CPU cores by the measured rates"
    text += f", {size_text(est.state_bytes)} of replica state"
    if on_cpu and est.cpu_seconds > DAY_SECONDS:
        return (
            f"this run is estimated at more than a day: {text}; make it smaller with fewer "
            f"replicas ({replicas}), a shorter window ({window}), or run it on a GPU"
        )
    if est.state_bytes > NOTE_BYTES and not slow:
        return f"a large run: {text}; fewer replicas ({replicas}) take less memory"
    return f"a large run: {text}"
