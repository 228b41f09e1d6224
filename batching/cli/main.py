"""``python -m batching run|compare|sweep|capacity|calibrate|report|specs|search|prepare``: the parser and the entry
point.

Each command is a module of this package with ``add_parser(subparsers)``; what they share (flags, validators,
``build_scenario``, output checks, error handling) is in ``args.py``. Nothing here is imported back by them, so
there is no import cycle and one ``CliError`` class, however the package is started.
"""
from __future__ import annotations

import multiprocessing
import sys

from batching.cli import calibrate, capacity, compare, prepare, report, run, search, specs, sweep
from batching.cli.args import PROG, Parser, dispatch
from batching.sim.engine import first_use

COMMANDS = (run, compare, sweep, capacity, calibrate, report, specs, search, prepare)


def make_parser() -> Parser:
    p = Parser(prog=PROG, description="Simulate LLM serving under batching policies.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def first_use_line(event: str, v: first_use.Variant) -> bool:
    """One line on stderr when a run has to compile its kernels (or wait for another process compiling them);
    whether it said one."""
    what = f"the simulator for {v.label}" if v.label else "the simulator"
    if event == "compile":
        print(f"{PROG}: preparing {what} (once per install): compiling its kernels, up to a minute; `{PROG} "
              "prepare` compiles every feature ahead", file=sys.stderr, flush=True)
        return True
    if event == "wait" and multiprocessing.parent_process() is None:  # a pool worker waits for its sibling's
        print(f"{PROG}: preparing {what} (once per install): waiting for the compile another process started",
              file=sys.stderr, flush=True)
        return True
    return False


def main(argv=None) -> int:
    """Run one command; a bad input is one line on stderr and exit code 2 (``args.dispatch``). A command that
    compiles says so once, however many kernel versions it needs (a closed loop and its saturated twin are two)."""
    told = False

    def tell(event: str, v: first_use.Variant) -> None:
        nonlocal told
        if not told:
            told = first_use_line(event, v)

    first_use.set_default_listener(tell)
    return dispatch(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
