"""Exact host totals of a run's measurements.

The devices return each chunk's sums in 32-bit integers
(:class:`~jaxqueue.sim.state.Stats`); :class:`Totals` adds them on the host in
64-bit integers, so nothing wraps or drifts however long a run is:

* the time sum of the tail, ``sum_t tail_t``, is kept as ``q * N + r`` with
  ``0 <= r < N`` (``tail_q``, ``tail_r``), so ``sum_t tail_t / N = q + r / N``
  is exact and ``q`` grows by at most one per step and level (``2**63`` steps);
  the I-queue tail likewise, over ``M``;
* the counters (arrivals, probes, seen-counts, steps, ...) are int64;
* user metrics' sums (:mod:`jaxqueue.core.user_metrics`) are float64 (``user``,
  ``(2, K)`` a replica: over time, over accepted arrivals), each chunk's float32
  compensated sums added (docs/metrics.md, "Rounding").

A window (the measured part, or one batch of it) is the difference of two
totals; its time sums come out as float64 ``(q1 - q0) + (r1 - r0) / N``.
"""

from __future__ import annotations

import numpy as np

from jaxqueue.core.rng import BLOCK
from jaxqueue.sim.state import COUNTERS

__all__ = ["Totals", "TIME_SUMS", "COUNTS", "CLASS_COUNTS"]

#: The time sums: name -> the Stats prefix of its chunk sums.
TIME_SUMS = ("tail", "iq")

#: The integer counts (per replica), besides the time sums.
COUNTS = ("seen",) + COUNTERS + ("steps",)

#: With server classes: ``(levels + 1, C)`` counts of the level and class
#: accepted arrivals found, and service candidates drew (a time-uniform sample).
CLASS_COUNTS = ("seen_class", "sampled_class")


