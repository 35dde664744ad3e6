"""Pytest fixtures around :class:`prom.prometheus_server.PrometheusServer` (imported by conftest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prom.prometheus_server import PrometheusServer, find_binary


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One real Prometheus server for the whole session, on 127.0.0.1 and a free port.

    It scrapes nothing until a test calls ``prometheus.set_targets([...])``; a test that changes
    the targets or rule files owns them until the next test sets its own.
    """
    binary = find_binary()
    if binary is None:
        pytest.fail("prometheus is not installed: run `bash scripts/setup.sh --test` "
                    "(Debian package `prometheus`)")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), binary=binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
