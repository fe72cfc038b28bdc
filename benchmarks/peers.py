"""The same load-balancing systems simulated by the peers a researcher would pick instead of jaxqueue.

    python benchmarks/peers.py                      # the standard table (minutes)
    python benchmarks/peers.py --json               # machine-readable, alone on stdout
    python benchmarks/peers.py --quick              # tiny sizes (seconds; what the test runs)
    python benchmarks/peers.py --peers numba,jaxqueue --systems pod2-1000 --budget 30

Systems (load lambda = 0.9, N FIFO exp(1) servers, Poisson arrivals at rate
lambda N, infinite buffers): Pod(2) and JSQ at N = 10 and N = 1000, and JIQ
(Wang, Feng and Cheng, with delete requests) at N = 1000 with M = 100
dispatchers (r = N / M = 10). ``--quick`` runs the N = 1000 systems at
N = 100 (M = 10), with tiny horizons and few replicas.

Peers, one after the other, each on all the cores (``--workers`` sets the
process pool and numba's threads; jaxqueue runs one XLA device per core):

* ``ciw``: the Ciw discrete-event library. Arrivals enter a dispatcher node
  (zero service time, infinitely many servers) whose router sends each task to
  one of N single-server nodes: JSQ is Ciw's built-in
  ``ciw.routing.LoadBalancing`` (queue length counting the task in service,
  random ties), Pod(d) and JIQ are ``ciw.routing.NodeRouting`` subclasses; JIQ's
  servers join an I-queue from their own router, called as a task leaves.
  Independent replicas in a process pool.
* ``simpy``: an event-driven SimPy model written here: a ``simpy.Resource`` per
  server, one process per task, the dispatch decision read from queue lengths
  the model keeps itself. Independent replicas in a process pool.
* ``numba``: a per-event loop written here as a numba user would: an
  ``@njit(parallel=True)`` ``prange`` over independent replicas, each a
  next-event simulation of the N servers (exponential holding times: the next
  event after Exp(lambda N + busy servers); an arrival with probability
  lambda N / that rate, else the completion of a uniformly random busy server),
  with servers kept sorted by queue length so that JSQ and the busy-server draw
  are O(1), and JIQ's I-queues as index arrays.
* ``jaxqueue``: its command line, ``python -m jaxqueue simulate --policy ...
  --json``, with many replicas, as a user runs it (its start-up, JAX import and
  compilation included in the wall time).

Start and warm-up. Ciw, SimPy and numba draw each server's initial queue
length independently from the mean-field occupancy (``python -m jaxqueue
theory``), list the idle servers in uniformly random I-queues, and discard
``--warmup`` time units (default 100 at N = 10, 5 at N = 1000, where the
mean-field start is within O(1/N) of the stationary law). jaxqueue
starts where its ``--init auto`` puts it (the mean field at N = 1000, empty at
N = 10) and discards the same warm-up time (``--warmup-time``).

Mean response time T with a 95% interval. Ciw and SimPy average the response
times of the tasks that arrive in the measured window (arrivals stop at its
end and the tasks in the system are drained, so no task is censored; FIFO
makes a task's response time independent of later arrivals). numba uses
Little's law in the window (time-integral of the number in system over the
arrivals counted in it). jaxqueue reports its own (Little's law with the
nominal rate lambda N). The interval is Student's t across replicas with at
least 10 replicas, else across the batch means of all replicas (16 batches a
replica, merged in pairs while consecutive ones are correlated, see
``interval``); jaxqueue chooses its own the same way (it widens a correlated
batch-means interval instead). Pairs of peers whose T differ by more than
the root-sum-square of their half-widths are reported as disagreements (after
the table, and under "disagreements" in the JSON); about one pair in 20 does
so by chance alone. The mean field (N = infinity) and, where it exists, its
1/N refinement at the system's N are printed as references; finite N differs
from the former (at N = 10 by about 10% for Pod(2)).

Events. One event is one arrival or one departure, warm-up (and drain)
included. Ciw, SimPy and numba count them as they happen (a task preloaded at
the start counts its departure only; Ciw's pass through the dispatcher node,
an internal event, is not counted). jaxqueue steps a uniformized chain whose
steps include no-op departures at idle servers; its events are counted as
replicas x 2 lambda N x (measured + warm-up time simulated, from its JSON
settings), the expected number of arrivals plus departures in steady state
(a fraction 2 lambda / (1 + lambda) = 0.947 of its steps at lambda = 0.9).

Wall time. ``events/s`` is events over the peer's whole run: Ciw and SimPy
from starting the process pool to the last replica's result; numba including
its compilation (``compile_s``, measured on the first call of the process and
charged to every row, as a process running that system alone would pay it);
jaxqueue from launching
the command to its exit. ``run events/s`` leaves the fixed costs out: Ciw and
SimPy over their replicas' simulation time per worker, numba without
compiling, jaxqueue as the difference between this run and a second,
minimal one (the same replicas and warm-up, the smallest measured time). The
``x jaxqueue`` columns divide a peer's rate by jaxqueue's on the same system.

Run length. ``--budget`` seconds per system and peer (default 20) sets each
peer's measured time from an assumed rate (``ASSUMED_RATE``: rough figures
from this project's 2-core machine, for sizing only; ``--plan`` prints the run
lengths and stops), at least ``MIN_MEASURED`` time units: Ciw's event
loop visits every node at each event, so at N = 1000 it runs past the budget
(10 replicas of 7 time units: about 2 minutes a system on 2 cores).
``--measured`` fixes the measured time units for every peer instead.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOAD = 0.9
BATCHES = 16  # batches of the measured window per replica (halved while correlated)
PEERS = ("ciw", "simpy", "numba", "jaxqueue")
POD, JSQ, JIQ = 0, 1, 2
#: The numba loop's largest queue length (a replica that reaches it is reported).
KMAX = 4096


@dataclass(frozen=True)
class System:
    key: str  # --systems name
    policy: str  # jaxqueue's name: pod, jsq, jiq
    n: int
    m: int = 1  # dispatchers (JIQ)
    d: int = 2  # probes (Pod)

    @property
    def code(self) -> int:
        return {"pod": POD, "jsq": JSQ, "jiq": JIQ}[self.policy]

    @property
    def label(self) -> str:
        name = {"pod": f"Pod({self.d})", "jsq": "JSQ", "jiq": "JIQ"}[self.policy]
        extra = f" M={self.m}" if self.policy == "jiq" else ""
        return f"{name} N={self.n}{extra}"


def systems(quick: bool) -> list[System]:
    big = 100 if quick else 1000
    return [
        System("pod2-10", "pod", 10),
        System("jsq-10", "jsq", 10),
        System(f"pod2-{big}", "pod", big),
        System(f"jsq-{big}", "jsq", big),
        System(f"jiq-{big}", "jiq", big, m=big // 10),
    ]


#: Assumed events per second of one worker (ciw, simpy, numba) or of the whole
#: run on 2 cores (jaxqueue, at its default replicas), by N: sizing only.
ASSUMED_RATE = {
    "ciw": lambda s: 1.0 / (25e-6 + 1.6e-6 * s.n),  # its loop is O(N) per event
    "simpy": lambda s: 1.0 / 10e-6,
    "numba": lambda s: 2.0e7,
    "jaxqueue": lambda s: 3.0e7 if s.policy == "jiq" else 8.0e7,
}
#: jaxqueue's start-up, JAX import and compilation (seconds; sizing only).
JAXQUEUE_FIXED_S = 6.0
#: The least measured time units, whatever the budget.
MIN_MEASURED = {10: 50.0, 100: 2.0, 1000: 2.0}
#: 10 replicas or more: intervals across replicas (batch means of short runs are
#: correlated at N = 100 and beyond, and their intervals too narrow)
DEFAULT_REPLICAS = {"ciw": 10, "simpy": 10, "numba": 16, "jaxqueue": 1024}
QUICK_REPLICAS = {"ciw": 10, "simpy": 10, "numba": 16, "jaxqueue": 16}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- statistics --------------------------------------------------------------------------------

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    """Student's t 0.975 quantile: a table to 30 degrees of freedom, past it the
    Cornish-Fisher expansion (error under 1e-4)."""
    if df <= 30:
        return _T975[df - 1]
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def interval(sums, counts) -> dict:
    """T and its 95% half-width from per-replica, per-batch sums and counts (a
    response-time sum and its tasks, or an area and its arrivals).

    T is the mean over replicas of their whole-window values. With at least 10
    replicas the interval is Student's t across them. With fewer it comes from
    the batch means of all replicas taken as one sample (as jaxqueue's batch
    means): while their lag-1 correlation (within replicas, about the grand
    mean) exceeds 2 / sqrt(number of batch means), about twice its standard
    error for independent batches, adjacent batches are merged in pairs (down to
    2 a replica), so the batches outgrow the correlation time rather than the
    interval claiming independent ones."""
    whole = [sum(s) / sum(c) for s, c in zip(sums, counts) if sum(c) > 0]
    mean = sum(whole) / len(whole) if whole else math.nan
    if len(whole) >= 10:
        n = len(whole)
        var = sum((v - mean) ** 2 for v in whole) / (n - 1)
        half = t975(n - 1) * math.sqrt(var / n)
        return {
            "mean": mean,
            "ci95": half,
            "n": n,
            "interval": "replicas",
            "batches": None,
            "lag1": None,
        }
    sums = [list(x) for x in sums]
    counts = [list(x) for x in counts]
    while True:
        per = [[x / c for x, c in zip(s, cs) if c > 0] for s, cs in zip(sums, counts)]
        values = [v for row in per for v in row]
        n = len(values)
        if n < 2:
            return {
                "mean": mean,
                "ci95": math.nan,
                "n": n,
                "interval": "batch-means",
                "batches": len(sums[0]),
                "lag1": None,
            }
        grand = sum(values) / n
        ss = sum((v - grand) ** 2 for v in values)
        lag = sum((a - grand) * (b - grand) for row in per for a, b in zip(row, row[1:]))
        lag1 = lag / ss if ss > 0 else 0.0
        batches = len(sums[0])
        if lag1 <= 2.0 / math.sqrt(n) or batches <= 2 or batches % 2:
            break
        sums = [[s[i] + s[i + 1] for i in range(0, batches, 2)] for s in sums]
        counts = [[c[i] + c[i + 1] for i in range(0, batches, 2)] for c in counts]
    half = t975(n - 1) * math.sqrt(ss / (n - 1) / n)
    return {
        "mean": mean,
        "ci95": half,
        "n": n,
        "interval": "batch-means",
        "batches": batches,
        "lag1": lag1,
    }


def _theory_command(s: System, refined: bool) -> list[str]:
    cmd = [sys.executable, "-m", "jaxqueue", "theory", "--policy", s.policy, "--load", str(LOAD)]
    if s.policy == "pod":
        cmd += ["--d", str(s.d)]
    if s.policy == "jiq":
        cmd += ["--ratio", str(s.n // s.m)]
    if refined and s.policy != "jsq":  # JSQ's drift is not differentiable at its fixed point
        cmd += ["--servers", str(s.n)]
    return cmd + ["--json"]


def mean_fields(chosen: list[System], refined: bool = True) -> dict[str, dict]:
    """Per system, from jaxqueue's theory command (all at once, in parallel): the
    N = infinity mean response time and occupancy, and with ``refined`` the
    1/N-refined mean field's T at the system's N (not for JSQ; JIQ's takes
    seconds)."""
    procs = {
        s.key: (
            _theory_command(s, refined),
            subprocess.Popen(
                _theory_command(s, refined),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            ),
        )
        for s in chosen
    }
    out = {}
    for key, (cmd, proc) in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr}")
        res = json.loads(stdout)
        occ = [max(0.0, float(x)) for x in res["occupancy"]["mean"]]
        total = sum(occ)
        cdf, acc = [], 0.0
        for x in occ:
            acc += x / total
            cdf.append(acc)
        cdf[-1] = 1.0
        refined = res.get("refined")
        out[key] = {
            "T": res["mean_response_time"]["mean"],
            "refined_T": refined["mean_response_time"]["mean"] if refined else None,
            "cdf": cdf,
            "command": " ".join(cmd[1:]),
        }
    return out


def initial_lengths(rng: random.Random, n: int, cdf: list[float]) -> list[int]:
    out = []
    for _ in range(n):
        u, k = rng.random(), 0
        while k < len(cdf) - 1 and u >= cdf[k]:
            k += 1
        out.append(k)
    return out


# -- shared pure-Python structures (SimPy) -----------------------------------------------------


class Levels:
    """Queue lengths with the servers kept sorted by length: O(1) updates, a
    uniformly random shortest queue in O(1) (JSQ)."""

    __slots__ = ("q", "order", "where", "start", "n")

    def __init__(self, n: int):
        self.n = n
        self.q = [0] * n
        self.order = list(range(n))
        self.where = list(range(n))
        self.start = [0] + [n] * 2  # start[k]: servers shorter than k; grows on demand

    def inc(self, j: int) -> None:
        q, order, where, start = self.q, self.order, self.where, self.start
        k = q[j]
        if k + 2 >= len(start):
            start.append(self.n)
        e = start[k + 1] - 1
        o, p = order[e], where[j]
        order[p], where[o] = o, p
        order[e], where[j] = j, e
        start[k + 1] = e
        q[j] = k + 1

    def dec(self, j: int) -> None:
        q, order, where, start = self.q, self.order, self.where, self.start
        k = q[j]
        f = start[k]
        o, p = order[f], where[j]
        order[p], where[o] = o, p
        order[f], where[j] = j, f
        start[k] = f + 1
        q[j] = k - 1

    def shortest(self, rng: random.Random) -> int:
        k = self.q[self.order[0]]
        return self.order[int(rng.random() * self.start[k + 1])]


class IQueues:
    """M I-queues of idle servers: uniform pick and removal of a member in O(1)."""

    __slots__ = ("lists", "of", "pos")

    def __init__(self, m: int, ids: int):
        self.lists = [[] for _ in range(m)]
        self.of = [-1] * ids
        self.pos = [0] * ids

    def add(self, j: int, k: int) -> None:
        lst = self.lists[k]
        self.of[j], self.pos[j] = k, len(lst)
        lst.append(j)

    def remove(self, j: int) -> None:
        lst = self.lists[self.of[j]]
        last = lst.pop()
        if last != j:
            p = self.pos[j]
            lst[p], self.pos[last] = last, p
        self.of[j] = -1


def _probe(rng: random.Random, n: int, d: int, length) -> int:
    """The shortest of d distinct uniformly random servers, ties uniform."""
    picks = rng.sample(range(n), d) if d > 2 else None
    if picks is None:
        i = int(rng.random() * n)
        j = int(rng.random() * (n - 1))
        picks = (i, j + (j >= i))
    best, bl, ties = -1, -1, 0
    for j in picks:
        lj = length(j)
        if best < 0 or lj < bl:
            best, bl, ties = j, lj, 1
        elif lj == bl:
            ties += 1
            if rng.random() * ties < 1.0:
                best = j
    return best


class Window:
    """Response times by arrival time in batches of the measured window."""

    def __init__(self, warm: float, end: float, batches: int):
        self.warm, self.end, self.b = warm, end, batches
        self.width = (end - warm) / batches
        self.sums = [0.0] * batches
        self.counts = [0] * batches

    def add(self, t_arr: float, rt: float) -> None:
        if self.warm <= t_arr < self.end:
            b = min(int((t_arr - self.warm) / self.width), self.b - 1)
            self.sums[b] += rt
            self.counts[b] += 1


# -- Ciw ---------------------------------------------------------------------------------------

_CIW = None


def _ciw_classes():
    """Ciw's custom distributions and routers (built once Ciw is imported)."""
    global _CIW
    if _CIW is not None:
        return _CIW
    import ciw
    from ciw.routing import NodeRouting

    class StoppingExponential(ciw.dists.Distribution):
        """Exponential inter-arrival times; no arrival after ``stop`` (the drain)."""

        def __init__(self, rate, stop):
            self.rate, self.stop = rate, stop

        def sample(self, t=None, ind=None):
            x = random.expovariate(self.rate)
            return x if t + x < self.stop else float("inf")

    class AtStart(ciw.dists.Distribution):
        """One batch at time 0 (the preloaded tasks), then none."""

        def __init__(self):
            self.done = False

        def sample(self, t=None, ind=None):
            if self.done:
                return float("inf")
            self.done = True
            return 0.0

    class PowerOfD(NodeRouting):
        """Pod(d): the shortest of d distinct uniformly random servers (tasks in
        service included), ties uniform."""

        def __init__(self, first, n, d):
            self.first, self.n, self.d = first, n, d

        def next_node(self, ind):
            nodes = self.simulation.nodes
            j = _probe(
                random, self.n, self.d, lambda i: nodes[self.first + i].number_of_individuals
            )
            return nodes[self.first + j]

    class JIQDispatch(NodeRouting):
        """JIQ (Wang et al.): a uniformly random dispatcher; a uniformly random idle
        server from its I-queue (which leaves it), else a uniformly random server,
        removed from its I-queue if it was idle (a delete request)."""

        def __init__(self, first, n, iq):
            self.first, self.n, self.iq = first, n, iq

        def next_node(self, ind):
            nodes, iq = self.simulation.nodes, self.iq
            lst = iq.lists[int(random.random() * len(iq.lists))]
            if lst:
                j = lst[int(random.random() * len(lst))]
                iq.remove(j)
            else:
                j = self.first + int(random.random() * self.n)
                if nodes[j].number_of_individuals == 0:
                    iq.remove(j)
            return nodes[j]

    class LeaveJoiningIQueue(NodeRouting):
        """A server's router: the task leaves; a server left idle joins a uniformly
        random I-queue (called before the task is released, so the server still
        counts it)."""

        def __init__(self, iq):
            self.iq = iq

        def next_node(self, ind):
            if self.node.number_of_individuals == 1:
                self.iq.add(self.node.id_number, int(random.random() * len(self.iq.lists)))
            return self.simulation.nodes[-1]

    _CIW = ciw, StoppingExponential, AtStart, PowerOfD, JIQDispatch, LeaveJoiningIQueue
    return _CIW


