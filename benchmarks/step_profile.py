"""JIQ's step against Pod(2)'s: what XLA compiles and what it costs (not a test: it prints figures).

    python benchmarks/step_profile.py                      # 2^10 and 2^13 replicas
    python benchmarks/step_profile.py --replicas 1024,10000 --json
    python benchmarks/step_profile.py --trace              # each kernel's share of a step

Rows: Pod(2) (M = 1), JIQ (M = 100) and, as a control, Pod(2) at JIQ's level
bound (``--control-levels``, 32 by default), each at N = 1000 and load 0.9
with the default bounds, at each replica count. Each row builds the program
the runner runs: :func:`jaxqueue.sim.blocks.run_blocks` for a
:func:`jaxqueue.runs.planner.plan`, lowered for the plan's devices and mesh
and compiled once. For each it reports:

* XLA's cost analysis (flops, bytes accessed, transcendentals) of the whole
  program and of one replica-step. XLA counts the body of a while loop once,
  so the whole program's figures are one block's set-up plus one step of
  one device's replicas; the step's figures are those of the step loop's
  body alone (the innermost while loop, ``BLOCK`` trips) divided by the
  replicas of a device, and likewise the flops of each kernel of the step
  loop. XLA's bytes count the whole operand of an in-place scatter-add, so
  they overstate what a scatter touches; the level entries (below) do not;
* the instructions of the optimized HLO by kind (fusions, copies, scatters,
  gathers, sorts, while loops, random-bit generation, reductions) in the
  whole module and in the step loop. Each top-level instruction of the step
  loop is a kernel run every step; they are classed as level searches (a
  reduction over a level-wide row), dense updates (a level-wide row
  rewritten), scatter-adds, word-and-decision kernels (per-replica values)
  and copies, and the entries of level-wide rows they read or write for
  each replica (a search its row, a dense update its row twice, a
  scatter-add one entry twice): the work that every replica does at the
  full level bound, whatever its queues;
* the replica state's arrays and shapes per replica, the random words a step
  draws (:func:`jaxqueue.sim.state.n_words`) and the words the step loop
  hashes (a word is hashed again in every kernel that reads it);
* replica-events per second, the best of 3 timed chunks after a warm-up
  call, the rows of one replica count timed in turns in this one process,
  and each row's step time relative to Pod(2)'s at the same count.

``--trace`` adds, at the largest replica count, each kernel's share of the
step loop's time, the median of 3 JAX profiler traces of a few blocks (the
profiler times every kernel, which inflates the small ones: shares, not
rates). Progress goes to stderr; ``--json`` prints one JSON object alone on
stdout. Runs on all devices of the default backend; on a CPU, one device per
core is exposed unless XLA_FLAGS says otherwise. The per-step cost analysis
uses two private functions of jaxlib (``jaxlib._hlo.hlo_module_from_text``
and ``hlo_module_cost_analysis``); where they are missing those figures are
left out.
"""

from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()

import argparse
import collections
import glob
import gzip
import json
import platform
import re
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks
from jaxqueue.sim.state import n_words

#: The first multiplier of the counter hash's mixer (``jaxqueue.core.rng``):
#: a word is two mixes, so two multiplies by it for each word hashed.
MIX_CONSTANT = 0xED5AD4BB
#: HLO kinds counted, in order (``rng``: every random-number instruction).
KINDS = ("fusion", "copy", "scatter", "gather", "sort", "while", "rng", "reduce")
#: Kernel roles in the step loop, in order.
ROLES = ("level search", "dense update", "scatter-add", "word and decision", "copy")
#: XLA's cost figures reported.
COSTS = ("flops", "bytes accessed", "transcendentals")
#: Instructions that do no work of their own.
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}
_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_OP = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*? ([a-z][\w\-]*)\(")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_METADATA = re.compile(r", metadata=\{[^}]*\}")


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The optimized HLO: computations, instructions by kind, the step loop
# --------------------------------------------------------------------------


def computations(text: str) -> dict:
    """The module's computations by name: their lines, without metadata."""
    comps, cur = {}, None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and line.rstrip().endswith("{"):
            cur = m.group(1)
            comps[cur] = [_METADATA.sub("", line)]
        elif cur is not None:
            comps[cur].append(_METADATA.sub("", line))
            if line.strip() == "}":
                cur = None
    return comps


def ops(lines: list) -> list:
    """``(name, opcode, line)`` of each instruction of a computation."""
    return [(m.group(1), m.group(2), line) for line in lines[1:] if (m := _OP.match(line))]


def callees(comps: dict, name: str, seen: set | None = None) -> set:
    """``name`` and every computation it calls, transitively."""
    seen = set() if seen is None else seen
    if name in seen or name not in comps:
        return seen
    seen.add(name)
    for line in comps[name]:
        for ref in _CALLS.findall(line):
            callees(comps, ref, seen)
    return seen


