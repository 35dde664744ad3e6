"""The worker pod template (``spec.worker.template``), /dev/shm, job names and the job's
NetworkPolicy under default-deny: shared/cases/38, 44 and 46, and the merge rules.

Rendered pods are validated strictly (``kubernetes_validate``, unknown fields refused) against the
Kubernetes schema; the same template against the real API server is in
tests/cluster/test_podtemplate_real.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s import crdcheck  # noqa: E402
from k8s.netpol import Cluster, Flow, Pod  # noqa: E402

from hetero_operator.api import podtemplate  # noqa: E402
from hetero_operator.api.errors import SpecError  # noqa: E402
from hetero_operator.api.jobnames import dns_1035_name  # noqa: E402
from hetero_operator.api.spec import JobSpec, parse_job  # noqa: E402
from hetero_operator.api.types import Plan  # noqa: E402
from hetero_operator.cluster.inventory import build_inventory  # noqa: E402
from hetero_operator.planning.placement import pod_tolerations, restrict_to_template  # noqa: E402
from hetero_operator.planning.plan import plan_job  # noqa: E402
from hetero_operator.render import pods as rendering  # noqa: E402
from hetero_operator.render.env import render_rank_envs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "cases"
K8S_VERSION = "1.35.0"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "nlp"}, "annotations": {"example.com/owner": "ana"}},
    "spec": {
        "serviceAccountName": "object-store-reader",
        "automountServiceAccountToken": True,
        "imagePullSecrets": [{"name": "private-registry"}],
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}],
        "nodeSelector": {"topology.kubernetes.io/zone": "zone-a"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spot", "on-demand"]}]}]}}},
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
        "terminationGracePeriodSeconds": 600,
        "runtimeClassName": "nvidia",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
                    {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}}],
        "initContainers": [
            {"name": "fetch", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
             "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
            {"name": "log-shipper", "image": "fluent/fluent-bit:3.0", "restartPolicy": "Always"}],
        "containers": [{
            "name": "worker",
            "env": [{"name": "HF_HOME", "value": "/cache/hf"},
                    {"name": "AWS_REGION", "valueFrom": {"configMapKeyRef": {"name": "s3", "key": "region"}}},
                    {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
            "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                             {"name": "cache", "mountPath": "/cache"}],
            "resources": {"requests": {"cpu": "8", "memory": "48Gi"}, "limits": {"memory": "64Gi"}},
            "workingDir": "/workspace",
            "securityContext": {"readOnlyRootFilesystem": False},
        }],
    },
}


def _body(name: str = "digits", template: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    if template is not None:
        body["spec"]["worker"]["template"] = copy.deepcopy(template)
    body["spec"]["worker"].update(worker)
    return body


def _mixed_nodes(**labels: str) -> list[dict[str, Any]]:
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    for n in nodes:
        n["metadata"]["labels"].update(labels)
    return nodes


def _render(job: JobSpec, nodes: list[dict[str, Any]]) -> tuple[Plan, list[dict[str, Any]]]:
    inventory = restrict_to_template(build_inventory(
        nodes, tolerations=pod_tolerations(job.worker.template)), job.worker.template)
    plan = plan_job(job, inventory)
    assert isinstance(plan, Plan), plan
    addr = rendering.master_addr(job.name, job.namespace, plan)
    envs = render_rank_envs(plan, job, master_addr=addr, master_port=29500, simulated=False)
    return plan, rendering.render_pods(job, plan, envs, launcher=("heterotrain", "launch", "--"))


def _strict(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(json.loads(json.dumps(obj)), K8S_VERSION, strict=True)


# --- the template: merge rules ----------------------------------------------------------------

def _full() -> tuple[JobSpec, list[dict[str, Any]]]:
    nodes = _mixed_nodes(pool="spot", **{"topology.kubernetes.io/zone": "zone-a"})
    job = parse_job(_body(template=FULL_TEMPLATE))
    return job, _render(job, nodes)[1]


def test_a_full_template_is_merged_into_every_pod_and_validates_strictly() -> None:
    job, pods = _full()
    assert len(pods) == 3
    for pod in pods:
        _strict(pod)
        spec, c = pod["spec"], pod["spec"]["containers"][0]
        assert pod["metadata"]["labels"]["team"] == "nlp"
        assert pod["metadata"]["labels"]["heterotrain.io/job-name"] == "digits"
        assert pod["metadata"]["annotations"]["example.com/owner"] == "ana"
        assert spec["serviceAccountName"] == "object-store-reader" and spec["automountServiceAccountToken"] is True
        assert spec["imagePullSecrets"] == [{"name": "private-registry"}]
        assert spec["runtimeClassName"] == "nvidia" and spec["terminationGracePeriodSeconds"] == 600
        assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "zone-a"}
        assert spec["tolerations"] == [rendering.GPU_TOLERATION, FULL_TEMPLATE["spec"]["tolerations"][0]]
        # ours win where we own it, theirs kept beside it
        assert spec["securityContext"] == {"runAsUser": 10001, "runAsGroup": 10001,
                                           "seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True}
        assert (spec["restartPolicy"], spec["hostname"], spec["subdomain"]) == ("Never", pod["metadata"]["name"], "digits")
        # volumes: ours first, then theirs
        assert [v["name"] for v in spec["volumes"]] == ["dshm", "data", "cache"]
        assert [m["mountPath"] for m in c["volumeMounts"]] == ["/dev/shm", "/data", "/cache"]
        # the worker container: their env and envFrom, our contract after it
        names = [e["name"] for e in c["env"]]
        assert names[:3] == ["HF_HOME", "AWS_REGION", "NCCL_SOCKET_IFNAME"] and "MASTER_ADDR" in names
        assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
        assert c["workingDir"] == "/workspace" and c["image"].startswith("ghcr.io/heterotrain/worker:")
        assert c["command"] == ["heterotrain", "launch", "--"]
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        assert c["resources"]["requests"] == {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": gpus}
        assert c["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": gpus}
        assert c["securityContext"] == {"readOnlyRootFilesystem": False, **rendering.CONTAINER_SECURITY_CONTEXT}
        # init containers and the native sidecar: as given, hardened
        assert [i["name"] for i in spec["initContainers"]] == ["fetch", "log-shipper"]
        assert spec["initContainers"][1]["restartPolicy"] == "Always"
        assert all(i["securityContext"] == rendering.CONTAINER_SECURITY_CONTEXT for i in spec["initContainers"])


def test_node_affinity_terms_get_the_node_pin_and_still_or() -> None:
    _, pods = _full()
    terms = pods[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spot", "on-demand"]}],
                      "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a100"]}]}]


def test_the_planner_uses_only_nodes_the_template_allows_and_tolerated_tainted_ones() -> None:
    nodes = _mixed_nodes()
    for n in nodes:
        if n["metadata"]["name"] == "node-t4":
            n["metadata"]["labels"]["pool"] = "spot"
            n.setdefault("spec", {})["taints"] = [{"key": "pool", "value": "spot", "effect": "NoSchedule"}]
    # without the toleration the tainted T4 node is out; with it (and a selector on the pool) only it
    job = parse_job(_body(template={"spec": {"nodeSelector": {"pool": "spot"}}}))
    inventory = restrict_to_template(build_inventory(nodes), job.worker.template)
    assert [n.name for n in inventory.nodes] == []
    job = parse_job(_body(template={"spec": {"nodeSelector": {"pool": "spot"}, "tolerations": [
        {"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]}}))
    inventory = restrict_to_template(build_inventory(
        nodes, tolerations=pod_tolerations(job.worker.template)), job.worker.template)
    assert [n.name for n in inventory.nodes] == ["node-t4"]
    assert {e.node: e.reason for e in inventory.excluded} == {
        "node-a100": "NodeSelectorMismatch", "node-v100": "NodeSelectorMismatch"}


def test_termination_grace_defaults_long_enough_for_a_checkpoint() -> None:
    _, pods = _render(parse_job(_body()), _mixed_nodes())
    assert {p["spec"]["terminationGracePeriodSeconds"] for p in pods} == {300}
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert "HTJ_TERMINATION_GRACE_S" not in env  # the default is not rendered
    _, pods = _render(parse_job(_body(template={"spec": {"terminationGracePeriodSeconds": 900}})), _mixed_nodes())
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert pods[0]["spec"]["terminationGracePeriodSeconds"] == 900 and env["HTJ_TERMINATION_GRACE_S"] == "900"


# --- refused fields: named, with the reason, the same in Python and in the CRD ---------------

def _with(template: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "worker", **template}]}}


def _nested(keys: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    """``{"a": {"b": leaf}}`` for keys ``("a", "b")``."""
    for key in reversed(keys):
        leaf = {key: leaf}
    return leaf


_RESTRICTED_CONTEXT = (("seccompProfile", {"type": "Unconfined"}, ".type"),
                       ("appArmorProfile", {"type": "Unconfined"}, ".type"),
                       ("seLinuxOptions", {"type": "spc_t"}, ".type"),
                       ("windowsOptions", {"hostProcess": True}, ".hostProcess"),
                       ("runAsUser", 0, ""), ("runAsGroup", 0, ""))
RESTRICTED_REFUSED = [
    # issue 32, F2: what Pod Security "restricted" refuses (hetero_operator.api.podsecurity)
    ({"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
     "spec.worker.template.spec.volumes[0].hostPath", "persistentVolumeClaim, projected, secret"),
    ({"spec": {"securityContext": {"supplementalGroups": [10001, 0]}}},
     "spec.worker.template.spec.securityContext.supplementalGroups[1]", "non-zero GID"),
    ({"spec": {"securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}}},
     "spec.worker.template.spec.securityContext.sysctls", "NCCL_*"),
    ({"spec": {"securityContext": {"fsGroup": 0}}}, "spec.worker.template.spec.securityContext.fsGroup",
     "non-zero GID"),
    ({"spec": {"securityContext": {"seLinuxOptions": {"user": "system_u"}}}},
     "spec.worker.template.spec.securityContext.seLinuxOptions.user", "remove user and role"),
    *(({"spec": {"securityContext": {field: value}}}, f"spec.worker.template.spec.securityContext.{field}{sub}",
       "restricted" if field != "runAsGroup" else "non-zero GID")
      for field, value, sub in _RESTRICTED_CONTEXT if field != "seccompProfile"),
    *(({"spec": {kind: [{"name": "worker" if kind == "containers" else "i", "securityContext": {field: value}}]}},
       f"spec.worker.template.spec.{kind}[0].securityContext.{field}{sub}",
       "restricted" if field != "runAsGroup" else "non-zero GID")
      for kind in ("containers", "initContainers") for field, value, sub in _RESTRICTED_CONTEXT),
    *(({"spec": {kind: [{"name": "worker" if kind == "containers" else "i", "ports": [
        {"containerPort": 8080}, {"containerPort": 8081, "hostPort": 8081}]}]}},
       f"spec.worker.template.spec.{kind}[0].ports[1].hostPort", "remove hostPort")
      for kind in ("containers", "initContainers")),
    *(({"spec": {kind: [{"name": "worker" if kind == "containers" else "i",
                         **_nested((*probe, handler), {"host": "10.0.0.1", "port": 80})}]}},
       f"spec.worker.template.spec.{kind}[0].{'.'.join(probe)}.{handler}.host", "leave host unset")
      for kind in ("containers", "initContainers")
      for probe in (("livenessProbe",), ("readinessProbe",), ("startupProbe",), ("lifecycle", "postStart"),
                    ("lifecycle", "preStop"))
      for handler in ("httpGet", "tcpSocket")),
    ({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"}}},
     "spec.worker.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/worker]",
     "localhost/<profile>"),
]


REFUSED = [
    ({"spec": {"hostNetwork": True}}, "spec.worker.template.spec.hostNetwork", "pod network"),
    ({"spec": {"hostIPC": True}}, "spec.worker.template.spec.hostIPC", "/dev/shm"),
    ({"spec": {"hostPID": True}}, "spec.worker.template.spec.hostPID", "baseline"),
    ({"spec": {"nodeName": "node-t4"}}, "spec.worker.template.spec.nodeName", "planner"),
    ({"spec": {"hostname": "x"}}, "spec.worker.template.spec.hostname", "MASTER_ADDR"),
    ({"spec": {"hostnameOverride": "x"}}, "spec.worker.template.spec.hostnameOverride", "hostname"),
    ({"spec": {"subdomain": "x"}}, "spec.worker.template.spec.subdomain", "headless Service"),
    ({"spec": {"setHostnameAsFQDN": True}}, "spec.worker.template.spec.setHostnameAsFQDN", "hostname"),
    ({"spec": {"restartPolicy": "OnFailure"}}, "spec.worker.template.spec.restartPolicy", "backoffLimit"),
    ({"spec": {"activeDeadlineSeconds": 5}}, "spec.worker.template.spec.activeDeadlineSeconds", "runPolicy"),
    ({"spec": {"priorityClassName": "hi"}}, "spec.worker.template.spec.priorityClassName", "priorityClass"),
    ({"spec": {"priority": 5}}, "spec.worker.template.spec.priority", "PriorityClass"),
    ({"spec": {"ephemeralContainers": [{"name": "d"}]}}, "spec.worker.template.spec.ephemeralContainers", "debug"),
    ({"spec": {"resourceClaims": [{"name": "gpu"}]}}, "spec.worker.template.spec.resourceClaims", "DRA"),
    ({"spec": {"resources": {"limits": {"cpu": "1"}}}}, "spec.worker.template.spec.resources", "worker container"),
    ({"spec": {"overhead": {"cpu": "1"}}}, "spec.worker.template.spec.overhead", "RuntimeClass"),
    ({"spec": {"containers": [{"name": "sidecar"}]}}, "spec.worker.template.spec.containers[0].name", "native sidecars"),
    ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "spec.worker.template.spec.volumes[0].name", "rename"),
    ({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}},
     "spec.worker.template.spec.securityContext.seccompProfile", "RuntimeDefault"),
    ({"spec": {"securityContext": {"runAsNonRoot": False}}},
     "spec.worker.template.spec.securityContext.runAsNonRoot", "HTJ_WORKER_RUN_AS_NON_ROOT"),
    (_with({"image": "mine:1"}), "spec.worker.template.spec.containers[0].image", "spec.images"),
    (_with({"command": ["python"]}), "spec.worker.template.spec.containers[0].command", "spec.worker.command"),
    (_with({"args": ["--x"]}), "spec.worker.template.spec.containers[0].args", "spec.worker.args"),
    (_with({"env": [{"name": "X", "value": "1"}, {"name": "MASTER_ADDR", "value": "a"}]}),
     "spec.worker.template.spec.containers[0].env[1].name", "env contract"),
    (_with({"volumeMounts": [{"name": "c", "mountPath": "/dev/shm"}]}),
     "spec.worker.template.spec.containers[0].volumeMounts[0].mountPath", "sharedMemorySize"),
    (_with({"resources": {"limits": {"nvidia.com/gpu": 1}}}),
     "spec.worker.template.spec.containers[0].resources.limits[nvidia.com/gpu]", "requests the GPUs"),
    ({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": 1}}}]}},
     "spec.worker.template.spec.initContainers[0].resources.requests[nvidia.com/gpu]", "requests the GPUs"),
    *((({"spec": {kind: [{"name": "worker" if kind == "containers" else "i", "securityContext": {field: value}}]}}),
       f"spec.worker.template.spec.{kind}[0].securityContext.{field}", "restricted")
      for kind in ("containers", "initContainers")
      for field, value in (("privileged", True), ("allowPrivilegeEscalation", True),
                           ("capabilities", {"add": ["NET_ADMIN"]}), ("procMount", "Unmasked"),
                           ("runAsNonRoot", False))),
    ({"metadata": {"labels": {"heterotrain.io/rank": "0"}}},
     "spec.worker.template.metadata.labels[heterotrain.io/rank]", "operator's"),
    ({"metadata": {"annotations": {"heterotrain.io/ranks": "0"}}},
     "spec.worker.template.metadata.annotations[heterotrain.io/ranks]", "operator's"),
    *RESTRICTED_REFUSED,
]


@pytest.mark.parametrize("template,path,why", REFUSED, ids=[p for _, p, _ in REFUSED])
def test_a_field_the_operator_owns_is_refused_naming_the_field_and_why(template: dict[str, Any], path: str,
                                                                        why: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(_body(template=template))
    assert err.value.path == path and "refused: " in str(err.value) and why in str(err.value), str(err.value)
    # the CRD's CEL rule (its Python twin) refuses the same manifest
    with pytest.raises(crdcheck.Invalid, match=re.escape(why)):
        crdcheck.validate(_body(template=template))


def test_every_rule_has_a_refusal_example() -> None:
    covered = set()
    for template, path, _ in REFUSED:
        covered |= {(r.at, r.field) for r in podtemplate.RULES if r.field in path and any(
            obj for obj, _ in podtemplate._at(template, r.at, "") if r.check(obj) is not None)}
    assert {(r.at, r.field) for r in podtemplate.RULES} == covered


def test_the_example_full_template_is_accepted_by_the_crd_and_the_parser() -> None:
    crdcheck.validate(_body(template=FULL_TEMPLATE))
    parse_job(_body(template=FULL_TEMPLATE))


def test_the_crd_schema_of_the_template_is_generated_from_kubernetes_openapi() -> None:
    """scripts/gen-crd-podtemplate.py --check: both CRD copies hold the generated PodTemplateSpec
    schema of the Kubernetes version tests/controlplane pins, with the rules of podtemplate.py."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-crd-podtemplate.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    template = crdcheck.openapi_schema(crdcheck.load_crd())["properties"]["spec"]["properties"]["worker"][
        "properties"]["template"]
    spec = template["properties"]["spec"]
    assert "x-kubernetes-preserve-unknown-fields" not in template and "x-kubernetes-preserve-unknown-fields" not in spec
    assert {"volumes", "tolerations", "affinity", "imagePullSecrets", "initContainers", "serviceAccountName"} <= set(
        spec["properties"])
    volume = spec["properties"]["volumes"]["items"]["properties"]
    assert volume["persistentVolumeClaim"]["properties"]["claimName"]["type"] == "string"