def _ciw_replica(job: dict) -> dict:
    ciw, StoppingExponential, AtStart, PowerOfD, JIQDispatch, LeaveJoiningIQueue = _ciw_classes()
    from ciw.routing import Leave, LoadBalancing, NetworkRouting

    s, warm, end, seed = job["system"], job["warm"], job["end"], job["seed"]
    n = s.n
    ciw.seed(seed)
    init = initial_lengths(random.Random(seed + 1), n, job["cdf"])
    first = 2  # node 1 dispatches; the servers are nodes 2 .. N + 1
    servers = list(range(first, first + n))
    iq = None
    if s.code == JSQ:
        dispatch = LoadBalancing(destinations=servers, tie_break="random")
    elif s.code == POD:
        dispatch = PowerOfD(first, n, s.d)
    else:
        iq = IQueues(s.m, first + n)
        for j, k in enumerate(init):
            if k == 0:
                iq.add(first + j, int(random.random() * s.m))
        dispatch = JIQDispatch(first, n, iq)
    leave = [LeaveJoiningIQueue(iq) if iq else Leave() for _ in range(n)]
    network = ciw.create_network(
        arrival_distributions=[StoppingExponential(LOAD * n, end)]
        + [AtStart() if k else None for k in init],
        service_distributions=[ciw.dists.Deterministic(0.0)] + [ciw.dists.Exponential(1.0)] * n,
        number_of_servers=[float("inf")] + [1] * n,
        batching_distributions=[ciw.dists.Deterministic(1)]
        + [ciw.dists.Deterministic(max(k, 1)) for k in init],
        routing=NetworkRouting(routers=[dispatch] + leave),
    )
    t0 = time.perf_counter()
    sim = ciw.Simulation(network)
    sim.simulate_until_max_time(end + 1e9)  # arrivals stop at `end`; it ends once drained
    sim_s = time.perf_counter() - t0
    window = Window(warm, end, BATCHES)
    arrivals = departures = 0
    for r in sim.get_all_records():
        if r.node == 1:
            arrivals += 1
        elif r.record_type == "service":
            departures += 1
            if r.arrival_date > 0.0:  # not a preloaded task
                window.add(r.arrival_date, r.exit_date - r.arrival_date)
    return {
        "sums": window.sums,
        "counts": window.counts,
        "events": arrivals + departures,
        "sim_s": sim_s,
        "left": sum(nd.number_of_individuals for nd in sim.transitive_nodes),
    }