def count_kinds(comps: dict, names) -> dict:
    """Instructions by kind (:data:`KINDS`) in the computations ``names``."""
    counts = collections.Counter(
        "rng" if op.startswith("rng") else op for n in names for _, op, _ in ops(comps[n])
    )
    return {k: counts.get(k, 0) for k in KINDS}


def step_loop(comps: dict, text: str):
    """The body of the innermost while loop (the scan over a block's steps) and its trips."""
    for line in text.splitlines():
        m = re.search(r" while\(.*?body=%([\w.\-]+)", line)
        if m and not any(
            op == "while" for c in callees(comps, m.group(1)) for _, op, _ in ops(comps[c])
        ):
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            return m.group(1), int(trips.group(1)) if trips else None
    return None, None


def words_hashed(comps: dict, names) -> int:
    """Random words hashed in the computations ``names`` (two multiplies by the mixer's first constant a word)."""
    total = 0
    for n in names:
        consts = set()
        for name, op, line in ops(comps[n]):
            if op == "constant" and f"constant({MIX_CONSTANT})" in line:
                consts.add(name)
            elif op == "broadcast" and any(f"(%{c})" in line for c in consts):
                consts.add(name)
        for _, op, line in ops(comps[n]):
            if op == "multiply" and any(re.search(rf"%{re.escape(c)}[,)]", line) for c in consts):
                total += 1
    return total // 2


def role(comps: dict, line: str, opcode: str) -> str:
    """What a kernel of the step loop does (:data:`ROLES`), from what it holds."""
    if opcode != "fusion":
        return "copy" if opcode == "copy" else "word and decision"
    inner = collections.Counter(
        op for c in _CALLS.findall(line) for n in callees(comps, c) for _, op, _ in ops(comps[n])
    )
    shape = re.search(r"= \w+\[([\d,]*)\]", line)
    dims = [int(x) for x in shape.group(1).split(",") if x] if shape else []
    if inner["scatter"]:
        return "scatter-add"
    if inner["reduce"]:
        return "level search"
    if len(dims) == 2 and dims[1] > 2:
        return "dense update"
    return "word and decision"


def entries(comps: dict, line: str, kind: str) -> int:
    """Entries of level-wide rows a kernel reads or writes for each replica: a
    search compares a row (the widest ``pred[B, W]`` inside), a dense update reads
    and writes its output row, a scatter-add reads and writes one entry."""
    if kind == "scatter-add":
        return 2
    if kind == "dense update":
        shape = re.search(r"= \w+\[\d+,(\d+)\]", line)
        return 2 * int(shape.group(1)) if shape else 0
    if kind == "level search":
        widths = [
            int(w)
            for c in _CALLS.findall(line)
            for n in callees(comps, c)
            for _, op, inner in ops(comps[n])
            if op == "compare"
            for w in re.findall(r"= pred\[\d+,(\d+)\]", inner)
        ]
        return max(widths, default=0)
    return 0


def kernels(comps: dict, body: str) -> list:
    """The step loop's kernels: ``(name, role, called computation or None, entries)``."""
    out = []
    for name, op, line in ops(comps[body]):
        if op not in FREE:
            called = _CALLS.findall(line)
            kind = role(comps, line, op)
            out.append((name, kind, called[0] if called else None, entries(comps, line, kind)))
    return out


def xla_cost(comps: dict, entry: str) -> dict | None:
    """XLA's cost analysis of computation ``entry`` (and what it calls) as a module of
    its own, or None where jaxlib does not expose it (private functions)."""
    try:
        from jax._src.lib import xla_client
        from jaxlib import _hlo
    except ImportError:
        return None
    names = callees(comps, entry)
    parts = [
        "\n".join(comps[n]).replace("ENTRY ", "", 1) for n in comps if n in names and n != entry
    ]
    parts.append("ENTRY " + "\n".join(comps[entry]).replace("ENTRY ", "", 1))
    try:
        module = _hlo.hlo_module_from_text("HloModule part\n\n" + "\n\n".join(parts))
        cost = xla_client._xla.hlo_module_cost_analysis(jax.devices()[0].client, module)
    except Exception as exc:  # a private API: report, do not fail
        log(f"  (no cost analysis of {entry}: {type(exc).__name__})")
        return None
    return {k: float(cost.get(k, 0.0)) for k in COSTS}


# --------------------------------------------------------------------------
# One configuration: plan, compile, analyse, time
# --------------------------------------------------------------------------


