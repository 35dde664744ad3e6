"""Layering: pure planning code never imports kopf or kubernetes; the worker never imports the
operator package; the contract never imports torch.

The same rule as an import-linter contract, checked on the source (every import statement,
including ones inside functions) so it needs no extra tool.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "operator" / "hetero_operator"
WORKER = REPO / "worker" / "hetero_worker"
ADAPTERS = {"main.py", "runner.py", "k8s.py", "reconcile.py"}
"""The thin kopf/kubernetes adapter; everything else in hetero_operator is pure."""


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


PURE = sorted(p.name for p in OPERATOR.glob("*.py") if p.name not in ADAPTERS)


@pytest.mark.parametrize("module", PURE)
def test_pure_operator_module_imports_neither_kopf_nor_kubernetes(module: str) -> None:
    assert _imported_roots(OPERATOR / module) & {"kopf", "kubernetes"} == set()


def test_the_adapter_is_where_kopf_lives() -> None:
    assert "kopf" in _imported_roots(OPERATOR / "main.py")


@pytest.mark.parametrize("module", sorted(str(p.relative_to(WORKER)) for p in WORKER.rglob("*.py")))
def test_worker_never_imports_the_operator_framework(module: str) -> None:
    assert _imported_roots(WORKER / module) & {"kopf", "kubernetes"} == set()


@pytest.mark.parametrize("module", sorted(str(p.relative_to(WORKER)) for p in WORKER.rglob("*.py")))
def test_worker_never_imports_the_operator_package(module: str) -> None:
    """The worker image carries no planner: planning and supervising (``heterotrain run``) live in
    ``hetero_operator.embedded``; the worker only runs ranks."""
    assert "hetero_operator" not in _imported_roots(WORKER / module)


def test_the_embedded_runner_lives_on_the_operator_side() -> None:
    assert {"embedded.py", "report.py", "localnodes.py"} <= {p.name for p in OPERATOR.glob("*.py")}
    assert not {"embedded.py", "report.py", "localnodes.py"} & {p.name for p in WORKER.glob("*.py")}


def test_contract_is_torch_free_and_the_operator_renders_through_it() -> None:
    assert _imported_roots(WORKER / "contract.py") <= {"__future__", "json", "collections",
                                                      "dataclasses", "typing"}
    assert "hetero_worker" in _imported_roots(OPERATOR / "envrender.py")
