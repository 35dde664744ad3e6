"""Layering: the house in floors, checked on the source (every import statement, including ones
inside functions and under ``TYPE_CHECKING``, and every module named in a string to be imported or
run: the string dispatches), so it needs no extra tool.

* ``heterotrain_common`` imports nothing of ours and neither torch nor kopf nor kubernetes;
* ``hetero_worker`` imports only ``heterotrain_common`` (and itself), never kopf or kubernetes;
* ``hetero_operator``'s floors import only downwards:
  ``api < cluster < planning < render < lifecycle < {controller, local, devcluster, convert}
  < jobview < cli``; ``controller``, ``local`` (the embedded run), ``devcluster`` (the dev control
  plane) and ``convert`` (``heterotrain convert``) stand side by side and import none of each
  other; ``jobview`` (``heterotrain status`` and ``logs``) reads local runs and cluster jobs;
  ``cli`` (the ``heterotrain`` command) is the face above them all;
* the operator never imports ``hetero_worker`` (what both sides share is in
  ``heterotrain_common``); only ``cli`` reaches the worker, by module name (``heterotrain launch``);
* a module named in a string (``importlib.import_module(name)``, ``python -m name``) is an arrow
  too: each is declared in :data:`DISPATCHES` and obeys the floors like an import;
* the floors below ``controller`` import no kopf and no Kubernetes client (``kubernetes`` or the
  API client :mod:`hetero_operator.controller.k8s`);
* no import circle between files anywhere.

The checker runs on a tree given as ``{package: folder}``, so a test can show it fail on a
synthetic tree with a forbidden import or an undeclared dispatch.
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
LEVELS = {"api": 0, "cluster": 1, "planning": 2, "render": 3, "lifecycle": 4,
          "controller": 5, "local": 5, "devcluster": 5, "convert": 5, "jobview": 6, "cli": 7}
"""The operator's floors by level, lowest first; ``controller``, ``local``, ``devcluster`` and
``convert`` (``heterotrain convert``) share a level (siblings import none of each other);
``jobview`` (``heterotrain status`` and ``logs``: a local run or a cluster job) stands on them,
``cli`` is the face on top."""
FLOORS = tuple(LEVELS)
PURE_BELOW = LEVELS["controller"]
"""Floors under this level import no kopf and no API client."""
FACE = "cli"
"""The one floor that may reach ``hetero_worker``, and only by module name."""
FRAMEWORKS = {"kopf", "kubernetes"}
API_CLIENT = "hetero_operator.controller.k8s"
DISPATCHES: dict[str, set[str]] = {
    # heterotrain <subcommand>: cli.SUBCOMMANDS, imported by name once the subcommand is chosen
    "hetero_operator.cli": {"hetero_operator.local.run", "hetero_operator.local.plan",
                            "hetero_operator.controller.serve", "hetero_worker.runtime.launch",
                            "hetero_worker.membership.keeper",
                            "hetero_operator.devcluster.cluster_cli", "hetero_operator.convert.command",
                            "hetero_operator.jobview.status", "hetero_operator.jobview.logs"},
    # heterotrain cluster up: python -m hetero_operator.devcluster.kubelet, a detached process
    "hetero_operator.devcluster.cluster_cli": {"hetero_operator.devcluster.kubelet"},
    # cluster up --monitoring with a prometheus lacking kubernetes_sd: the stand-in pod discovery
    "hetero_operator.devcluster.monitoring": {"hetero_operator.devcluster.podsd"},
}
"""Every module named in a string to be imported or run (``module -> named modules``)."""
COMMANDS: dict[str, set[str]] = {
    # the pod's command: settings.launcher = heterotrain launch -- <spec.worker.command>
    "hetero_operator.api.settings": {"launch"},
    # an elastic job's keeper pod: heterotrain keeper
    "hetero_operator.render.keeper": {"keeper"},
}
"""Every argv literal starting with the ``heterotrain`` console script (``module -> subcommands``):
it runs :mod:`hetero_operator.cli` in another process (a pod), which dispatches as above."""


def _level(floor: str) -> int:
    return LEVELS[floor]


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


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node of ``tree`` (module, class and function docstrings)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(path: Path) -> tuple[list[str], list[list[str]]]:
    """The string constants of ``path`` that are no docstring, and its list/tuple literals whose
    items are all strings (argv literals)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docs = _docstrings(tree)
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    argvs = [[e.value for e in n.elts] for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple))
             and n.elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts)]
    return strings, argvs


