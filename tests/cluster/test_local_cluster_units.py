"""The pure parts of the local cluster's volumes, Service routing, queues and pod discovery
(issue 33 item 7); the real-cluster tests are in test_local_cluster_real.py."""

from __future__ import annotations

from pathlib import Path

import yaml
from realcluster import REPO

from hetero_operator.devcluster import monitoring, podsd, probes, queues, services, volumes


def test_rewrite_maps_paths_under_a_mount_path_once_and_leaves_others() -> None:
    mounts = [volumes.Mount("/checkpoints/digits", Path("/tmp/c/volumes/x")),
              volumes.Mount("/tmp", Path("/tmp/c/pods/p/volumes/tmp"))]
    assert volumes.rewrite("/checkpoints/digits/step-1", mounts) == "/tmp/c/volumes/x/step-1"
    assert volumes.rewrite("--ckpt=/checkpoints/digits", mounts) == "--ckpt=/tmp/c/volumes/x"
    assert volumes.rewrite("/tmp/a:/checkpoints/digits", mounts) == "/tmp/c/pods/p/volumes/tmp/a:/tmp/c/volumes/x"
    assert volumes.rewrite("/checkpoints/digitsx", mounts) == "/checkpoints/digitsx"
    assert volumes.rewrite("x/tmp", mounts) == "x/tmp"


def test_the_provisioner_serves_pending_claims_of_its_class_or_none_only() -> None:
    pvc = {"metadata": {"name": "c", "namespace": "n", "uid": "0123456789"},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}}},
           "status": {"phase": "Pending"}}
    assert volumes.wants_volume(pvc)
    assert not volumes.wants_volume({**pvc, "spec": {**pvc["spec"], "storageClassName": "fast-ssd"}})
    pv = volumes.persistent_volume(pvc, Path("/cl/volumes"))
    assert pv["spec"]["hostPath"]["path"] == "/cl/volumes/n_c_01234567"
    assert pv["spec"]["claimRef"]["uid"] == "0123456789" and pv["spec"]["capacity"] == {"storage": "2Gi"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]


def test_a_service_port_goes_to_the_remapped_port_of_a_running_endpoint() -> None:
    svc = {"spec": {"ports": [{"port": 8080, "targetPort": "metrics"}]}}
    pod = {"metadata": {"annotations": {"local.heterotrain.io/ports": '{"9000": 41234}'}},
           "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 9000}]}]},
           "status": {"phase": "Running"}}
    assert services.endpoint_port(svc, 8080, [pod]) == 41234
    assert services.endpoint_port(svc, 81, [pod]) is None
    assert services.endpoint_port(svc, 8080, [{**pod, "status": {"phase": "Pending"}}]) is None
    assert services.ADDRESS.search("wget http://op-metrics.ns.svc:8080/metrics").groups() == (
        "op-metrics", "ns", "8080")
    assert services.ADDRESS.search("digits-g0.digits.ns.svc:29500") is None  # a pod's name, not a Service's


def test_queues_cover_every_gpu_type_with_its_nodes_allocatable() -> None:
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    docs = queues.manifests(nodes)
    cq = next(d for d in docs if d["kind"] == "ClusterQueue")
    quotas = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}
              for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    assert quotas["tesla-t4"] == {"cpu": "15000m", "memory": "61440Mi", "nvidia.com/gpu": "2"}
    assert set(quotas) == {"nvidia-a100-sxm4-40gb", "tesla-v100-sxm2-16gb", "tesla-t4"}


def test_pod_discovery_makes_one_target_per_container_port_with_kubernetes_sd_labels() -> None:
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"app.k/x": "y"},
                        "annotations": {"local.heterotrain.io/named-ports": '{"metrics": 41001}'}},
           "spec": {"nodeName": "node-a", "containers": [{"name": "worker", "ports": [
               {"name": "metrics", "containerPort": 9480}, {"name": "metrics-1", "containerPort": 9481}]}]},
           "status": {"phase": "Running", "podIP": "127.0.0.1"}}
    groups = podsd.pod_targets([pod, {**pod, "status": {"phase": "Pending"}}])
    assert [g["targets"] for g in groups] == [["127.0.0.1:9480"], ["127.0.0.1:9481"]]
    labels = groups[1]["labels"]
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics-1"
    assert labels["__meta_kubernetes_pod_label_app_k_x"] == "y"
    assert labels["__meta_kubernetes_pod_annotation_local_heterotrain_io_named_ports"] == '{"metrics": 41001}'
    rules = monitoring.scrape_config("https://a", Path("/ca"), Path("/t"))["relabel_configs"]
    assert sum(r.get("target_label") == "__address__" and "regex" in r for r in rules) == monitoring.MAX_LOCAL_RANKS


def test_a_readiness_probe_is_polled_at_the_remapped_port_of_its_named_port() -> None:
    c = {"name": "operator", "ports": [{"name": "health", "containerPort": 8081}],
         "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}}}
    assert probes.readiness_url(c, {"8081": 45001}) == "http://127.0.0.1:45001/healthz"
    assert probes.readiness_url({"name": "w"}, {}) is None
    status = {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
              "containerStatuses": [{"name": "operator", "ready": True}]}
    held = probes.not_ready(status, {"operator"})
    assert [c["status"] for c in held["conditions"]] == ["False", "True"]
    assert held["containerStatuses"][0]["ready"] is False and status["containerStatuses"][0]["ready"] is True
