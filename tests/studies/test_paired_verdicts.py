"""What jq.paired says of its points (jaxqueue.studies.crn.paired, docs/crn.md, "Paired
comparisons"): the coupling verdict comes from the replicas, not from their batch
means; a metric constant on a side has no correlation; an Estimate from batch means
says what its ``n`` counts; and ``Estimate - Estimate`` points to jq.paired.

The runs are one small shape: Pod(2) and JIQ at N = 6, M = 2, load 0.8, 8 replicas
(batch means) of 4,096 steps.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.studies.crn.paired import (
    HEADLINE,
    MIN_COUPLED_CORRELATION,
    Paired,
    compare_samples,
    coupling_of,
    coupling_threshold,
    plan_points,
)

#: 8 replicas: intervals from batch means (16 batches of 256 steps each).
RUN = dict(replicas=8, steps=4096, levels=32, seed=4)
POD, JIQ = jq.Model("pod", 6, 2, d=2), jq.Model("jiq", 6, 2)


def _samples(models, load):
    """Each point's per-replica and per-batch values (as jq.paired takes them)."""
    return plan_points(models, load, **RUN).run().samples


@pytest.mark.slow  # compiles Pod(2) and JIQ; test_paired.py's slow tests say not coupled too
def test_two_policies_are_not_coupled_by_their_batch_means():
    """Pod(2) and JIQ read the words at other positions. Over the 128 batch means of
    8 replicas their mean response times correlate above 2 / sqrt(128) (the old
    verdict, "coupled"); over the 8 replicas, which are independent, they do not
    (measured: batches 0.20, replicas -0.39), and the verdict is the replicas'."""
    samples = _samples([POD, JIQ], 0.8)
    (whole_a, batches_a), (whole_b, batches_b) = samples
    a, b = np.ravel(batches_a[HEADLINE]), np.ravel(batches_b[HEADLINE])
    assert np.corrcoef(a, b)[0, 1] > coupling_threshold(a.size)  # what misled the old verdict
    _, _, corr, coupled, batched = compare_samples(samples)
    assert batched and not coupled[0][HEADLINE]
    assert corr[0][HEADLINE] == coupling_of(whole_a[HEADLINE], whole_b[HEADLINE])[0]
    assert corr[0][HEADLINE] < coupling_threshold(8)


@pytest.mark.slow  # the programs of the test above
def test_jq_paired_says_not_coupled_and_what_n_counts():
    c = jq.paired([POD, JIQ], 0.8, **RUN)
    assert c.settings["paired_interval"] == "batch-means"
    assert not c.coupled[0][HEADLINE] and c.pairs[0][HEADLINE] == 8
    assert c.coupling(1).startswith(
        "not coupled (correlation "
    ) and "over 8 replicas" in c.coupling(1)
    # the batch-means difference: n counts the batch means, replicas the replicas
    est = c[HEADLINE]
    assert est.replicas == 8 and est.n == 8 * 16 and est.counts == "batch means of 8 replicas"
    assert repr(est).endswith(", n=128, replicas=8)")
    # JIQ's probe rate is 0 in every replica: no correlation, and no "nan" anywhere
    assert math.isnan(c.correlation[0]["probe_rate"]) and not c.coupled[0]["probe_rate"]
    text = str(c)
    assert "nan" not in text.lower()
    row = next(line for line in text.splitlines() if line.strip().startswith("probe_rate"))
    assert "no correlation: constant on a side" in row
    data = json.loads(json.dumps(c.to_dict()))
    (point,) = data["points"]
    assert point["correlation"]["probe_rate"] is None
    assert point["coupling"] == c.coupling(1) and point["correlation_replicas"][HEADLINE] == 8
    assert point["differences"][HEADLINE]["replicas"] == 8
    assert jq.Estimate.from_dict(point["differences"][HEADLINE]).replicas == 8


def test_two_loads_of_one_policy_are_coupled():
    c = jq.paired(POD, [0.8, 0.85], **RUN)
    assert c.coupled[0][HEADLINE], c.correlation
    assert c.coupling(1).startswith("coupled (correlation ") and "over 8 replicas" in c.coupling(1)
    assert c.narrowing() > 1.5


