"""The worker's floors, checked on the source (issue 28, item 6): every module of
``hetero_worker`` imports only from its own floor or lower ones, and no import circle runs between
its files.

Floors, lowest first (:data:`FLOORS`)::

    runtime  <  comm  <  speed, memory  <  data  <  ckpt  <  trainer  <  examples

* ``runtime``: a rank's life outside training (launch, rendezvous, preflight, shutdown, simulated
  devices, the rank log, the stop-agreement interval), the metrics exporter, the profiler and
  experiment tracking;
* ``comm``: process groups, the communicator plan, the gradient sync, collectives, agreement
  across ranks (:mod:`hetero_worker.comm.agree`), and the precision policy (its skip decision is
  an agreement);
* ``speed``, ``memory`` and ``stages`` side by side (rebalancing, stealing, codecs, the measured
  hierarchy; memory caps, micro-batches, sharding, the model part; pipeline stages);
* ``data``: the split and the data position (position, sampler, streaming, the data part in
  loading) and the step count;
* ``ckpt``: checkpoints, resume, the checkpoint manager over the parts;
* ``trainer``: the Trainer and its stepping, efficiency-window, graceful-stop, elastic
  membership and pipeline parts, and the attributes it shows of them;
* ``examples``: scripts that use the Trainer.

Every import statement counts, also one inside a function. The checker takes module sources, so a
test shows it failing on a synthetic module with a forbidden import.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "worker" / "hetero_worker"
FLOORS = {
    "runtime": 0, "metrics": 0, "profiling": 0, "tracking": 0,
    "comm": 1, "precision": 1,
    "speed": 2, "memory": 2, "stages": 2,
    "position": 3, "sampler": 3, "streaming": 3, "loading": 3, "steps": 3,
    "ckpt": 4,
    "efficiency": 5, "stepping": 5, "stop": 5, "trainer": 5, "membership": 5, "pipelinepart": 5,
    "partattr": 5,
    "examples": 6,
}
"""Floor of each top-level module or sub-package of ``hetero_worker`` (the package's
``__init__`` imports nothing and stands below all)."""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``hetero_worker.comm.sync`` for ``<root>/comm/sync.py`` (``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["hetero_worker", *parts])


def floor_of(module: str) -> int:
    """The floor of ``hetero_worker[.x[...]]``; -1 for the package itself.

    Raises:
        KeyError: a module no floor names (add it to :data:`FLOORS`).
    """
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    return FLOORS[parts[1]]


def imports_of(source: str, module: str) -> set[str]:
    """The ``hetero_worker`` modules ``source`` (of ``module``) imports, anywhere in it; a name
    imported from a package (``from hetero_worker.ckpt import store``) counts as its module."""
    found: set[str] = set()
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "hetero_worker")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])
            if base.split(".")[0] != "hetero_worker":
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in _ALL_MODULES or base == "hetero_worker"
                          else base)
    return found


def sources(root: Path = PACKAGE) -> dict[str, str]:
    """Every module of the package: name -> source."""
    return {module_name(p, root): p.read_text() for p in sorted(root.rglob("*.py"))}


_ALL_MODULES = set(sources())


def violations(modules: Mapping[str, str]) -> list[str]:
    """``"a imports b (floor x > floor y)"`` for each import from a higher floor."""
    found = []
    for module, source in sorted(modules.items()):
        mine = floor_of(module)
        for target in sorted(imports_of(source, module)):
            if floor_of(target) > mine:
                found.append(f"{module} (floor {mine}) imports {target} (floor {floor_of(target)})")
    return found


def circles(modules: Mapping[str, str]) -> list[list[str]]:
    """Import circles between the modules (each as the path that closes it)."""
    graph = {m: sorted(t for t in imports_of(s, m) if t in modules and t != m)
             for m, s in modules.items()}
    found, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state[nxt] == 1:
                found.append(path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt])
            elif state[nxt] == 0:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node, [])
    return found


def test_every_module_has_a_floor() -> None:
    unnamed = sorted(m for m in sources() if m.count(".") and m.split(".")[1] not in FLOORS)
    assert unnamed == []


def test_the_worker_imports_only_downwards() -> None:
    assert violations(sources()) == []


def test_no_import_circle_between_the_worker_files() -> None:
    assert circles(sources()) == []


def test_the_floors_are_in_the_declared_order() -> None:
    order = ["runtime", "comm", "speed", "data", "ckpt", "trainer", "examples"]
    levels = [FLOORS[name] for name in ("runtime", "comm", "speed", "loading", "ckpt",
                                        "trainer", "examples")]
    assert levels == sorted(levels) == list(range(len(order)))
    assert FLOORS["memory"] == FLOORS["speed"]


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("hetero_worker.comm.sync", "from hetero_worker.trainer import Trainer\n",
     ["hetero_worker.comm.sync (floor 1) imports hetero_worker.trainer (floor 5)"]),
    ("hetero_worker.runtime.launch",
     "def f():\n    from hetero_worker.ckpt import checkpoint\n    return checkpoint\n",
     ["hetero_worker.runtime.launch (floor 0) imports hetero_worker.ckpt.checkpoint (floor 4)"]),
    ("hetero_worker.speed.rebalance", "import hetero_worker.memory.caps\n", []),
    ("hetero_worker.ckpt.resume", "from hetero_worker.loading import TrainData\n", []),
], ids=["a sync importing the trainer", "an import inside a function", "a side-by-side floor",
        "a lower floor"])
def test_the_checker_fails_on_a_forbidden_import(module: str, source: str,
                                                 expected: list[str]) -> None:
    tree = dict(sources())
    tree[module] = source
    assert violations(tree) == expected


def test_the_checker_finds_a_circle() -> None:
    tree = {"hetero_worker.comm.a": "from hetero_worker.comm import b\n",
            "hetero_worker.comm.b": "import hetero_worker.comm.a\n"}
    global _ALL_MODULES
    known, _ALL_MODULES = _ALL_MODULES, _ALL_MODULES | set(tree)
    try:
        assert circles(tree) == [["hetero_worker.comm.a", "hetero_worker.comm.b",
                                  "hetero_worker.comm.a"]]
    finally:
        _ALL_MODULES = known
