"""Fixtures of the real-control-plane tests: one cluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, local kubelet) for this package, stopped when its last
test is done (package scope: the rest of the suite runs without it), Kueue on first use, one
operator in process.  The binaries come from scripts/build-controlplane.sh: if they cannot be
built, every test here errors (no skip)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realcluster import CONFIG, RealCluster  # noqa: E402


@pytest.fixture(scope="package")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """This package's real control plane (no operator)."""
    cluster = RealCluster(tmp_path_factory.mktemp("realcluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def operator(real: RealCluster) -> RealCluster:
    """The cluster with the operator running (kopf in process, ``realcluster.CONFIG``)."""
    if real._operator is None:
        real.start_operator(CONFIG)
    return real


@pytest.fixture(scope="package")
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
