"""Certificates and keys of the local control plane, made with the ``openssl`` command line.

One CA signs every serving certificate (kube-apiserver, Kueue's webhook server); etcd has a CA
of its own (``pki/etcd/``, as kubeadm does) that signs etcd's certificate and the one client
certificate etcd accepts (kube-apiserver's), so no certificate the cluster CA signs (the
controller-manager signs CSRs with it) opens etcd.  The service account signing key is a separate
RSA key pair.  Files are made once and kept: a cluster dir that already has them is reused as it
is.  Every file is made under umask 077 in a 0700 dir (:mod:`.private`): keys are 0600 from the
start.

Errors: :class:`PkiError` when ``openssl`` is missing or fails (its stderr in the message).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .private import UMASK, private_dir

DAYS = 3650
"""Validity of every certificate, days (a local test cluster; not for anything real)."""


class PkiError(RuntimeError):
    """``openssl`` is missing or one of its commands failed."""


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PkiError("openssl not found on PATH (Debian: apt-get install openssl)")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False,
                          umask=UMASK)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()[-800:]}")


def ensure_ca(pki: Path, *, cn: str = "heterotrain-local-ca") -> tuple[Path, Path]:
    """``ca.crt``/``ca.key`` in ``pki`` (EC P-256, subject ``CN=<cn>``), made if absent in a
    0700 ``pki``; returns their paths."""
    private_dir(pki)
    crt, key = pki / "ca.crt", pki / "ca.key"
    if not (crt.exists() and key.exists()):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", key.name, "-out", crt.name, "-days", str(DAYS),
                 "-subj", f"/CN={cn}", cwd=pki)
    return crt, key


def ensure_serving_cert(pki: Path, name: str, *, ips: Sequence[str] = ("127.0.0.1",),
                        dns: Sequence[str] = ("localhost",)) -> tuple[Path, Path]:
    """``<name>.crt``/``<name>.key`` signed by ``pki``'s CA, with the given IP and DNS SANs (for
    serving; usable as a client certificate too)."""
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{d}" for d in dns)])
    return _ensure_cert(pki, name, f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n")


def ensure_client_cert(pki: Path, name: str) -> tuple[Path, Path]:
    """``<name>.crt``/``<name>.key`` signed by ``pki``'s CA, subject ``CN=<name>``, for client
    authentication only (no SANs: it serves nothing)."""
    return _ensure_cert(pki, name, "extendedKeyUsage=clientAuth\n")


def _ensure_cert(pki: Path, name: str, extensions: str) -> tuple[Path, Path]:
    ca_crt, ca_key = ensure_ca(pki)
    crt, key = pki / f"{name}.crt", pki / f"{name}.key"
    if crt.exists() and key.exists():
        return crt, key
    ext = pki / f"{name}.ext"
    ext.write_text(f"{extensions}keyUsage=critical,digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key.name, "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=pki)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca_crt.name, "-CAkey", ca_key.name,
             "-CAcreateserial", "-out", crt.name, "-days", str(DAYS), "-extfile", ext.name, cwd=pki)
    return crt, key


def ensure_service_account_key(pki: Path) -> tuple[Path, Path]:
    """``sa.key`` (RSA 2048, signs service account tokens) and ``sa.pub`` (verifies them)."""
    private_dir(pki)
    key, pub = pki / "sa.key", pki / "sa.pub"
    if not (key.exists() and pub.exists()):
        _openssl("genrsa", "-out", key.name, "2048", cwd=pki)
        _openssl("rsa", "-in", key.name, "-pubout", "-out", pub.name, cwd=pki)
    return key, pub