def test_the_verdict_needs_enough_replicas_and_a_useful_correlation():
    rng = np.random.default_rng(1)
    x = rng.normal(size=8)
    assert coupling_of(x, x + 0.1 * rng.normal(size=8))[1:] == (8, True)
    # 4 replicas: 2 / sqrt(4) = 1, no correlation passes
    r, n, coupled = coupling_of(x[:4], x[:4] + 0.01 * rng.normal(size=4))
    assert r > 0.99 and (n, coupled) == (4, False)
    # a weak correlation that many replicas resolve is not a coupling
    y = rng.normal(size=4000)
    r, n, coupled = coupling_of(y, 0.15 * y + rng.normal(size=4000))
    assert coupling_threshold(n) < r < MIN_COUPLED_CORRELATION and not coupled
    # NaN replicas are left out of n; a constant side has no correlation
    assert coupling_of(np.r_[x, np.nan], np.r_[x, 1.0])[1] == 8
    r, n, coupled = coupling_of(x, np.zeros(8))
    assert math.isnan(r) and (n, coupled) == (8, False)


def test_batches_that_agree_do_not_couple_replicas_that_do_not():
    """Synthetic values: the batches of each replica move together on both sides,
    the replicas' whole windows are independent: not coupled."""
    rng = np.random.default_rng(0)
    common = rng.normal(size=(8, 20))
    batches = [np.asfortranarray(common + 0.5 * rng.normal(size=(8, 20))) for _ in range(2)]
    wholes = [rng.normal(size=8), rng.normal(size=8)]
    samples = [({"m": w}, {"m": bt}) for w, bt in zip(wholes, batches)]
    diff, _, corr, coupled, batched = compare_samples(samples)
    assert batched and corr[0]["m"] == coupling_of(*wholes)[0] and not coupled[0]["m"]
    assert diff[0]["m"].replicas == 8 and diff[0]["m"].n == 160


def _paired(replicas: int, r: float) -> Paired:
    est = jq.Estimate(0.5, 0.1, replicas)
    return Paired(
        ("a", "b"),
        ({HEADLINE: est},),
        ({HEADLINE: 0.2},),
        ({HEADLINE: r},),
        ({HEADLINE: False},),
        (None, None),
        {"replicas": replicas, "paired_interval": "replicas"},
        ({HEADLINE: replicas},),
    )


def test_the_coupling_sentence_with_few_replicas_or_a_constant_side():
    assert _paired(4, 0.99).coupling(1).startswith("coupling not measured: 4 replicas are too few")
    assert _paired(1, math.nan).coupling(1).startswith("coupling not measured: 1 replica is")
    assert "correlation not measured" in str(_paired(1, math.nan))
    assert _paired(8, math.nan).coupling(1) == (
        f"coupling not measured: the {HEADLINE} is constant on a side"
    )
    weak = _paired(400, 0.2).coupling(1)
    assert weak.startswith("not coupled (correlation 0.20 over 400 replicas, too weak to gain")
    # a Paired built without pairs (the older positional form) reads the run's replicas
    old = Paired(*[getattr(_paired(8, 0.1), f) for f in Paired.__dataclass_fields__][:-1])
    assert old.coupling(1).startswith("not coupled (correlation 0.10 over 8 replicas)")


# --- Estimate ------------------------------------------------------------------------------


def test_an_estimate_from_batch_means_says_what_n_counts():
    plain = jq.Estimate(1.5, 0.25, 8)
    assert plain.replicas is None and plain.counts == "replicas"
    assert plain.to_dict() == {"mean": 1.5, "ci95": 0.25, "n": 8}  # as before
    assert repr(plain) == "Estimate(mean=1.5, ci95=0.25, n=8)"
    est = jq.Estimate(1.5, 0.25, 160, replicas=8)
    assert repr(est) == "Estimate(mean=1.5, ci95=0.25, n=160, replicas=8)"
    assert est.to_dict() == {"mean": 1.5, "ci95": 0.25, "n": 160, "replicas": 8}
    assert jq.Estimate.from_dict(est.to_dict()) == est
    for got in (est + 1, 2 * est, est / 2, -est, 1 - est):
        assert (got.n, got.replicas) == (160, 8)
    vec = jq.Estimate(np.array([1.0, 2.0]), np.array([0.1, 0.2]), np.array([160, 150]), 8)
    assert [(e.n, e.replicas) for e in jq.results.estimates.entries(vec)] == [(160, 8), (150, 8)]
    assert repr(vec).endswith("n=[160 150], replicas=8)")


def test_a_difference_of_two_estimates_points_to_jq_paired():
    a, b = jq.Estimate(1.0, 0.1, 8), jq.Estimate(0.5, 0.1, 8)
    for op in (lambda: a - b, lambda: a + b):
        with pytest.raises(TypeError, match=r"paired replicas.*jq\.paired\(") as info:
            op()
        assert "per-replica differences" not in str(info.value)
    for op in (lambda: a * b, lambda: a / b):
        with pytest.raises(TypeError, match=r"correlated.*paired replicas.*jq\.paired"):
            op()