def dispatches(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    """``module -> the modules it names in a string`` (a module, never a package: what
    ``import_module(name).run`` or ``python -m name`` takes), for every module naming one."""
    mods = modules(packages)
    runnable = {m for m, p in mods.items() if p.name != "__init__.py"}
    found: dict[str, set[str]] = {}
    for m, path in mods.items():
        named = {s for s in _strings(path)[0] if s in runnable} - {m}
        if named:
            found[m] = named
    return found


def commands(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    """``module -> the subcommands of its argv literals that start with heterotrain``."""
    found: dict[str, set[str]] = {}
    for m, path in modules(packages).items():
        subs = {argv[1] for argv in _strings(path)[1] if len(argv) > 1 and argv[0] == "heterotrain"}
        if subs:
            found[m] = subs
    return found


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


def violations(packages: Mapping[str, Path],
               declared: Mapping[str, set[str]] | None = None) -> list[str]:
    """Every broken rule of the module docstring, one sentence each (empty: the house stands).

    ``declared`` (default :data:`DISPATCHES`): the string dispatches the tree may hold; one that
    is found and not declared is a violation, and every declared one is checked as an import.
    """
    declared = DISPATCHES if declared is None else declared
    g = graph(packages)
    named = dispatches(packages)
    bad = [f"{m} names {t} in a string: declare it in DISPATCHES (tests/operator/test_layering.py)"
           for m, ts in sorted(named.items()) for t in sorted(ts - declared.get(m, set()))]
    for m, targets in sorted(g.items()):
        root = m.split(".")[0]
        by_name = named.get(m, set())
        for t in sorted(targets | by_name):
            troot = t.split(".")[0]
            if t in by_name and t not in targets and _floor(m) == FACE and troot == "hetero_worker":
                continue  # the face dispatches to the worker's launcher by name
            verb = "imports" if t in targets else "names"
            if root == "heterotrain_common" and (troot in PACKAGES and troot != root
                                                 or troot in FRAMEWORKS | {"torch"}):
                bad.append(f"{m} {verb} {t}: common imports nothing of ours, no torch, no kopf")
            if root == "hetero_worker" and (troot == "hetero_operator" or troot in FRAMEWORKS):
                bad.append(f"{m} {verb} {t}: the worker imports only heterotrain_common")
            if root == "hetero_operator" and troot == "hetero_worker":
                bad.append(f"{m} {verb} {t}: the operator shares code through heterotrain_common")
            mf, tf = _floor(m), _floor(t)
            if mf and tf and (_level(tf) > _level(mf) or (mf != tf and _level(tf) == _level(mf))):
                bad.append(f"{m} {verb} {t}: floor {mf} may import only floors below it")
            if mf and _level(mf) < PURE_BELOW and (troot in FRAMEWORKS or t == API_CLIENT):
                bad.append(f"{m} {verb} {t}: floor {mf} imports no kopf and no API client")
    both = {m: g[m] | named.get(m, set()) for m in g}
    bad += [f"import circle: {' -> '.join(c)}" for c in cycles(both)]
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
            "hetero_operator.local.plan", "hetero_operator.local.supervise"} <= set(mods)
    assert "hetero_operator.cli" in mods


def test_the_dev_cluster_is_a_package_of_its_own_sharing_no_import_with_the_embedded_run() -> None:
    g = graph(PACKAGES)
    devcluster = {m for m in g if _floor(m) == "devcluster"}
    local = {m for m in g if _floor(m) == "local"}
    assert {f"hetero_operator.devcluster.{name}" for name in (
        "controlplane", "cpflags", "pki", "kueue", "kubelet", "kubeapi", "podenv", "cluster_cli")} <= devcluster
    assert [(m, t) for m in devcluster for t in g[m] if t in local] == []
    assert [(m, t) for m in local for t in g[m] if t in devcluster] == []


def test_every_string_dispatch_is_declared_and_none_is_stale() -> None:
    assert dispatches(PACKAGES) == DISPATCHES


def test_the_cli_dispatches_exactly_its_subcommands() -> None:
    from hetero_operator.cli import SUBCOMMANDS
    assert {module for module, _ in SUBCOMMANDS.values()} == DISPATCHES["hetero_operator.cli"]


def test_every_heterotrain_argv_names_a_subcommand() -> None:
    from hetero_operator.cli import SUBCOMMANDS
    assert commands(PACKAGES) == COMMANDS
    assert set().union(*COMMANDS.values()) <= set(SUBCOMMANDS)


def test_the_console_script_is_the_face() -> None:
    import tomllib
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {"heterotrain": "hetero_operator.cli:main"}


def test_every_python_m_outside_the_code_names_a_module_of_ours() -> None:
    """Examples, images and the chart run our modules by name too (``python -m
    hetero_worker.examples.digits``): each name must still be a module after a move."""
    import re
    mods = modules(PACKAGES)
    files = [*REPO.glob("Dockerfile*"), *(REPO / "examples").rglob("*.yaml"),
             *(REPO / "charts").rglob("*.yaml"), *(REPO / "docs").glob("*.md")]
    named = {(f.name, m) for f in files for m in re.findall(
        r"-m[\"',\s]+((?:hetero_operator|hetero_worker|heterotrain_common)(?:\.\w+)+)",
        f.read_text(encoding="utf-8"))}
    assert ("digits.yaml", "hetero_worker.examples.digits") in named
    assert [(f, m) for f, m in sorted(named) if m not in mods] == []


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
    "operator/hetero_operator/devcluster/__init__.py": '"""hetero_operator.devcluster.kubelet in a docstring is no dispatch."""\n',
    "operator/hetero_operator/devcluster/kubelet.py": "from hetero_operator.api import spec\n",
    "operator/hetero_operator/devcluster/up.py": 'ARGV = ["python", "-m", "hetero_operator.devcluster.kubelet"]\n',
    "operator/hetero_operator/cli.py": ('from hetero_operator.local import run\n'
                                        'SUB = {"run": "hetero_operator.local.run", "launch": "hetero_worker.launch"}\n'),
    "worker/hetero_worker/__init__.py": "",
    "worker/hetero_worker/launch.py": "",
    "worker/hetero_worker/trainer.py": "import torch\nfrom heterotrain_common.contract import C\n",
}
CLEAN_DISPATCHES = {"hetero_operator.cli": {"hetero_operator.local.run", "hetero_worker.launch"},
                    "hetero_operator.devcluster.up": {"hetero_operator.devcluster.kubelet"}}
