"""``python -m batching run|compare|sweep|capacity|calibrate|report|specs``: the parser and the entry point.

Each command is a module of this package with ``add_parser(subparsers)``; what they share (flags, validators,
``build_scenario``, output checks, error handling) is in ``args.py``. Nothing here is imported back by them, so
there is no import cycle and one ``CliError`` class, however the package is started.
"""
from __future__ import annotations

import sys

from batching.cli import calibrate, capacity, compare, report, run, search, specs, sweep
from batching.cli.args import PROG, Parser, dispatch

COMMANDS = (run, compare, sweep, capacity, calibrate, report, specs, search)


def make_parser() -> Parser:
    p = Parser(prog=PROG, description="Simulate LLM serving under batching policies.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv=None) -> int:
    """Run one command; a bad input is one line on stderr and exit code 2 (``args.dispatch``)."""
    return dispatch(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
