"""Pods and Service rendered from a plan: names, env contract, GPU requests, affinity, labels.

Plans come from the real planner over the example cluster and the H100 case (shared/cases/05).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hetero_operator.api import labels
from hetero_operator.api.spec import JobSpec, parse_job
from hetero_operator.api.types import Plan
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.env import render_rank_envs
from heterotrain_common import contract

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "cases"
LAUNCHER = ("heterotrain", "launch", "--")
K8S_VERSION = "1.30.0"


def _job(namespace: str = "default", **spec_changes: Any) -> JobSpec:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    for section, values in spec_changes.items():
        body["spec"].setdefault(section, {}).update(values)
    return parse_job(body)


def _mixed_nodes() -> list[dict[str, Any]]:
    return yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]


def _render(job: JobSpec, nodes: list[dict[str, Any]]) -> tuple[Plan, list[dict[str, Any]]]:
    plan = plan_job(job, build_inventory(nodes))
    assert isinstance(plan, Plan), plan
    addr = rendering.master_addr(job.name, job.namespace, plan)
    envs = render_rank_envs(plan, job, master_addr=addr, master_port=29500, simulated=False)
    return plan, rendering.render_pods(job, plan, envs, launcher=LAUNCHER, attempt=3)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


def test_one_pod_per_node_and_gpu_type_with_deterministic_names() -> None:
    _, pods = _render(_job(), _mixed_nodes())
    assert [p["metadata"]["name"] for p in pods] == ["digits-g0", "digits-g1", "digits-g2"]
    assert [_env(p)["LOCAL_WORLD_SIZE"] for p in pods] == ["1", "1", "2"]
    gpus = [p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods]
    assert gpus == ["1", "1", "2"]
    assert [p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0]["values"] for p in pods] == [
        ["node-a100"], ["node-v100"], ["node-t4"]]


def test_each_pod_runs_the_launcher_with_the_image_chosen_for_its_node() -> None:
    _, pods = _render(_job(), _mixed_nodes())
    c = [p["spec"]["containers"][0] for p in pods]
    assert c[0]["command"] == ["heterotrain", "launch", "--"]
    assert c[0]["args"] == ["python", "-m", "hetero_worker.examples.digits", "--epochs", "12"]
    assert [x["image"] for x in c] == ["ghcr.io/heterotrain/worker:0.1.0-cu126",
                                       "ghcr.io/heterotrain/worker:0.1.0-cu126",
                                       "ghcr.io/heterotrain/worker:0.1.0-cu128"]


def test_master_addr_is_one_namespaced_service_name_on_every_pod() -> None:
    """shared/cases/18: same MASTER_ADDR/PORT everywhere, <rank0 pod>.<svc>.<namespace>.svc."""
    job = _job(namespace="train")
    _, pods = _render(job, _mixed_nodes())
    addrs = {(_env(p)["MASTER_ADDR"], _env(p)["MASTER_PORT"]) for p in pods}
    assert addrs == {("digits-g0.digits.train.svc", "29500")}
    assert all(p["spec"]["subdomain"] == "digits" and p["spec"]["hostname"] == p["metadata"]["name"]
               for p in pods)
    service = rendering.render_service(job, master_port=29500)
    assert service["metadata"] == {"name": "digits", "namespace": "train", "labels": {
        "heterotrain.io/job-name": "digits", "app.kubernetes.io/managed-by": "heterotrain-operator"}}
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert all(labels.selector("digits").items() <= p["metadata"]["labels"].items() for p in pods)


def test_world_size_counts_training_ranks_and_ranks_expand_to_0_to_3() -> None:
    """shared/cases/19: WORLD_SIZE = training processes only; RANK set is exactly {0..3}."""
    _, pods = _render(_job(), _mixed_nodes())
    assert {_env(p)["WORLD_SIZE"] for p in pods} == {"4"}
    ranks = []
    for p in pods:
        env = _env(p)
        for local in range(int(env["LOCAL_WORLD_SIZE"])):
            c = contract.parse_contract(contract.expand_pod_env(env, local))
            ranks.append(c.dist.rank)
            assert c.topology[c.dist.rank].node == p["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all("RANK" not in _env(p) and "LOCAL_RANK" not in _env(p) for p in pods)


def test_labels_and_annotations_name_job_group_arch_rank_and_attempt() -> None:
    _, pods = _render(_job(), _mixed_nodes())
    assert pods[2]["metadata"]["labels"] == {
        "heterotrain.io/job-name": "digits", "heterotrain.io/group-index": "2",
        "heterotrain.io/arch": "turing", "heterotrain.io/rank": "2",
        "heterotrain.io/attempt": "3", "app.kubernetes.io/managed-by": "heterotrain-operator"}
    assert pods[2]["metadata"]["annotations"] == {"heterotrain.io/gpu-type": "Tesla-T4",
                                                  "heterotrain.io/ranks": "2-3"}


def test_user_env_resources_pvc_and_priority_class_are_carried() -> None:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["spec"]["worker"]["env"] = [{"name": "NCCL_DEBUG", "value": "INFO"},
                                     {"name": "RANK", "value": "99"}]
    body["spec"]["worker"]["resources"] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    body["spec"]["training"]["checkpoint"] = {"path": "/ckpt", "persistentVolumeClaim": "digits-ckpt"}
    body["spec"]["runPolicy"]["schedulingPolicy"] = {"priorityClass": "training-high"}
    _, pods = _render(parse_job(body), _mixed_nodes())
    c = pods[0]["spec"]["containers"][0]
    assert c["env"][0] == {"name": "NCCL_DEBUG", "value": "INFO"}
    assert [e for e in c["env"] if e["name"] == "RANK"] == [{"name": "RANK", "value": "99"}]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                              "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}
    assert c["volumeMounts"] == [{"name": "checkpoint", "mountPath": "/ckpt"},
                                 {"name": "dshm", "mountPath": "/dev/shm"}]
    assert pods[0]["spec"]["volumes"] == [
        {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "digits-ckpt"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]  # 2Gi x 1 rank < 8Gi / 2
    assert pods[0]["spec"]["priorityClassName"] == "training-high"


def test_user_cannot_override_contract_variables() -> None:
    """A user ``RANK`` is dropped only where the pod form sets it; the contract's value wins."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["spec"]["worker"]["env"] = [{"name": "WORLD_SIZE", "value": "99"}]
    _, pods = _render(parse_job(body), _mixed_nodes())
    sizes = [e["value"] for e in pods[0]["spec"]["containers"][0]["env"] if e["name"] == "WORLD_SIZE"]
    assert sizes == ["4"]


