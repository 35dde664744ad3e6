"""The local kubelet's stand-in for a pod's projected service-account token: a kubeconfig with a
TokenRequest token of the pod's service account, handed to the pod's processes in ``$KUBECONFIG``
(the process runs on the host, where ``/var/run/secrets/...`` cannot be its own: docs/cluster.md).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .cpflags import kubeconfig_text
from .kubeapi import Api, ApiError
from .private import write_secret

TOKEN_EXPIRATION_S = 3600
"""The TokenRequest's ``expirationSeconds`` (1 h)."""


async def pod_kubeconfig(api: Api, pod_dir: Path, key: tuple[str, str], pod: Mapping[str, Any]) -> Path | None:
    """A kubeconfig (0600, ``<pod_dir>/<ns>_<pod>.kubeconfig``) with a TokenRequest token of the
    pod's service account bound to the pod, when the pod mounts one; ``None`` when
    ``automountServiceAccountToken`` is false or the API server gives no token (logged)."""
    spec = pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return None
    sa = spec.get("serviceAccountName") or "default"
    try:
        answer = await api.create(
            f"/api/v1/namespaces/{key[0]}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "expirationSeconds": TOKEN_EXPIRATION_S, "boundObjectRef": {
                    "kind": "Pod", "apiVersion": "v1", "name": key[1], "uid": pod["metadata"]["uid"]}}})
    except ApiError as exc:
        print(f"kubelet: no token for {key}: {exc}", file=sys.stderr, flush=True)
        return None
    path = pod_dir / f"{key[0]}_{key[1]}.kubeconfig"
    return write_secret(path, kubeconfig_text(api.server, api.ca or Path(""), answer["status"]["token"],
                                              user=f"system:serviceaccount:{key[0]}:{sa}"))
