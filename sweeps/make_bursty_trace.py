"""Write sweeps/data/bursty_trace.csv: a synthetic bursty trace of task arrivals.

    python sweeps/make_bursty_trace.py            # numpy only, a fixed seed

A cluster's task submissions come in bursts: a job submits many tasks at
once, and busy hours follow quiet ones. This trace imitates that with a
two-state Markov-modulated Poisson process (MMPP-2). In the "high" state
tasks arrive at 3 times the mean rate and in the "low" state at 0.5 times
it; the chain spends 20% of the time in the high state, in spells of mean
0.5 time units, and 80% in the low state, in spells of mean 2 (so 60% of
the tasks arrive in the high state). The mean rate is 880 tasks per time
unit, load 0.88 on N = 1000 servers, and the time unit is the mean service
time: each task's service time (the ``service`` column) is exponential with
mean 1. jaxqueue rescales the arrival times so that the trace's mean rate is
``load * N`` at each point, and its servers keep their exp(1) law (the
``service`` column is recorded, not replayed); after its last arrival the
trace starts over.

What the process yields, and this file (the script prints the file's values):

* interarrival times: squared coefficient of variation (SCV) 2.33 for the
  process, 2.12 in the file (1 for Poisson arrivals). The spells are long
  against the gaps, so the gaps are nearly a mixture of exponentials, of
  rates 3 and 0.5 times the mean with weights 0.6 and 0.4:
  SCV = 2 * (0.6 / 3**2 + 0.4 / 0.5**2) - 1 = 2.33;
* index of dispersion of counts, Var(N(w)) / E[N(w)] in windows of w time
  units (1 for Poisson arrivals): 1 + (I - 1) (1 - (1 - exp(-a w)) / (a w))
  with a = 1 / 0.5 + 1 / 2 = 2.5 and, for long windows,
  I = 1 + 2 * 0.2 * 0.8 * (3 - 0.5)**2 * 880 / 2.5 = 705; 447 for w = 1
  (421 in the file).

The file has 40,000 rows (50 time units, some 20 high spells; with so few
spells its mean rate is 799 rather than 880, which the rescaling absorbs)
and a header ``time,service``; times are written to 1e-7 (5 pairs of equal
consecutive times) and service times to 6 significant digits: 0.78 MB.
numpy 2.4 writes it byte for byte; numpy's generators may change their
streams in other versions.
"""

from pathlib import Path

import numpy as np

SEED = 20171001
ROWS = 40_000
MEAN_RATE = 880.0  # tasks per time unit: load 0.88 on 1000 servers
HIGH, LOW = 3.0, 0.5  # rate in each state over the mean rate
SPELL_HIGH, SPELL_LOW = 0.5, 2.0  # mean sojourn in each state, in time units
OUT = Path(__file__).resolve().parent / "data" / "bursty_trace.csv"


def mmpp2(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Arrival times of the MMPP-2, started in its stationary law at time 0."""
    times, t = [], 0.0
    high = rng.random() < SPELL_HIGH / (SPELL_HIGH + SPELL_LOW)
    while sum(map(len, times)) < rows:
        spell = rng.exponential(SPELL_HIGH if high else SPELL_LOW)
        rate = MEAN_RATE * (HIGH if high else LOW)
        count = rng.poisson(rate * spell)  # given the count, the times are uniform in the spell
        times.append(t + np.sort(rng.uniform(0.0, spell, count)))
        t, high = t + spell, not high
    return np.concatenate(times)[:rows]


def dispersion(times: np.ndarray, window: float) -> float:
    """Var / mean of the arrivals counted in consecutive windows of ``window`` time units."""
    counts = np.bincount((times // window).astype(np.int64))[:-1]  # the last window is cut short
    return float(counts.var() / counts.mean())


def main() -> None:
    rng = np.random.default_rng(SEED)
    times = np.round(mmpp2(rng, ROWS), 7)
    service = rng.exponential(1.0, ROWS)
    OUT.parent.mkdir(exist_ok=True)
    with open(OUT, "w", newline="\n") as f:
        f.write("time,service\n")
        f.writelines(f"{t:.7f},{s:.6g}\n" for t, s in zip(times, service))
    gaps = np.diff(times)
    print(
        f"wrote {OUT.name}: {ROWS} arrivals over {times[-1]:.1f} time units "
        f"(mean rate {ROWS / times[-1]:.0f}), {OUT.stat().st_size / 1e6:.2f} MB"
    )
    print(
        f"interarrival SCV {gaps.var() / gaps.mean() ** 2:.2f}; index of dispersion of "
        f"counts {dispersion(times, 1.0):.0f} (windows of 1), {dispersion(times, 5.0):.0f} "
        f"(windows of 5); mean service time {service.mean():.3f}; "
        f"{int(np.sum(gaps == 0))} equal consecutive times"
    )


if __name__ == "__main__":
    main()