def _case05() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = list(yaml.safe_load_all((CASES / "05-h100-hopper-node-and-mig-switch.yaml").read_text()))
    state1 = docs[0]["items"][0]
    state2 = copy.deepcopy(state1)
    state2["metadata"]["labels"].update(docs[1]["metadata"]["labels"])
    state2["status"] = docs[1]["status"]
    return state1, state2


def _h100_job(ranks: int) -> JobSpec:
    return _job(gpus={"ranks": ranks, "minRanks": ranks}, training={"globalBatchSize": 8 * ranks})


def test_h100_node_gets_one_pod_with_eight_local_ranks_in_bf16() -> None:
    """shared/cases/05 state 1: 8 whole H100s -> one pod, LOCAL_WORLD_SIZE=8, bf16, 8 GPUs."""
    state1, _ = _case05()
    _, pods = _render(_h100_job(8), [state1])
    assert len(pods) == 1
    env = _env(pods[0])
    assert env["LOCAL_WORLD_SIZE"] == "8" and env["HTJ_PRECISION"] == "bf16"
    assert pods[0]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pods[0]["metadata"]["labels"]["heterotrain.io/arch"] == "hopper"


def test_h100_after_mig_switch_gets_one_pod_per_mig_device_and_no_whole_gpu_request() -> None:
    """shared/cases/05 state 2: never request nvidia.com/gpu; one pod per MIG device."""
    _, state2 = _case05()
    plan, pods = _render(_h100_job(3), [state2])
    assert len(pods) == 3
    for k, pod in enumerate(pods):
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/mig-1g.10gb": "1"}
        assert _env(pod)["LOCAL_WORLD_SIZE"] == "1"
        assert contract.parse_contract(contract.expand_pod_env(_env(pod), 0)).dist.rank == k
    assert rendering.master_addr("digits", "default", plan) == f"{pods[0]['metadata']['name']}.digits.default.svc"
    assert {_env(p)["MASTER_ADDR"] for p in pods} == {f"{pods[0]['metadata']['name']}.digits.default.svc"}


