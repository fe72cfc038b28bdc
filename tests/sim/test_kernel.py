"""The register layout and the Pallas kernel against the engine, bit for bit.

The kernel runs in interpret mode here (about 1e6 replica-steps per second on
the CPU), so the batches are small; the CUDA lowering is checked without a
GPU. See docs/simulation.md, "Backends".
"""

import functools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks
from jaxqueue.sim.kernel import advance_kernel, eqns, lower_for_cuda
from jaxqueue.sim.registers import MAX_LEVELS, run_registers

ONE = jax.devices()[:1]

# (policy, options, N, M, buffer, levels, iqueue_levels): every exchangeable
# policy, with and without buffers, one and several dispatchers; the small
# bounds make queues and I-queues overflow now and then, which must match too.
CASES = [
    ("pod", {"d": 2}, 60, 1, None, 8, None),
    ("random", {}, 60, 1, 3, None, None),
    ("jsq", {}, 60, 1, 4, None, None),  # JSQ's exhaustive draw (as Pod(d = N))
    ("jsew", {}, 60, 1, 4, None, None),  # identical servers: JSQ's draw under its own name
    ("i1f", {}, 60, 1, None, 8, None),
    ("jiq", {}, 60, 10, None, 8, 6),
    ("jiq", {}, 60, 1, 6, None, None),
    ("jiq-pod", {"d": 2}, 60, 10, 4, None, 6),
    ("jiq-sq", {"d": 2}, 60, 8, None, 8, 8),
    ("idle-first", {"d": 3}, 60, 1, 5, None, None),  # three distinct probes
]
# the register layout in plain XLA (compiles slowly; the same step as the kernel): Pod(2),
# and JIQ-SQ(2) with eight dispatchers, whose I-queues it relists by changes
REGISTERS = {0, 8}


def _setup(name, opts, n, m, buffer, levels, iq, replicas=24):
    p = planner.plan(
        name,
        [0.6, 0.9],
        n,
        m,
        buffer=buffer,
        levels=levels,
        iqueue_levels=iq,
        replicas=replicas // 2,
        steps=2560,
        seed=11,
        devices=ONE,
        backend="xla",
        **opts,
    )
    core = runner._initial_core(p)
    _, _, keys, loads = runner.placement(p)
    return p, core, keys, loads


def _same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)
    )


@functools.cache
def _kernel(system, policy):
    # two blocks a launch: three blocks take a full launch and a partial one
    return jax.jit(
        functools.partial(
            advance_kernel, system=system, policy=policy, interpret=True, tile=8, key_blocks=2
        )
    )


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) for c in CASES],
    ids=[f"{c[0]}-{c[1]}-M{c[3]}-b{c[4]}" for c in CASES],
)
def test_kernel_and_register_layout_match_the_engine_bit_for_bit(case):
    p, core, keys, loads = _setup(*case)
    put = lambda: jax.tree.map(jnp.asarray, core)  # noqa: E731  (a fresh copy: donated)
    kernel = _kernel(p.system, p.policy)
    # a start past 2**32 - 2 blocks: the high word of the block index turns over inside
    for first, n_blocks in ((0, 1), (2**32 - 2, 3)):
        fb, nb = jnp.asarray(block_words(first)), jnp.int32(n_blocks)
        want = run_blocks(put(), keys, fb, nb, loads, system=p.system, policy=p.policy)
        got_kernel = kernel(put(), keys, fb, nb, loads)
        assert _same(want, got_kernel), f"kernel differs from the engine at {first}+{n_blocks}"
        if CASES.index(case) in REGISTERS:
            got = run_registers(put(), keys, fb, nb, loads, system=p.system, policy=p.policy)
            assert _same(want, got), f"register layout differs at {first}+{n_blocks}"
        assert int(want[1].arrivals.sum()) > 0  # the runs did something


@pytest.mark.slow
@pytest.mark.parametrize("case", [CASES[0], CASES[7]], ids=["pod", "jiq-pod-b4"])
def test_kernel_lowers_for_cuda_through_triton(case):
    """Lowering for CUDA needs no GPU: a construct Triton rejects fails here."""
    p, *_ = _setup(*case)
    text = lower_for_cuda(p.system, p.policy).as_text()
    assert "triton" in text  # the Triton custom call, chosen by its compiler parameters


def test_backend_choice_and_its_errors():
    pod = dict(policy="pod", loads=[0.8], n_servers=50, d=2, replicas=2, steps=512)
    assert planner.plan(**pod).backend == "xla"  # auto off a GPU
    assert planner.plan(**pod, backend="registers").backend == "registers"
    with pytest.raises(ValueError, match="backend='gpu' is not valid"):
        planner.plan(**pod, backend="gpu")
    for bad, why in [
        (dict(policy="jiq-original", n_dispatchers=5), "per-server state"),
        (dict(policy="pod", d=10), "d=10 > 8"),
        (dict(policy="pod", levels=MAX_LEVELS + 1), f"levels={MAX_LEVELS + 1} > {MAX_LEVELS}"),
    ]:
        args = {**pod, **bad}
        with pytest.warns(jq.BackendWarning, match=why):
            p = planner.plan(**args, backend="pallas")
        assert p.backend == "xla" and why in p.backend_note
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert planner.plan(**args).backend == "xla"  # auto: no warning


