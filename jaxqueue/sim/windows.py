"""Each load's measured window in a lockstep batch: timeline, batches, warm-up diagnostic.

The replicas of a batch step together, block by block, but each load (each
point of a sweep) keeps a timeline of its own: ``warmup_blocks`` discarded
blocks, then a measured window of ``measure_blocks`` blocks cut into
``batches`` batches. A :class:`Window` follows one load's timeline: which
blocks it measures, where its batch boundaries fall, the batch series its
warm-up diagnostic reads and, under ``warmup="auto"``, how many windows it
has turned into warm-up. A load whose window has ended stops accumulating;
its replicas step on with the batch, but nothing of theirs is read again, so
a load's result does not depend on the loads beside it or on their lengths.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxqueue.core.rng import BLOCK
from jaxqueue.results.warmup import diagnose

__all__ = ["Window"]


@dataclasses.dataclass
class Window:
    """One load's timeline in a batch (blocks counted from the run's start).

    Attributes:
        warmup_blocks: discarded blocks before the first window.
        measure_blocks: blocks of a measured window.
        batches: batches of a window (:attr:`edges`).
        rows: the load's replicas in the batch (a slice of the replica axis).
        auto: ``warmup="auto"``: a window whose diagnostic fails becomes
            warm-up, at most ``max_extensions`` times.
        max_extensions: see ``auto``.
        extensions: windows turned into warm-up so far.
        done: the window has ended (and passed, or may not be extended).
        diagnostic: the warm-up diagnostic of the last window that ended.
        queue: each finished batch's mean queue length per replica, ``(R,)`` each.
        sums: each finished batch's sums (kept for batch means only).
    """

    warmup_blocks: int
    measure_blocks: int
    batches: int
    rows: slice
    auto: bool = False
    max_extensions: int = 0
    extensions: int = 0
    done: bool = False
    diagnostic: dict | None = None
    queue: list = dataclasses.field(default_factory=list)
    sums: list = dataclasses.field(default_factory=list)

    @property
    def edges(self) -> tuple:
        """Block offsets of the batch boundaries within a window, ``0 .. measure_blocks``."""
        b, m = self.batches, self.measure_blocks
        return tuple((i * m) // b for i in range(b + 1))

    @property
    def warmup_end(self) -> int:
        """The block where the current window starts."""
        return self.warmup_blocks + self.extensions * self.measure_blocks

    @property
    def end(self) -> int:
        """The block where the current window ends."""
        return self.warmup_end + self.measure_blocks

    def measuring(self, block: int) -> bool:
        """Whether block ``block`` belongs to the current window."""
        return not self.done and self.warmup_end <= block < self.end

    def next_stop(self, block: int) -> int | None:
        """The first boundary (warm-up end, batch edge) after ``block``; None once done."""
        if self.done:
            return None
        if block < self.warmup_end:
            return self.warmup_end
        return next(self.warmup_end + e for e in self.edges if self.warmup_end + e > block)

    def restart(self) -> None:
        """Forget the current window's batches (a new window starts here)."""
        self.queue, self.sums = [], []

    def finish_batch(self, window: dict, keep_sums: bool) -> None:
        """Record a finished batch from its sums (``tail``, ``steps``, ...)."""
        self.queue.append(window["tail"][:, 1:].sum(axis=1) / window["steps"])
        if keep_sums:
            self.sums.append(window)

    def finish_window(self) -> bool:
        """Judge the window that just ended; True if it becomes warm-up (a new
        window follows), else the load is done."""
        diag = diagnose(np.stack(self.queue, axis=1).mean(axis=0))
        diag.update(auto=self.auto, extensions=self.extensions, warmup=self.warmup_end * BLOCK)
        self.diagnostic = diag
        if self.auto and diag["passed"] is False and self.extensions < self.max_extensions:
            self.extensions += 1
            self.restart()
            return True
        self.done = True
        return False

    def meta(self) -> dict:
        """What a checkpoint records of the window besides its arrays."""
        return {
            "extensions": self.extensions,
            "done": self.done,
            "diagnostic": self.diagnostic,
            "batches_done": len(self.queue),
        }
