"""Progress of long runs (a run's blocks, a sweep's points), on the ``jaxqueue``
logger (INFO) and never on stdout. A first chunk or batch compiles, so rates and
the time left leave it out. With the ``progress`` extra (tqdm) and stderr a
terminal, a bar replaces the lines; a silenced logger silences the bar too.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = [
    "LOGGER",
    "Progress",
    "PointProgress",
    "log",
    "enabled",
    "show_progress",
    "stderr_handler",
    "tqdm_bar",
    "duration",
]

#: The package's logger: the command line gives it a stderr handler at INFO; a
#: Python program can silence it (``setLevel(logging.WARNING)``) or redirect it.
LOGGER = logging.getLogger("jaxqueue")

PREFIX = "[jaxqueue] "


def stderr_handler(stream=None) -> logging.Handler:
    """A handler writing ``[jaxqueue] MESSAGE`` lines to ``stream`` (default: stderr)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
    return handler


def log(message: str, level: int = logging.INFO) -> None:
    """``message`` at ``level`` (INFO) on the ``jaxqueue`` logger; on stderr where no
    handler is set up anywhere (a Python program that configured no logging)."""
    if LOGGER.hasHandlers():
        LOGGER.log(level, message)
    elif LOGGER.isEnabledFor(level):
        print(PREFIX + message, file=sys.stderr, flush=True)


def enabled() -> bool:
    """Whether progress shows: the logger passes INFO, or its level is unset (a run
    asked for progress then sets INFO, see :class:`Progress`)."""
    return LOGGER.level == logging.NOTSET or LOGGER.isEnabledFor(logging.INFO)


def show_progress() -> None:
    """Asked for progress: the logger at INFO unless its level is set otherwise."""
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)


def duration(seconds: float) -> str:
    """``"2.5 s"``, ``"45 s"``, ``"3 min 20 s"``, ``"2 h 05 min"``."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def tqdm_bar(total: int, initial: int, desc: str, unit: str, stream=None, bar_format=None):
    """A tqdm bar on ``stream`` (default stderr) where the ``progress`` extra is installed,
    the stream is a terminal and progress is not silenced (:func:`enabled`); else None."""
    stream = sys.stderr if stream is None else stream
    if not enabled() or not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        from tqdm.auto import tqdm  # the optional progress extra: imported where used
    except ModuleNotFoundError:
        return None
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=stream,
        dynamic_ncols=True,
        bar_format=bar_format,
    )


class Progress:
    """A run's progress in blocks: a line at most every ``every`` seconds (and at the
    end) with the percentage, the rate and the time left, or a tqdm bar.

    :meth:`start` says the first chunk compiles; the rate and the time left count
    from the end of the first :meth:`update` (the compiling chunk) on.
    """

    def __init__(
        self, name: str, per_block: float, *, every: float = 2.0, bar=None, clock=time.perf_counter
    ):
        self.name, self.per_block, self.every, self.clock = name, per_block, every, clock
        self.bar = bar
        self.since = None  # (clock, block) at the end of the compiling chunk
        self.last = -float("inf")  # clock of the last line
        show_progress()

    def start(self, block: int, end: int) -> None:
        """Before the first chunk: it compiles."""
        self.t0 = self.clock()
        if self.bar is None:
            log(f"{self.name}: compiling, then the first chunk from block {block} of {end}")

    def update(self, block: int, end: int, phase: str) -> None:
        """After a chunk: the run is at ``block`` of ``end``."""
        now = self.clock()
        first = self.since is None
        if first:
            self.since = (now, block)
        rate = self._rate(now, block)  # blocks per second, None until measured
        if self.bar is not None:
            self._bar(block, end, phase, rate)
            return
        if not (first or block >= end or now - self.last >= self.every):
            return
        self.last = now
        head = f"{self.name} {phase}: block {block}/{end} ({100 * block / max(end, 1):.0f}%)"
        if rate is None:
            log(f"{head}, compiled and ran the first chunk in {now - self.t0:.1f} s")
        elif block >= end:
            log(
                f"{head}, {rate * self.per_block:.3g} replica-steps/s, done in {duration(now - self.t0)}"
            )
        else:
            log(
                f"{head}, {rate * self.per_block:.3g} replica-steps/s, "
                f"about {duration((end - block) / rate)} left"
            )

    def _rate(self, now: float, block: int) -> float | None:
        t, b = self.since
        return (block - b) / (now - t) if block > b and now > t else None

    def _bar(self, block: int, end: int, phase: str, rate) -> None:
        self.bar.total = end
        self.bar.set_description_str(f"{self.name} {phase}", refresh=False)
        if rate is not None:
            self.bar.set_postfix_str(f"{rate * self.per_block:.3g} replica-steps/s", refresh=False)
        self.bar.update(block - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class PointProgress:
    """A sweep's progress in points: a line a batch (points done of the total, the
    replica-steps per second and the time left), or a tqdm bar of points.

    A batch that compiled (the first of its shape) is left out of the rate. The time
    left is the replica-steps still to run (``steps_left``, the plan's) at that rate:
    points of a sweep differ in size by orders of magnitude, so counting them misled
    (a sweep said "about 1.0 s left" and took a minute more). Without ``steps_left``
    it counts the points still to run at the pace of those run.
    """

    def __init__(
        self,
        name: str,
        total: int,
        done: int,
        *,
        steps_left: float | None = None,
        bar=None,
        clock=time.perf_counter,
    ):
        self.name, self.total, self.done, self.clock = name, total, done, clock
        self.steps_left = steps_left
        self.bar = bar
        self.t0 = clock()
        self.points, self.steps, self.seconds = 0, 0.0, 0.0  # batches that did not compile
        show_progress()

    def compiling(self, what: str) -> None:
        """Before a batch that compiles (``what``: the shape, in words)."""
        if self.bar is None:
            log(f"{self.name}: compiling {what}")

    def update(self, n: int, replica_steps: float, seconds: float, compiled: bool) -> None:
        """After a batch of ``n`` points: ``replica_steps`` in ``seconds``; ``compiled``:
        the batch compiled its shape first."""
        self.done += n
        if self.steps_left is not None:
            self.steps_left = max(self.steps_left - replica_steps, 0.0)
        if not compiled:
            self.points += n
            self.steps += replica_steps
            self.seconds += seconds
        rate = self.steps / self.seconds if self.seconds > 0 else None
        left = None
        if rate is not None and self.steps_left is not None:
            left = self.steps_left / rate
        elif rate is not None:
            left = (self.total - self.done) * self.seconds / self.points
        if self.bar is not None:  # (its own estimate, of points and with compiling, is not shown)
            if rate is not None:
                self.bar.set_postfix_str(
                    f"{rate:.3g} replica-steps/s, about {duration(left)} left", refresh=False
                )
            self.bar.update(n)
            return
        head = (
            f"{self.name}: {self.done}/{self.total} points "
            f"({100 * self.done / max(self.total, 1):.0f}%)"
        )
        if self.done >= self.total:
            speed = "" if rate is None else f", {rate:.3g} replica-steps/s"
            log(f"{head}{speed}, done in {duration(self.clock() - self.t0)}")
        elif rate is None:
            log(f"{head}, compiled and ran the batch in {seconds:.1f} s")
        else:
            log(f"{head}, {rate:.3g} replica-steps/s, about {duration(left)} left")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