# -- SimPy -------------------------------------------------------------------------------------


def _simpy_replica(job: dict) -> dict:
    import simpy

    s, warm, end, seed = job["system"], job["warm"], job["end"], job["seed"]
    n, m = s.n, s.m
    rng = random.Random(seed)
    env = simpy.Environment()
    res = [simpy.Resource(env, capacity=1) for _ in range(n)]
    lv = Levels(n)
    q = lv.q
    iq = IQueues(m, n) if s.code == JIQ else None
    window = Window(warm, end, BATCHES)
    counts = [0, 0]  # arrivals, departures
    expo = rng.expovariate

    def task(j, t_arr, req):
        yield req
        yield env.timeout(expo(1.0))
        res[j].release(req)
        lv.dec(j)
        counts[1] += 1
        if iq is not None and q[j] == 0:
            iq.add(j, int(rng.random() * m))
        window.add(t_arr, env.now - t_arr)

    def dispatch() -> int:
        if s.code == POD:
            return _probe(rng, n, s.d, q.__getitem__)
        if s.code == JSQ:
            return lv.shortest(rng)
        lst = iq.lists[int(rng.random() * m)]
        if lst:
            j = lst[int(rng.random() * len(lst))]
            iq.remove(j)
        else:
            j = int(rng.random() * n)
            if q[j] == 0:
                iq.remove(j)
        return j

    def admit(j, t_arr):
        lv.inc(j)
        env.process(task(j, t_arr, res[j].request()))

    def source():
        rate = LOAD * n
        while True:
            dt = expo(rate)
            if env.now + dt >= end:
                return  # arrivals stop; the run ends once the tasks drain
            yield env.timeout(dt)
            counts[0] += 1
            admit(dispatch(), env.now)

    for j, k in enumerate(initial_lengths(random.Random(seed + 1), n, job["cdf"])):
        for _ in range(k):
            admit(j, -1.0)  # preloaded: outside the window
        if iq is not None and k == 0:
            iq.add(j, int(rng.random() * m))
    env.process(source())
    t0 = time.perf_counter()
    env.run()
    return {
        "sums": window.sums,
        "counts": window.counts,
        "events": counts[0] + counts[1],
        "sim_s": time.perf_counter() - t0,
        "left": sum(q),
    }


