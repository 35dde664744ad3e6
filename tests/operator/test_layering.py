"""Layering: the house in floors, checked on the source (every import statement, including ones
inside functions and under ``TYPE_CHECKING``), so it needs no extra tool.

* ``heterotrain_common`` imports nothing of ours and neither torch nor kopf nor kubernetes;
* ``hetero_worker`` imports only ``heterotrain_common`` (and itself), never kopf or kubernetes;
* ``hetero_operator``'s floors import only downwards:
  ``api < cluster < planning < render < lifecycle < {controller, local}``; ``controller`` and
  ``local`` stand side by side and import neither each other; the operator never imports
  ``hetero_worker`` (what both sides share is in ``heterotrain_common``);
* the floors below ``controller`` import no kopf and no Kubernetes client (``kubernetes`` or the
  API client :mod:`hetero_operator.controller.k8s`);
* no import circle between files anywhere.

The checker runs on a tree given as ``{package: folder}``, so a test can show it fail on a
synthetic tree with a forbidden import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "heterotrain_common": REPO / "common" / "heterotrain_common",
    "hetero_operator": REPO / "operator" / "hetero_operator",
    "hetero_worker": REPO / "worker" / "hetero_worker",
}
FLOORS = ("api", "cluster", "planning", "render", "lifecycle", "controller", "local")
"""The operator's floors, lowest first; ``controller`` and ``local`` share the top floor."""
TOP = ("controller", "local")
FRAMEWORKS = {"kopf", "kubernetes"}
API_CLIENT = "hetero_operator.controller.k8s"


def _level(floor: str) -> int:
    return FLOORS.index(TOP[0]) if floor in TOP else FLOORS.index(floor)


