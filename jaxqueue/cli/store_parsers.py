"""The parsers of the subcommands that work on grid specs and result stores:
``sweep``, ``export`` and ``plot`` (:mod:`jaxqueue.cli.parser` builds the rest)."""

from __future__ import annotations

__all__ = ["sweep_parser", "export_parser", "plot_parser"]


def sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid experiment (a TOML spec) into a result store")
    p.add_argument("spec", help="the spec file (TOML)")
    p.add_argument(
        "--store",
        default=None,
        help="SQLite result store; the same command resumes (default: NAME.sqlite, "
        "with --quick NAME.quick.sqlite, with --gpu NAME.gpu.sqlite, with --cpu "
        "NAME.cpu.sqlite)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        action="store_true",
        help="apply the spec's [quick] overrides (a smaller grid, shorter runs)",
    )
    mode.add_argument(
        "--gpu",
        action="store_true",
        help="apply the spec's [gpu] overrides (many replicas over short windows "
        "from the mean-field start: a lockstep batch that fills a GPU)",
    )
    mode.add_argument(
        "--cpu",
        action="store_true",
        help="apply the spec's [cpu] overrides (paper scale sized for a few hours on two "
        "CPU cores: more replicas over shorter windows from the mean-field start)",
    )
    p.add_argument("--batch-points", type=int, default=None, help="points per batch (default 32)")
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument(
        "--plan",
        action="store_true",
        help="print what would run (points, compiled shapes, batches, replica-steps) "
        "and run nothing",
    )
    p.add_argument("--json", action="store_true", help="with --plan: the plan as JSON on stdout")
    p.add_argument(
        "--accept-code-change",
        action="store_true",
        help="resume a store written by another version of jaxqueue (or of JAX, NumPy, "
        "Python): only where the change cannot alter results; the store records which "
        "batches each version wrote",
    )


def export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a result store (CSV, Parquet, netCDF)")
    p.add_argument("store", help="the SQLite result store")
    p.add_argument(
        "--csv", default=None, help="write one row per point and metric to this CSV ('-': stdout)"
    )
    p.add_argument("--parquet", default=None, help="the same rows as Parquet (extra: parquet)")
    p.add_argument(
        "--netcdf", default=None, help="an xarray Dataset, grid axes as dimensions (extra: xarray)"
    )


def plot_parser(sub) -> None:
    p = sub.add_parser(
        "plot", help="draw the figures of a result store as PNG, PDF or SVG (extra: plot)"
    )
    p.add_argument("store", help="the SQLite result store")
    p.add_argument(
        "--figure", default=None, help="a [[figure]] name of the spec (default: every figure)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="a .png, .pdf or .svg file (one figure), else a folder: one NAME.png per figure",
    )
    p.add_argument("--dpi", type=int, default=120, help="pixels per inch of a PNG (default: 120)")
    p.add_argument(
        "--spec",
        default=None,
        help="read the figures from this spec file instead of the store's copy",
    )
    p.add_argument(
        "--json", action="store_true", help="print the comparison with theory as one JSON object"
    )