def run_pool(
    peer: str,
    s: System,
    warm: float,
    measured: float,
    replicas: int,
    workers: int,
    seed: int,
    cdf: list[float],
) -> dict:
    fn = _ciw_replica if peer == "ciw" else _simpy_replica
    jobs = [
        {"system": s, "warm": warm, "end": warm + measured, "seed": seed + 1000 * r, "cdf": cdf}
        for r in range(replicas)
    ]
    t0 = time.perf_counter()
    if workers == 1 or replicas == 1:
        out = [fn(j) for j in jobs]
    else:
        # spawn: safe after numba's threads have started, and what macOS and Windows do
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(workers, replicas)) as pool:
            out = pool.map(fn, jobs, chunksize=1)
    wall = time.perf_counter() - t0
    est = interval([o["sums"] for o in out], [o["counts"] for o in out])
    events = sum(o["events"] for o in out)
    busy = sum(o["sim_s"] for o in out) / min(workers, replicas)
    return {
        **est,
        "events": events,
        "wall_s": wall,
        "run_s": busy,
        "left_in_system": sum(o["left"] for o in out),
    }


# -- numba -------------------------------------------------------------------------------------

_NUMBA = None


def _numba_kernel():
    """The numba replicas loop, compiled on first use."""
    global _NUMBA
    if _NUMBA is not None:
        return _NUMBA
    import numba
    import numpy as np
    from numba import njit, prange

    @njit
    def inc(j, q, order, where, start):
        # servers sorted by queue length: start[k] = the number shorter than k
        k = q[j]
        e = start[k + 1] - 1
        o = order[e]
        p = where[j]
        order[p] = o
        where[o] = p
        order[e] = j
        where[j] = e
        start[k + 1] = e
        q[j] = k + 1

    @njit
    def dec(j, q, order, where, start):
        k = q[j]
        f = start[k]
        o = order[f]
        p = where[j]
        order[p] = o
        where[o] = p
        order[f] = j
        where[j] = f
        start[k] = f + 1
        q[j] = k - 1

    @njit
    def iq_add(j, k, lists, size, of, pos):
        s = size[k]
        lists[k, s] = j
        pos[j] = s
        of[j] = k
        size[k] = s + 1

    @njit
    def iq_remove(j, lists, size, of, pos):
        k = of[j]
        p = pos[j]
        s = size[k] - 1
        last = lists[k, s]
        lists[k, p] = last
        pos[last] = p
        size[k] = s
        of[j] = -1

    @njit
    def replica(policy, n, m, d, lam, warm, end, nbatch, seed, cdf, kmax, area, arrs):
        np.random.seed(seed)
        q = np.zeros(n, np.int64)
        order = np.arange(n)
        where = np.arange(n)
        start = np.full(kmax + 2, n, np.int64)
        start[0] = 0
        jiq = policy == 2
        lists = np.empty((m, n) if jiq else (1, 1), np.int64)
        size = np.zeros(m, np.int64)
        of = np.full(n, -1, np.int64)
        pos = np.zeros(n, np.int64)
        probes = np.empty(max(d, 1), np.int64)
        total = 0
        for j in range(n):
            k = min(np.searchsorted(cdf, np.random.random(), side="right"), kmax - 1)
            for _ in range(k):
                inc(j, q, order, where, start)
            total += k
        if jiq:
            for j in range(n):
                if q[j] == 0:
                    iq_add(j, int(np.random.random() * m), lists, size, of, pos)
        lam_n = lam * n
        width = (end - warm) / nbatch
        t = 0.0
        events = 0
        overflow = 0
        while True:
            busy = n - start[1]
            rate = lam_n + busy
            tn = t + np.random.exponential(1.0) / rate
            # the number in system over [t, tn], inside the window, by batch
            a = max(t, warm)
            bnd = min(tn, end)
            while a < bnd:
                b = int((a - warm) / width)
                if b >= nbatch - 1:
                    b = nbatch - 1
                    be = end
                else:
                    be = warm + (b + 1) * width
                    if be <= a:  # on a boundary by rounding
                        b += 1
                        be = end if b >= nbatch - 1 else warm + (b + 1) * width
                e = bnd if bnd < be else be
                area[b] += total * (e - a)
                a = e
            if tn >= end:
                break
            t = tn
            if np.random.random() * rate < lam_n:
                if policy == 0:  # Pod(d)
                    for i in range(d):
                        while True:
                            c = int(np.random.random() * n)
                            fresh = True
                            for h in range(i):
                                if probes[h] == c:
                                    fresh = False
                            if fresh:
                                break
                        probes[i] = c
                    j = probes[0]
                    ties = 1
                    for i in range(1, d):
                        c = probes[i]
                        if q[c] < q[j]:
                            j = c
                            ties = 1
                        elif q[c] == q[j]:
                            ties += 1
                            if np.random.random() * ties < 1.0:
                                j = c
                elif policy == 1:  # JSQ: a uniformly random shortest queue
                    k = q[order[0]]
                    j = order[int(np.random.random() * start[k + 1])]
                else:  # JIQ
                    k = int(np.random.random() * m)
                    if size[k] > 0:
                        j = lists[k, int(np.random.random() * size[k])]
                        iq_remove(j, lists, size, of, pos)
                    else:
                        j = int(np.random.random() * n)
                        if q[j] == 0:
                            iq_remove(j, lists, size, of, pos)
                if q[j] >= kmax:
                    overflow = 1
                    break
                inc(j, q, order, where, start)
                total += 1
                events += 1
                if t >= warm:
                    b = min(int((t - warm) / width), nbatch - 1)
                    arrs[b] += 1
            else:  # a uniformly random busy server completes
                j = order[start[1] + int(np.random.random() * busy)]
                dec(j, q, order, where, start)
                total -= 1
                events += 1
                if jiq and q[j] == 0:
                    iq_add(j, int(np.random.random() * m), lists, size, of, pos)
        return events, overflow

    @njit(parallel=True)
    def replicas(policy, n, m, d, lam, warm, end, nbatch, seeds, cdf, kmax):
        r = seeds.shape[0]
        area = np.zeros((r, nbatch))
        arrs = np.zeros((r, nbatch), np.int64)
        events = np.zeros(r, np.int64)
        overflow = np.zeros(r, np.int64)
        for i in prange(r):
            e, o = replica(
                policy, n, m, d, lam, warm, end, nbatch, seeds[i], cdf, kmax, area[i], arrs[i]
            )
            events[i] = e
            overflow[i] = o
        return area, arrs, events, overflow

    _NUMBA = numba, np, replicas
    return _NUMBA