def test_render_refuses_a_wrong_number_of_rank_envs() -> None:
    job = _job()
    plan = plan_job(job, build_inventory(_mixed_nodes()))
    with pytest.raises(ValueError, match="rank_envs has 1 entries, plan has 4 ranks"):
        rendering.render_pods(job, plan, [{}], launcher=LAUNCHER)


@pytest.mark.parametrize("kind", ["pods", "service", "networkpolicy"])
def test_rendered_objects_validate_against_kubernetes_schemas(kind: str) -> None:
    """kubernetes-validate, offline and strict (unknown fields are errors)."""
    job = _job(namespace="train")
    plan, pods = _render(job, _mixed_nodes())
    state1, state2 = _case05()
    _, mig_pods = _render(_h100_job(2), [state2])
    _, pvc_pods = _render(_job(training={"checkpoint": {"persistentVolumeClaim": "ckpt", "path": "/ckpt"}}),
                          _mixed_nodes())
    root = rendering.render_pods(job, plan, _envs(job, plan), launcher=LAUNCHER, run_as_non_root=False)
    objs = {"pods": pods + mig_pods + pvc_pods + root,
            "service": [rendering.render_service(job, master_port=29500)],
            "networkpolicy": [rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring"]),
                              rendering.render_network_policy(job, plan, metrics_namespaces=[])]}[kind]
    for obj in objs:
        kubernetes_validate.validate(json.loads(json.dumps(obj)), K8S_VERSION, strict=True)


def test_every_local_rank_gets_a_named_metrics_port() -> None:
    """The chart's PodMonitor keeps ports named ``metrics(-N)?``; the T4 pod hosts two ranks."""
    job = _job()
    _, pods = _render(job, _mixed_nodes())
    ports = [[(p["name"], p["containerPort"]) for p in pod["spec"]["containers"][0]["ports"]
              if p["name"].startswith("metrics")] for pod in pods]
    base = job.worker.metrics_port
    assert ports == [[("metrics", base)], [("metrics", base)], [("metrics", base), ("metrics-1", base + 1)]]


# --- hardened worker pods and the per-job NetworkPolicy (issue 10) ------------------------------

def _envs(job: JobSpec, plan: Plan) -> list[dict[str, str]]:
    addr = rendering.master_addr(job.name, job.namespace, plan)
    return render_rank_envs(plan, job, master_addr=addr, master_port=29500, simulated=False)


