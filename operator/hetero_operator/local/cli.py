"""The ``heterotrain`` command line: one entry point, one module per subcommand.

Subcommands are loaded lazily so ``heterotrain plan`` and ``heterotrain operator`` work without
torch, and ``heterotrain run`` works without kopf.  Each subcommand module exposes
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.

Exit codes shared by every subcommand: 64 for a usage error (unknown flag, missing argument:
``EX_USAGE`` of BSD ``sysexits.h``, so it never collides with ``plan``'s 2 = unschedulable), 141
when the reader of our output went away (``heterotrain plan -o json | head``: 128 + SIGPIPE, as a
shell reports a process killed by SIGPIPE), 130 on Ctrl-C. ``heterotrain run`` exits 3 when a rank
failed (whatever the rank's own code; :data:`hetero_operator.local.run.EXIT_RANK_FAILED`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

EXIT_USAGE = 64
"""Usage error (BSD ``sysexits.h`` ``EX_USAGE``); argparse's own default would be 2."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: the reader of our output closed the pipe."""

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hetero_operator.local.run", "run a HeteroTrainingJob on this machine (the embedded default)"),
    "plan": ("hetero_operator.local.plan", "dry-run placement of a job over a node list"),
    "operator": ("hetero_operator.controller.serve", "run the Kubernetes operator (kopf)"),
    "launch": ("hetero_worker.runtime.launch", "in a pod: start one process per local rank, like torchrun"),
    "cluster": ("hetero_operator.local.cluster_cli", "a real local Kubernetes control plane: cluster up / down"),
}


class UsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit :data:`EXIT_USAGE` (subparsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        """Print usage and ``message`` to stderr, exit 64."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def version() -> str:
    """The installed ``heterotrain`` distribution's version (``unknown`` when not installed)."""
    from importlib import metadata
    try:
        return metadata.version("heterotrain")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported.

    The chosen subcommand's parser is kept as ``parser.chosen`` (None without one), so an unknown
    flag is reported with that subcommand's usage, not the top-level one.
    """
    parser = UsageParser(prog="heterotrain", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"heterotrain {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser.chosen = None  # type: ignore[attr-defined]
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).configure(p)
            parser.chosen = p  # type: ignore[attr-defined]
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``heterotrain`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        (parser.chosen or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _reader_went_away() -> int:
    """The pipe we print into was closed (``| head``): stop quietly, as the Python docs advise
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe): point stdout at devnull so
    the interpreter's final flush does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
