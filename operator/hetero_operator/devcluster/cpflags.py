"""Pure helpers of the local control plane: each component's flags and the admin kubeconfig.

No I/O here: :mod:`.controlplane` writes the files these name and starts the processes.
Ports are a mapping ``etcd_client``, ``etcd_peer``, ``apiserver``, ``controller_manager``,
``scheduler`` -> TCP port on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVICE_CIDR = "10.96.0.0/24"
"""Service ClusterIPs are allocated from here; nothing routes them (no kube-proxy)."""
SERVICE_IP = "10.96.0.1"
"""The ``kubernetes`` Service's ClusterIP (a SAN of the API server's certificate)."""
APISERVER_DNS = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local")
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMISSION_PLUGINS = ("NamespaceLifecycle", "LimitRanger", "ServiceAccount", "DefaultTolerationSeconds",
                     "Priority", "PodSecurity", "NodeRestriction", "TaintNodesByCondition",
                     "MutatingAdmissionWebhook", "ValidatingAdmissionPolicy", "ValidatingAdmissionWebhook",
                     "ResourceQuota")
"""Admission plugins enabled on the API server (Kubernetes runs them in its own fixed order)."""


@dataclass(frozen=True, kw_only=True)
class Paths:
    """Files of one cluster dir that the flags name."""

    dir: Path
    ca: Path
    ca_key: Path
    tls_crt: Path
    tls_key: Path
    sa_key: Path
    sa_pub: Path
    tokens: Path
    kubeconfig: Path
    etcd_ca: Path
    """etcd's own CA: it signs etcd's certificate and the one client certificate etcd takes."""
    etcd_crt: Path
    etcd_key: Path
    etcd_client_crt: Path
    """kube-apiserver's client certificate for etcd (``CN=kube-apiserver-etcd-client``)."""
    etcd_client_key: Path
    kubelet_client_crt: Path | None = None
    """kube-apiserver's client certificate for the kubelet's log endpoint
    (``CN=kube-apiserver-kubelet-client``, :mod:`.kubeletlogs`); None: no kubelet is verified."""
    kubelet_client_key: Path | None = None


def kubeconfig_text(server: str, ca: Path, token: str, *, user: str = "admin") -> str:
    """A kubeconfig (JSON, which is YAML) for ``server`` with a bearer token and the CA file."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "heterotrain-local",
        "clusters": [{"name": "heterotrain-local",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "heterotrain-local",
                      "context": {"cluster": "heterotrain-local", "user": user, "namespace": "default"}}],
    }, indent=2) + "\n"


def etcd_client_url(ports: Mapping[str, int]) -> str:
    """etcd's client URL (TLS; a client without a certificate of etcd's CA is refused)."""
    return f"https://127.0.0.1:{ports['etcd_client']}"


def etcd_args(p: Paths, ports: Mapping[str, int]) -> list[str]:
    """etcd: one member on loopback, TLS on the client and peer ports with client-certificate
    authentication against its own CA (any local user can reach 127.0.0.1, so a plain port would
    hand every object and Secret of the cluster to them); ``--unsafe-no-fsync`` (a throw-away
    test store: losing the last writes on a machine crash is fine, and fsync dominates its
    latency on a shared disk)."""
    client, peer = etcd_client_url(ports), f"https://127.0.0.1:{ports['etcd_peer']}"
    return ["--name=local", f"--data-dir={p.dir / 'etcd'}", f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=local={peer}",
            f"--cert-file={p.etcd_crt}", f"--key-file={p.etcd_key}", "--client-cert-auth=true",
            f"--trusted-ca-file={p.etcd_ca}", f"--peer-cert-file={p.etcd_crt}",
            f"--peer-key-file={p.etcd_key}", "--peer-client-cert-auth=true",
            f"--peer-trusted-ca-file={p.etcd_ca}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296"]


def apiserver_args(p: Paths, ports: Mapping[str, int], verbosity: int = 0) -> list[str]:
    """kube-apiserver: secure port on 127.0.0.1, etcd over TLS with its client certificate,
    static admin token and client-cert auth,
    Node + RBAC authorization, service-account tokens, the admission plugins of
    :data:`ADMISSION_PLUGINS`, aggregator routing to endpoints (no kube-proxy here)."""
    return [f"--etcd-servers={etcd_client_url(ports)}", f"--etcd-cafile={p.etcd_ca}",
            f"--etcd-certfile={p.etcd_client_crt}", f"--etcd-keyfile={p.etcd_client_key}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={p.tls_crt}", f"--tls-private-key-file={p.tls_key}", f"--client-ca-file={p.ca}",
            f"--token-auth-file={p.tokens}", "--authorization-mode=Node,RBAC", "--anonymous-auth=true",
            f"--service-account-key-file={p.sa_pub}", f"--service-account-signing-key-file={p.sa_key}",
            f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
            "--enable-aggregator-routing=true", "--profiling=false", "--event-ttl=2h",
            "--max-requests-inflight=800", "--max-mutating-requests-inflight=400", f"-v={verbosity}",
            *kubelet_args(p)]


def kubelet_args(p: Paths) -> list[str]:
    """How kube-apiserver reaches the local kubelet (``pods/log``, ``kubectl logs``): at the
    Node's InternalIP (127.0.0.1; a Hostname such as ``node-a100`` resolves nowhere), verifying
    the kubelet's certificate with the cluster CA and showing its own client certificate."""
    if p.kubelet_client_crt is None or p.kubelet_client_key is None:
        return ["--kubelet-preferred-address-types=InternalIP"]
    return ["--kubelet-preferred-address-types=InternalIP", f"--kubelet-certificate-authority={p.ca}",
            f"--kubelet-client-certificate={p.kubelet_client_crt}",
            f"--kubelet-client-key={p.kubelet_client_key}"]


def controller_manager_args(p: Paths, ports: Mapping[str, int], *, grace_s: int, period_s: int,
                            verbosity: int = 0) -> list[str]:
    """kube-controller-manager: every default controller (garbage collector, namespace, node
    lifecycle with a grace of ``grace_s`` seconds checked every ``period_s``, service account and
    its tokens, resource quota, deployment/replicaset, ...), each with its own service account."""
    return [f"--kubeconfig={p.kubeconfig}", f"--authentication-kubeconfig={p.kubeconfig}",
            f"--authorization-kubeconfig={p.kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={ports['controller_manager']}", f"--cert-dir={p.dir / 'pki' / 'kcm'}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p.sa_key}", f"--root-ca-file={p.ca}",
            f"--cluster-signing-cert-file={p.ca}", f"--cluster-signing-key-file={p.ca_key}",
            f"--node-monitor-grace-period={grace_s}s", f"--node-monitor-period={period_s}s",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--controllers=*",
            "--concurrent-gc-syncs=10", "--resource-quota-sync-period=10s", f"-v={verbosity}"]


def scheduler_args(p: Paths, ports: Mapping[str, int], verbosity: int = 0) -> list[str]:
    """kube-scheduler: the default profile (node affinity, taints, resource fit incl. nvidia.com/gpu)."""
    return [f"--kubeconfig={p.kubeconfig}", f"--authentication-kubeconfig={p.kubeconfig}",
            f"--authorization-kubeconfig={p.kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={ports['scheduler']}", f"--cert-dir={p.dir / 'pki' / 'scheduler'}",
            "--leader-elect=false", f"-v={verbosity}"]
