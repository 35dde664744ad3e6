"""Issue 20 against the REAL API server: the pod template's schema (kubectl explain), its
admission rules, rendered pods that a strict server and Pod Security "restricted" admit, the
example a cluster user copies, the job's NetworkPolicy objects, and a SIGTERM (graceful pod
deletion) that stops the gang at an agreed step with one checkpoint and resumes there as an
infrastructure restart."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from realcluster import REPO, RealCluster

sys.path.insert(0, str(REPO / "tests" / "operator"))
sys.path.insert(0, str(REPO / "tests"))
from test_podtemplate import FULL_TEMPLATE, _body, _mixed_nodes, _render  # noqa: E402

from hetero_operator.api.errors import SpecError  # noqa: E402
from hetero_operator.api.spec import parse_job  # noqa: E402
from hetero_operator.render import pods as rendering  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _dry_run(real: RealCluster, ns: str, obj: dict[str, Any]) -> Any:
    return real.kubectl("create", "--dry-run=server", "--validate=strict", "-n", ns, "-o", "json",
                        "-f", "-", input_text=json.dumps(obj), check=False)


def _explain(real: RealCluster, path: str) -> str:
    """``kubectl explain`` once discovery knows the short name (a fresh API server may not yet)."""
    return real.wait_for(lambda: real.kubectl("explain", path, check=False).stdout, 30, f"explain {path}")


def test_kubectl_explain_shows_the_pod_templates_kubernetes_schema(real: RealCluster) -> None:
    out = _explain(real, "htj.spec.worker.template.spec.volumes.persistentVolumeClaim")
    assert "claimName" in out and "readOnly" in out, out
    out = _explain(real, "htj.spec.worker.template.spec.hostNetwork")
    assert "Refused: ranks talk over the pod network" in out, out
    out = _explain(real, "htj.spec.worker.sharedMemorySize")
    assert "/dev/shm" in out


def test_the_template_is_admitted_and_what_the_operator_owns_is_refused_naming_the_field(
        real: RealCluster) -> None:
    ns = real.namespace("tmpl")
    body = _body("full", template=FULL_TEMPLATE)
    proc = real.kubectl("apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-",
                        input_text=json.dumps(body), check=False)
    assert proc.returncode == 0, proc.stderr
    refused = [
        ({"spec": {"hostNetwork": True}}, "spec.worker.template.spec: Invalid value: hostNetwork: refused: ranks talk"),
        ({"spec": {"containers": [{"name": "worker", "image": "mine:1"}]}},
         "spec.worker.template.spec.containers[0]: Invalid value: image: refused: the operator picks the image"),
        ({"spec": {"containers": [{"name": "worker", "env": [{"name": "RANK", "value": "1"}]}]}},
         "spec.worker.template.spec.containers[0]: Invalid value: env: refused: the variables of the env contract"),
        ({"spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
         "spec.worker.template.spec.containers[0]: Invalid value: resources: refused: the operator requests the GPUs"),
        ({"spec": {"containers": [{"name": "sidecar", "image": "x"}]}},
         "spec.worker.template.spec: Invalid value: containers: refused: only a container named worker"),
        ({"spec": {"initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]}},
         "spec.worker.template.spec.initContainers[0].securityContext: Invalid value: privileged: refused"),
        ({"metadata": {"labels": {"heterotrain.io/rank": "0"}}},
         "spec.worker.template.metadata: Invalid value: labels: refused: labels under heterotrain.io/"),
    ]
    for template, message in refused:
        proc = real.kubectl("apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-",
                            input_text=json.dumps(_body("bad", template=template)), check=False)
        path, _, why = message.partition(": Invalid value: ")  # newer servers omit the value
        assert proc.returncode != 0 and re.search(
            rf"{re.escape(path)}: Invalid value: (\"object\": )?{re.escape(why)}", proc.stderr), (message, proc.stderr)
    proc = real.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", check=False,
                        input_text=json.dumps(_body("bad", template={"spec": {"hostNetwrok": True}})))
    assert proc.returncode != 0 and 'unknown field "spec.worker.template.spec.hostNetwrok"' in proc.stderr


RESTRICTED_REFUSED = [  # issue 32, F2: each names the field and the fix
    ({"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
     "spec.worker.template.spec: Invalid value: volumes: refused: Pod Security Standards \"restricted\" allows only the volume types"),
    ({"spec": {"securityContext": {"supplementalGroups": [10001, 0]}}},
     "spec.worker.template.spec.securityContext: Invalid value: supplementalGroups: refused: group 0 (root)"),
    ({"spec": {"containers": [{"name": "worker", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}},
     "spec.worker.template.spec.containers[0].securityContext: Invalid value: seccompProfile: refused: Pod Security "
     "Standards \"restricted\" allows only the types RuntimeDefault and Localhost"),
    ({"spec": {"initContainers": [{"name": "i", "image": "x", "securityContext": {
        "appArmorProfile": {"type": "Unconfined"}}}]}},
     "spec.worker.template.spec.initContainers[0].securityContext: Invalid value: appArmorProfile: refused: Pod "
     "Security Standards \"restricted\" allows only the types RuntimeDefault and Localhost"),
    ({"spec": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}},
     "spec.worker.template.spec.securityContext: Invalid value: seLinuxOptions: refused: Pod Security Standards "
     "\"restricted\" allows no SELinux user or role"),
    ({"spec": {"securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}}},
     "spec.worker.template.spec.securityContext: Invalid value: sysctls: refused: sysctls change the node"),
    ({"spec": {"containers": [{"name": "worker", "securityContext": {"runAsUser": 0}}]}},
     "spec.worker.template.spec.containers[0].securityContext: Invalid value: runAsUser: refused: Pod Security "
     "Standards \"restricted\" refuses user 0"),
    ({"spec": {"containers": [{"name": "worker", "ports": [{"containerPort": 80, "hostPort": 80}]}]}},
     "spec.worker.template.spec.containers[0]: Invalid value: ports: refused: Pod Security Standards "
     "\"restricted\" refuses hostPort"),
]


def test_what_pod_security_restricted_forbids_is_refused_by_the_real_api_server_naming_the_field(
        real: RealCluster) -> None:
    """Issue 32, F2: the CRD's CEL rules (hetero_operator.api.podsecurity) on the real API server:
    hostPath /, group 0, Unconfined seccomp/AppArmor at container level, an SELinux type, sysctls,
    root, a hostPort are each refused naming the field and the fix; the parser refuses the same."""
    ns = real.namespace("tmpl-refused")
    for template, message in RESTRICTED_REFUSED:
        body = _body("bad", template=template)
        proc = real.kubectl("apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-",
                            input_text=json.dumps(body), check=False)
        path, _, why = message.partition(": Invalid value: ")
        assert proc.returncode != 0 and re.search(
            rf"{re.escape(path)}: Invalid value: (\"object\": )?{re.escape(why)}", proc.stderr), (message, proc.stderr)
        field = why.split(":")[0]
        with pytest.raises(SpecError, match=re.escape(field)):
            parse_job(body)
    from test_podsecurity import ALLOWED
    proc = real.kubectl("apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-",
                        input_text=json.dumps(_body("allowed", template=ALLOWED)), check=False)
    assert proc.returncode == 0, proc.stderr
    # what it allows renders into pods that Pod Security admission "restricted" admits
    pss = real.namespace("restricted-pods", labels={"pod-security.kubernetes.io/enforce": "restricted",
                                                    "pod-security.kubernetes.io/enforce-version": "latest"})
    job = parse_job(_body(template=ALLOWED) | {"metadata": {"name": "digits", "namespace": pss}})
    for pod in _render(job, _mixed_nodes())[1]:
        proc = _dry_run(real, pss, pod)
        assert proc.returncode == 0, (pod["metadata"]["name"], proc.stderr)


def test_rendered_pods_with_a_full_template_validate_strictly_under_pod_security_restricted(
        real: RealCluster) -> None:
    ns = real.namespace("tmpl-pods", labels={"pod-security.kubernetes.io/enforce": "restricted",
                                             "pod-security.kubernetes.io/enforce-version": "latest"})
    real.core.create_namespaced_service_account(ns, {"metadata": {"name": "object-store-reader"}})
    node = kubernetes.client.NodeV1Api(real.client)
    if not [r for r in node.list_runtime_class().items if r.metadata.name == "nvidia"]:
        node.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                   "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    job = parse_job(_body(template=FULL_TEMPLATE) | {"metadata": {"name": "digits", "namespace": ns}})
    plan, pods = _render(job, _mixed_nodes(pool="spot", **{"topology.kubernetes.io/zone": "zone-a"}))
    for pod in pods:
        proc = _dry_run(real, ns, pod)
        assert proc.returncode == 0, (pod["metadata"]["name"], proc.stderr)
        served = json.loads(proc.stdout)
        assert [v["name"] for v in served["spec"]["volumes"]][:3] == ["dshm", "data", "cache"]
    # the job's NetworkPolicy with egress, and the Service: valid objects for the real server
    for obj in (rendering.render_network_policy(job, plan, metrics_namespaces=["monitoring"], egress=True),
                rendering.render_service(job, master_port=29500)):
        proc = _dry_run(real, ns, obj)
        assert proc.returncode == 0, proc.stderr


def test_the_cluster_example_is_valid_on_the_real_api_server(real: RealCluster) -> None:
    """examples/cluster-job.yaml: PVCs and the job admitted; its pods (PVC, private registry
    secret, toleration, /dev/shm, grace) validate strictly."""
    ns = real.namespace("example")
    text = (REPO / "examples" / "cluster-job.yaml").read_text()
    proc = real.kubectl("apply", "--server-side", "--dry-run=server", "-n", ns, "-f", "-", input_text=text,
                        check=False)
    assert proc.returncode == 0, proc.stderr
    assert "persistentvolumeclaim/digits-checkpoints" in proc.stdout and "heterotrainingjob" in proc.stdout
    body = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "HeteroTrainingJob")
    body["metadata"]["namespace"] = ns
    job = parse_job(body)
    nodes = _mixed_nodes()
    for n in nodes:  # the example's tainted GPU pool
        n.setdefault("spec", {})["taints"] = [{"key": "gpu-pool", "value": "spot", "effect": "NoSchedule"}]
    _, pods = _render(job, nodes)
    for pod in pods:
        proc = _dry_run(real, ns, pod)
        assert proc.returncode == 0, proc.stderr
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "private-registry"}]
        assert {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "digits-checkpoints"}} in spec["volumes"]
        assert spec["terminationGracePeriodSeconds"] == 600


def test_sigterm_to_one_pod_stops_the_gang_with_one_checkpoint_and_resumes_there(
        cluster: RealCluster, tmp_path: Path) -> None:
    """A graceful pod deletion (what a drain or a preemption does: SIGTERM, then the grace) of the
    T4 pod mid-run: every rank stops after the same step with one checkpoint and exits 75, the
    operator restarts the gang as an infrastructure restart (backoffLimit 0 survives it), and the
    restart resumes at that step."""
    from builders import digits_job
    ns = cluster.namespace("preempt")
    body = digits_job("preempt", tmp_path, args=["--max-steps", "120", "--checkpoint-every", "1000"],
                  runPolicy={"backoffLimit": 0})
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": "0.004"}]
    cluster.apply(body, ns)
    cluster.wait_for(lambda: cluster.phase("preempt", ns) == "Running", 90, "Running")
    cluster.wait_for(lambda: ((cluster.job("preempt", ns).get("status") or {}).get("progress") or {}).get(
        "step", 0) >= 5, 90, "five steps trained")
    cluster.core.delete_namespaced_pod("preempt-g2", ns)  # graceful: SIGTERM to its ranks
    job = cluster.finished("preempt", ns, 240)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status.get("restarts", 0) == 0 and status["infrastructureRestarts"] == 1, status
    assert status["attempt"] == 2
    saved = sorted((tmp_path / "preempt" / "ckpt").glob("step-*"))
    log = cluster.log(ns, "preempt-g0")
    resumed = re.search(r"resumed at step (\d+)", log)
    assert resumed, log[-2000:]
    assert 0 < int(resumed.group(1)) < 120 and any(f"step-{int(resumed.group(1)):08d}-" in p.name for p in saved)
    events = cluster.event_counts("preempt", ns)
    assert events.get("PodDeleted", 0) + events.get("PodPreempted", 0) >= 1, events
