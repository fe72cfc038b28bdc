"""The model a command's flags describe (``--policy`` to ``--arrivals``)."""

from __future__ import annotations

from jaxqueue.core.config import Model

__all__ = ["model_of", "order_option"]


def order_option(args) -> dict:
    """``order=`` only when given (a policy without the option then never sees it)."""
    return {} if args.order is None else {"order": args.order}


def model_of(args, **more):
    """The Model of the command's flags (``--policy`` to ``--arrivals``)."""
    return Model(
        args.policy,
        args.servers,
        args.dispatchers,
        d=args.d,
        z=args.z,
        buffer=args.buffer,
        service=args.service,
        pools=args.pools,
        **order_option(args),
        **more,
    )
