"""docs/benchmarks.md is what ``bench/report.py`` makes of ``bench/results`` (issue 33, item 8),
and the README's short Benchmarks section quotes only figures those tables hold.

The tables come from real runs: a hand edit of a figure, or a results file changed without
``bench/report.py --readme docs/benchmarks.md``, fails here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

PAGE = REPO / "docs" / "benchmarks.md"
README = REPO / "README.md"
_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?:x| ms| MiB| s| %)?")
"""A measured figure as the tables print it: ``1.879x``, ``35.8 ms``, ``362.0 MiB``, ``0.959``."""


def generated_part(text: str) -> str:
    """The text between ``bench/report.py``'s markers."""
    start, end = text.index(report.BEGIN) + len(report.BEGIN), text.index(report.END)
    return text[start:end]


def readme_benchmarks_section(text: str) -> str:
    """The README's ``## Benchmarks`` section, up to the next ``## `` heading."""
    start = text.index("\n## Benchmarks\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_page_holds_exactly_what_the_results_files_say() -> None:
    assert generated_part(PAGE.read_text()) == "\n" + report.report(BENCH / "results")


def test_the_page_names_every_results_file_it_shows() -> None:
    head = PAGE.read_text().split(report.BEGIN)[0]
    for stem, _, _ in report.BENCHMARKS:
        assert f"`{stem}.json`" in head, stem


def test_the_readme_sums_up_and_links_the_page_without_the_tables() -> None:
    text = README.read_text()
    section = readme_benchmarks_section(text)
    assert report.BEGIN not in text and report.END not in text
    assert "[docs/benchmarks.md](docs/benchmarks.md)" in section
    assert len(section.splitlines()) < 40


def test_every_figure_the_readme_quotes_is_in_the_tables() -> None:
    tables = generated_part(PAGE.read_text())
    figures = _FIGURE.findall(readme_benchmarks_section(README.read_text()))
    assert len(figures) >= 20
    missing = [f for f in figures if not re.search(rf"(?<![\w.]){re.escape(f)}(?![\w.])", tables)]
    assert missing == []


def test_a_figure_not_in_the_tables_is_found() -> None:
    tables = "| proportional / equal split | 1.879x | 1.842x - 1.899x | >= 1.850x | met |"
    figures = _FIGURE.findall("split 1.879x, 1.88x and 35.8 ms; 3 runs of 1,024 ranks")
    assert figures == ["1.879x", "1.88x", "35.8 ms"]
    assert [f for f in figures if not re.search(rf"(?<![\w.]){re.escape(f)}(?![\w.])", tables)] == [
        "1.88x", "35.8 ms"]