def test_worker_pods_are_hardened() -> None:
    """No privilege escalation, every capability dropped, seccomp RuntimeDefault, non-root, no
    service-account token: the Pod Security Standards' "restricted" profile."""
    job = _job(namespace="train")
    plan, pods = _render(job, _mixed_nodes())
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        (container,) = spec["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                                "capabilities": {"drop": ["ALL"]}}
    root = rendering.render_pods(job, plan, _envs(job, plan), launcher=LAUNCHER, run_as_non_root=False)
    assert {json.dumps(p["spec"]["securityContext"]) for p in root} == {
        json.dumps({"seccompProfile": {"type": "RuntimeDefault"}})}
    assert all(p["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]} for p in root)


def test_a_checkpoint_volume_is_writable_by_the_worker_images_group() -> None:
    job = _job(training={"checkpoint": {"persistentVolumeClaim": "ckpt", "path": "/ckpt"}})
    _, pods = _render(job, _mixed_nodes())
    assert {(p["spec"]["securityContext"]["fsGroup"], p["spec"]["securityContext"]["fsGroupChangePolicy"])
            for p in pods} == {(10001, "OnRootMismatch")}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions In/NotIn/Exists) applied to labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        value = labels.get(e["key"])
        ok = {"In": value in e.get("values", ()), "NotIn": value not in e.get("values", ()),
              "Exists": e["key"] in labels, "DoesNotExist": e["key"] not in labels}[e["operator"]]
        if not ok:
            return False
    return True


def _admits(policy: dict[str, Any], *, pod: dict[str, Any], namespace: str, port: int) -> bool:
    """Whether ``policy`` lets a pod (its labels, in ``namespace``) connect to ``port``."""
    ns_labels = {"kubernetes.io/metadata.name": namespace}
    for rule in policy["spec"]["ingress"]:
        ports = rule.get("ports")
        if ports and not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports):
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                if _selects(peer["namespaceSelector"], ns_labels) and _selects(
                        peer.get("podSelector", {}), pod["metadata"].get("labels", {})):
                    return True
            elif namespace == policy["metadata"]["namespace"] and _selects(
                    peer["podSelector"], pod["metadata"].get("labels", {})):
                return True
    return False


def test_network_policy_selects_exactly_the_jobs_pods_and_admits_only_them_and_metrics() -> None:
    job = _job(namespace="train")
    plan, pods = _render(job, _mixed_nodes())
    policy = rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring", "heterotrain-system"])
    assert (policy["metadata"]["name"], policy["metadata"]["namespace"]) == ("digits", "train")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    other = copy.deepcopy(pods[0])  # a pod of another job, "digits-2", in the same namespace
    other["metadata"]["labels"][labels.LABEL_JOB] = "digits-2"
    stranger = {"metadata": {"labels": {"app": "web"}}}
    selector = policy["spec"]["podSelector"]
    assert [_selects(selector, p["metadata"]["labels"]) for p in pods] == [True, True, True]
    assert not _selects(selector, other["metadata"]["labels"]) and not _selects(selector, {})
    rendezvous, gloo, metrics = 29500, 41234, job.worker.metrics_port
    # the job's own pods reach every port (Gloo and NCCL connect to ephemeral ports)
    assert all(_admits(policy, pod=pods[1], namespace="train", port=p) for p in (rendezvous, gloo, metrics))
    # another job's pods, the same pods in another namespace, and strangers reach nothing
    for src, ns in ((other, "train"), (pods[1], "elsewhere"), (stranger, "train")):
        assert not any(_admits(policy, pod=src, namespace=ns, port=p) for p in (rendezvous, gloo, metrics))
    # the monitoring and operator namespaces reach the metrics ports of every local rank, nothing else
    prom = {"metadata": {"labels": {"app.kubernetes.io/name": "prometheus"}}}
    for ns in ("monitoring", "heterotrain-system"):
        assert _admits(policy, pod=prom, namespace=ns, port=metrics)
        assert _admits(policy, pod=prom, namespace=ns, port=metrics + 1)  # the T4 pod's second rank
        assert not _admits(policy, pod=prom, namespace=ns, port=metrics + 2)
        assert not _admits(policy, pod=prom, namespace=ns, port=rendezvous)
    assert policy["spec"]["ingress"][1]["ports"] == [{"protocol": "TCP", "port": metrics, "endPort": metrics + 1}]


def test_network_policy_without_metrics_admits_only_the_job() -> None:
    job = _job(worker={"metricsPort": 0})
    plan, pods = _render(job, _mixed_nodes())
    policy = rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring"])
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": labels.selector(job.name)}}]}]