class Totals:
    """Per-replica sums of a run's measurements since the last reset (host, exact).

    Attributes:
        arrays: ``tail_q``, ``tail_r``, ``iq_q``, ``iq_r`` and the counts
            (:data:`COUNTS`, and :data:`CLASS_COUNTS` with server classes),
            int64 with a leading replica axis.
        n_servers, n_dispatchers: the divisors of the tail and I-queue time sums:
            ints, or int64 ``(R,)`` arrays, each replica's (a batch of several sizes).
        scale: what a chunk's 64-bit time sums are multiplied by
            (:func:`jaxqueue.sim.blocks.time_sum_scale`: ``BLOCK``, or 1 for a trace).
    """

    def __init__(self, arrays: dict, n_servers, n_dispatchers, scale: int = BLOCK):
        self.arrays = arrays
        self.n_servers, self.n_dispatchers = (
            int(x) if np.ndim(x) == 0 else np.asarray(x, np.int64)
            for x in (n_servers, n_dispatchers)
        )
        self.scale = int(scale)

    def _divisor(self, name: str, rows: slice = slice(None)):
        """The divisor of time sum ``name`` (``tail``: N, ``iq``: M) for the
        replicas ``rows``, shaped to divide their ``(R, levels)`` sums."""
        div = self.n_servers if name == "tail" else self.n_dispatchers
        return div if isinstance(div, int) else div[rows][:, None]

    @classmethod
    def zeros(
        cls,
        replicas: int,
        levels: int,
        iq_width: int,
        n_servers,
        n_dispatchers,
        scale: int = BLOCK,
        n_classes: int = 0,
        n_user: int = 0,
    ) -> Totals:
        """Zero totals for ``replicas`` replicas tracking ``levels + 1`` tail
        entries (and, with ``n_classes`` server classes, ``seen_class`` and
        ``sampled_class``: ``(levels + 1, n_classes)`` counts of the level and
        class accepted arrivals found, and service candidates drew,
        :class:`~jaxqueue.sim.state.Stats`), and with ``n_user`` user metrics
        their float64 sums ``user``."""
        z = lambda *shape: np.zeros((replicas,) + shape, np.int64)  # noqa: E731
        arrays = {
            "tail_q": z(levels + 1),
            "tail_r": z(levels + 1),
            "iq_q": z(iq_width),
            "iq_r": z(iq_width),
            "seen": z(levels + 1),
        }
        arrays.update({name: z() for name in COUNTERS + ("steps",)})
        if n_classes:
            arrays["seen_class"] = z(levels + 1, n_classes)
            arrays["sampled_class"] = z(levels + 1, n_classes)
        if n_user:
            arrays["user"] = np.zeros((replicas, 2, n_user), np.float64)
        return cls(arrays, n_servers, n_dispatchers, scale)

    def _counts(self) -> tuple:
        user = ("user",) if "user" in self.arrays else ()
        return COUNTS + (CLASS_COUNTS if "seen_class" in self.arrays else ()) + user

    def copy(self) -> Totals:
        """An independent copy."""
        return Totals(
            {k: v.copy() for k, v in self.arrays.items()},
            self.n_servers,
            self.n_dispatchers,
            self.scale,
        )

    def add(self, chunk: dict, rows: slice = slice(None)) -> None:
        """Add one chunk's :class:`~jaxqueue.sim.state.Stats` (numpy, leading
        replica axis) to the replicas ``rows`` (the chunk holds those rows only)."""
        a = self.arrays
        for name in TIME_SUMS:
            div = self._divisor(name, rows)
            base = (chunk[f"{name}_hi"].astype(np.int64) << 32) | chunk[f"{name}_lo"].astype(
                np.int64
            )
            exact = self.scale * base + chunk[f"{name}_delta"].astype(np.int64)
            r = a[f"{name}_r"][rows] + exact
            a[f"{name}_q"][rows] += r // div
            a[f"{name}_r"][rows] = r % div
        for name in COUNTS:
            a[name][rows] += np.asarray(chunk[name], np.int64).reshape(a[name][rows].shape)
        if "seen_class" in a:  # by_class: the arrivals' finds, then the candidates' draws
            r, levels, n_classes = a["seen_class"][rows].shape
            by_class = np.asarray(chunk["by_class"], np.int64).reshape(r, 2, levels, n_classes)
            for j, name in enumerate(CLASS_COUNTS):
                a[name][rows] += by_class[:, j]
        if "user" in a:  # float32 compensated sums: their value is the sum less the compensation
            comp = np.asarray(chunk["user_comp"], np.float64)
            a["user"][rows] += np.asarray(chunk["user"], np.float64) - comp

    def reset(self, rows: slice = slice(None)) -> None:
        """Zero the replicas ``rows``."""
        for v in self.arrays.values():
            v[rows] = 0

    def assign(self, other: Totals, rows: slice = slice(None)) -> None:
        """Copy the replicas ``rows`` of ``other`` into these."""
        for k, v in self.arrays.items():
            v[rows] = other.arrays[k][rows]

    def sums(self, since: Totals | None = None, rows: slice = slice(None)) -> dict:
        """The window's sums since ``since`` (default: since the reset), of the replicas ``rows``.

        Returns:
            ``tail`` and ``iq``: float64 ``sum_t tail_t / N`` and ``sum_t
            iq_tail_t / M``; the counts (:data:`COUNTS`, and
            :data:`CLASS_COUNTS` with server classes) as int64; ``user`` (float64)
            with user metrics.
        """
        a = {k: v[rows] for k, v in self.arrays.items()}
        b = {k: v[rows] for k, v in since.arrays.items()} if since is not None else None
        out = {}
        for name in TIME_SUMS:
            div = self._divisor(name, rows)
            q, r = a[f"{name}_q"], a[f"{name}_r"]
            if b is not None:
                q, r = q - b[f"{name}_q"], r - b[f"{name}_r"]
            out[name] = q.astype(np.float64) + r.astype(np.float64) / div
        for name in self._counts():
            out[name] = a[name] - b[name] if b is not None else a[name].copy()
        return out
