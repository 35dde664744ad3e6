"""Session fixtures of the real-control-plane tests: one cluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, local kubelet) per session, Kueue on first use, one
operator in process.  The binaries come from scripts/build-controlplane.sh: if they cannot be
built, every test here errors (no skip)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realcluster import RealCluster  # noqa: E402

from hetero_operator.api.settings import OperatorConfig  # noqa: E402

CONFIG = OperatorConfig(peering="", metrics_port=0, health_port=0, simulate_devices=True,
                        resync_s=1.0, progress_interval_s=0.3, backoff_base_s=0.3, backoff_max_s=1.0,
                        unschedulable_retry_s=1.0,
                        # an int: the real API server refuses ``timeoutSeconds=300.0`` (400 BadRequest)
                        watch_server_timeout_s=300)


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The session's real control plane (no operator)."""
    cluster = RealCluster(tmp_path_factory.mktemp("realcluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def operator(real: RealCluster) -> RealCluster:
    """The cluster with the operator running (kopf in process, :data:`CONFIG`)."""
    if real._operator is None:
        real.start_operator(CONFIG)
    return real


@pytest.fixture(scope="session")
def kueue(operator: RealCluster) -> RealCluster:
    """The cluster with Kueue's manager running too (started once, on first use)."""
    operator.start_kueue()
    return operator


@pytest.fixture
def cluster(operator: RealCluster) -> Iterator[RealCluster]:
    """The operator's cluster, idle before each test; the operator running after it."""
    if operator._operator is None:
        operator.start_operator(CONFIG)
    operator.idle()
    yield operator
    if operator._operator is None:
        operator.start_operator(CONFIG)
