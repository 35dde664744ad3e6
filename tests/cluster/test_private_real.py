"""The dev cluster is private to its user, on the real control plane (issue 32, F10): etcd takes
no client without a certificate of its own CA, the cluster dir is 0700 and its secrets 0600."""

from __future__ import annotations

import json
import ssl
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from realcluster import RealCluster

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _etcd_health(url: str, ca: Path, cert: tuple[Path, Path] | None = None) -> dict:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    with urllib.request.urlopen(f"{url}/health", timeout=10, context=ctx) as resp:
        return json.loads(resp.read())


def test_etcd_refuses_a_client_without_its_certificate(real: RealCluster) -> None:
    port = real.state["ports"]["etcd_client"]
    etcd = real.dir.resolve() / "pki" / "etcd"
    ca, client = etcd / "ca.crt", (etcd / "kube-apiserver-etcd-client.crt",
                                   etcd / "kube-apiserver-etcd-client.key")
    # the API server's certificate opens it: the port is up and healthy
    assert _etcd_health(f"https://127.0.0.1:{port}", ca, client)["health"] == "true"
    # TLS without a client certificate: the handshake (or, with TLS 1.3, the first read) fails
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _etcd_health(f"https://127.0.0.1:{port}", ca)
    # a certificate of the cluster CA (what the CSR signer hands out) is no etcd client either
    cluster_ca = real.dir.resolve() / "pki"
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _etcd_health(f"https://127.0.0.1:{port}", ca, (cluster_ca / "kube-apiserver.crt",
                                                       cluster_ca / "kube-apiserver.key"))
    # plain HTTP, as etcd was reached before: the TLS-only port closes the connection unanswered
    with pytest.raises(ConnectionError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10)


def test_the_cluster_dir_is_0700_and_its_secrets_0600(real: RealCluster) -> None:
    root = real.dir.resolve()
    assert _mode(root) == 0o700
    assert _mode(root / "pki") == 0o700 and _mode(root / "pki" / "etcd") == 0o700
    assert _mode(root / "tokens.csv") == 0o600 and _mode(root / "kubeconfig") == 0o600
    keys = {str(k.relative_to(root)): _mode(k) for k in root.glob("pki/**/*.key")}
    assert {"pki/ca.key", "pki/kube-apiserver.key", "pki/sa.key", "pki/etcd/ca.key", "pki/etcd/etcd.key",
            "pki/etcd/kube-apiserver-etcd-client.key"} <= set(keys)
    assert set(keys.values()) == {0o600}, keys
