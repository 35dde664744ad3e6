"""``heterotrain convert PYTORCHJOB.yaml [-o JOB.yaml] [--global-batch-size N]``.

Writes the HeteroTrainingJob made from a Kubeflow PyTorchJob (:mod:`.pytorchjob`) to stdout or
``-o``, with every input field it could not map listed as YAML comments on top of the manifest and
on stderr, each with its reason, and what to check (notes).  Exit codes: 0 converted, 1 bad input
(one line on stderr naming the file or field), 64 usage error (see :mod:`hetero_operator.cli`).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import yaml

from hetero_operator.convert.pytorchjob import Conversion, ConvertError, convert_pytorchjob

EXIT_CONVERTED, EXIT_BAD_INPUT = 0, 1
COMMENT_WIDTH = 100
"""Columns of the comment lines on top of the manifest."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``convert`` arguments."""
    parser.add_argument("source", metavar="PYTORCHJOB.yaml",
                        help="a Kubeflow PyTorchJob manifest (kubeflow.org/v1)")
    parser.add_argument("-o", "--output", metavar="JOB.yaml", default=None,
                        help="write the HeteroTrainingJob here (default: stdout)")
    parser.add_argument("--global-batch-size", type=int, default=None, metavar="N",
                        help="spec.training.globalBatchSize: samples per optimizer step over all "
                             "ranks (a PyTorchJob has none; default: 32 per rank)")


def run(args: argparse.Namespace) -> int:
    """Convert, write, list what was not mapped; returns the exit code."""
    try:
        doc = yaml.safe_load(Path(args.source).read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"heterotrain convert: error: {args.source}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.global_batch_size is not None and args.global_batch_size < 1:
        print("heterotrain convert: error: --global-batch-size must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        conversion = convert_pytorchjob(doc if isinstance(doc, dict) else {},
                                        global_batch_size=args.global_batch_size)
    except ConvertError as exc:
        print(f"heterotrain convert: error: {args.source}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text = render(conversion, source=args.source)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    for line in report_lines(conversion):
        print(f"heterotrain convert: {line}", file=sys.stderr)
    return EXIT_CONVERTED


def report_lines(conversion: Conversion) -> list[str]:
    """One line per unmapped field (``not mapped: PATH: why``) and per note (``check: ...``)."""
    return ([f"not mapped: {u.path}: {u.reason}" for u in conversion.unmapped]
            + [f"check: {note}" for note in conversion.notes])


def render(conversion: Conversion, *, source: str) -> str:
    """The manifest as YAML, with the unmapped fields and the notes as comments on top."""
    lines = [f"# Converted from the PyTorchJob in {source} by heterotrain convert",
             "# (docs/migrating-from-kubeflow.md has the field table)."]
    if conversion.unmapped:
        lines.append("# Not mapped:")
        lines += _wrapped([f"{u.path}: {u.reason}" for u in conversion.unmapped])
    if conversion.notes:
        lines.append("# Check:")
        lines += _wrapped(list(conversion.notes))
    body = yaml.safe_dump(conversion.job, sort_keys=False, default_flow_style=None, width=COMMENT_WIDTH)
    return "\n".join(lines) + "\n" + body


def _wrapped(items: list[str]) -> list[str]:
    out = []
    for item in items:
        out += textwrap.wrap(item, COMMENT_WIDTH - 4, initial_indent="# - ", subsequent_indent="#   ",
                             break_on_hyphens=False, break_long_words=False)
    return out
