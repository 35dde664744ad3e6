"""The dev cluster's secrets are private from the moment they exist (issue 32, F10), without a
control plane: :mod:`hetero_operator.devcluster.private` and the certificates of
:mod:`hetero_operator.devcluster.pki` (real ``openssl``)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hetero_operator.devcluster import controlplane, pki, private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def wide_umask():
    """A umask that makes files 0644 and dirs 0755 (the default of most systems)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_secret_is_0600_before_its_first_byte_is_written(tmp_path, monkeypatch, wide_umask):
    seen = []
    write = os.write

    def spy(fd: int, data: bytes) -> int:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    path = private.write_secret(tmp_path / "tokens.csv", "tok,admin,admin,system:masters\n")
    assert seen == [0o600]
    assert _mode(path) == 0o600
    assert path.read_text() == "tok,admin,admin,system:masters\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.csv"]  # no temp file left


def test_a_secret_replacing_a_readable_file_is_a_new_0600_file(tmp_path, wide_umask):
    path = tmp_path / "kubeconfig"
    path.write_text("old")
    assert _mode(path) == 0o644
    with open(path) as held:  # a reader that opened the old file never sees the new secret
        private.write_secret(path, "new secret")
        assert held.read() == "old"
    assert _mode(path) == 0o600 and path.read_text() == "new secret"


def test_a_secret_never_follows_a_planted_temp_link(tmp_path, wide_umask):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    (tmp_path / ".kubeconfig.tmp").symlink_to(elsewhere)
    private.write_secret(tmp_path / "kubeconfig", "secret")
    assert elsewhere.read_text() == "untouched"
    assert (tmp_path / "kubeconfig").read_text() == "secret" and _mode(tmp_path / "kubeconfig") == 0o600


def test_the_cluster_dir_is_0700_new_or_from_before(tmp_path, wide_umask):
    new = private.private_dir(tmp_path / "a" / "cluster")
    assert _mode(new) == 0o700
    old = tmp_path / "old"
    old.mkdir()
    assert _mode(old) == 0o755
    assert _mode(private.private_dir(old)) == 0o700


def test_etcd_has_a_ca_of_its_own_and_every_key_is_0600(tmp_path, wide_umask):
    pdir = tmp_path / "pki"
    pki.ensure_ca(pdir)
    etcd = controlplane.etcd_pki(pdir / "etcd")
    assert _mode(pdir) == 0o700 and _mode(pdir / "etcd") == 0o700
    assert sorted(_mode(k) for k in (*pdir.glob("*.key"), *(pdir / "etcd").glob("*.key"))) == [0o600] * 4
    # the apiserver's client certificate verifies against etcd's CA, and not against the
    # cluster CA (whose CSR signer hands out certificates): only etcd's CA opens etcd
    client = str(etcd["etcd_client_crt"])
    assert _openssl("verify", "-CAfile", str(etcd["etcd_ca"]), client).returncode == 0
    assert _openssl("verify", "-CAfile", str(pdir / "ca.crt"), client).returncode != 0
    names = _openssl("x509", "-noout", "-subject", "-issuer", "-nameopt", "RFC2253", "-in", client).stdout.split("\n")
    assert names[:2] == ["subject=CN=kube-apiserver-etcd-client", "issuer=CN=heterotrain-local-etcd-ca"]


def _openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
