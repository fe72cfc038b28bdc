"""The command line's argument parser: one builder per subcommand.

It imports no simulator or theory (only the metric names of the result schema), so
``--help`` and a usage error answer without them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from jaxqueue.cli.markup import PlainHelpFormatter
from jaxqueue.cli.metric_flags import add_compare_metric, add_user_metrics
from jaxqueue.cli.paired_flags import add_paired
from jaxqueue.cli.store_parsers import export_parser, plot_parser, sweep_parser
from jaxqueue.core.config import COMPARE_TIME, COMPARE_WARMUP_TIME, OPTION_FIELDS

__all__ = ["build_parser", "DESCRIPTION", "package_version", "add_option_flags"]


def add_option_flags(p, *names: str, **helps: str) -> None:
    """``--NAME`` for each option field in ``names`` (``levels`` as ``--levels``,
    ``iqueue_levels`` as ``--iqueue-levels``), with the field's default and the
    type, choices and help declared with it (:mod:`jaxqueue.core.config`);
    ``helps`` word a command's own help for some of them."""
    for name in names:
        field = OPTION_FIELDS[name]
        spec = dict(field.metadata["flag"])
        spec["help"] = helps.get(name, spec["help"])
        p.add_argument("--" + name.replace("_", "-"), default=field.default, **spec)


def _flag_help(name: str) -> str:
    """The help of an option's flag as declared with its field."""
    return OPTION_FIELDS[name].metadata["flag"]["help"]


#: The parser's description (``python -m jaxqueue --help``), plain text: it is printed.
DESCRIPTION = """Load balancing by simulation, mean-field theory and exact solution: \
python -m jaxqueue COMMAND --help for the flags of a command.

--json prints one JSON object alone on stdout; progress and logs go to stderr.
simulate, theory and exact print the same keys (the result schema,
jaxqueue.results.schema), so their outputs can be compared field by field.
"""


class _Parser(argparse.ArgumentParser):
    """The parser of the command line and of each subcommand (``add_subparsers`` makes
    its subparsers of this class): flags spelled out in full (no prefix of a flag
    stands for it: ``compare --warmup`` is not ``--warmup-time``), help printed as
    plain text, and an unknown flag named before the required ones that are missing."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        if message.startswith("the following arguments are required"):
            unknown = self._unknown_flags()
            if unknown:  # the typo, not what it left out, is the mistake to name
                message = f"unrecognized arguments: {' '.join(unknown)}"
        super().error(message)

    def _unknown_flags(self) -> list[str]:
        """The ``--flags`` given (up to ``--``) that this parser does not have."""
        given = getattr(self, "_given", [])
        given = given[: given.index("--")] if "--" in given else given
        return [
            a
            for a in given
            if a.startswith("--") and a.partition("=")[0] not in self._option_string_actions
        ]


def package_version() -> str:
    """The installed package's version, read without importing JAX (from the source
    tree's :mod:`jaxqueue.core.versions` where the package is not installed)."""
    try:
        return importlib.metadata.version("jaxqueue")
    except importlib.metadata.PackageNotFoundError:
        return importlib.import_module("jaxqueue.core.versions").__version__


class _Version(argparse.Action):
    """``--version``: ``jaxqueue X.Y.Z`` on stdout, exit status 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"jaxqueue {package_version()}")
        parser.exit()


def _loads(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs comma-separated numbers, got {text!r}") from None


class _Loads(argparse.Action):
    """``--load``: one load or many, comma-separated or the flag repeated (the
    values add up; a default is replaced). ``--loads``, its earlier spelling,
    says so on stderr and does the same."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == "--loads":
            print("warning: --loads is deprecated: use --load (one or many)", file=sys.stderr)
        have = getattr(namespace, self.dest, None)
        given = list(have) if isinstance(have, list) else []  # a default is a tuple
        setattr(namespace, self.dest, given + list(values))


