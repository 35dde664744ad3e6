"""Ownership on every create through the operator's real API wrapper (kopf in process, the HTTP
fake API server of tests/k8s/fakeapi.py; issue 32, F1 and F4).

The objects in the way are placed by the test before the job exists, so every create the operator
makes of that name is answered 409 by the server, and the read that follows sees an object
without the job's ownerReference.  No kubelet: the pods the operator creates stay unbound."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import e2e_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PODS = ("", "v1", "pods")
NETPOL = ("networking.k8s.io", "v1", "networkpolicies")
CONFIG = e2e_config({"restart.backoff_base_s": 0.3, "restart.backoff_max_s": 5.0})

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("ownership"), kubelet=False) as cl:
        await cl.add_nodes(load_nodes())
        await cl.start_operator(CONFIG)
        yield cl


def job(name: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    return body


def status(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    return (cluster.job(name, ns) or {}).get("status") or {}


async def test_f1_a_job_named_like_a_default_deny_policy_never_opens_it(cluster: Cluster) -> None:
    """Today the 409 on the job's NetworkPolicy is taken as the job's own policy and its spec is
    patched to the job's (ingress from the job's pods and the metrics namespaces): the namespace's
    default deny is opened, and deleting the job does not undo it."""
    ns = "f1"
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny", "namespace": ns},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}
    before = await cluster.api.create(NETPOL, ns, deny)
    await cluster.apply(job("default-deny"), ns)
    await cluster.wait_for(lambda: status(cluster, "default-deny", ns).get("createRefusals"), 30,
                           "the start to be refused")
    st = status(cluster, "default-deny", ns)
    assert st["phase"] == "Pending"
    assert f"NetworkPolicy {ns}/default-deny exists and is not this job's" in st["message"]
    await cluster.wait_for(lambda: [e for e in cluster.events("default-deny", ns)
                                    if e["reason"] == "ObjectNotOwned"], 30, "the Warning Event")
    (event,) = [e for e in cluster.events("default-deny", ns) if e["reason"] == "ObjectNotOwned"]
    assert event["type"] == "Warning" and "delete or rename that NetworkPolicy" in event["message"]
    assert cluster.api.get(NETPOL, ns, "default-deny") == before
    assert cluster.pods(ns) == []
    await cluster.api.delete(("heterotrain.io", "v1alpha1", "heterotrainingjobs"), ns, "default-deny")
    assert cluster.api.get(NETPOL, ns, "default-deny") == before


async def test_f4_an_unowned_pod_of_a_planned_name_costs_a_few_backed_off_tries(cluster: Cluster) -> None:
    """Today a 409 on a pod create counts as created and the job re-plans, deletes and starts
    again for ever (measured: 275 starts, 550 pod creates and 548 deletes in 20 s).  Now each
    try is refused, undone without touching the other pod, and the next waits twice as long."""
    ns = "f4"
    foreign = await cluster.api.create(PODS, ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "digits-g0", "namespace": ns},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
    await cluster.apply(job("digits"), ns)
    await cluster.wait_for(lambda: (status(cluster, "digits", ns).get("createRefusals") or 0) >= 3, 30,
                           "three refused tries")
    st = status(cluster, "digits", ns)
    assert "Pod f4/digits-g0 exists and is not this job's" in st["message"]
    per_try = len(st["plan"]["pods"]) - 1
    creates = [c for c in cluster.api.created if c[0] == PODS and c[1] == ns and c[2] != "digits-g0"]
    assert len(creates) <= 3 * per_try + per_try, creates  # 3 tries (a 4th may be under way)
    assert not [d for d in cluster.api.deletions if d[:3] == (PODS, ns, "digits-g0")]
    assert cluster.api.get(PODS, ns, "digits-g0") == foreign
    assert 0 < per_try < len(st["plan"]["pods"])
    assert copy.deepcopy(st["conditions"]) and next(
        c for c in st["conditions"] if c["type"] == "Created")["reason"] == "ObjectNotOwned"