# --- case 38: /dev/shm ------------------------------------------------------------------------

def _shm(pod: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    volume = next((v for v in pod["spec"].get("volumes") or () if v.get("emptyDir", {}).get("medium") == "Memory"
                   and any(m["name"] == v["name"] and m["mountPath"] == "/dev/shm"
                           for m in pod["spec"]["containers"][0].get("volumeMounts") or ())), None)
    return volume, pod["spec"]["containers"][0].get("volumeMounts") or []


def _parse_bytes(text: str) -> int:
    from hetero_operator.api.quantities import parse_quantity
    return parse_quantity(text)


def _check_shm(pod: dict[str, Any]) -> bool:
    """Case 38's checker: a Memory emptyDir on /dev/shm, sizeLimit within limits.memory, no hostIPC."""
    volume, _ = _shm(pod)
    if volume is None or pod["spec"].get("hostIPC"):
        return False
    limit = pod["spec"]["containers"][0]["resources"].get("limits", {}).get("memory")
    size = volume["emptyDir"].get("sizeLimit")
    return size is not None and (limit is None or _parse_bytes(size) <= _parse_bytes(limit))


def test_case_38_every_worker_pod_mounts_a_memory_emptydir_on_dev_shm() -> None:
    docs = [d for d in yaml.safe_load_all((CASES / "38-dev-shm-default-64mib.yaml").read_text()) if d]
    nodes, expected = docs[0]["items"], docs[2]["expected"]
    _, digits = _render(parse_job(_body()), _mixed_nodes())
    body = _body("t4x4", resources=docs[1]["spec"]["worker"]["resources"])  # limits.memory 32Gi
    body["spec"]["gpus"] = {"ranks": docs[1]["spec"]["groups"][0]["ranks"]}
    _, t4 = _render(parse_job(body), nodes)
    assert [len(digits), len(t4)] == [3, 1]
    pods = [*digits, *t4]
    assert [_check_shm(p) for p in pods] == [True] * 4, "4 of 4 (3 for digits + 1 for t4x4)"
    assert expected["pods_with_mount"].startswith("4 of 4")
    env = {e["name"]: e.get("value") for e in t4[0]["spec"]["containers"][0]["env"]}
    volume, _ = _shm(t4[0])
    assert env["LOCAL_WORLD_SIZE"] == "4" and volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volume["name"] == expected["pod_volume"]["name"] == "dshm"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in t4[0]["spec"]["containers"][0]["volumeMounts"]
    assert not any(p["spec"].get("hostIPC") for p in pods)
    # negative control of the checker: without the volume a pod fails it; added by hand it passes
    bare = copy.deepcopy(digits[0])
    bare["spec"]["volumes"] = []
    assert not _check_shm(bare)
    bare["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    assert _check_shm(bare)


def test_shm_default_grows_with_local_ranks_and_stays_under_half_the_limit() -> None:
    _, pods = _render(parse_job(_body()), _mixed_nodes())
    assert [_shm(p)[0]["emptyDir"]["sizeLimit"] for p in pods] == ["2Gi", "2Gi", "4Gi"]  # 1, 1, 2 local ranks
    _, pods = _render(parse_job(_body(resources={"limits": {"memory": "3Gi"}})), _mixed_nodes())
    assert [_shm(p)[0]["emptyDir"]["sizeLimit"] for p in pods] == ["1536Mi"] * 3


def test_shm_size_field_sets_it_refuses_more_than_the_limit_and_zero_turns_it_off() -> None:
    _, pods = _render(parse_job(_body(sharedMemorySize="16Gi")), _mixed_nodes())
    assert {_shm(p)[0]["emptyDir"]["sizeLimit"] for p in pods} == {"16Gi"}
    with pytest.raises(SpecError, match="spec.worker.sharedMemorySize: 16Gi exceeds the worker container's memory limit"):
        parse_job(_body(sharedMemorySize="16Gi", resources={"limits": {"memory": "8Gi"}}))
    with pytest.raises(SpecError, match="spec.worker.sharedMemorySize"):  # the template's limit counts too
        parse_job(_body(sharedMemorySize="16Gi", template=_with({"resources": {"limits": {"memory": "8Gi"}}})))
    _, pods = _render(parse_job(_body(sharedMemorySize="0")), _mixed_nodes())
    assert all(_shm(p)[0] is None for p in pods)


# --- case 44: job names -----------------------------------------------------------------------

def test_case_44_no_admitted_name_renders_an_invalid_child_name() -> None:
    """Our choice: refuse at admission (CEL on metadata.name, and heterotrain plan exits 1 with the
    rule); children are named <job>, <job>-g<k>[-m<i>] as before, never rewritten."""
    scenario = yaml.safe_load((CASES / "44-job-name-with-dots-or-leading-digit.yaml").read_text())
    accepted_and_unrenderable = 0
    for entry in scenario["jobs"]:
        name = entry["metadata"]["name"]
        body = _body(name)
        try:
            crdcheck.validate(body)
        except crdcheck.Invalid as exc:
            assert "metadata.name must be a DNS-1035 label" in str(exc)
            with pytest.raises(SpecError, match="metadata.name: .* is not a DNS-1035 label"):
                parse_job(body)
            continue
        plan, pods = _render(parse_job(body), _mixed_nodes())
        svc = rendering.render_service(parse_job(body), master_port=29500)
        names_ok = (DNS_1035.match(svc["metadata"]["name"]) and len(svc["metadata"]["name"]) <= 63
                    and all(DNS_1123_LABEL.match(p["spec"]["hostname"]) and len(p["spec"]["hostname"]) <= 63
                            and DNS_1123_LABEL.match(p["spec"]["subdomain"]) for p in pods)
                    and all(len(v) <= 63 for p in pods for v in p["metadata"]["labels"].values()))
        accepted_and_unrenderable += not names_ok
        assert name == "digits"  # the control, accepted
    assert accepted_and_unrenderable == scenario["expected"]["accepted_and_unrenderable"] == 0


def test_a_refused_name_comes_with_a_name_that_would_do() -> None:
    assert dns_1035_name("llama-3.1-8b") == "llama-3-1-8b"
    assert dns_1035_name("7b-sft") == "job-7b-sft"
    assert dns_1035_name("Mistral-7B_v0.1") == "mistral-7b-v0-1"
    for name in ("llama-3.1-8b", "7b-sft", "mistral-7b-v0.1"):
        assert DNS_1035.match(dns_1035_name(name))
        with pytest.raises(SpecError, match=re.escape(repr(dns_1035_name(name)))):
            parse_job(_body(name))


def test_heterotrain_plan_exits_1_with_the_rule(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_body("llama-3.1-8b")))
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "heterotrain"), "plan", str(job)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc
    assert "metadata.name" in proc.stderr and "DNS-1035 label" in proc.stderr and "llama-3-1-8b" in proc.stderr