FORBIDDEN = [
    ("common/heterotrain_common/contract.py", "import torch\n", "common imports nothing of ours", {}),
    ("common/heterotrain_common/contract.py", "from hetero_worker import trainer\n", "common imports nothing", {}),
    ("worker/hetero_worker/trainer.py", "from hetero_operator.api.spec import JobSpec\n",
     "the worker imports only heterotrain_common", {}),
    ("operator/hetero_operator/api/spec.py", "from hetero_worker import trainer\n", "through heterotrain_common", {}),
    ("operator/hetero_operator/api/spec.py", "from hetero_operator.planning import plan\n",
     "floor api may import only floors below it", {}),
    ("operator/hetero_operator/local/run.py", "from hetero_operator.controller import main\n",
     "floor local may import only floors below it", {}),
    ("operator/hetero_operator/planning/plan.py", "def f():\n    import kopf\n",
     "floor planning imports no kopf and no API client", {}),
    ("operator/hetero_operator/planning/plan.py", "from hetero_operator.controller.k8s import Api\n",
     "floor planning imports no kopf and no API client", {}),
    ("worker/hetero_worker/__init__.py", "from hetero_worker import trainer\n", "import circle", {}),
    ("operator/hetero_operator/local/run.py", "from hetero_operator.devcluster import kubelet\n",
     "floor local may import only floors below it", {}),
    ("operator/hetero_operator/devcluster/kubelet.py", "def f():\n    from hetero_operator.local import run\n",
     "floor devcluster may import only floors below it", {}),
    ("operator/hetero_operator/local/run.py", "def f():\n    from hetero_operator import cli\n",
     "floor local may import only floors below it", {}),
    ("operator/hetero_operator/cli.py", "import hetero_worker.launch\n", "through heterotrain_common", {}),
    ("operator/hetero_operator/local/run.py", 'M = "hetero_operator.devcluster.kubelet"\n',
     "declare it in DISPATCHES", {}),
    ("operator/hetero_operator/local/run.py", 'ARGV = ["python", "-m", "hetero_operator.devcluster.kubelet"]\n',
     "run names hetero_operator.devcluster.kubelet: floor local may import only",
     {"hetero_operator.local.run": {"hetero_operator.devcluster.kubelet"}}),
    ("operator/hetero_operator/planning/plan.py", 'M = "hetero_worker.launch"\n', "through heterotrain_common",
     {"hetero_operator.planning.plan": {"hetero_worker.launch"}}),
]


def test_the_checker_passes_a_clean_synthetic_tree(tmp_path: Path) -> None:
    packages = _write(tmp_path, CLEAN)
    assert dispatches(packages) == CLEAN_DISPATCHES
    assert violations(packages, CLEAN_DISPATCHES) == []


@pytest.mark.parametrize(("path", "extra", "says", "declare"), FORBIDDEN, ids=[
    "common importing torch fails", "common importing the worker fails",
    "the worker importing the operator fails", "the operator importing the worker fails",
    "api importing planning (upwards) fails", "local importing controller (its sibling) fails",
    "planning importing kopf inside a function fails", "planning importing the API client fails",
    "two files importing each other fail", "local importing devcluster (its sibling) fails",
    "devcluster importing local inside a function fails", "local importing the cli (upwards) fails",
    "the cli importing the worker (not by name) fails", "an undeclared string dispatch fails",
    "a declared dispatch to a sibling floor fails", "a declared dispatch from planning to the worker fails"])
def test_the_checker_fails_on_a_forbidden_import(tmp_path: Path, path: str, extra: str, says: str,
                                                 declare: dict[str, set[str]]) -> None:
    files = dict(CLEAN)
    files[path] = files[path] + extra
    if says == "import circle":
        files["worker/hetero_worker/trainer.py"] += "import hetero_worker\n"
    found = violations(_write(tmp_path, files), {**CLEAN_DISPATCHES, **declare})
    assert any(says in v for v in found), found
