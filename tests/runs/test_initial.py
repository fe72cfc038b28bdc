"""Initial states (jaxqueue.runs.initial): the mean-field start sets the I-queues too.

Host-side only: nothing here compiles a simulation. How much the start
shortens the warm-up is measured in docs/simulation.md ("Warm-up"); the
statistical tests of JIQ-Original at N = 10^4 (test_tagged_server) and of
phase-type service against its mean field (test_phases) run with short
warm-ups because of it.
"""

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.runs.initial import initial_classes, initial_counts, iqueue_counts, listed_counts
from jaxqueue.runs.planner import plan
from jaxqueue.sim.runner import _initial_core

N, M = 1000, 100


def _start(policy, load, init="mean-field", **opts):
    """One replica's initial Core, as a run builds it (numpy arrays)."""
    p = plan(policy, [load], N, M, replicas=2, init=init, **opts)
    core = _initial_core(p)
    return p, type(core)(*(None if x is None else _first(x) for x in core))


def _first(tree):
    return (
        type(tree)(*(np.asarray(x)[0] for x in tree))
        if isinstance(tree, tuple)
        else np.asarray(tree)[0]
    )


@pytest.mark.parametrize(
    "policy, load, opts",
    [
        ("jiq", 0.6, {}),
        ("jiq", 0.95, {}),
        ("jiq-pod", 0.9, {"d": 2}),
        ("jiq-original", 0.7, {"order": "fifo"}),
    ],
)
def test_iqueue_counts_follow_the_mean_field_law_and_hold_every_listed_server(policy, load, opts):
    mf = theory.mean_field(policy, load, N / M, **opts)
    law = mf.iqueue_distribution
    system = jq.System(N, M, None, 40, 60)
    listed = round(M * np.arange(law.size) @ law)  # as many as the law's mean size says
    if policy != "jiq-original":  # JIQ's I-queues hold exactly the idle servers
        assert listed == round(N * (1 - load))
    c = iqueue_counts(law, system, listed)
    sizes = np.arange(c.size)
    assert c.sum() == M and sizes @ c == listed and np.all(c >= 0)
    # each size's count stays within 1 of its share of the law
    target = np.zeros(c.size)
    target[: min(law.size, c.size)] = M * law[: c.size] / law[: c.size].sum()
    assert np.abs(c - target).max() <= 1, np.abs(c - target).max()


def test_iqueue_counts_that_cannot_fit_say_which_bound():
    with pytest.raises(ValueError, match="iqueue_levels=3 is too small"):
        iqueue_counts([0.5, 0.5], jq.System(N, M, None, 40, 3), 301)