# --- case 46: NetworkPolicy under default-deny ------------------------------------------------

def _case46() -> tuple[dict[str, Any], dict[str, Any]]:
    deny, scenario = [d for d in yaml.safe_load_all(
        (CASES / "46-networkpolicy-under-default-deny-egress.yaml").read_text()) if d]
    return deny, scenario


def _flows(scenario: dict[str, Any], pods: list[dict[str, Any]]) -> list[Flow]:
    rank = {f"team-x/rank-{i}": Pod("team-x", p["metadata"]["labels"], p["metadata"]["name"])
            for i, p in enumerate(pods)}
    rank["team-x/rank-2"] = Pod("team-x", pods[2]["metadata"]["labels"], pods[2]["metadata"]["name"])
    others = {"kube-system/{k8s-app: kube-dns}": Pod("kube-system", {"k8s-app": "kube-dns"}, "coredns"),
              "monitoring/prometheus": Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, "prometheus")}
    where = {**rank, **others}
    return [Flow(where[f["from"]], where[f["to"]], f["port"], f["protocol"]) for f in scenario["flows"]]


def test_case_46_the_jobs_policy_works_under_default_deny_all() -> None:
    deny, scenario = _case46()
    job = parse_job(_body() | {"metadata": {"name": "digits", "namespace": "team-x"}})
    plan, pods = _render(job, _mixed_nodes())
    policy = rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring"], egress=True)
    _strict(policy)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    flows = _flows(scenario, pods)
    assert len(flows) == 5
    namespaces = {n: {} for n in scenario["namespaces"]}
    # controls of the evaluator: open namespace allows all 5, default-deny alone blocks all 5
    assert Cluster(namespaces).blocked(flows) == []
    assert len(Cluster(namespaces, [deny]).blocked(flows)) == scenario["negative_controls"]["default_deny_only"]["blocked"]
    assert Cluster(namespaces, [deny, policy]).blocked(flows) == []
    assert scenario["expected"]["blocked"] == 0
    # the old, ingress-only policy leaves rendezvous, Gloo and DNS blocked under default-deny
    ingress_only = rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring"], egress=False)
    assert len(Cluster(namespaces, [deny, ingress_only]).blocked(flows)) == 4
    # and it still admits nothing else: a stranger in the namespace, another job's pod
    stranger = Pod("team-x", {"app": "web"})
    other_job = Pod("team-x", {**pods[0]["metadata"]["labels"], "heterotrain.io/job-name": "other"})
    rank0 = flows[0].dst
    for src in (stranger, other_job):
        assert not Cluster(namespaces, [policy]).allowed(Flow(src, rank0, 29500))
    # the job's pods may not reach other pods of the namespace (egress is the job's own only)
    assert not Cluster(namespaces, [deny, policy]).allowed(Flow(rank0, Pod("team-x", {"app": "db"}), 5432))


def test_auto_egress_follows_the_namespace() -> None:
    from hetero_operator.cluster.netpol import egress_isolated
    deny, _ = _case46()
    labels = {"heterotrain.io/job-name": "digits"}
    assert egress_isolated([deny], labels) == ["default-deny-all"]
    ingress_deny = copy.deepcopy(deny)
    ingress_deny["spec"]["policyTypes"] = ["Ingress"]
    assert egress_isolated([ingress_deny], labels) == []
    assert egress_isolated([], labels) == []