def _add_loads(p, default=None, help_default: str = "") -> None:
    """``--load`` (one or many loads, into ``loads``) and its deprecated spelling
    ``--loads`` (not in the help); ``p`` a parser or a group."""
    for flag, text in (
        ("--load", "lambda: one load, or several comma-separated or with the flag repeated"),
        ("--loads", argparse.SUPPRESS),
    ):
        p.add_argument(
            flag,
            dest="loads",
            type=_loads,
            action=_Loads,
            default=default,
            metavar="LOAD[,LOAD...]",
            help=text if text is argparse.SUPPRESS else text + help_default,
        )


def _warmup(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--warmup needs a number of steps or 'auto', got {text!r}"
        ) from None


def _window(text: str) -> tuple:
    try:
        start, length = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START,LENGTH (two numbers), got {text!r}"
        ) from None
    return (start, length)


def _add_policy(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument(
            "--policies",
            default="jiq,jiq-pod,pod",
            help="comma-separated policy names, each optionally with its own options "
            "as NAME:OPTION=VALUE[:...], e.g. jiq-pod:d=3,jiq-threshold:z=2 "
            "(default: jiq,jiq-pod,pod)",
        )
    else:
        p.add_argument("--policy", required=True, help="policy name (see the policies command)")
    shared = (
        " (to every listed policy that takes it, but those given their own options)" if many else ""
    )
    add_option_flags(p, "d", "z", d=_flag_help("d") + shared, z=_flag_help("z") + shared)
    if not many:
        add_option_flags(p, "order")


_JSON_HELP = "print one JSON object on stdout instead of a table"


def _sized_parser(sub, name: str, help: str, servers: str = "", dispatchers: bool = True):
    """The parser of subcommand ``name``: ``--policy`` and its options, a required
    ``--servers N`` (``servers`` ends its help) and, where ``dispatchers``,
    ``--dispatchers M`` (default 1)."""
    p = sub.add_parser(name, help=help)
    _add_policy(p)
    servers = "n_servers N, the number of servers" + servers
    p.add_argument("--servers", type=int, required=True, help=servers)
    if dispatchers:
        help = "n_dispatchers M, the number of dispatchers (default 1)"
        p.add_argument("--dispatchers", type=int, default=1, help=help)
    return p


def _add_run(p: argparse.ArgumentParser) -> None:
    """The options of a run: the servers' model, its length, and how it runs."""
    _add_servers(p)
    _add_length(p)
    _add_run_options(p)


def _add_servers(p: argparse.ArgumentParser, arrivals_help: str | None = None) -> None:
    """``--buffer``, ``--service``, ``--pools`` and ``--arrivals`` (whose help a
    command may word for itself)."""
    helps = {} if arrivals_help is None else {"arrivals": arrivals_help}
    add_option_flags(p, "buffer", "service", "pools", "arrivals", **helps)


def _add_length(p: argparse.ArgumentParser) -> None:
    add_option_flags(p, "replicas")
    _add_window(p)


def _add_window(
    p: argparse.ArgumentParser,
    steps_default: str = " (default 1000000)",
    time_default: str = "",
    warmup_default: str = " (default: 100 time units)",
    warmup_time_help: str = "warm-up time units instead of --warmup",
    auto_help: str = "extend it",
) -> None:
    """The measured window (``--steps`` or ``--time``) and the warm-up (``--warmup``,
    which may be ``auto``, or ``--warmup-time``) of a run, each pair exclusive; every
    default None (the command's own default is applied where none is given). The
    ``*_default`` texts end their help, for a command whose defaults are its own."""
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"measured uniformized steps per replica{steps_default}",
    )
    length.add_argument(
        "--time",
        type=float,
        default=None,
        help="measured time units per replica instead of --steps (steps = "
        "time x N x the step rate per server at the load, rounded up to "
        "whole blocks of 256 steps; a warning when that simulates more "
        f"than 10%% beyond --time){time_default}",
    )
    warm = p.add_mutually_exclusive_group()
    warm.add_argument(
        "--warmup",
        type=_warmup,
        default=None,
        help=f"discarded warm-up steps per replica{warmup_default}, or "
        f"'auto': {auto_help} while the warm-up diagnostic fails",
    )
    warm.add_argument("--warmup-time", type=float, default=None, help=warmup_time_help)


