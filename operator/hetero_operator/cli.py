"""The ``heterotrain`` command line: one entry point, one module per subcommand.

The face above every tool of the project: the embedded run (:mod:`hetero_operator.local`), the dev
cluster (:mod:`hetero_operator.devcluster`), the operator (:mod:`hetero_operator.controller`) and
the worker's launcher (:mod:`hetero_worker.runtime.launch`).  It reaches them only by module name
(:data:`SUBCOMMANDS`), so nothing below it imports the command line, and the operator's side never
imports the worker: tests/operator/test_layering.py declares these string arrows and checks them.

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
from typing import Any, NoReturn

from hetero_operator.local.invocation import EXIT_USAGE

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: the reader of our output closed the pipe."""

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hetero_operator.local.run", "run a HeteroTrainingJob on this machine (the embedded default)"),
    "plan": ("hetero_operator.local.plan", "dry-run placement of a job over a node list"),
    "operator": ("hetero_operator.controller.serve", "run the Kubernetes operator (kopf)"),
    "launch": ("hetero_worker.runtime.launch", "in a pod: start one process per local rank, like torchrun"),
    "keeper": ("hetero_worker.membership.keeper", "in a pod: an elastic job's membership keeper (spec.elastic)"),
    "cluster": ("hetero_operator.devcluster.cluster_cli", "a real local Kubernetes control plane: cluster up / down"),
    "convert": ("hetero_operator.convert.command", "write a HeteroTrainingJob from a Kubeflow PyTorchJob"),
    "status": ("hetero_operator.jobview.status", "a job's plan, state, progress and result (a local run or a cluster job)"),
    "logs": ("hetero_operator.jobview.logs", "a rank's log (a local run or a cluster job, as kubectl logs)"),
}


class UsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit :data:`EXIT_USAGE`, and which takes a long
    flag only as spelled in full (``allow_abbrev=False``: ``plan --node x`` is an unknown flag,
    never ``--nodes x``). Subparsers are of the same class, so every subcommand inherits both."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

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
    parser.add_argument("-V", "--version", action="version", version=f"heterotrain {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser.chosen = None  # type: ignore[attr-defined]
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).configure(p)
            parser.chosen = p  # type: ignore[attr-defined]
    return parser


def innermost(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the innermost subcommand ``argv`` names under ``parser`` (``cluster up``'s for
    ``heterotrain cluster up --nodez x``), so a usage error prints that subcommand's usage."""
    for token in argv:
        subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subs is not None and token in subs.choices:
            parser = subs.choices[token]
    return parser


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """``"; did you mean --nodes?"`` for the first unknown long flag close to one of ``parser``'s
    (``--node``, ``--nodez``), else ``""``."""
    import difflib

    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
    for token in unknown:
        if token.startswith("--"):
            close = difflib.get_close_matches(token.partition("=")[0], flags, n=1, cutoff=0.75)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``heterotrain`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        usage = innermost(parser.chosen or parser, argv)
        usage.error(f"unrecognized arguments: {' '.join(unknown)}{_did_you_mean(usage, unknown)}")
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
