"""The manifests shown in docs/dra.md and docs/kueue.md validate: built-in kinds strictly with
kubernetes-validate for Kubernetes 1.34, Kueue kinds against Kueue's own CRD schemas
(tests/fixtures/kueue/), HeteroTrainingJobs against our CRD."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.34.0"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def doc_manifests(name: str) -> list[dict[str, Any]]:
    text = (REPO / "docs" / name).read_text()
    return [d for block in BLOCK.findall(text) for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and "kind" in d]


def test_dra_doc_manifests_validate_for_kubernetes_134() -> None:
    docs = doc_manifests("dra.md")
    assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "Pod"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_dra_doc_template_is_what_the_operator_renders() -> None:
    """The documented template is the rendered one of tests/operator/test_dra.py's MIG group."""
    from test_dra import rendered

    _plan, _pods, templates = rendered()
    assert doc_manifests("dra.md")[0] == templates[1]


def test_kueue_doc_manifests_validate() -> None:
    """Kueue objects against Kueue v0.19.2's CRDs, the job against ours; the manager
    configuration names our kind as Kueue spells an external framework (Kind.version.group)."""
    from k8s import crdcheck, kueuecheck

    docs = doc_manifests("kueue.md")
    assert [d["kind"] for d in docs] == ["Configuration", "ResourceFlavor", "ResourceFlavor",
                                         "ClusterQueue", "LocalQueue", "HeteroTrainingJob"]
    assert docs[0]["integrations"]["externalFrameworks"] == ["HeteroTrainingJob.v1alpha1.heterotrain.io"]
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
              "LocalQueue": "localqueues"}
    for doc in docs[1:5]:
        kueuecheck.validate(doc, plural[doc["kind"]])
    crdcheck.validate(docs[5])
    assert docs[5]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == docs[4]["metadata"]["name"]
    products = {f["spec"]["nodeLabels"]["nvidia.com/gpu.product"] for f in docs[1:3]}
    assert products == set(docs[5]["spec"]["gpus"]["allowedProducts"])


def test_queued_job_example_validates_and_is_not_suspended_by_hand() -> None:
    """examples/queued-job.yaml: Kueue holds it through the Workload, so no runPolicy.suspend."""
    from k8s import crdcheck

    body = next(d for d in yaml.safe_load_all((REPO / "examples" / "queued-job.yaml").read_text())
                if d["kind"] == "HeteroTrainingJob")  # after its checkpoint claim
    crdcheck.validate(body)
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert "suspend" not in body["spec"]["runPolicy"]