@pytest.mark.parametrize(
    "policy, opts",
    [
        ("jiq", {}),  # closed form
        pytest.param("jiq-sq", {"d": 2}, marks=pytest.mark.slow),  # the generic fixed point (7 s)
    ],
)
def test_mean_field_start_sets_the_iqueue_sizes_of_the_exchangeable_jiq_family(policy, opts):
    load = 0.7
    p, core = _start(policy, load, **opts)
    counts, by_size = initial_counts("mean-field", p.system, p.policy, load)
    assert by_size.sum() == M and np.arange(by_size.size) @ by_size == counts[0]
    np.testing.assert_array_equal(core.iq_tail, np.cumsum(by_size[::-1])[::-1])
    mf = theory.mean_field(policy, load, N / M, **opts)
    assert abs(by_size[0] / M - mf.p0) <= 2 / M  # p0: empty I-queues
    _, even = _start(policy, load, init=mf.occupancy, **opts)  # an array: spread evenly
    assert even.iq_tail[0] == M and even.iq_tail[1] == M  # no I-queue empty
    assert even.iq_tail[(N - int(core.tail[1])) // M + 2] == 0


@pytest.mark.slow  # a mean-field solve above capacity (heavy compile)
def test_one_dispatcher_starts_from_the_single_dispatcher_mean_field():
    """With M = 1 the one I-queue lists every idle server: the start is the
    single-dispatcher limit (ratio None), not the many-dispatcher one at
    r = N, whose ~4N I-queue levels took minutes to solve at N = 1000."""
    from jaxqueue.runs.initial import mean_field_of

    p = plan("jiq", [1.2], N, 1, replicas=2, buffer=3, init="mean-field")
    mf = mean_field_of(p.policy, 1.2, p.system)
    assert mf.settings["ratio"] is None and mf.iqueue_distribution is None
    np.testing.assert_allclose(mf.occupancy, theory.mean_field("jiq", 1.2, buffer=3).occupancy)
    counts, _ = initial_counts("mean-field", p.system, p.policy, 1.2)
    assert counts.sum() == N and counts[0] == 0  # above capacity: no server idle


@pytest.mark.slow
def test_one_dispatcher_theory_is_the_single_dispatcher_limit_everywhere():
    """JIQ and JIQ-Pod have closed forms for many dispatchers only; with one
    dispatcher (ratio None) below capacity and infinite buffers every arrival
    finds an idle server in the limit: T = 1 and no server holds two tasks.
    The start, a grid's theory column and ``compare`` all use that limit (the
    closed form at r = N is a different system: T = 1.008 at N = 1000)."""
    from jaxqueue.runs.initial import mean_field_of
    from jaxqueue.studies.grids import grid
    from jaxqueue.studies.grids.spec import Point

    for name in ("jiq", "jiq-pod"):
        mf = theory.mean_field(name, 0.9)
        assert mf.settings["ratio"] is None
        assert mf.mean_response_time == pytest.approx(1.0, abs=1e-9)
        assert mf.tail[1] == pytest.approx(0.9, abs=1e-9) and mf.tail[2] < 1e-9
    many = theory.mean_field("jiq", 0.9, float(N)).mean_response_time
    assert many > 1.005  # what grids and compare used to put beside an M = 1 run

    p = plan("jiq", [0.9], N, 1, replicas=2, init="mean-field")
    start = mean_field_of(p.policy, 0.9, p.system)
    assert start.mean_response_time == pytest.approx(1.0, abs=1e-9)
    counts, _ = initial_counts("mean-field", p.system, p.policy, 0.9)
    assert counts[0] == N - 900 and counts[1] == 900 and counts[2:].sum() == 0

    point = Point("jiq", (), N, 1, None, 0.9, None, None)
    (th,) = grid._theory([point], "mean-field", {})
    assert th.settings["ratio"] is None
    assert th.mean_response_time == pytest.approx(1.0, abs=1e-9)
    several = Point("jiq", (), N, M, None, 0.9, None, None)
    (th,) = grid._theory([several], "mean-field", {})
    assert th.settings["ratio"] == N / M


@pytest.mark.slow
@pytest.mark.parametrize("dispatchers", [1, 10])
def test_every_policy_with_a_mean_field_starts_from_it(dispatchers):
    """The default start (init="auto": the mean field from N = 100 on) of
    every registered policy, with one dispatcher and with several: a guard
    for the ratio each start passes to its mean field (a JIQ run with M = 1
    once failed here before anything ran). Host side only: nothing compiles
    but the mean fields. (JIQ-Original and JIQ-Threshold solve their
    many-dispatcher mean field at r = N / M whatever M: tested at M = 10.)"""
    n, load = 100, 0.9
    for name in jq.available():
        pol = jq.make(name)
        if pol.mean_field_kind() == "none" or (pol.single_dispatcher and dispatchers > 1):
            continue
        if pol.per_server and dispatchers == 1:
            continue
        opts = {"d": 1} if name == "jiq-sq" and dispatchers == 1 else {}
        p = plan(name, [load], n, dispatchers, replicas=2, init="auto", **opts)
        counts, _ = initial_counts("mean-field", p.system, p.policy, load)
        assert counts.sum() == n, name
        # the busy servers: N * lambda in the limit, rounded level by level
        assert abs(counts[1:].sum() - n * load) <= 2, (name, counts[:4])


@pytest.mark.parametrize("opts", [{}, {"order": "fifo", "z": 1}], ids=["random", "fifo,z=1"])
def test_jiq_original_start_lists_busy_servers_as_its_mean_field_does(opts):
    load = 0.7
    mf = theory.mean_field("jiq-original", load, N / M, **opts)
    listed = np.asarray(mf.diagnostics["listed_occupancy"])
    assert np.all(listed >= 0) and np.all(listed <= mf.occupancy + 1e-15)
    assert listed[1:].sum() > 0.01  # stale listings: busy servers still listed
    p, core = _start("jiq-original", load, **opts)
    q, where, sizes, slots = core.lists.q, core.lists.where, core.lists.sizes, core.lists.slots
    on = where >= 0
    assert np.all(on[q == 0])  # an idle server is always listed (it joined when it went idle)
    # each length's listed servers: the level's count (within 1 of N * occupancy), rounded
    per_length = np.bincount(q[on], minlength=q.max() + 1)
    assert np.all(np.abs(per_length - N * listed[: per_length.size]) <= 1.5)
    # the I-queue sizes: the mean-field law, holding exactly the listed servers
    by_size = iqueue_counts(mf.iqueue_distribution, p.system, int(on.sum()))
    np.testing.assert_array_equal(np.bincount(sizes, minlength=by_size.size), by_size)
    assert np.all(core.iq_tail == np.cumsum(by_size[::-1])[::-1])
    # every listed server sits where `where` says, and the heads are the longest queues
    cap = p.system.iqueue_levels
    for server in np.nonzero(on)[0]:
        disp, place = divmod(int(where[server]), cap)
        assert place < sizes[disp] and slots[disp, place] == server
    heads = q[slots[sizes > 0, 0]]
    assert heads.mean() >= q[on].mean()


def test_empty_start_lists_every_server_evenly():
    _, core = _start("jiq-original", 0.7, init="empty")
    assert np.all(core.lists.where >= 0) and np.all(core.lists.q == 0)
    assert np.all(core.lists.sizes == N // M)
    _, core = _start("jiq", 0.7, init="empty")
    assert core.iq_tail[N // M] == M and core.iq_tail[N // M + 1] == 0


def test_listed_counts_never_exceed_the_level():
    counts = np.array([5, 3, 2, 0])
    got = listed_counts(counts, [0.5, 0.3, 0.2, 0.0], [0.5, 0.29, 0.01, 0.0])
    np.testing.assert_array_equal(got, [5, 3, 0, 0])


def test_phase_type_start_splits_each_level_by_the_mean_fields_joint_law():
    """Hyperexponential service: long queues are mostly in the slow phase, which
    the in-service mix (every level alike) misses."""
    load = 0.9
    p = plan("pod", [load], N, d=2, service="hyperexp:4", replicas=2, init="mean-field")
    counts, _ = initial_counts("mean-field", p.system, p.policy, load)
    split = initial_classes("mean-field", p.system, p.policy, load, counts)
    mf = theory.mean_field("pod", load, d=2, service="hyperexp:4")
    joint = np.asarray(mf.diagnostics["phase_occupancy"])
    np.testing.assert_array_equal(split.sum(axis=1), counts)
    rows = min(joint.shape[0], counts.size)
    # each level's split is its count times the joint law's shares, rounded
    share = joint[1:rows] / np.maximum(joint[1:rows].sum(axis=1, keepdims=True), 1e-300)
    assert np.all(np.abs(split[1:rows] - counts[1:rows, None] * share) < 1)
    # the slow phase's share: 0.19 of the servers with one task and 0.84 of
    # those with seven in the joint law; half of each in the in-service mix
    mix = initial_classes("empty", p.system, p.policy, load, counts)
    slow = int(np.argmin(p.system.service.exit_rates))
    assert counts[7] >= 40
    assert split[1, slow] / counts[1] < 0.25 and split[7, slow] / counts[7] > 0.8
    assert all(abs(mix[k, slow] / counts[k] - 0.5) < 0.05 for k in (1, 7))
