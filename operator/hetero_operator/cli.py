"""The ``heterotrain`` command line: one entry point, one module per subcommand.

Subcommands are loaded lazily so ``heterotrain plan`` and ``heterotrain operator`` work without
torch, and ``heterotrain run`` works without kopf.  Each subcommand module exposes
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hetero_operator.embedded", "run a HeteroTrainingJob on this machine (the embedded default)"),
    "plan": ("hetero_operator.plancli", "dry-run placement of a job over a node list"),
    "operator": ("hetero_operator.runner", "run the Kubernetes operator (kopf)"),
    "launch": ("hetero_worker.launch", "in a pod: start one process per local rank, like torchrun"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(prog="heterotrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``heterotrain`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
