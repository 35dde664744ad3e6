"""The chart grants what the operator's code calls (issue 32, F14), and ships the queue admission
policy (F3).

F14: the Event recorder counts a repeated Event on the one object (create, then on 409 get and
patch), while the chart granted only ``create`` on events: every repeat failed with 403 and the
count never grew.  The calls are taken from the recorder itself (a recording API), not from a
list written beside it.  The same holds for the reads that follow a create answered 409
(hetero_operator.controller.ownership).  The policy's CEL is exercised on the real API server
(tests/cluster/test_queue_policy_real.py); here its rendering."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm import helm
from test_chart import CHART, NAMESPACE, RELEASE, env_of, grants, objects, one, operator_container

from hetero_operator.api.settings import OperatorConfig
from hetero_operator.controller.events import EventRecorder

VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
pytestmark = pytest.mark.timeout(120)


class RecordingEvents:
    """The Event calls of hetero_operator.controller.k8s.Api, on a dict, recording each call."""

    VERBS = {"create_event": "create", "get_event": "get", "patch_event": "patch"}

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.called: list[str] = []

    async def create_event(self, namespace: str, event: dict[str, Any]) -> bool:
        self.called.append("create_event")
        if event["metadata"]["name"] in self.store:
            return False
        self.store[event["metadata"]["name"]] = dict(event)
        return True

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.called.append("get_event")
        return self.store.get(name)

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.called.append("patch_event")
        self.store[name].update(patch)


def _roles(scenario: str) -> list[list[dict[str, Any]]]:
    """Per place the operator writes: the rule sets that apply there (cluster scope: the one
    ClusterRole; namespaced: the ClusterRole plus each namespace's Role)."""
    cluster_roles = [r for r in objects(scenario, kind="ClusterRole") if "crd-upgrade" not in r["metadata"]["name"]]
    roles = objects(scenario, kind="Role")
    return [[*cluster_roles, r] for r in roles] if roles else [cluster_roles]


def _granted(rule_sets: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(grants(r, group, resource, verb) for r in rule_sets)


@pytest.mark.parametrize("scenario", ["default", "namespaced-values.yaml"])
def test_f14_every_event_call_the_recorder_makes_is_granted(scenario: str) -> None:
    api = RecordingEvents()
    recorder = EventRecorder(api, repeat_s=0.0)
    job = {"metadata": {"name": "digits", "namespace": "team-a", "uid": "u"}}
    for now in (1.0, 2.0):  # the same Warning twice: created, then counted
        asyncio.run(recorder.post(job, "Warning", "Unschedulable", "no GPUs", now))
    assert next(iter(api.store.values()))["count"] == 2
    verbs = {RecordingEvents.VERBS[c] for c in api.called}
    assert verbs == {"create", "get", "patch"}
    for rule_set in _roles(scenario):
        for verb in sorted(verbs):
            assert _granted(rule_set, "", "events", verb), (scenario, verb)


@pytest.mark.parametrize("scenario", ["default", "namespaced-values.yaml"])
def test_a_create_answered_409_can_read_what_exists(scenario: str) -> None:
    """Ownership on every create: the object that answered 409 is read before anything else."""
    for rule_set in _roles(scenario):
        for group, resource in (("", "pods"), ("", "services"), ("networking.k8s.io", "networkpolicies"),
                                ("resource.k8s.io", "resourceclaimtemplates"), ("kueue.x-k8s.io", "workloads")):
            assert _granted(rule_set, group, resource, "create"), (scenario, resource)
            assert _granted(rule_set, group, resource, "get"), (scenario, resource)


def _render(*args: str) -> list[dict[str, Any]]:
    text = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_queue_policy_is_rendered_where_the_api_server_serves_it() -> None:
    docs = _render("--api-versions", VAP)
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    for doc in (policy, binding):
        kubernetes_validate.validate(doc, "1.34.0", strict=True)
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["heterotrain.io"], ["heterotrainingjobs"], ["CREATE", "UPDATE"])
    assert [v["reason"] for v in policy["spec"]["validations"]] == ["Invalid", "Forbidden"]
    # an API server without it (Kubernetes < 1.30), or the policy turned off: nothing rendered
    assert not [d for d in objects("default") if "AdmissionPolicy" in d["kind"]]
    assert not [d for d in _render("--api-versions", VAP, "--set", "operator.queuePolicy.enabled=false")
                if "AdmissionPolicy" in d["kind"]]


def test_require_queue_reaches_the_operator_config() -> None:
    assert env_of(operator_container())["HTJ_REQUIRE_QUEUE"] == "false"
    env = env_of(one("default", "Deployment", "operator.requireQueue=true")["spec"]["template"]["spec"]
                 ["containers"][0])
    assert OperatorConfig.from_env({k: v for k, v in env.items() if v is not None}).kueue.require_queue is True
