"""Image platforms (``os/arch[/variant]``, as OCI image indexes and ``docker buildx --platform``
write them) and the platform of a node (pure).

A worker image runs only on nodes of a platform it is built for: an amd64-only image on an arm64
node (a GH200's Grace CPU) fails at pull (``no matching manifest for linux/arm64 in the manifest
list entries``) or at start (``exec format error``); shared case 53.  The GPU side cannot tell: a
GH200 has cc 9.0, 96 GB and the same driver labels as an x86 H100.

A ``spec.images[]`` entry lists the platforms it is built for in ``platforms``; left out it is
:data:`DEFAULT_PLATFORMS` (``linux/amd64``): what ``scripts/build-images.sh`` builds by default,
what the CUDA PyTorch images most catalogs start from publish (``pytorch/pytorch`` has no arm64
CUDA manifest), and what every existing catalog was built for.  A multi-arch image (one index with
an amd64 and an arm64 manifest) lists both.

A node's platform is its ``kubernetes.io/os`` / ``kubernetes.io/arch`` labels, which the kubelet
sets from the Go runtime (``GOOS``/``GOARCH``: ``amd64``, ``arm64``, never ``x86_64`` or
``aarch64``).  A node without the arch label has an unknown platform, and any image may go there
(as an image choice by CUDA skips the check when the driver version is unknown).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

DEFAULT_PLATFORMS = ("linux/amd64",)
"""Platforms of a ``spec.images[]`` entry that does not say (and of the operator's default images)."""
OS_LABEL = "kubernetes.io/os"
ARCH_LABEL = "kubernetes.io/arch"
KNOWN_OS = ("linux", "windows")
"""Operating systems a node reports (GPU nodes: linux)."""
KNOWN_ARCHS = ("386", "amd64", "arm", "arm64", "loong64", "mips64le", "ppc64le", "riscv64", "s390x")
"""``GOARCH`` values a Kubernetes node reports in ``kubernetes.io/arch``."""
ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64",
                "armv8": "arm64", "arm64v8": "arm64", "i386": "386", "i686": "386"}
"""Names ``uname -m`` and distributions use, with the name Kubernetes and OCI use instead."""
_VARIANT = re.compile(r"^[a-z0-9]{1,8}$")


def parse_platform(text: object, path: str) -> str:
    """``"linux/arm64"`` (or ``"linux/arm64/v8"``) as given, checked.

    Raises:
        ValueError: ``"<path>: ..."`` naming what is wrong and the spelling to use (``x86_64`` ->
            ``linux/amd64``, ``aarch64`` -> ``linux/arm64``).
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"{path}: entries are strings such as \"linux/arm64\", got {text!r}")
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        hint = f"; did you mean \"linux/{ARCH_ALIASES.get(text, text)}\"?" if len(parts) == 1 else ""
        raise ValueError(f"{path}: must be os/arch[/variant] such as \"linux/amd64\" or "
                         f"\"linux/arm64\", got {text!r}{hint}")
    os_name, arch = parts[0], parts[1]
    if os_name not in KNOWN_OS:
        raise ValueError(f"{path}: unknown os {os_name!r} in {text!r}; use one of "
                         f"{', '.join(KNOWN_OS)} (the node label {OS_LABEL})")
    if arch not in KNOWN_ARCHS:
        alias = ARCH_ALIASES.get(arch.lower())
        fix = (f"Kubernetes and OCI call it {alias}: write \"{os_name}/{alias}\"" if alias else
               f"use one of {', '.join(KNOWN_ARCHS)}")
        raise ValueError(f"{path}: unknown architecture {arch!r} in {text!r}; {fix} (the node "
                         f"label {ARCH_LABEL})")
    if len(parts) == 3 and not _VARIANT.match(parts[2]):
        raise ValueError(f"{path}: the variant of {text!r} must be 1-8 lowercase letters or digits "
                         "such as v8 (or leave it out: linux/arm64)")
    return text


def node_platform(labels: Mapping[str, str]) -> str | None:
    """``"linux/arm64"`` from a node's labels; None when ``kubernetes.io/arch`` is missing."""
    arch = str(labels.get(ARCH_LABEL) or "")
    if not arch:
        return None
    return f"{labels.get(OS_LABEL) or 'linux'}/{arch}"


def runs_on(platforms: Iterable[str], node: str | None) -> bool:
    """Whether an image built for ``platforms`` runs on a node of platform ``node`` (``os/arch``;
    None: unknown, anything goes).  A variant (``linux/arm64/v8``) matches its ``os/arch``."""
    if node is None:
        return True
    return any("/".join(p.split("/")[:2]) == node for p in platforms)
