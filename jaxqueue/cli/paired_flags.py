"""The ``compare --paired`` flag (its run: :mod:`jaxqueue.cli.paired_command`)."""

from __future__ import annotations

__all__ = ["add_paired"]


def add_paired(p) -> None:
    p.add_argument(
        "--paired",
        action="store_true",
        help="instead of the mean field: each metric's difference from the first point on "
        "common random numbers, with the paired 95%% interval and the correlation achieved "
        "(one policy: its loads from the first; several: at each load, the policies from "
        "the first); docs/crn.md",
    )
