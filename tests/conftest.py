"""Shared test helpers: the repository root, a free port, the session's Prometheus server.

Keep this file small: area-specific fixtures live next to their tests.
"""

from __future__ import annotations

import socket
from pathlib import Path

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
    import os

    if not os.environ.get("HETEROTRAIN_CACHE_DIR"):
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        monkeypatch.setenv("HETEROTRAIN_CACHE_DIR", os.path.join(xdg, "heterotrain"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