_NUMBA_COMPILE_S = None


def run_numba(
    s: System,
    warm: float,
    measured: float,
    replicas: int,
    workers: int,
    seed: int,
    cdf: list[float],
) -> dict:
    global _NUMBA_COMPILE_S
    numba, np, kernel = _numba_kernel()
    numba.set_num_threads(min(workers, numba.config.NUMBA_NUM_THREADS))
    cdfa = np.asarray(cdf, np.float64)
    if _NUMBA_COMPILE_S is None:
        # the first call of the process compiles (a tiny run: a few events); every
        # row is charged it, as a process running that system alone would be
        t0 = time.perf_counter()
        kernel(JIQ, 4, 2, 2, LOAD, 0.0, 0.5, 2, np.arange(2, dtype=np.int64), cdfa, KMAX)
        _NUMBA_COMPILE_S = time.perf_counter() - t0
    compile_s = _NUMBA_COMPILE_S
    seeds = np.arange(replicas, dtype=np.int64) * 7919 + seed
    t0 = time.perf_counter()
    area, arrs, events, overflow = kernel(
        s.code, s.n, s.m, s.d, LOAD, warm, warm + measured, BATCHES, seeds, cdfa, KMAX
    )
    run_s = time.perf_counter() - t0
    est = interval(area.tolist(), arrs.tolist())
    return {
        **est,
        "events": int(events.sum()),
        "wall_s": run_s + compile_s,
        "run_s": run_s,
        "compile_s": compile_s,
        "overflow_replicas": int(overflow.sum()),
        "threads": numba.get_num_threads(),
    }


