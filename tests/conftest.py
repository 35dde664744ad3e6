"""Shared test helpers: the repository root, a free port, the session's Prometheus server, and
the ``fresh_process`` marker (a test run in a Python process of its own).

Keep this file small: area-specific fixtures live next to their tests.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prom.fixtures import prometheus  # noqa: F401  (session fixture: a real Prometheus server)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the directory holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture
def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _private_learned_speeds(monkeypatch: pytest.MonkeyPatch,
                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test gets its own ``XDG_CACHE_HOME``: ``heterotrain run``/``plan`` keep learned speeds
    in ``$XDG_CACHE_HOME/heterotrain/profiles.json``, and one test's run must not steer another's
    plan (subprocesses inherit the variable). The extracted test tools (helm, Prometheus) stay in
    the shared cache through ``HETEROTRAIN_CACHE_DIR``."""

    if not os.environ.get("HETEROTRAIN_CACHE_DIR"):
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        monkeypatch.setenv("HETEROTRAIN_CACHE_DIR", os.path.join(xdg, "heterotrain"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


FRESH_PROCESS_ENV = "HTJ_TEST_IN_FRESH_PROCESS"
"""Set in the pytest process that runs a ``fresh_process`` test (so it runs there, not again)."""
FRESH_PROCESS_TIMEOUT_S = 240
"""The inner pytest's own limit per test is 180 s (``-o timeout``), under the suite's 300 s, so a
hang there is reported with its stacks before the outer test times out."""


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a test marked ``fresh_process`` in a new pytest process (fork-started DataLoader
    workers: forked from a process fresh as a rank's is, not from the suite's process that has run
    a thousand tests and their threads; twice one hung there, never alone, cause not found)."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(FRESH_PROCESS_ENV):
        return None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=180", "-n", "0",
         pyfuncitem.nodeid], cwd=pyfuncitem.config.rootpath, capture_output=True, text=True,
        env={**os.environ, FRESH_PROCESS_ENV: "1"}, timeout=FRESH_PROCESS_TIMEOUT_S)
    assert done.returncode == 0, (f"{pyfuncitem.nodeid} in a fresh process: exit "
                                  f"{done.returncode}\n{done.stdout[-8000:]}{done.stderr[-3000:]}")
    assert re.search(r"(^|\s)1 passed", done.stdout), done.stdout[-3000:]  # not skipped
    return True


SERIAL_GROUPS = {"cluster": "real control plane"}
"""Test folders whose tests share one xdist worker (``addopts``: ``-n 2``), by folder -> why:
``tests/cluster``'s package fixture is one real control plane (etcd, kube-apiserver,
controller-manager, scheduler, Kueue), started once and reused by its tests; split over two
workers it would run twice on the machine's two cores."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler with each of :data:`SERIAL_GROUPS`' folders one unit of work, every
    other test a unit of its own. ``--dist loadgroup`` with ``xdist_group`` marks would say the
    same, but pytest-xdist 3.8.0 marks the group in ``Item._nodeid``, which pytest 9.2's
    structured node ids no longer read (pytest-dev/pytest-xdist#1386, open): the tests spread."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/", 2)
            folder = parts[1] if len(parts) == 3 and parts[0] == "tests" else ""
            return f"tests/{folder}" if folder in SERIAL_GROUPS else nodeid

    return FolderGroups(config, log)