def modules(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of ``packages``, by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for name, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """What ``module`` imports: our modules (the longest known prefix) and other top-level names."""
    known = set(known)
    ours = {m.split(".")[0] for m in known}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known and "." in name:
            if name.split(".")[0] not in ours:
                break
            name = name.rpartition(".")[0]
        out.add(name if name in known else name.split(".")[0])

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
    out.discard(module)
    return out


def graph(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    """``module -> what it imports`` for every module of ``packages``."""
    mods = modules(packages)
    return {m: imports(m, p, mods) for m, p in mods.items()}


def cycles(g: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "hetero_operator" and len(parts) > 1 and parts[1] in FLOORS else None


def violations(packages: Mapping[str, Path]) -> list[str]:
    """Every broken rule of the module docstring, one sentence each (empty: the house stands)."""
    g = graph(packages)
    bad = []
    for m, targets in sorted(g.items()):
        root = m.split(".")[0]
        for t in sorted(targets):
            troot = t.split(".")[0]
            if root == "heterotrain_common" and (troot in PACKAGES and troot != root
                                                 or troot in FRAMEWORKS | {"torch"}):
                bad.append(f"{m} imports {t}: common imports nothing of ours, no torch, no kopf")
            if root == "hetero_worker" and (troot == "hetero_operator" or troot in FRAMEWORKS):
                bad.append(f"{m} imports {t}: the worker imports only heterotrain_common")
            if root == "hetero_operator" and troot == "hetero_worker":
                bad.append(f"{m} imports {t}: the operator shares code through heterotrain_common")
            mf, tf = _floor(m), _floor(t)
            if mf and tf and (_level(tf) > _level(mf) or (mf != tf and _level(tf) == _level(mf))):
                bad.append(f"{m} imports {t}: floor {mf} may import only floors below it")
            if mf and mf not in TOP and (troot in FRAMEWORKS or t == API_CLIENT):
                bad.append(f"{m} imports {t}: floor {mf} imports no kopf and no API client")
    bad += [f"import circle: {' -> '.join(c)}" for c in cycles(g)]
    return bad


def test_the_house_stands() -> None:
    assert violations(PACKAGES) == []


def test_every_operator_module_lives_on_a_floor() -> None:
    loose = [m for m in modules({"hetero_operator": PACKAGES["hetero_operator"]})
             if m != "hetero_operator" and _floor(m) is None]
    assert loose == []


def test_kopf_lives_in_the_controller() -> None:
    g = graph(PACKAGES)
    assert "kopf" in g["hetero_operator.controller.main"]
    assert {m for m, t in g.items() if "kopf" in t} <= {m for m in g if _floor(m) == "controller"}


def test_the_embedded_runner_lives_on_the_local_floor() -> None:
    mods = modules(PACKAGES)
    assert {"hetero_operator.local.run", "hetero_operator.local.report", "hetero_operator.local.nodes",
            "hetero_operator.local.cli"} <= set(mods)


def _write(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {name: root / folder / name for name, folder in
            (("heterotrain_common", "common"), ("hetero_operator", "operator"), ("hetero_worker", "worker"))}


CLEAN = {
    "common/heterotrain_common/__init__.py": "",
    "common/heterotrain_common/contract.py": "import json\n",
    "operator/hetero_operator/__init__.py": "",
    "operator/hetero_operator/api/__init__.py": "",
    "operator/hetero_operator/api/spec.py": "from heterotrain_common import contract\n",
    "operator/hetero_operator/planning/__init__.py": "",
    "operator/hetero_operator/planning/plan.py": "from hetero_operator.api import spec\n",
    "operator/hetero_operator/controller/__init__.py": "",
    "operator/hetero_operator/controller/k8s.py": "import kubernetes\n",
    "operator/hetero_operator/controller/main.py": "import kopf\nfrom . import k8s\n",
    "operator/hetero_operator/local/__init__.py": "",
    "operator/hetero_operator/local/run.py": "from ..planning.plan import x\n",
    "worker/hetero_worker/__init__.py": "",
    "worker/hetero_worker/trainer.py": "import torch\nfrom heterotrain_common.contract import C\n",
}
FORBIDDEN = [
    ("common/heterotrain_common/contract.py", "import torch\n", "common imports nothing of ours"),
    ("common/heterotrain_common/contract.py", "from hetero_worker import trainer\n", "common imports nothing"),
    ("worker/hetero_worker/trainer.py", "from hetero_operator.api.spec import JobSpec\n",
     "the worker imports only heterotrain_common"),
    ("operator/hetero_operator/api/spec.py", "from hetero_worker import trainer\n", "through heterotrain_common"),
    ("operator/hetero_operator/api/spec.py", "from hetero_operator.planning import plan\n",
     "floor api may import only floors below it"),
    ("operator/hetero_operator/local/run.py", "from hetero_operator.controller import main\n",
     "floor local may import only floors below it"),
    ("operator/hetero_operator/planning/plan.py", "def f():\n    import kopf\n",
     "floor planning imports no kopf and no API client"),
    ("operator/hetero_operator/planning/plan.py", "from hetero_operator.controller.k8s import Api\n",
     "floor planning imports no kopf and no API client"),
    ("worker/hetero_worker/__init__.py", "from hetero_worker import trainer\n", "import circle"),
]


def test_the_checker_passes_a_clean_synthetic_tree(tmp_path: Path) -> None:
    assert violations(_write(tmp_path, CLEAN)) == []


@pytest.mark.parametrize(("path", "extra", "says"), FORBIDDEN, ids=[
    "common importing torch fails", "common importing the worker fails",
    "the worker importing the operator fails", "the operator importing the worker fails",
    "api importing planning (upwards) fails", "local importing controller (its sibling) fails",
    "planning importing kopf inside a function fails", "planning importing the API client fails",
    "two files importing each other fail"])
def test_the_checker_fails_on_a_forbidden_import(tmp_path: Path, path: str, extra: str, says: str) -> None:
    files = dict(CLEAN)
    files[path] = files[path] + extra
    if says == "import circle":
        files["worker/hetero_worker/trainer.py"] += "import hetero_worker\n"
    found = violations(_write(tmp_path, files))
    assert any(says in v for v in found), found
