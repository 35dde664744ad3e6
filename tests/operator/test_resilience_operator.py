"""The operator's side of issue 20 with a fake API object: a start whose pods the API server
refuses (quota, Pod Security, a webhook) backs off without a storm; the job's NetworkPolicy adds
egress when the namespace isolates it; ranks that stopped at an agreed step after a SIGTERM are
an infrastructure restart.  The real API server's version of the first is
tests/cluster/test_operator_real.py (a real ResourceQuota)."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
from test_handlers import CONFIG, NOW, FakeApi, _job, _reconciler, _status

from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import status as st
from heterotrain_common.envnames import PREEMPTED_EXIT_CODE

QUOTA = ('pods "digits-g2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, '
         'used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2')


class QuotaApi(FakeApi):
    """Refuses the T4 pod (two GPUs) with the API server's 403, while ``refuse`` is set."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.refuse = True
        self.pod_creates = 0
        self.policies: list[dict[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> bool:
        if obj["kind"] == "Pod":
            self.pod_creates += 1
            if self.refuse and obj["metadata"]["name"] == "digits-g2":
                exc = kubernetes.client.ApiException(status=403, reason="Forbidden")
                exc.body = json.dumps({"kind": "Status", "message": QUOTA, "reason": "Forbidden"})
                raise exc
        return await super().create(obj)

    async def list_network_policies(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.policies)


async def test_a_refused_pod_removes_the_attempt_waits_pending_and_backs_off() -> None:
    api = QuotaApi(_job())
    config = CONFIG.with_({"restart.backoff_base_s": 10, "restart.backoff_max_s": 300})
    clock = [NOW]
    rec = _reconciler(api, config=config)
    rec.clock = lambda: clock[0]
    wait = await rec.reconcile("team-x", "digits")
    status = _status(api)
    assert status["phase"] == "Pending" and QUOTA in status["message"]
    assert status["createRefusals"] == 1 and wait == 10
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "PodsRefused") and QUOTA in created["message"]
    assert api.pods == {}, "what this start created is removed"
    assert sorted(api.deleted_pods) == ["digits-g0", "digits-g1", "digits-g2"]
    assert [e[:2] for e in api.events if e[1] == "PodsRefused"] == [("Warning", "PodsRefused")]
    # within the backoff: nothing is created, nothing is written
    creates = api.pod_creates
    clock[0] = NOW + 5
    assert await rec.reconcile("team-x", "digits") == 5
    assert api.pod_creates == creates and _status(api) == status
    # at the backoff: one more try, refused again, the next wait doubles; one Event, counted
    clock[0] = NOW + 10
    assert await rec.reconcile("team-x", "digits") == 20
    assert _status(api)["createRefusals"] == 2 and api.pod_creates == creates + 3
    assert len([e for e in api.events if e[1] == "PodsRefused"]) == 1
    # a minute of refusals costs a handful of tries, never a storm
    tries = 2
    clock[0] = NOW + 30
    while clock[0] < NOW + 90:
        wait = await rec.reconcile("team-x", "digits")
        tries += 1
        clock[0] += wait
    assert tries <= 4, tries
    # the quota is raised: the next try starts the job and the refusal is forgotten
    api.refuse = False
    await rec.reconcile("team-x", "digits")
    status = _status(api)
    assert status["phase"] == "Created" and sorted(api.pods) == ["digits-g0", "digits-g1", "digits-g2"]
    assert "createRefusals" not in status and "createRetryTime" not in status


async def test_the_jobs_policy_adds_egress_only_when_the_namespace_isolates_it() -> None:
    api = QuotaApi(_job())
    api.refuse = False
    await _reconciler(api).reconcile("team-x", "digits")
    assert api.others["digits"]["spec"]["policyTypes"] == ["Ingress"]  # an open namespace stays open
    api = QuotaApi(_job())
    api.refuse = False
    api.policies = [{"metadata": {"name": "default-deny-all", "namespace": "team-x"},
                     "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}]
    await _reconciler(api).reconcile("team-x", "digits")
    policy = api.others["digits"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["egress"][1]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert policy["egress"][1]["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    never = QuotaApi(_job())
    never.refuse = False
    never.policies = api.policies
    await _reconciler(never, config=CONFIG.with_({"network.egress": "never"})).reconcile("team-x", "digits")
    assert never.others["digits"]["spec"]["policyTypes"] == ["Ingress"]


def _stopped_pod(name: str, rank: int, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"heterotrain.io/rank": str(rank),
                                                    "heterotrain.io/attempt": "1"}}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": f"node-{rank}"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "worker", "state": {
                "terminated": {"exitCode": PREEMPTED_EXIT_CODE, "reason": "Error"}}}]}}


def test_ranks_that_stopped_after_a_peers_sigterm_restart_as_infrastructure() -> None:
    job = lc.JobState(phase="Running", attempt=1, restarts=0, planned_pods=("j-g0", "j-g1", "j-g2"))
    pods = [st.pod_state(_stopped_pod("j-g0", 0)), st.pod_state(_stopped_pod("j-g1", 1)),
            st.pod_state(_stopped_pod("j-g2", 2, deleting=True))]  # the preempted one
    assert pods[0].disruption == lc.STOPPED_AT_CHECKPOINT
    d = lc.decide(job, lc.RunPolicy(backoff_limit=0), pods, nodes=None, now_s=NOW)
    assert (d.action, d.count_restart, d.count_infrastructure_restart) == (lc.RESTART, False, True)
    assert d.reason == "PodDeleted" and d.message.startswith("j-g2 on node-2 was deleted while the job ran")
    # preempted by the scheduler: its DisruptionTarget names the cause, before its exit code
    preempted = _stopped_pod("j-g2", 2, deleting=True)
    preempted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                          "reason": "PreemptionByScheduler"}]
    d = lc.decide(job, lc.RunPolicy(backoff_limit=0), [*pods[:2], st.pod_state(preempted)], nodes=None, now_s=NOW)
    assert (d.reason, d.count_infrastructure_restart) == ("PodPreempted", True)
    assert d.message.startswith("j-g2 on node-2 was preempted (PreemptionByScheduler)")
    # the preempted pod already gone: still the cluster's doing
    d = lc.decide(job, lc.RunPolicy(backoff_limit=0), pods[:2], nodes=None, now_s=NOW)
    assert d.count_infrastructure_restart and not d.count_restart
    # exit 75 with no cause in sight (every pod there, none disrupted): an ordinary failure
    alone = [st.pod_state(_stopped_pod(f"j-g{i}", i)) for i in range(3)]
    d = lc.decide(job, lc.RunPolicy(backoff_limit=3), alone, nodes=None, now_s=NOW)
    assert d.count_restart and not d.count_infrastructure_restart
