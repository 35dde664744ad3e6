"""The README's (and docs') ``heterotrain`` command lines parse: the CLI accepts every flag shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hetero_operator.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_CALL = re.compile(r"(?:^|[\s;&|(])(?:\.venv/bin/|\S*/)?heterotrain\s+(run|plan|operator|launch)\b(.*)$")


def _code_lines(path: Path) -> list[str]:
    """Lines of fenced code blocks, with shell continuations (a trailing backslash) joined."""
    lines, fenced, pending = [], False, ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
    return lines


def commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` for every ``heterotrain <subcommand> ...`` in a fenced block."""
    found = []
    for path in DOCS:
        for line in _code_lines(path):
            if line.lstrip().startswith(("#", "%%")) or "-->" in line:  # comments, mermaid
                continue
            for part in re.split(r"&&|\||;", line.split(" #")[0].rstrip().removesuffix("&")):
                m = _CALL.search(part.strip())
                if m and not part.strip().startswith(("kubectl", "helm", "docker")):
                    argv = [m.group(1), *shlex.split(m.group(2))]
                    found.append((f"{path.name}: {part.strip()}", argv))
    return found


def test_the_readme_shows_commands() -> None:
    readme = [argv for where, argv in commands() if where.startswith("README.md")]
    assert len(readme) >= 8
    flags = {a for argv in readme for a in argv if a.startswith("-")}
    assert {"--nodes", "--epochs", "--profile-steps", "--keep-runs"} <= flags


@pytest.mark.parametrize(("where", "argv"), commands(), ids=[w for w, _ in commands()])
def test_every_shown_command_parses(where: str, argv: list[str]) -> None:
    args = build_parser(argv).parse_args(argv)  # a usage error exits 64 and fails the test
    assert args.command == argv[0]