@pytest.mark.slow  # traces four kernel steps, up to 64 levels (about 3 s)
def test_auto_runs_the_kernel_on_a_gpu_while_its_step_fits_in_registers():
    """On a GPU, ``auto`` takes the kernel unless its step would carry more than
    AUTO_MAX_VALUES values a replica (measured: JIQ at 64 levels spills and runs
    slower than the engine); the note says why and how to get the kernel."""
    from types import SimpleNamespace

    from jaxqueue.core.system import System
    from jaxqueue.sim.kernel import AUTO_MAX_VALUES, step_values

    gpu = (SimpleNamespace(platform="gpu"),)
    pod = jq.make("pod", d=2)
    jiq = jq.make("jiq")
    fits = [
        (System(1000, 1, None, 64, 0), pod),
        (System(1000, 100, None, 32, 32), jiq),
        (System(1000, 100, None, 16, 32), jiq),
    ]
    for system, policy in fits:
        assert step_values(system, policy) <= AUTO_MAX_VALUES
        assert planner._backend("auto", system, policy, gpu) == ("pallas", None)
    big = System(1000, 100, None, 64, 32)
    assert step_values(big, jiq) > AUTO_MAX_VALUES
    used, note = planner._backend("auto", big, jiq, gpu)
    assert used == "xla" and f"carry {step_values(big, jiq)} values" in note
    assert planner._backend("pallas", big, jiq, gpu) == ("pallas", None)  # asked for: runs
    # the distributed JIQ family does not carry iq_listed (it follows from iq_tail;
    # carrying it would add its 33 values)
    no_iq = System(1000, 1, None, 32, 0)
    assert step_values(System(1000, 100, None, 32, 32), jiq) < step_values(no_iq, pod) + 2 * 33


