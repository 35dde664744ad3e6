"""The pure helpers of hetero_operator.local (no control plane needed): flags, env, status, manifests."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from hetero_operator.devcluster import cpflags, kueue, podenv


def test_cluster_dns_names_of_the_namespace_become_the_pod_ip() -> None:
    assert podenv.resolve_dns("digits-g0.digits.train.svc", "train") == "127.0.0.1"
    assert podenv.resolve_dns("tcp://j-g0.j.train.svc.cluster.local:29500", "train") == "tcp://127.0.0.1:29500"
    assert podenv.resolve_dns("digits-g0.digits.other.svc", "train") == "digits-g0.digits.other.svc"


def test_container_env_resolves_field_refs_expands_vars_and_remaps_ports() -> None:
    pod = {"metadata": {"name": "j-g0", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
           "spec": {"nodeName": "node-a100"}}
    container = {"env": [
        {"name": "MASTER_ADDR", "value": "j-g0.j.ns.svc"}, {"name": "MASTER_PORT", "value": "29500"},
        {"name": "LOCAL_WORLD_SIZE", "value": "2"}, {"name": "HTJ_METRICS_PORT", "value": "9480"},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "BOTH", "value": "$(NAME)@$(IP)"}]}
    asked: list[tuple[str, int]] = []

    def port_for(name: str, count: int) -> int:
        asked.append((name, count))
        return 40000 if name == "MASTER_PORT" else 41000
    env = podenv.container_env(pod, container, {"PATH": "/bin"}, lookup=lambda *_: None, port_for=port_for)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HTJ_METRICS_PORT"]) == ("127.0.0.1", "40000", "41000")
    assert (env["NAME"], env["LABEL"], env["IP"], env["BOTH"]) == ("j-g0", "b", "127.0.0.1", "j-g0@127.0.0.1")
    assert sorted(asked) == [("HTJ_METRICS_PORT", 2), ("MASTER_PORT", 1)]


def test_node_status_adds_the_kubelets_pod_capacity_and_ready() -> None:
    status = podenv.node_status({"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": "2"}}})
    assert status["allocatable"] == {"pods": "110", "nvidia.com/gpu": "2"}
    assert [c["type"] for c in status["conditions"] if c["status"] == "True"] == ["Ready"]


def test_terminated_status_reports_exit_codes_and_phase() -> None:
    pod = {"spec": {"containers": [{"name": "worker", "image": "img"}]}}
    ok = podenv.terminated_status(pod, {"worker": 0}, {}, {})
    bad = podenv.terminated_status(pod, {"worker": 137}, {}, {})
    assert ok["phase"] == "Succeeded" and bad["phase"] == "Failed"
    assert bad["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_kubeconfig_and_flags_name_the_cluster_files(tmp_path: Path) -> None:
    cfg = json.loads(cpflags.kubeconfig_text("https://127.0.0.1:6443", tmp_path / "ca.crt", "tok"))
    assert cfg["users"][0]["user"] == {"token": "tok"}
    paths = cpflags.Paths(dir=tmp_path, ca=tmp_path / "ca.crt", ca_key=tmp_path / "ca.key", tls_crt=tmp_path / "s.crt",
                          tls_key=tmp_path / "s.key", sa_key=tmp_path / "sa.key", sa_pub=tmp_path / "sa.pub",
                          tokens=tmp_path / "t.csv", kubeconfig=tmp_path / "kubeconfig",
                          etcd_ca=tmp_path / "e-ca.crt", etcd_crt=tmp_path / "e.crt", etcd_key=tmp_path / "e.key",
                          etcd_client_crt=tmp_path / "ec.crt", etcd_client_key=tmp_path / "ec.key")
    ports = {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3, "controller_manager": 4, "scheduler": 5}
    api = cpflags.apiserver_args(paths, ports)
    assert [a for a in api if a.startswith("--etcd-")] == [
        "--etcd-servers=https://127.0.0.1:1", f"--etcd-cafile={tmp_path / 'e-ca.crt'}",
        f"--etcd-certfile={tmp_path / 'ec.crt'}", f"--etcd-keyfile={tmp_path / 'ec.key'}"]
    etcd = cpflags.etcd_args(paths, ports)
    assert {"--listen-client-urls=https://127.0.0.1:1", "--listen-peer-urls=https://127.0.0.1:2",
            "--client-cert-auth=true", "--peer-client-cert-auth=true",
            f"--trusted-ca-file={tmp_path / 'e-ca.crt'}", f"--peer-trusted-ca-file={tmp_path / 'e-ca.crt'}",
            f"--cert-file={tmp_path / 'e.crt'}", f"--key-file={tmp_path / 'e.key'}"} <= set(etcd)
    assert not [a for a in etcd if "http://" in a]
    assert "--authorization-mode=Node,RBAC" in api and "--secure-port=3" in api
    assert any(a.startswith("--enable-admission-plugins=") and "PodSecurity" in a and "ResourceQuota" in a for a in api)
    kcm = cpflags.controller_manager_args(paths, ports, grace_s=10, period_s=1)
    assert "--node-monitor-grace-period=10s" in kcm and "--use-service-account-credentials=true" in kcm


def test_kueue_webhooks_call_loopback_urls_with_the_cluster_ca() -> None:
    docs = kueue.manifests(kueue.module_dir(), 9443, b"PEM")
    hooks = [h for d in docs if d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
    assert hooks and all(h["clientConfig"]["url"].startswith("https://127.0.0.1:9443/") for h in hooks)
    assert all(base64.b64decode(h["clientConfig"]["caBundle"]) == b"PEM" for h in hooks)
    groups = {g for h in hooks for r in h["rules"] for g in r["apiGroups"]}
    assert groups <= kueue.WEBHOOK_GROUPS and "kueue.x-k8s.io" in groups
    workloads = next(d for d in docs if d["kind"] == "CustomResourceDefinition"
                     and d["metadata"]["name"] == "workloads.kueue.x-k8s.io")
    assert workloads["spec"]["conversion"]["webhook"]["clientConfig"]["url"] == "https://127.0.0.1:9443/convert"
    assert "v1beta2" in {v["name"] for v in workloads["spec"]["versions"] if v["served"]}


def test_the_api_server_reaches_kubelets_at_their_internal_ip_with_certificates(tmp_path: Path) -> None:
    base = dict(dir=tmp_path, ca=tmp_path / "ca.crt", ca_key=tmp_path / "ca.key", tls_crt=tmp_path / "s.crt",
                tls_key=tmp_path / "s.key", sa_key=tmp_path / "sa.key", sa_pub=tmp_path / "sa.pub",
                tokens=tmp_path / "t.csv", kubeconfig=tmp_path / "kubeconfig", etcd_ca=tmp_path / "e-ca.crt",
                etcd_crt=tmp_path / "e.crt", etcd_key=tmp_path / "e.key", etcd_client_crt=tmp_path / "ec.crt",
                etcd_client_key=tmp_path / "ec.key")
    assert cpflags.kubelet_args(cpflags.Paths(**base)) == ["--kubelet-preferred-address-types=InternalIP"]
    paths = cpflags.Paths(**base, kubelet_client_crt=tmp_path / "kc.crt", kubelet_client_key=tmp_path / "kc.key")
    ports = {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3, "controller_manager": 4, "scheduler": 5}
    assert [a for a in cpflags.apiserver_args(paths, ports) if a.startswith("--kubelet-")] == [
        "--kubelet-preferred-address-types=InternalIP", f"--kubelet-certificate-authority={tmp_path / 'ca.crt'}",
        f"--kubelet-client-certificate={tmp_path / 'kc.crt'}", f"--kubelet-client-key={tmp_path / 'kc.key'}"]