def _add_dispatchers(p, dispatchers_help: str, ratio_help: str, ratio_default=None) -> None:
    """``--dispatchers M`` and ``--ratio R`` (``R = N / M``), two spellings of one
    setting, exclusive: :func:`jaxqueue.cli.checks.prepare` resolves the one the
    command uses from the other (``--dispatchers``, where given, over a default ratio)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--dispatchers",
        type=int,
        default=None,
        metavar="M",
        help=f"n_dispatchers M, the number of dispatchers{dispatchers_help}",
    )
    group.add_argument(
        "--ratio",
        type=float,
        default=ratio_default,
        metavar="R",
        help=f"r = N / M, servers per dispatcher{ratio_help}",
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    add_option_flags(p, "seed", "levels", "iqueue_levels", "init", "interval", "batches")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="save the run to this file and resume from it when it exists and "
        "matches (a run stopped part-way resumes where it was saved)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=300.0,
        help="seconds between checkpoints (default 300; 0: every chunk)",
    )
    add_option_flags(p, "backend")
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    ap = _Parser(prog="python -m jaxqueue", description=DESCRIPTION)
    ap.add_argument("--version", action=_Version, help="print the version and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    _simulate_parser(sub)
    _transient_parser(sub)
    _theory_parser(sub)
    _exact_parser(sub)
    _compare_parser(sub)
    sweep_parser(sub)
    export_parser(sub)
    plot_parser(sub)
    _policies_parser(sub)
    return ap


def _simulate_parser(sub) -> None:
    p = _sized_parser(
        sub,
        "simulate",
        "simulate one policy at one load or several",
        " (up to 2**31 - 1; with a trace --arrivals up to 2**23 - 1)",
        dispatchers=False,
    )
    _add_dispatchers(
        p, " (default 1)", ": another spelling of --dispatchers (M = N / R, a whole number)"
    )
    load = p.add_mutually_exclusive_group(required=True)
    _add_loads(load, help_default=" (a table each)")
    load.add_argument(
        "--alpha", type=float, help="heavy traffic: lambda = 1 - N**(-alpha) (Liu and Ying)"
    )
    load.add_argument(
        "--beta", type=float, help="Halfin-Whitt: lambda = 1 - beta / sqrt(N) (Mukherjee et al.)"
    )
    _add_run(p)
    add_user_metrics(p, "; it may read --alpha or --beta as alpha, beta")
    p.add_argument(
        "--sensitivity",
        choices=("load", "alpha", "beta", "speed", "share", "scv", "amplitude"),
        help="print d(metric)/d(this parameter) by common random numbers instead (docs/crn.md; "
        "speed and share are the first pool's)",
    )


def _transient_parser(sub) -> None:
    p = _sized_parser(
        sub, "transient", "ensemble estimates at given times beside the mean-field ODE"
    )
    p.add_argument(
        "--load", type=float, required=True, help="lambda from time 0 on (one load: a transient)"
    )
    p.add_argument(
        "--start-load",
        type=float,
        default=None,
        help="a load step: run --warmup-time at this load first (from its mean field)",
    )
    p.add_argument(
        "--warmup-time", type=float, default=100.0, help="time units at --start-load (default 100)"
    )
    p.add_argument(
        "--times",
        type=_loads,
        default=[0.5, 1, 2, 4, 8, 16, 32],
        help="comma-separated times (default 0.5,1,2,4,8,16,32)",
    )
    replicas = _flag_help("replicas").replace("(per load; ", "(>= 2; ")
    add_option_flags(p, "replicas", "seed", "buffer", "service", "pools", replicas=replicas)
    p.add_argument("--plot", default=None, help="write a PNG of simulation and ODE (extra: plot)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)


def _theory_parser(sub) -> None:
    p = sub.add_parser("theory", help="mean-field prediction for one policy")
    _add_policy(p)
    p.add_argument("--load", type=float, required=True, help="lambda")
    _add_dispatchers(
        p,
        ": another spelling of --ratio, r = N / M with --servers N (1: one dispatcher, "
        "the default)",
        " (JIQ family; default: one dispatcher)",
    )
    levels = "largest queue length of the printed tail (default: automatic)"
    add_option_flags(p, "buffer", "levels", levels=levels)
    p.add_argument(
        "--servers",
        type=int,
        default=None,
        help="n_servers N: add the 1/N-refined mean field at N servers (and its 1/N coefficients)",
    )
    arrivals = (
        "a periodic rate profile (CSV time,rate): averages over the mean field's "
        "periodic regime; --load is the time-mean load"
    )
    add_option_flags(p, "service", "pools", "arrivals", arrivals=arrivals)
    p.add_argument(
        "--window",
        type=_window,
        default=None,
        help="START,LENGTH: with --arrivals, average over this window of the "
        "periodic regime (time 0 = the profile's start) instead of one period",
    )
    p.add_argument(
        "--model",
        choices=("mean-field", "lu", "erlang"),
        default="mean-field",
        help="mean-field (default), or lu: Lu et al.'s approximation of JIQ, reconstructed "
        "from their stated assumptions (needs --ratio), "
        "or erlang: the M/M/N queue of --servers N (Erlang C), the pooled-queue benchmark",
    )
    p.add_argument("--json", action="store_true", help=_JSON_HELP)


def _exact_parser(sub) -> None:
    p = _sized_parser(
        sub,
        "exact",
        "exact stationary solution of a small system",
        " (small: the state space grows fast)",
    )
    p.add_argument("--load", type=float, required=True, help="lambda")
    add_option_flags(p, "buffer")
    p.add_argument(
        "--queue-bound",
        type=int,
        default=None,
        help="truncation of infinite buffers (default: automatic, mass below 1e-9)",
    )
    add_option_flags(p, "service", "pools")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)


def _compare_parser(sub) -> None:
    p = sub.add_parser("compare", help="simulation beside mean-field theory over loads")
    _add_policy(p, many=True)
    p.add_argument(
        "--servers",
        type=int,
        default=1000,
        help="n_servers N, the number of servers (default 1000)",
    )
    _add_dispatchers(p, ": another spelling of --ratio (r = N / M)", " (default 10)", 10.0)
    _add_loads(p, (0.5, 0.7, 0.9, 0.95, 0.98), " (default 0.5,0.7,0.9,0.95,0.98)")
    add_option_flags(p, "replicas")
    _add_window(
        p,
        steps_default=f" instead of --time (default: --time {COMPARE_TIME:g})",
        time_default=f" (default {COMPARE_TIME:g}, at the largest load)",
        warmup_default=f" instead of --warmup-time (default: --warmup-time {COMPARE_WARMUP_TIME:g})",
        warmup_time_help="warm-up time units, from the mean-field state where the policy has one "
        f"(default {COMPARE_WARMUP_TIME:g})",
        auto_help="100 time units, extended",
    )
    add_option_flags(p, "seed")
    _add_servers(
        p,
        "time-varying arrivals (a CSV rate profile time,rate; a trace or an MMPP "
        "JSON file, simulated without a mean field), scaled to mean load --load; "
        "each row's mean field is the periodic regime averaged over that row's "
        "measured window",
    )
    add_compare_metric(p)
    add_paired(p)
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)


def _policies_parser(sub) -> None:
    p = sub.add_parser(
        "policies", help="list the policies, their options (defaults) and mean fields"
    )
    p.add_argument("--json", action="store_true", help="the list as one JSON object on stdout")
