"""How a subcommand joins the command line: one call, its texts from its handler's docstring.

A handler's docstring is its subcommand's documentation: the first line, as a lower-case phrase,
is the help in the command list; the whole text is the description ``NAME --help`` prints. A
handler reports a failure by raising :class:`CliError` (every module of commands imports it
from here, below ``main``, which imports them).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import TypeVar

_ParserT = TypeVar("_ParserT", bound=argparse.ArgumentParser)

Handler = Callable[[argparse.Namespace], int]

PROG = "disagg-transforms"
EXIT_USAGE = 2


class CliError(Exception):
    """A failure reported as one line on stderr with exit code 2."""


def add_command(
    commands: argparse._SubParsersAction[_ParserT], name: str, handler: Handler
) -> _ParserT:
    """Add subcommand ``name``, run by ``handler``; returns its parser for its arguments."""
    text = inspect.cleandoc(handler.__doc__ or "")  # None under python -OO: no texts, still runs
    summary = text.split("\n\n", 1)[0].replace("\n", " ").rstrip(".")
    parser = commands.add_parser(name, help=summary[:1].lower() + summary[1:], description=text)
    parser.set_defaults(handler=handler)
    return parser
