"""A queue or an I-queue past its tracked bound, in every engine: detected, never clipped.

The plain engine's checks are in tests/sim/test_engine.py. Here the same for the
per-server engine (``jiq-original``, ``jiq-threshold``) and for the engines by
phase and by pool (a service law, server pools): with bounds far too small,
the run fails with :class:`jaxqueue.LevelOverflowError` and its advice, or,
with ``on_overflow="report"``, the counts are kept in the result of each load
(a light load overflows its I-queues, a heavy one its queues).
"""

import pytest

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK

#: (policy, options, the heavy load): the per-server policies refuse bounds
#: below what their mean field needs at the load (3 levels up to load 0.6).
ENGINES = [
    ("jiq-original", {}, 0.6),
    ("jiq-threshold", {"z": 1}, 0.6),
    ("jiq", {"service": "hyperexp:4"}, 0.9),
    ("jiq", {"pools": "0.5:2,0.5:1"}, 0.9),
]


def _id(case):
    name, opts, _ = case
    return "-".join([name, *(str(v) for v in opts.values())])


@pytest.mark.slow
@pytest.mark.parametrize("case", ENGINES, ids=[_id(c) for c in ENGINES])
# 8 blocks from empty with bounds cut short on purpose: the overflow is the point, not the drift
@pytest.mark.filterwarnings("ignore::jaxqueue.WarmupWarning")
def test_overflow_fails_with_advice_or_is_reported(case):
    name, opts, heavy = case
    kw = dict(
        replicas=2,
        steps=8 * BLOCK,
        warmup=0,
        init="empty",
        seed=1,
        levels=3,
        iqueue_levels=6,
        **opts,
    )
    loads = [0.1, heavy]
    with pytest.raises(jq.LevelOverflowError, match=r"levels=\S+; rerun with a larger") as err:
        jq.simulate(name, loads, 40, 8, **kw)
    assert "on_overflow='report'" in str(err.value)
    light, loaded = jq.simulate(name, loads, 40, 8, on_overflow="report", **kw)
    assert light.iq_overflow > 0 and light.overflow == 0
    assert loaded.overflow > 0
    for res in (light, loaded):
        diag = res.to_dict()["diagnostics"]
        assert (diag["overflow"], diag["iq_overflow"]) == (res.overflow, res.iq_overflow)
