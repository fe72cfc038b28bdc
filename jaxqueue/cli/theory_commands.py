"""The theory commands: ``theory`` (the mean field, the 1/N-refined one at N
servers, or Lu et al.'s approximation with ``--model lu``), ``exact`` (a small
system's stationary solution) and ``policies``.
"""

from __future__ import annotations

import json

import numpy as np

from jaxqueue import theory
from jaxqueue.cli.flags import model_of, policy_options
from jaxqueue.cli.output import emit, print_tail_rest, tail_levels
from jaxqueue.cli.policies_command import cmd_policies
from jaxqueue.core.config import options_from
from jaxqueue.core.versions import versions
from jaxqueue.exact import solve_exact
from jaxqueue.theory.baselines.erlang import erlang_result
from jaxqueue.theory.baselines.lu import lu_result

__all__ = ["cmd_theory", "cmd_exact", "cmd_policies"]


def cmd_theory(args) -> int:
    if getattr(args, "model", "mean-field") == "lu":
        return _lu(args)
    if getattr(args, "model", "mean-field") == "erlang":
        return _erlang(args)
    if args.window is not None and args.arrivals is None:
        raise ValueError("--window averages a periodic regime: give --arrivals (a rate profile)")
    if args.servers is not None and args.arrivals is not None:
        raise ValueError(
            "--servers (the refined mean field) is for Poisson arrivals at a "
            "constant rate: leave out --arrivals"
        )
    if args.servers is not None and (args.service is not None or args.pools is not None):
        raise ValueError(
            "--servers (the refined mean field) is for identical exponential "
            "servers: leave out --service and --pools"
        )
    if args.servers is not None:
        # validated (and refused for a policy without an occupancy mean field) before any work
        if args.z is not None or args.order is not None:
            raise ValueError(
                "--servers (the refined mean field) takes no --z or --order: it "
                "covers the policies with an occupancy mean field"
            )
        rf = theory.refined_mean_field(
            args.policy,
            args.load,
            args.ratio,
            d=args.d,
            buffer=args.buffer,
            n_servers=args.servers,
            levels=args.levels,
        )
    mf = theory.mean_field(
        args.policy,
        args.load,
        args.ratio,
        levels=args.levels,
        window=args.window,
        **options_from(args, theory.mean_field.option_names),
    )
    mf.settings["versions"] = versions()
    if args.servers is None:
        return emit(mf, args)
    if rf.refined is not None:
        rf.refined.settings["versions"] = mf.settings["versions"]
    if args.json:
        out = mf.to_dict()
        extra = rf.to_dict()
        out["refined"], out["correction"] = extra["refined"], extra["correction"]
        out["refined_status"] = {"status": extra["status"], "reason": extra["reason"]}
        print(json.dumps(out))
        return 0
    emit(mf, args)
    _print_refined(rf)
    return 0


def _given(args, *names: str) -> list[str]:
    """The ``--flags`` of those of ``names`` that were given (not None), in that order."""
    return ["--" + name for name in names if getattr(args, name) is not None]


def _lu(args) -> int:
    """``theory --model lu``: Lu et al.'s approximation (Poisson arrivals, exp(1) servers)."""
    given = _given(args, "buffer", "servers", "service", "pools", "arrivals", "window")
    if given:
        raise ValueError(
            f"--model lu is Lu et al.'s approximation of JIQ with infinite buffers, "
            f"Poisson arrivals and exp(1) servers: leave out {', '.join(given)}"
        )
    res = lu_result(
        args.policy,
        args.load,
        args.ratio,
        levels=args.levels,
        **policy_options(args),
    )
    return emit(res, args)


def _erlang(args) -> int:
    """``theory --model erlang``: the M/M/N queue of ``--servers`` N at ``--load``
    (one shared queue: the pooled benchmark, whatever the policy)."""
    given = _given(args, "buffer", "service", "pools", "arrivals", "window")
    if args.servers is None or given:
        raise ValueError(
            "--model erlang is the M/M/N queue of N exp(1) servers sharing one infinite "
            "queue under Poisson arrivals: give --servers"
            + (f" and leave out {', '.join(given)}" if given else "")
        )
    res = erlang_result(args.servers, args.load)
    res.settings["versions"] = versions()
    return emit(res, args)


def _print_refined(rf) -> None:
    print()
    if rf.refined is None:
        print(f"refined mean field at N={rf.n_servers}: {rf.status.name}: {rf.reason}")
        return
    print(
        f"refined mean field at N={rf.n_servers}: mean field + V / N "
        f"(generic fixed point, levels={rf.mean_field.settings['levels']})"
    )
    print(f"  {'metric':24s} {'mean field':>12s} {'V':>12s} {'refined':>12s}")
    for name, value in rf.refined.scalar_metrics().items():
        print(
            f"  {name:24s} {getattr(rf.mean_field, name):12.6f} {rf.correction[name]:12.6f} "
            f"{value:12.6f}"
        )
    for q, value in sorted(rf.refined.response_quantiles.items()):
        name = "response p" + format(100 * q, "g")
        print(
            f"  {name:24s} {rf.mean_field.response_quantiles[q]:12.6f} "
            f"{rf.correction['response_quantiles'][q]:12.6f} {value:12.6f}"
        )
    tail = rf.refined.tail
    upto, shown = tail_levels(np.asarray(rf.mean_field.tail))
    for i in range(1, shown):
        print(
            f"  {'s_' + str(i):24s} {rf.mean_field.tail[i]:12.6f} {rf.correction['tail'][i]:12.6f} "
            f"{tail[i]:12.6f}"
        )
    print_tail_rest(upto, shown)


def cmd_exact(args) -> int:
    res = solve_exact(model_of(args), args.load, queue_bound=args.queue_bound)
    res.settings["versions"] = versions()
    return emit(res, args)
