"""Every cross-reference in the docs resolves (issue 33, item 8): each relative Markdown link in
README.md and docs/*.md names a file or folder that exists, and each ``#anchor`` names a heading
of the page it points to, by GitHub's slug rules (or an explicit ``<a id=...>``/``<a name=...>``).
A section cited in prose, as ``docs/<page>.md, "<Section>"`` (in code, the CRD's descriptions that
``kubectl explain`` shows, examples, charts), names a page of docs/ with a heading that starts with
it, or a paragraph that opens with it in bold.

The checker reads Markdown as text: links inside fenced code blocks and inline code spans are not
links; absolute URLs (``https:``, ``mailto:``) are left to the reader.  Tests below show it failing
on a missing file, a missing anchor and GitHub's slug cases.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
"""The pages checked: the README and every page under docs/."""

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                          r"(?:\s+\"[^\"]*\"|\s+'[^']*')?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: formatting dropped (code spans keep their text,
    links their label), lower case, every character but letters, digits, ``_``, ``-`` and spaces
    dropped, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _lines_outside_fences(text: str) -> Iterator[tuple[int, str]]:
    fence = ""
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            continue
        if m:
            fence = m.group(1)
            continue
        yield number, line


def anchors(text: str) -> set[str]:
    """The anchors a page has: its headings' slugs (a repeated one gets ``-1``, ``-2``, ... as
    GitHub numbers them) and explicit ``<a id>`` / ``<a name>`` anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _lines_outside_fences(text):
        found.update(_EXPLICIT_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """``(line, target)`` of every link and image in ``text`` outside code (inline and reference
    definitions)."""
    for number, line in _lines_outside_fences(text):
        plain = _CODE_SPAN.sub("", line)
        for m in _INLINE_LINK.finditer(plain):
            yield number, m.group(1).strip("<>")
        m = _REFERENCE.match(plain)
        if m:
            yield number, m.group(1).strip("<>")


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of ``page`` that does not resolve, one sentence each (empty: all do).

    A target is a path relative to the page (a file or a folder inside ``root``), optionally with
    ``#anchor``; a bare ``#anchor`` is the page itself.  Anchors are checked on Markdown targets.
    """
    text = page.read_text(encoding="utf-8")
    bad = []
    for number, target in links(text):
        if not target or _EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part.split("?", 1)[0])
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if root.resolve() not in (dest, *dest.parents):
            bad.append(f"{where}: points outside the repository")
            continue
        if not dest.exists():
            bad.append(f"{where}: {dest.relative_to(root.resolve())} does not exist")
            continue
        if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{where}: no heading or anchor #{anchor} in {dest.relative_to(root.resolve())}")
    return bad


_CITATION = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)\)?,? ?\(?\\?\"([^\"\\]+)\\?\"")
"""``docs/operator.md, "Settings"``, ``docs/operator.md ("Settings"`` (also with ``\\"`` quotes,
as in a Python string)."""
CITING = ("README.md", "docs", "crds", "charts", "examples", "common", "operator", "worker", "scripts",
          "bench")
"""Where prose citations are looked for (files and folders of the repository)."""
_CITING_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".txt", ".tpl", ".sh"}


def sections(text: str) -> list[str]:
    """A page's section names: its headings' text and the bold text that opens a paragraph."""
    found = []
    for _, line in _lines_outside_fences(text):
        m = _HEADING.match(line)
        if m:
            found.append(m.group(2).replace("`", ""))
        bold = re.match(r"^\*\*(.+?)\*\*", line)
        if bold:
            found.append(bold.group(1))
    return found


def broken_citations(path: Path, root: Path = REPO) -> list[str]:
    """Each ``docs/<page>.md, "<Section>"`` in ``path`` whose page is not in ``root/docs`` or has
    no section starting with ``<Section>``, one sentence each."""
    bad, docs, where = [], root / "docs", path.relative_to(root)
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for m in _CITATION.finditer(line):
            page, section = docs / m.group(1), m.group(2)
            if not page.is_file():
                bad.append(f"{where}:{number}: docs/{m.group(1)} does not exist")
            elif not any(s.lower().startswith(section.lower()) for s in sections(page.read_text())):
                bad.append(f"{where}:{number}: docs/{m.group(1)} has no section \"{section}\"")
    return bad


def _citing_files() -> list[Path]:
    files = []
    for name in CITING:
        top = REPO / name
        found = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        files += [p for p in found if p.suffix in _CITING_SUFFIXES and "__pycache__" not in p.parts]
    return sorted(files)


def test_every_section_cited_in_prose_exists() -> None:
    files = _citing_files()
    assert {REPO / "crds" / "heterotrainingjobs.heterotrain.io.yaml", REPO / "README.md",
            REPO / "common" / "heterotrain_common" / "defaults.py"} <= set(files)
    assert [b for f in files for b in broken_citations(f)] == []


def test_the_citation_check_finds_a_missing_page_and_section(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "operator.md").write_text("# The operator\n## Settings and more\n"
                                                   "**The stop agreement** (later): ...\n")
    code = tmp_path / "code.py"
    code.write_text('"""See docs/operator.md, "Settings"; docs/operator.md ("The stop agreement").\n'
                    'desc = "(docs/operator.md, \\"Preemption\\")."\n'
                    '"""docs/gone.md, "Any"; shared/docs/facts.md, "MIG" is not ours."""\n')
    assert broken_citations(code, tmp_path) == [
        'code.py:2: docs/operator.md has no section "Preemption"',
        "code.py:3: docs/gone.md does not exist",
    ]


def test_the_pages_checked_include_the_readme_and_the_docs() -> None:
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "docs/architecture.md", "docs/operator.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Run a job on this machine") == "run-a-job-on-this-machine"
    assert slug("Decision aid: what each GPU type adds") == "decision-aid-what-each-gpu-type-adds"
    assert slug("`heterotrain plan` exit codes") == "heterotrain-plan-exit-codes"
    assert slug("HTJ_TOPOLOGY and the batch") == "htj_topology-and-the-batch"
    assert slug("Kueue (v0.17) / DRA: 1.35+") == "kueue-v017--dra-135"
    assert slug("See [the worker](worker.md) **now**") == "see-the-worker-now"
    text = "# Title\n## Setup\n```\n## Not a heading\n```\n## Setup\n<a id=\"custom\"></a>\n"
    assert anchors(text) == {"title", "setup", "setup-1", "custom"}


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n## Real section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n"
                    "[ok](other.md#real-section) [top](#page) [web](https://example.com/x.md)\n"
                    "[gone](missing.md) [no anchor](other.md#imagined-section) [self](#nowhere)\n"
                    "`[in code](missing-too.md)`\n"
                    "```\n[in a fence](missing-three.md)\n```\n"
                    "[up](../docs/other.md) ![img](../pic.png)\n"
                    "[ref]: ../nothing.md\n")
    assert broken_links(page, tmp_path) == [
        "docs/page.md:3: missing.md: docs/missing.md does not exist",
        "docs/page.md:3: other.md#imagined-section: no heading or anchor #imagined-section in docs/other.md",
        "docs/page.md:3: #nowhere: no heading or anchor #nowhere in docs/page.md",
        "docs/page.md:8: ../pic.png: pic.png does not exist",
        "docs/page.md:9: ../nothing.md: nothing.md does not exist",
    ]