@pytest.mark.parametrize("levels", [4, 16, 17])
def test_step_values_count_what_the_step_loop_carries(levels):
    """Pod(2)'s step loop carries the loop counter, ``levels`` tail levels
    (level 0 never changes), as many time sums, one I-queue time sum, the
    packed histogram (three counts a value) and the counters. Counted from
    the traced loop without its parameters (JAX 0.11's scan has no
    ``num_carry``), so the same on every JAX version the package supports."""
    from jaxqueue.core.system import System
    from jaxqueue.sim.kernel import step_values
    from jaxqueue.sim.state import COUNTERS

    want = 1 + 2 * levels + 1 + -(-levels // 3) + len(COUNTERS)
    assert step_values(System(1000, 1, None, levels, 0), jq.make("pod", d=2)) == want


def test_auto_runs_a_small_run_on_the_host_cpu_when_the_default_device_is_a_gpu(monkeypatch):
    """Compiling the GPU kernel takes seconds to tens of seconds, more than two
    CPU cores take for a run of fewer than HOST_AUTO_STEPS replica-steps: with
    no devices given, backend='auto' runs such a run on the host's CPU and says
    so; a larger run, devices given or another backend keep the GPU."""
    from types import SimpleNamespace

    from jaxqueue.core.host import host_device

    gpu = SimpleNamespace(platform="gpu")
    devs, note = planner._small_on_host((gpu,), True, 6.3e7)
    assert devs == (host_device(),) and "6.3e+07 replica-steps" in note
    for auto, stepped in ((True, planner.HOST_AUTO_STEPS), (False, 6.3e7)):
        assert planner._small_on_host((gpu,), auto, stepped) == ((gpu,), None)
    cpu = jax.devices()[0]
    assert planner._small_on_host((cpu,), True, 6.3e7) == ((cpu,), None)
    # through plan(): the main job's size of batch goes to the host
    monkeypatch.setattr(runner.jax, "devices", lambda *a: [gpu])
    p = planner.plan("pod", [0.5, 0.9], 100, d=2, replicas=4, steps=4 * 256, warmup=256)
    assert p.devices == (host_device(),) and p.backend == "xla"
    assert "runs on the host's CPU" in p.backend_note


def test_listed_servers_follow_from_the_iqueue_tail():
    """The register layout recomputes iq_listed from iq_tail each step
    (registers.listed_of): the same as the state the engine carries."""
    from jaxqueue.core.system import System
    from jaxqueue.sim.registers import listed_of
    from jaxqueue.sim.state import core_from_counts

    system, policy = System(40, 5, None, 8, 6), jq.make("jiq")
    counts = np.array([12, 20, 8, 0, 0, 0, 0, 0, 0])  # 12 idle servers
    iq_counts = np.array([1, 1, 1, 1, 0, 0, 1])  # 5 I-queues listing 0, 1, 2, 3 and 6: 12
    core = core_from_counts(counts, iq_counts, system, policy)
    got = listed_of(tuple(jnp.asarray(core.iq_tail)[j][None] for j in range(7)))
    assert [int(x[0]) for x in got] == [int(v) for v in core.iq_listed]


@pytest.mark.slow
def test_simulate_on_the_kernel_gives_the_engines_result_and_records_it(capsys):
    """Through the runner (chunks, two devices under shard_map, batch means, the
    result) and the command line."""
    args = [
        "--policy",
        "jiq",
        "--load",
        "0.85",
        "--servers",
        "40",
        "--dispatchers",
        "8",
        "--replicas",
        "6",
        "--steps",
        "1024",
        "--warmup",
        "256",
        "--levels",
        "12",
        "--iqueue-levels",
        "12",
        "--seed",
        "2",
        "--json",
    ]
    kw = dict(replicas=6, steps=1024, warmup=256, levels=12, iqueue_levels=12, seed=2)
    ref = jq.simulate("jiq", 0.85, 40, 8, **kw, backend="xla").to_dict()
    assert cli_main(["simulate", *args, "--backend", "pallas"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["settings"].pop("backend") == "pallas" and ref["settings"].pop("backend") == "xla"
    for d in (ref, got):
        d["settings"].pop("wall_seconds")
    assert got == json.loads(json.dumps(ref))  # what the command line prints is the result


def test_every_exchangeable_policy_is_covered_by_the_kernel():
    """A policy added to the registry is covered by the kernel unless it keeps per-server state."""
    from jaxqueue.core.system import System
    from jaxqueue.sim.registers import unsupported

    covered = set()
    for name in jq.available():
        policy = jq.make(name)
        m = 1 if policy.single_dispatcher or not policy.uses_iqueues else 10
        reason = unsupported(System(100, m, None, 16, 16 if m > 1 else 0), policy)
        assert (reason is None) == (not policy.per_server), (name, reason)
        covered |= {name} if reason is None else set()
    assert {c[0] for c in CASES} == covered  # and each is checked bit for bit above


@pytest.mark.slow  # traces the GPU kernel (interpreted) twice
def test_kernel_loads_and_stores_each_state_matrix_once():
    """Triton's coalescing pass walks the whole kernel once per load or store,
    so loading the state level by level (about 260 rows for JIQ at 32 I-queue
    levels) took minutes to compile on a GPU. The kernel loads and stores its
    two state matrices (uint32 and int32 rows) once each, outside the step
    loop, whatever the levels, and their rows are of odd length (see
    kernel._pack)."""
    from jaxqueue.core.system import System
    from jaxqueue.sim.kernel import _zero_core

    policy, replicas = jq.make("jiq"), 16
    for iq in (6, 40):
        system = System(60, 10, None, 8, iq)
        run = functools.partial(
            advance_kernel, system=system, policy=policy, interpret=True, tile=8, key_blocks=2
        )
        jaxpr = jax.make_jaxpr(run)(
            _zero_core(system, policy, replicas),
            jnp.zeros((replicas, 2), jnp.uint32),
            jnp.zeros(2, jnp.uint32),
            jnp.int32(3),
            jnp.zeros(replicas, jnp.float32),
        )
        (call,) = [e for e in eqns(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
        body = call.params["jaxpr"]
        names = [e.primitive.name for e in eqns(body)]
        # count, keys, p and the two state matrices read once; the matrices written once
        assert names.count("get") == 5 and names.count("swap") == 2, iq
        loops = [e for e in body.eqns if e.primitive.name == "while"]
        assert loops and not {"get", "swap"} & {
            e.primitive.name for lp in loops for e in eqns(lp.params["body_jaxpr"].jaxpr)
        }
        assert [a.dtype for a in call.params["out_avals"]] == [jnp.uint32, jnp.int32]
        assert all(a.shape[1] % 2 == 1 for a in call.params["out_avals"])


def test_backend_choice_past_max_probes():
    """Pod(d) and idle-first JSQ(d) past 64 probes at one N draw from a table (no
    logarithms): ``registers`` runs them, ``pallas`` (which does not capture the
    table) falls back to the engine naming the reason, and ``auto`` on a GPU takes
    the engine without a note. Where each replica reads its own N (loads of other
    buffers), the draw takes the formula's logarithms and ``registers`` refuses too."""
    from types import SimpleNamespace

    gpu = (SimpleNamespace(platform="gpu"),)
    for name in ("pod", "idle-first"):
        args = dict(policy=name, loads=[0.6], n_servers=200, d=100, levels=8, replicas=2)
        assert planner.plan(**args, steps=512, backend="registers").backend == "registers"
        with pytest.warns(jq.BackendWarning, match=r"a table of C\(t, d\) / C\(N, d\) at N=200"):
            p = planner.plan(**args, steps=512, backend="pallas")
        assert p.backend == "xla" and "backend='registers' runs it" in p.backend_note
        assert planner._backend("auto", p.system, p.policy, gpu) == ("xla", None)
        with pytest.warns(jq.BackendWarning):
            used, note = planner._backend("registers", p.system, p.policy, ONE, sized=True)
        assert used == "xla" and "float32 logarithms of the tail at N=200 (read per" in note
