"""The real API server itself: version, OpenAPI (kubectl explain), the local kubelet's nodes, the
CRD's structural schema, CEL rules and pruning as kube-apiserver applies them."""

from __future__ import annotations

import json

import pytest
import yaml
from realcluster import REPO, SPARE, RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_server_reports_a_real_kubernetes_version(real: RealCluster) -> None:
    out = json.loads(real.kubectl("version", "-o", "json").stdout)
    server = out["serverVersion"]
    assert server["gitVersion"].startswith("v1.") and (int(server["major"]), int(server["minor"])) >= (1, 34), server
    assert out["clientVersion"]["gitVersion"] == server["gitVersion"]


def test_kubectl_explain_reads_the_crd_schema_from_openapi(real: RealCluster) -> None:
    out = real.kubectl("explain", "heterotrainingjobs.spec.gpus").stdout
    assert "minRanks" in out and "ranks" in out, out


def test_nodes_are_registered_with_gfd_labels_capacity_and_leases(real: RealCluster) -> None:
    node = real.node("node-a100")
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1" and node["status"]["allocatable"]["pods"] == "110"
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    lease = json.loads(real.kubectl("get", "lease", "-n", "kube-node-lease", "node-a100", "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"] == "node-a100"
    real.wait_for(lambda: json.loads(real.kubectl("get", "lease", "-n", "kube-node-lease", "node-a100", "-o",
                                                  "json").stdout)["spec"]["renewTime"] != lease["spec"]["renewTime"],
                  15, "a lease renewal")
    assert real.node(SPARE)["spec"]["unschedulable"] is True


def _digits(name: str) -> dict:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"] = {"name": name}
    return body


def test_cel_rule_refuses_a_bad_manifest_naming_the_field(real: RealCluster) -> None:
    real.namespace("cel")
    body = _digits("bad")
    body["spec"]["gpus"] = {"ranks": 2, "minRanks": 3}
    proc = real.kubectl("apply", "-n", "cel", "-f", "-", input_text=json.dumps(body), check=False)
    assert proc.returncode != 0
    assert "spec.gpus" in proc.stderr and "minRanks must not exceed spec.gpus.ranks" in proc.stderr, proc.stderr
    body["spec"]["gpus"] = {"ranks": "four"}
    proc = real.kubectl("apply", "-n", "cel", "-f", "-", input_text=json.dumps(body), check=False)
    assert proc.returncode != 0 and "spec.gpus.ranks" in proc.stderr, proc.stderr


def test_unknown_fields_are_refused_by_kubectl_and_pruned_by_the_server(real: RealCluster) -> None:
    real.namespace("prune")
    body = _digits("extra")
    body["spec"]["training"]["notAField"] = 1
    proc = real.kubectl("apply", "-n", "prune", "-f", "-", input_text=json.dumps(body), check=False)
    assert proc.returncode != 0 and 'unknown field "spec.training.notAField"' in proc.stderr, proc.stderr
    real.kubectl("apply", "--validate=false", "-n", "prune", "-f", "-", input_text=json.dumps(body))
    stored = real.job("extra", "prune")
    assert stored is not None and "notAField" not in stored["spec"]["training"]
    # defaults of the structural schema were applied by the server
    assert stored["spec"]["gpus"]["allowMig"] is True


def test_a_service_named_like_a_number_is_refused_by_the_real_server(real: RealCluster) -> None:
    """The stand-in accepted anything; a real API server refuses DNS-1035-invalid Service names
    (a job named ``7b-sft`` gets no headless Service of its name)."""
    real.namespace("dnsnames")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "7b-sft"},
           "spec": {"clusterIP": "None", "selector": {"a": "b"}}}
    proc = real.kubectl("apply", "-n", "dnsnames", "-f", "-", input_text=json.dumps(svc), check=False)
    assert proc.returncode != 0 and "a DNS-1035 label must consist of" in proc.stderr, proc.stderr