class Row:
    """One policy at one replica count, compiled as the runner compiles it."""

    def __init__(self, label: str, policy, m: int, replicas: int, levels: int | None):
        self.label, self.pol, self.replicas = label, policy, replicas
        kw = {} if levels is None else {"levels": levels}
        self.plan = planner.plan(
            policy, [0.9], 1000, m, replicas=replicas, steps=2 * BLOCK, warmup=0, **kw
        )
        self.system = self.plan.system
        self.core = runner.Run.start(self.plan).core
        mesh, _, self.keys, self.lam = runner.placement(self.plan)
        t0 = time.perf_counter()
        self.compiled = run_blocks.lower(
            self.core,
            self.keys,
            jnp.asarray(block_words(0)),
            jnp.int32(1),
            self.lam,
            system=self.system,
            policy=policy,
            mesh=mesh,
        ).compile()
        self.compile_s = time.perf_counter() - t0
        self.block, self.blocks, self.rates = 0, 1, []
        self.info = self.analyse()

    def run(self, blocks: int) -> float:
        """Seconds for ``blocks`` blocks of every replica (the state carried on)."""
        t0 = time.perf_counter()
        self.core, stats = self.compiled(
            self.core, self.keys, jnp.asarray(block_words(self.block)), jnp.int32(blocks), self.lam
        )
        jax.block_until_ready((self.core, stats))
        self.block += blocks
        return time.perf_counter() - t0

    def analyse(self) -> dict:
        text = self.compiled.as_text()
        comps = computations(text)
        whole = self.compiled.cost_analysis()
        whole = whole[0] if isinstance(whole, (list, tuple)) else whole
        body, trips = step_loop(comps, text)
        per_device = self.plan.padded // len(self.plan.devices)
        loop = callees(comps, body)
        ks = kernels(comps, body)
        by_role = {r: {"kernels": 0, "entries": 0, "flops": 0.0} for r in ROLES}
        for _, r, called, n in ks:
            by_role[r]["kernels"] += 1
            by_role[r]["entries"] += n
            cost = xla_cost(comps, called) if called else None
            by_role[r]["flops"] += (cost or {}).get("flops", 0.0) / per_device
        step = xla_cost(comps, body)
        state = {
            name: list(np.shape(x)[1:])
            for name, x in self.core._asdict().items()
            if x is not None and hasattr(x, "shape")
        }
        return {
            "row": self.label,
            "policy": self.pol.label(),
            "n_servers": self.system.n_servers,
            "n_dispatchers": self.system.n_dispatchers,
            "load": 0.9,
            "replicas": self.replicas,
            "replicas_per_device": per_device,
            "devices": len(self.plan.devices),
            "levels": self.system.levels,
            "iqueue_levels": self.system.iqueue_levels,
            "state_per_replica": state,
            "state_int32_per_replica": int(sum(np.prod(s) for s in state.values())),
            "words_drawn_per_step": n_words(self.system, self.pol),
            "words_hashed_per_step": words_hashed(comps, loop),
            "compile_seconds": self.compile_s,
            "program_cost": {k: float(whole.get(k, 0.0)) for k in COSTS},
            "step_loop_trips": trips,
            "per_replica_step": None if step is None else {k: step[k] / per_device for k in COSTS},
            "hlo_module": count_kinds(comps, list(comps)),
            "hlo_step_loop": count_kinds(comps, loop),
            "step_kernels": len(ks),
            "by_role": by_role,
            "level_entries_per_replica_step": sum(n for *_, n in ks),
            "kernel_roles": {name: r for name, r, *_ in ks},
        }


def time_rows(batch: list, seconds: float) -> None:
    """Best of 3 chunks of about ``seconds`` for each row, in turns; the ratios to the first."""
    for row in batch:
        row.run(1)  # the first call of a compiled program pays its set-up
        row.blocks = max(1, int(seconds / min(row.run(1) for _ in range(2))))
    for rep in range(3):  # in turns: a busy moment of the machine falls on every row
        for row in batch:
            row.rates.append(row.replicas * row.blocks * BLOCK / row.run(row.blocks))
        log(f"  repeat {rep + 1}: " + ", ".join(f"{r.label} {r.rates[-1]:.3g}" for r in batch))
    pod = max(batch[0].rates)
    for row in batch:
        row.info.update(
            events_per_second=max(row.rates),
            rates=row.rates,
            time_vs_pod=pod / max(row.rates),
            blocks_per_chunk=row.blocks,
        )


