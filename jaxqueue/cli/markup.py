"""Plain text for a terminal: reStructuredText markup of docstrings and help texts
removed (double backquotes, roles such as :mod:`x`, single backquotes).

Docstrings stay in reStructuredText for the API documentation; what the command
line prints (its help and the policies' summaries) passes through :func:`plain`.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["plain", "PlainHelpFormatter"]

#: ``:role:`~a.b.c``` (the tilde shows the last name only), ``:role:`text```.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`")
#: ``literal``, then `interpreted text`.
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_INTERPRETED = re.compile(r"`([^`]+)`")


def _role(match: re.Match) -> str:
    text = match.group(2)
    return text.rsplit(".", 1)[-1] if match.group(1) else text


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: ``:mod:`jaxqueue.results``` is
    ``jaxqueue.results``, ``:func:`~a.b``` is ``b``, a literal or interpreted text
    its content."""
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"\1", text)
    return _INTERPRETED.sub(r"\1", text)


class PlainHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, printing descriptions and flag help as :func:`plain` text."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action) -> str:
        return plain(super()._expand_help(action))
