"""The model a command's flags describe (``--policy`` to ``--arrivals``)."""

from __future__ import annotations

from jaxqueue.core.config import Model, options_from

__all__ = ["model_of", "policy_options"]


def policy_options(args) -> dict:
    """The policy's options given (``--d``, ``--z``, ``--order``; a policy without
    one then never sees it)."""
    return options_from(args, ("d", "z", "order"))


def model_of(args, **more):
    """The Model of the command's flags (``--policy`` to ``--pools``)."""
    options = options_from(args, ("buffer", "service", "pools"))
    return Model(
        args.policy, args.servers, args.dispatchers, **policy_options(args), **options, **more
    )