def trace_shares(row: Row, blocks: int, repeats: int = 3) -> dict:
    """Each step-loop kernel's share of the step loop's time: the median over
    ``repeats`` profiler traces of ``blocks`` blocks."""
    roles = row.info["kernel_roles"]
    shares = collections.defaultdict(list)
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            jax.profiler.start_trace(folder, create_perfetto_trace=True)
            row.run(blocks)
            jax.profiler.stop_trace()
            found = glob.glob(os.path.join(folder, "**", "*perfetto_trace.json.gz"), recursive=True)
            if not found:
                return {}
            with gzip.open(found[0]) as fh:
                events = json.load(fh)
        events = events["traceEvents"] if isinstance(events, dict) else events
        spent = collections.Counter()
        for e in events:
            if e.get("ph") == "X" and e.get("name") in roles:
                spent[e["name"]] += e.get("dur", 0)
        total = sum(spent.values()) or 1
        for name in roles:
            shares[name].append(spent[name] / total)
    return {
        name: {"role": roles[name], "share": statistics.median(v)} for name, v in shares.items()
    }


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def fmt(x) -> str:
    return "" if x is None else f"{x:.0f}"


def table(rows: list) -> str:
    """The main table (markdown)."""
    head = [
        "row",
        "replicas",
        "levels (I-queue)",
        "state int32 / replica",
        "words drawn / hashed a step",
        "kernels a step: searches, dense, scatters, other",
        "level entries / replica-step",
        "flops / replica-step",
        "bytes / replica-step",
        "replica-events/s",
        "step time / Pod(2)'s",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        n = {k: v["kernels"] for k, v in r["by_role"].items()}
        other = n["word and decision"] + n["copy"]
        per = r["per_replica_step"] or {}
        out.append(
            f"| {r['row']} | {r['replicas']} | {r['levels']} ({r['iqueue_levels']}) | "
            f"{r['state_int32_per_replica']} | {r['words_drawn_per_step']} / "
            f"{r['words_hashed_per_step']} | {r['step_kernels']}: {n['level search']}, "
            f"{n['dense update']}, {n['scatter-add']}, {other} | "
            f"{r['level_entries_per_replica_step']} | "
            f"{fmt(per.get('flops'))} | {fmt(per.get('bytes accessed'))} | "
            f"{r['events_per_second']:.3g} | {r['time_vs_pod']:.2f} |"
        )
    return "\n".join(out)


def role_table(rows: list, shares: dict) -> str:
    """Kernels by role at the largest replica count: count, level entries and XLA's
    flops per replica-step, and (with a trace) the share of the step loop's time."""
    head = ["row", "role", "kernels", "level entries / replica-step", "flops / replica-step"]
    head += ["share of step time (trace)"] if shares else []
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        per = shares.get(r["row"], {})
        for name in ROLES:
            v = r["by_role"][name]
            cells = [r["row"], name, str(v["kernels"]), str(v["entries"]), fmt(v["flops"])]
            if shares:
                cells.append(f"{sum(s['share'] for s in per.values() if s['role'] == name):.0%}")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1024,8192", help="replica counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=0.4, help="seconds a timed chunk")
    ap.add_argument(
        "--control-levels", type=int, default=32, help="levels of the Pod(2) control row (0: none)"
    )
    ap.add_argument("--trace", action="store_true", help="kernel shares from profiler traces")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",") if x]
    configs = [("Pod(2)", jq.make("pod", d=2), 1, None), ("JIQ", jq.make("jiq"), 100, None)]
    if args.control_levels:
        label = f"Pod(2), {args.control_levels} levels"
        configs.append((label, jq.make("pod", d=2), 1, args.control_levels))
    t_start, load_before = time.perf_counter(), os.getloadavg()
    rows, shares = [], {}
    for replicas in counts:
        batch = []
        for label, pol, m, levels in configs:
            log(f"compiling {label} at {replicas} replicas")
            batch.append(Row(label, pol, m, replicas, levels))
        time_rows(batch, args.seconds)
        rows += [row.info for row in batch]
        if args.trace and replicas == max(counts):
            for row in batch:
                log(f"tracing {row.label}")
                shares[row.label] = trace_shares(row, max(2, row.blocks // 4))
    meta = {
        "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - t_start,
        "versions": {"jaxqueue": jq.__version__, "jax": jax.__version__, "numpy": np.__version__},
    }
    if args.json:
        print(json.dumps({"rows": rows, "trace_shares": shares, **meta}))
        return 0
    print(table(rows))
    print()
    print(role_table([r for r in rows if r["replicas"] == max(counts)], shares))
    print()
    for r in rows:
        print(
            f"{r['row']} at {r['replicas']} replicas: state {r['state_per_replica']}; "
            f"step loop {r['hlo_step_loop']}; module {r['hlo_module']}; "
            f"whole program {r['program_cost']}; compiled in {r['compile_seconds']:.1f} s"
        )
    avg = lambda x: " ".join(f"{v:.1f}" for v in x)  # noqa: E731
    print(
        f"{len(meta['devices'])} devices; load average {avg(load_before)} before, "
        f"{avg(meta['load_average_after'])} after; {meta['wall_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