# -- jaxqueue ----------------------------------------------------------------------------------


def _jaxqueue_cli(s: System, warm: float, measured: float | None, replicas: int, seed: int):
    cmd = [sys.executable, "-m", "jaxqueue", "simulate", "--policy", s.policy]
    if s.policy == "pod":
        cmd += ["--d", str(s.d)]
    cmd += ["--servers", str(s.n)]
    if s.m > 1:
        cmd += ["--dispatchers", str(s.m)]
    # measured None: one block of 256 uniformized steps, the least it runs
    length = ["--steps", "256"] if measured is None else ["--time", f"{measured:g}"]
    cmd += [
        "--load",
        str(LOAD),
        "--replicas",
        str(replicas),
        *length,
        "--warmup-time",
        f"{warm:g}",
        "--seed",
        str(seed),
        "--json",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
    for line in out.stderr.splitlines():
        log(f"    jaxqueue: {line}")
    res = json.loads(out.stdout)
    st = res["settings"]
    sim_time = st["time_measured"] + st["time_warmup"]
    events = replicas * 2 * LOAD * s.n * sim_time
    return res, wall, events, " ".join(cmd[1:])


def run_jaxqueue(
    s: System, warm: float, measured: float, replicas: int, seed: int, baseline: bool = True
) -> dict:
    res, wall, events, cmd = _jaxqueue_cli(s, warm, measured, replicas, seed)
    st, est = res["settings"], res["mean_response_time"]
    row = {
        "mean": est["mean"],
        "ci95": est["ci95"],
        "n": est["n"],
        "interval": st["interval"],
        "lag1": res["diagnostics"].get("lag1_correlation"),
        "batches": res["diagnostics"].get("batches"),
        "widened": res["diagnostics"].get("widened"),
        "events": events,
        "wall_s": wall,
        "run_s": None,
        "in_process_s": st["wall_seconds"],
        "measured_simulated": st["time_measured"],
        "warmup_simulated": st["time_warmup"],
        "steps": st["steps"] + st["warmup"],
        "levels": st["levels"],
        "iqueue_levels": st["iqueue_levels"],
        "init": st["init"],
        "overflow": res["diagnostics"]["overflow"],
        "iq_overflow": res["diagnostics"]["iq_overflow"],
        "command": cmd,
    }
    if baseline:
        # the same command with the least measured time: its wall is the fixed cost
        _, wall0, events0, _ = _jaxqueue_cli(s, warm, None, replicas, seed)
        row["baseline_wall_s"], row["baseline_events"] = wall0, events0
        if wall > wall0 and events > events0:
            row["run_s"] = (wall - wall0) * events / (events - events0)
    return row


# -- the benchmark -----------------------------------------------------------------------------


def measured_time(
    peer: str,
    s: System,
    warm: float,
    replicas: int,
    workers: int,
    budget: float,
    fixed: float | None,
) -> float:
    """Measured time units for a peer to take about `budget` seconds of wall."""
    if fixed is not None:
        return fixed
    events_per_unit = 2 * LOAD * s.n  # arrivals and departures of one replica
    if peer == "jaxqueue":
        total = ASSUMED_RATE[peer](s) * max(budget - JAXQUEUE_FIXED_S, 1.0)
    else:
        lanes = min(workers, replicas)
        total = ASSUMED_RATE[peer](s) * budget * lanes
    units = total / replicas / events_per_unit - warm
    least = MIN_MEASURED.get(s.n, 5.0)
    return float(f"{max(units, least):.3g}")


def expected_seconds(
    peer: str, s: System, warm: float, measured: float, replicas: int, workers: int
) -> float:
    """The wall a run should take at the assumed rates (the --plan column)."""
    events = replicas * 2 * LOAD * s.n * (warm + measured)
    if peer == "jaxqueue":
        return JAXQUEUE_FIXED_S + events / ASSUMED_RATE[peer](s)
    return events / (ASSUMED_RATE[peer](s) * min(workers, replicas))


def fmt_t(row: dict) -> str:
    mean, half = row.get("mean"), row.get("ci95")
    if mean is None or not math.isfinite(mean):
        return "-"
    if half is None or not math.isfinite(half) or half <= 0:
        return f"{mean:.4f}"
    digits = max(0, min(6, 1 - math.floor(math.log10(half))))
    return f"{mean:.{digits}f} +- {half:.{digits}f}"


def disagreements(rows: list[dict]) -> tuple[list[dict], int]:
    """Pairs of peers on one system whose T differ by more than the root-sum-square
    of their 95% half-widths (about 1 pair in 20 by chance alone), and the
    number of pairs compared."""
    found, pairs = [], 0
    by_system: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("mean") is not None and math.isfinite(r["mean"]):
            by_system.setdefault(r["system"], []).append(r)
    for system, rs in by_system.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                ha = a["ci95"] if math.isfinite(a["ci95"]) else 0.0
                hb = b["ci95"] if math.isfinite(b["ci95"]) else 0.0
                diff = a["mean"] - b["mean"]
                allowed = math.hypot(ha, hb)
                pairs += 1
                if abs(diff) > allowed:
                    found.append(
                        {
                            "system": system,
                            "peers": [a["peer"], b["peer"]],
                            "T": [a["mean"], b["mean"]],
                            "difference": diff,
                            "allowed": allowed,
                            "times_allowed": abs(diff) / allowed if allowed > 0 else math.inf,
                        }
                    )
    return found, pairs


def _finite(x):
    """NaN and infinities as None: the JSON stays strict."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (N = 1000 runs at N = 100)")
    ap.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated, of " + ",".join(PEERS)
    )
    ap.add_argument("--systems", default=None, help="comma-separated keys (default: all)")
    ap.add_argument(
        "--budget", type=float, default=20.0, help="seconds per system and peer (about)"
    )
    ap.add_argument(
        "--measured",
        type=float,
        default=None,
        help="measured time units per replica for every peer (instead of --budget)",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="warm-up time units (default 100 at N = 10, else 5; --quick: 20 and 5)",
    )
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="cores to use")
    ap.add_argument(
        "--replicas",
        default="",
        help="per peer, e.g. numba=32,jaxqueue=4096 (default: ciw 10, simpy 10, numba 16, "
        "jaxqueue 1024; --quick 10, 10, 16, 16)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--strict", action="store_true", help="stop at a peer's failure")
    ap.add_argument("--plan", action="store_true", help="print the run lengths and stop")
    ap.add_argument(
        "--refined",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the 1/N-refined mean field's T as a reference (theory --servers N); default "
        "on, off with --quick",
    )
    ap.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a second, minimal jaxqueue run per system for its fixed cost (the "
        "run events/s); default on, off with --quick",
    )
    args = ap.parse_args(argv)
    baseline = args.baseline if args.baseline is not None else not args.quick
    refined = args.refined if args.refined is not None else not args.quick

    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        ap.error(f"--peers: unknown {bad}; choose from {','.join(PEERS)}")
    all_systems = systems(args.quick)
    if args.systems:
        keys = [k for k in args.systems.split(",") if k]
        known = {s.key: s for s in all_systems}
        unknown = [k for k in keys if k not in known]
        if unknown:
            ap.error(f"--systems: unknown {unknown}; choose from {','.join(known)}")
        chosen = [known[k] for k in keys]
    else:
        chosen = all_systems
    reps = dict(QUICK_REPLICAS if args.quick else DEFAULT_REPLICAS)
    for part in (p for p in args.replicas.split(",") if p):
        name, _, value = part.partition("=")
        if name not in PEERS or not value.isdigit() or int(value) < 1:
            ap.error(f"--replicas: {part!r} is not PEER=COUNT")
        reps[name] = int(value)
    workers = max(1, args.workers)
    out = sys.stderr if args.json else sys.stdout

    def warmup(s: System) -> float:
        if args.warmup is not None:
            return args.warmup
        return (20.0 if s.n <= 10 else 5.0) if args.quick else (100.0 if s.n <= 10 else 5.0)

    def measured_units(peer: str, s: System) -> float:
        if args.quick and args.measured is None:
            return 20.0 if s.n <= 10 else 2.0
        return measured_time(peer, s, warmup(s), reps[peer], workers, args.budget, args.measured)

    if args.plan:
        total = 0.0
        for s in chosen:
            for peer in peers:
                warm, measured = warmup(s), measured_units(peer, s)
                secs = expected_seconds(peer, s, warm, measured, reps[peer], workers)
                if peer == "jaxqueue" and baseline:
                    secs += JAXQUEUE_FIXED_S  # its minimal second run
                total += secs
                print(
                    f"{s.label:22s} {peer:9s} {reps[peer]:5d} x ({warm:g} + {measured:g}) "
                    f"time units: about {secs:.0f} s",
                    file=out,
                )
        print(f"about {total / 60:.1f} minutes at the assumed rates (ASSUMED_RATE)", file=out)
        return 0

    rows, references, failed = [], [], []
    log(f"mean fields of {len(chosen)} systems (python -m jaxqueue theory) ...")
    fields = mean_fields(chosen, refined)
    for s in chosen:
        warm = warmup(s)
        mf = fields[s.key]
        references.append(
            {
                "system": s.key,
                "label": s.label,
                "mean_field_T": mf["T"],
                "refined_T": mf["refined_T"],
                "command": mf["command"],
            }
        )
        log(
            f"{s.label}: mean-field T = {mf['T']:.4f} (N = infinity)"
            + (f", {mf['refined_T']:.4f} (refined, 1/N)" if mf["refined_T"] else "")
        )
        for peer in peers:
            r = reps[peer]
            measured = measured_units(peer, s)
            log(f"  {peer}: {r} replicas x ({warm:g} warm-up + {measured:g}) time units ...")
            seed = args.seed
            try:
                if peer in ("ciw", "simpy"):
                    row = run_pool(peer, s, warm, measured, r, workers, seed, mf["cdf"])
                elif peer == "numba":
                    row = run_numba(s, warm, measured, r, workers, seed, mf["cdf"])
                else:
                    row = run_jaxqueue(s, warm, measured, r, seed, baseline)
                    measured = row["measured_simulated"]
            except Exception as exc:  # one peer failing leaves the others' rows
                if args.strict:
                    raise
                log(f"    failed: {type(exc).__name__}: {exc}")
                failed.append(
                    {"system": s.key, "peer": peer, "error": f"{type(exc).__name__}: {exc}"}
                )
                continue
            row.update(
                {
                    "system": s.key,
                    "label": s.label,
                    "peer": peer,
                    "replicas": r,
                    "warmup": warm,
                    "measured": measured,
                }
            )
            row["events_per_s"] = row["events"] / row["wall_s"]
            row["run_events_per_s"] = row["events"] / row["run_s"] if row["run_s"] else None
            rows.append(row)
            log(f"    T = {fmt_t(row)}, {row['events']:.3g} events in {row['wall_s']:.2f} s")

    for r in rows:
        base = next(
            (x for x in rows if x["system"] == r["system"] and x["peer"] == "jaxqueue"), None
        )
        r["x_jaxqueue"] = r["events_per_s"] / base["events_per_s"] if base else None
        r["run_x_jaxqueue"] = (
            r["run_events_per_s"] / base["run_events_per_s"]
            if base and r["run_events_per_s"] and base["run_events_per_s"]
            else None
        )
    found, pairs = disagreements(rows)
    table(rows, references, found, pairs, out)
    for f in failed:
        print(f"failed: {f['system']} {f['peer']}: {f['error'].splitlines()[0]}", file=out)
    if args.json:
        from importlib import metadata

        versions = {"python": platform.python_version()}
        for dist in ("jaxqueue", "jax", "numpy", "ciw", "simpy", "numba"):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
        print(
            json.dumps(
                _finite(
                    {
                        "rows": rows,
                        "references": references,
                        "disagreements": found,
                        "failed": failed,
                        "pairs_compared": pairs,
                        "load": LOAD,
                        "workers": workers,
                        "cpu_count": os.cpu_count(),
                        "machine": platform.machine(),
                        "quick": args.quick,
                        "budget_s": args.budget,
                        "jax_compilation_cache": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
                        "versions": versions,
                    }
                )
            )
        )
    return 1 if failed else 0


def table(rows: list[dict], references: list[dict], found: list[dict], pairs: int, out) -> None:
    def rate(x):
        return f"{x:.3g}" if x else "-"

    def ratio(x):
        return f"{x:.3g}" if x else "-"

    head = (
        f"{'system':22s} {'peer':9s} {'T +- 95% CI':>20s} {'replicas x time':>17s} "
        f"{'events':>9s} {'wall s':>7s} {'events/s':>9s} {'run ev/s':>9s} "
        f"{'x jaxqueue':>10s} {'run x jq':>9s}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    ref = {x["system"]: x for x in references}
    last = None
    for r in rows:
        if r["system"] != last:
            if last is not None:
                print(file=out)
            last = r["system"]
            mf = ref[r["system"]]
            print(
                f"{r['label']:22s} {'mean field':9s} {mf['mean_field_T']:>20.4f}   (N = infinity)",
                file=out,
            )
            if mf["refined_T"]:
                print(
                    f"{r['label']:22s} {'refined':9s} {mf['refined_T']:>20.4f}"
                    "   (mean field + V / N at this N)",
                    file=out,
                )
        rt = f"{r['replicas']} x {r['measured']:g}"
        print(
            f"{r['label']:22s} {r['peer']:9s} {fmt_t(r):>20s} {rt:>17s} {r['events']:9.3g} "
            f"{r['wall_s']:7.2f} {rate(r['events_per_s']):>9s} {rate(r['run_events_per_s']):>9s} "
            f"{ratio(r['x_jaxqueue']):>10s} {ratio(r['run_x_jaxqueue']):>9s}",
            file=out,
        )
    print(file=out)
    if found:
        print(
            f"Disagreements, |T_a - T_b| > sqrt(h_a^2 + h_b^2), in {len(found)} of {pairs} "
            f"pairs (about {pairs / 20:.1g} expected by chance):",
            file=out,
        )
        for f in found:
            print(
                f"  {f['system']}: {f['peers'][0]} {f['T'][0]:.4f} vs {f['peers'][1]} "
                f"{f['T'][1]:.4f} (difference {f['difference']:+.4f}, allowed {f['allowed']:.4f},"
                f" x{f['times_allowed']:.2g})",
                file=out,
            )
    elif pairs:
        print(f"T agrees across peers within their intervals ({pairs} pairs).", file=out)


if __name__ == "__main__":
    sys.exit(main())
