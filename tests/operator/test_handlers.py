"""Handlers and the reconciler with a fake API object (no HTTP): each decision's side effects."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

import hetero_operator.controller.main  # noqa: F401 - registers the handlers
from hetero_operator.api.settings import OperatorConfig
from hetero_operator.cluster import nodeindex
from hetero_operator.controller import runner
from hetero_operator.controller.leadership import peering_leader
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.reconcile import Reconciler
from hetero_operator.lifecycle.status import STATUS_KEYS

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


class FakeApi:
    """Records calls; pods and jobs live in dicts; creates tolerate 409 like the real wrapper."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.jobs = {(job["metadata"]["namespace"], job["metadata"]["name"]): job}
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.others: dict[str, dict[str, Any]] = {}  # NetworkPolicy
        self.events: list[tuple[str, str, str]] = []
        self.event_objects: dict[str, dict[str, Any]] = {}
        self.deleted_pods: list[str] = []
        self.force_deleted_pods: list[str] = []
        self.create_calls = 0
        self.create_order: list[str] = []
        self.peering: dict[str, Any] | None = None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        job = self.jobs.get((namespace, name))
        return copy.deepcopy(job) if job else None

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        job = self.jobs[(namespace, name)]
        current = job.setdefault("status", {})
        for k, v in status.items():
            if v is None:
                current.pop(k, None)
            else:
                current[k] = copy.deepcopy(v)

    async def delete_job(self, namespace: str, name: str) -> None:
        self.jobs.pop((namespace, name), None)

    async def create(self, obj: dict[str, Any]) -> bool:
        self.create_calls += 1
        self.create_order.append(f"{obj['kind']}/{obj['metadata']['name']}")
        store = {"Pod": self.pods, "Service": self.services}.get(obj["kind"], self.others)
        if obj["metadata"]["name"] in store:
            return False
        store[obj["metadata"]["name"]] = copy.deepcopy(obj)
        return True

    async def read(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        store = {"Pod": self.pods, "Service": self.services}.get(obj["kind"], self.others)
        found = store.get(obj["metadata"]["name"])
        return copy.deepcopy(found) if found is not None else None

    async def patch_network_policy(self, obj: dict[str, Any]) -> None:
        self.others[obj["metadata"]["name"]]["spec"] = copy.deepcopy(obj["spec"])

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values()
                if labels.items() <= p["metadata"]["labels"].items()]

    async def delete_pod(self, namespace: str, name: str, *, grace_s: int | None = None) -> None:
        (self.force_deleted_pods if grace_s == 0 else self.deleted_pods).append(name)
        self.pods.pop(name, None)

    async def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        return self.peering

    async def create_event(self, namespace: str, event: dict[str, Any]) -> bool:
        if event["metadata"]["name"] in self.event_objects:
            return False
        self.event_objects[event["metadata"]["name"]] = copy.deepcopy(event)
        self.events.append((event["type"], event["reason"], event["message"]))
        return True

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.event_objects.get(name))

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.event_objects[name].update(patch)

    def close(self) -> None:
        pass


def _job(**spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"].update(namespace="team-x", uid="uid-1", generation=1)
    for section, values in spec.items():
        body["spec"].setdefault(section, {}).update(values)
    return body


def _nodes() -> list[dict[str, Any]]:
    return yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]


CONFIG = OperatorConfig().with_({"peering.name": "", "restart.unschedulable_retry_s": 30,
                                 "intervals.resync_s": 10, "ports.metrics": 0, "ports.health": 0})


def _reconciler(api: FakeApi, nodes: list[dict[str, Any]] | None = None, clock: float = NOW,
                config: OperatorConfig = CONFIG) -> Reconciler:
    nodes = _nodes() if nodes is None else nodes
    return Reconciler(config=config, api=api, metrics=OperatorMetrics(), nodes=lambda: nodes,
                      gpu_pods=lambda: [], clock=lambda: clock)


def _status(api: FakeApi) -> dict[str, Any]:
    return api.jobs[("team-x", "digits")]["status"]


def _set_phase(api: FakeApi, **phases: str) -> None:
    for name, phase in phases.items():
        api.pods[name]["status"] = {"phase": phase}
        api.pods[name]["spec"]["nodeName"] = api.pods[name]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]


def test_no_handler_puts_a_finalizer_on_the_job() -> None:
    """shared/cases/23: no timers/daemons and no mandatory delete handlers for our resource."""
    registry = kopf.get_default_registry()
    assert registry._spawning.get_all_handlers() == []
    changing = registry._changing.get_all_handlers()
    assert all(h.requires_finalizer is False or h.requires_finalizer is None for h in changing)
    watched = {h.fn.__name__ for h in registry._watching.get_all_handlers()}
    assert watched == {"job_event", "workload_event"}  # Nodes and Pods: controller/informer.py
    assert registry._indexing.get_all_handlers() == []  # no kopf index paces the node inventory


async def test_new_job_is_planned_then_pods_and_service_created() -> None:
    api = FakeApi(_job())
    requeue = await _reconciler(api).reconcile("team-x", "digits")
    assert requeue == CONFIG.intervals.resync_s
    assert sorted(api.pods) == ["digits-g0", "digits-g1", "digits-g2"]
    assert list(api.services) == ["digits"]
    owner = api.pods["digits-g0"]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "HeteroTrainingJob", "digits", "uid-1", True)
    st = _status(api)
    assert st["phase"] == "Created" and st["attempt"] == 1 and st["ranksWanted"] == 4
    assert [(g["pod"], g["node"], g["gpuType"], g["firstRank"], g["ranks"]) for g in st["plan"]["groups"]] == [
        ("digits-g0", "node-a100", "NVIDIA-A100-SXM4-40GB", 0, 1),
        ("digits-g1", "node-v100", "Tesla-V100-SXM2-16GB", 1, 1),
        ("digits-g2", "node-t4", "Tesla-T4", 2, 2)]
    assert st["plan"]["masterAddr"] == "digits-g0.digits.team-x.svc"
    assert st["gpuTypes"] == "NVIDIA-A100-SXM4-40GB:1,Tesla-V100-SXM2-16GB:1,Tesla-T4:2"
    assert set(st) <= STATUS_KEYS
    assert api.events[0][:2] == ("Normal", "Planned")


async def test_service_exists_before_any_rank_pod_and_all_pods_come_in_one_pass() -> None:
    """shared/cases/17: rank 0 is often the last pod up; its name must already resolve.

    Our policy is "waiting", not "ordering": the headless Service (publishNotReadyAddresses) is
    created first, every pod in the same pass, and the worker's rendezvous retries until rank 0
    listens, so no rank crash-loops while rank 0's image is still pulling.
    """
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    assert api.create_order == ["Service/digits", "NetworkPolicy/digits", "Pod/digits-g0",
                                "Pod/digits-g1", "Pod/digits-g2"]
    assert api.services["digits"]["spec"]["publishNotReadyAddresses"] is True
    # the NetworkPolicy exists before any pod and goes with the job (owner reference)
    policy = api.others["digits"]
    assert [(o["kind"], o["name"]) for o in policy["metadata"]["ownerReferences"]] == [
        ("HeteroTrainingJob", "digits")]
    assert policy["spec"]["podSelector"] == {"matchLabels": {
        "heterotrain.io/job-name": "digits", "app.kubernetes.io/managed-by": "heterotrain-operator"}}
    off = FakeApi(_job())
    await _reconciler(off, config=CONFIG.with_({"network.policy": False})).reconcile("team-x", "digits")
    assert off.create_order[:2] == ["Service/digits", "Pod/digits-g0"]


async def test_a_second_operator_creates_no_duplicates() -> None:
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    _set_phase(api, **{"digits-g0": "Running", "digits-g1": "Running", "digits-g2": "Running"})
    calls = api.create_calls
    await _reconciler(api).reconcile("team-x", "digits")  # a restarted operator
    assert api.create_calls == calls and sorted(api.pods) == ["digits-g0", "digits-g1", "digits-g2"]
    assert _status(api)["phase"] == "Running" and _status(api)["ranksSummary"] == "4/4"


async def test_unschedulable_job_gets_no_pods_and_the_shortfall_message() -> None:
    api = FakeApi(_job(gpus={"ranks": 8, "minRanks": 8}, training={"globalBatchSize": 128}))
    requeue = await _reconciler(api).reconcile("team-x", "digits")
    assert requeue == 30 and api.pods == {} and api.services == {}
    st = _status(api)
    assert st["phase"] == "Pending"
    assert st["message"].startswith("Unschedulable: ") and "need" in st["message"]
    created = [c for c in st["conditions"] if c["type"] == "Created"][0]
    assert (created["status"], created["reason"]) == ("False", "InsufficientGPUs")
    assert api.events == [("Warning", "InsufficientGPUs", st["message"])]


async def test_a_waiting_job_reposts_its_warning_periodically_as_one_aggregated_event() -> None:
    """Issue 10: after an hour `kubectl describe` must still say why the job waits."""
    api = FakeApi(_job(gpus={"ranks": 8, "minRanks": 8}, training={"globalBatchSize": 128}))
    clock = [NOW]
    rec = Reconciler(config=CONFIG, api=api, metrics=OperatorMetrics(), nodes=_nodes,
                     gpu_pods=lambda: [], clock=lambda: clock[0])
    await rec.reconcile("team-x", "digits")
    clock[0] = NOW + CONFIG.intervals.waiting_event_s - 1
    await rec.reconcile("team-x", "digits")
    (event,) = api.event_objects.values()
    assert event["count"] == 1  # unchanged message within the interval: not re-posted
    clock[0] = NOW + CONFIG.intervals.waiting_event_s
    await rec.reconcile("team-x", "digits")
    (event,) = api.event_objects.values()  # one object, its count bumped (Events aggregate)
    assert (event["reason"], event["count"], event["lastTimestamp"]) == (
        "InsufficientGPUs", 2, "2027-01-15T08:05:00Z")
    assert event["firstTimestamp"] == "2027-01-15T08:00:00Z"
    # a node disappears: the shortfall grows, the condition and a new Warning carry it
    rec.nodes = lambda: _nodes()[1:]
    clock[0] += 1
    await rec.reconcile("team-x", "digits")
    created = [c for c in _status(api)["conditions"] if c["type"] == "Created"][0]
    assert created["message"] == _status(api)["message"] != event["message"]
    assert [e[2] for e in api.events] == [event["message"], created["message"]]


async def test_invalid_spec_is_a_failed_condition_with_the_field_path() -> None:
    api = FakeApi(_job(gpus={"ranks": 2, "minRanks": 3}))
    assert await _reconciler(api).reconcile("team-x", "digits") is None
    st = _status(api)
    assert st["phase"] == "Failed"
    failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"] == "Invalid spec: spec.gpus.minRanks: 3 exceeds spec.gpus.ranks=2; lower minRanks or raise ranks"
    assert api.pods == {}


async def test_profile_steps_annotation_reaches_the_pods_and_the_status_says_where() -> None:
    job = _job()
    job["metadata"]["annotations"] = {"heterotrain.io/profile-steps": "20-25"}
    api = FakeApi(job)
    await _reconciler(api).reconcile("team-x", "digits")
    assert _status(api)["message"].endswith(
        " Profiling steps 20-25: every rank writes /tmp/heterotrain/digits/profiles/"
        "rank-<r>-steps-20-25.trace.json.")
    envs = [{e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]} for p in api.pods.values()]
    assert len(envs) == 3 and {e["HTJ_PROFILE_STEPS"] for e in envs} == {"20-25"}


async def test_an_unknown_field_the_api_server_let_through_is_a_condition_not_a_crash() -> None:
    """E.g. a CRD installed with preserve-unknown-fields, or a client that skipped validation."""
    api = FakeApi(_job(gpus={"ranks": 2, "minRank": 2}))
    assert await _reconciler(api).reconcile("team-x", "digits") is None
    failed = [c for c in _status(api)["conditions"] if c["type"] == "Failed"][0]
    assert (failed["reason"], failed["message"]) == (
        "InvalidSpec", "Invalid spec: spec.gpus.minRank: unknown field; did you mean minRanks?")
    assert api.pods == {}


async def test_failed_rank_restarts_everything_and_the_count_survives_a_new_operator() -> None:
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    _set_phase(api, **{"digits-g0": "Running", "digits-g1": "Running", "digits-g2": "Failed"})
    await _reconciler(api, clock=NOW + 1).reconcile("team-x", "digits")
    st = _status(api)
    assert st["phase"] == "Restarting" and st["restarts"] == 1
    assert sorted(api.deleted_pods) == ["digits-g0", "digits-g1", "digits-g2"] and api.pods == {}
    assert st["restartNotBefore"] == "2027-01-15T08:00:11Z"
    # a fresh operator (no memory) waits for the backoff, then starts attempt 2
    await _reconciler(api, clock=NOW + 5).reconcile("team-x", "digits")
    assert api.pods == {}
    await _reconciler(api, clock=NOW + 12).reconcile("team-x", "digits")
    assert _status(api)["attempt"] == 2 and _status(api)["restarts"] == 1
    assert {p["metadata"]["labels"]["heterotrain.io/attempt"] for p in api.pods.values()} == {"2"}


async def test_backoff_limit_exceeded_fails_and_deletes_pods() -> None:
    api = FakeApi(_job(runPolicy={"backoffLimit": 0, "cleanPodPolicy": "All"}))
    await _reconciler(api).reconcile("team-x", "digits")
    _set_phase(api, **{"digits-g0": "Running", "digits-g1": "Failed", "digits-g2": "Running"})
    assert await _reconciler(api).reconcile("team-x", "digits") == CONFIG.intervals.resync_s
    assert await _reconciler(api).reconcile("team-x", "digits") is None  # finished, nothing left
    st = _status(api)
    assert (st["phase"], [c["reason"] for c in st["conditions"] if c["type"] == "Failed"]) == (
        "Failed", ["BackoffLimitExceeded"])
    assert api.pods == {} and "completionTime" in st


async def test_suspend_then_resume() -> None:
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    api.jobs[("team-x", "digits")]["spec"]["runPolicy"]["suspend"] = True
    await _reconciler(api).reconcile("team-x", "digits")
    assert api.pods == {} and _status(api)["phase"] == "Suspended"
    api.jobs[("team-x", "digits")]["spec"]["runPolicy"]["suspend"] = False
    await _reconciler(api).reconcile("team-x", "digits")
    assert len(api.pods) == 3 and _status(api)["attempt"] == 2


async def test_ttl_deletes_a_finished_job() -> None:
    api = FakeApi(_job(runPolicy={"ttlSecondsAfterFinished": 5}))
    api.jobs[("team-x", "digits")]["status"] = {"phase": "Succeeded", "completionTime": "2027-01-15T08:00:00Z"}
    assert await _reconciler(api, clock=NOW + 2).reconcile("team-x", "digits") == pytest.approx(3)
    assert await _reconciler(api, clock=NOW + 5).reconcile("team-x", "digits") is None
    assert api.jobs == {}


async def test_kicks_coalesce_and_run_one_reconcile_at_a_time() -> None:
    api = FakeApi(_job())
    rec = _reconciler(api)
    calls: list[str] = []

    async def fake(namespace: str, name: str) -> None:
        calls.append(name)
        await asyncio.sleep(0.01)  # sync-ok: a reconcile that takes a moment

    rec.reconcile = fake  # type: ignore[method-assign]
    for _ in range(5):
        rec.kick("team-x", "digits")
    while rec.requeue._due or rec.requeue._tasks:  # the one kick fires and its reconcile ends
        await asyncio.sleep(0)  # sync-ok: yield to the loop while polling the asserted state
    assert calls == ["digits"]
    await rec.stop()


def test_peering_rule_matches_kopf() -> None:
    seen = "2027-01-15T08:00:00+00:00"
    body = {"status": {"me": {"priority": 5, "lastseen": seen, "lifetime": 60},
                       "other": {"priority": 9, "lastseen": seen, "lifetime": 60}}}
    assert peering_leader(body, "me", 5, NOW + 1) is False       # a live higher peer
    assert peering_leader(body, "me", 10, NOW + 1) is True       # we are higher
    assert peering_leader(body, "me", 5, NOW + 61) is True       # the other one is dead
    same = {"status": {"other": {"priority": 5, "lastseen": seen, "lifetime": 60}}}
    assert peering_leader(same, "me", 5, NOW + 1) is False       # a tie pauses both, like kopf
    assert peering_leader(None, "me", 5, NOW) is True            # no peering object: standalone


def test_node_index_keeps_what_the_planner_reads_and_gpu_pod_index_skips_finished() -> None:
    node = _nodes()[0]
    trimmed = nodeindex.trim_node({**node, "metadata": {**node["metadata"], "managedFields": [1]}})
    assert "managedFields" not in trimmed["metadata"]
    assert trimmed["metadata"]["labels"] == node["metadata"]["labels"]
    assert trimmed["status"]["allocatable"] == node["status"]["allocatable"]
    pod = {"metadata": {"name": "p", "namespace": "n"},
           "spec": {"nodeName": "node-t4", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running"}}
    assert list(nodeindex.gpu_pod_entry(pod)) == ["node-t4"]
    assert nodeindex.gpu_pod_entry({**pod, "status": {"phase": "Succeeded"}}) is None
    cpu = copy.deepcopy(pod)
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert nodeindex.gpu_pod_entry(cpu) is None


async def test_case_34_one_restart_generation_on_every_pod_and_backoff_limit_per_job() -> None:
    """shared/cases/34: after two gang restarts every pod says generation 2 (torchrun-style
    per-agent counters would say 0/0/2); a third failure with backoffLimit 2 fails the job
    whichever rank failed; restarts are the operator's, not a per-pod agent's."""
    from heterotrain_common.contract import expand_pod_env, parse_contract
    from heterotrain_common.envnames import RESTART_GENERATION, TORCHELASTIC_RESTART_COUNT

    case = list(yaml.safe_load_all((REPO / "tests" / "fixtures" / "cases" / "34-restart-count-not-global.yaml").read_text()))
    assert case[0]["job"]["spec"]["backoffLimit"] == 2 and case[1]["expected"]["store_prefix_allgather"] == ["gen-2"] * 3
    api = FakeApi(_job(runPolicy={"backoffLimit": 2}))
    clock = NOW
    await _reconciler(api, clock=clock).reconcile("team-x", "digits")
    for failing in ("digits-g2", "digits-g2"):  # the T4 rank fails twice (case: rank-2, exit 137)
        _set_phase(api, **{p: ("Failed" if p == failing else "Running") for p in api.pods})
        clock += 1
        await _reconciler(api, clock=clock).reconcile("team-x", "digits")
        clock += 100  # past the backoff
        await _reconciler(api, clock=clock).reconcile("team-x", "digits")
    st = _status(api)
    assert (st["restarts"], st["attempt"]) == (2, 3)
    pod_envs = {name: {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"] if "value" in e}
                for name, p in api.pods.items()}
    assert {n: (e[RESTART_GENERATION], e[TORCHELASTIC_RESTART_COUNT]) for n, e in pod_envs.items()} == {
        "digits-g0": ("2", "2"), "digits-g1": ("2", "2"), "digits-g2": ("2", "2")}
    # the worker reads one value on every rank, whatever a local agent's counter says
    ranks = [expand_pod_env(pod_envs["digits-g0"], 0), expand_pod_env(pod_envs["digits-g1"], 0),
             expand_pod_env(pod_envs["digits-g2"], 1)]
    local_counters = ["0", "0", "2"]
    for env, local in zip(ranks, local_counters):
        env[TORCHELASTIC_RESTART_COUNT] = local  # as if a torchrun agent inside restarted alone
    assert [f"gen-{parse_contract(env).dist.restart_generation}" for env in ranks] == ["gen-2"] * 3
    assert [f"gen-{env[TORCHELASTIC_RESTART_COUNT]}" for env in ranks] == ["gen-0", "gen-0", "gen-2"]
    # third failure, on another rank this time: the job-level limit holds
    _set_phase(api, **{p: ("Failed" if p == "digits-g0" else "Running") for p in api.pods})
    await _reconciler(api, clock=clock + 1).reconcile("team-x", "digits")
    st = _status(api)
    assert (st["phase"], st["restarts"]) == ("Failed", 2)
    assert [c["reason"] for c in st["conditions"] if c["type"] == "Failed"] == ["BackoffLimitExceeded"]


async def test_a_lost_node_is_recorded_before_its_pods_are_force_deleted() -> None:
    """The restart is in status before any pod goes: an operator dying in between cannot count
    it twice or lose it; the pod on the silent node goes with grace 0, its peers gracefully."""
    api = FakeApi(_job(runPolicy={"backoffLimit": 0, "nodeLossGraceSeconds": 60}))
    await _reconciler(api).reconcile("team-x", "digits")
    _set_phase(api, **{"digits-g0": "Running", "digits-g1": "Running", "digits-g2": "Running"})
    nodes = _nodes()
    t4 = next(n for n in nodes if n["metadata"]["name"] == "node-t4")
    t4["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                   "lastTransitionTime": "2027-01-15T08:00:00Z"}]
    seen: list[tuple[str, Any]] = []
    delete = api.delete_pod

    async def recording_delete(namespace: str, name: str, *, grace_s: int | None = None) -> None:
        seen.append((name, _status(api).get("infrastructureRestarts")))
        await delete(namespace, name, grace_s=grace_s)

    api.delete_pod = recording_delete  # type: ignore[method-assign]
    assert await _reconciler(api, nodes, clock=NOW + 59).reconcile("team-x", "digits") == pytest.approx(1.05)
    assert _status(api)["phase"] == "Created" and api.events[-1][:2] == ("Warning", "NodeNotReady")
    await _reconciler(api, nodes, clock=NOW + 60).reconcile("team-x", "digits")
    st = _status(api)
    assert (st["phase"], st["infrastructureRestarts"], st.get("restarts", 0)) == ("Restarting", 1, 0)
    assert st["lastNodeLoss"] == {"node": "node-t4", "reason": "Ready=Unknown (NodeStatusUnknown)",
                                  "notReadySince": "2027-01-15T08:00:00Z", "lostTime": "2027-01-15T08:01:00Z",
                                  "pods": ["digits-g2"]}
    assert (api.force_deleted_pods, sorted(api.deleted_pods)) == (["digits-g2"], ["digits-g0", "digits-g1"])
    assert {infra for _, infra in seen} == {1}
    assert api.events[-1][:2] == ("Warning", "NodeLost")


async def test_a_job_started_before_anothers_pods_are_indexed_does_not_take_their_gpus() -> None:
    """bench_operator: jobs started in the same seconds all planned onto the same free GPUs, since
    the pod index shows a start's pods only once the watch delivers them. Here the index never
    does (``gpu_pods`` is empty): the first start's hold keeps its 4 GPUs taken."""
    api = FakeApi(_job())  # 4 ranks on the mixed cluster's 4 GPUs, minRanks 2
    other = _job()
    other["metadata"].update(name="other", uid="uid-2")
    api.jobs[("team-x", "other")] = other
    clock = [NOW]
    rec = Reconciler(config=CONFIG, api=api, metrics=OperatorMetrics(), nodes=_nodes,
                     gpu_pods=lambda: [], clock=lambda: clock[0])
    await rec.reconcile("team-x", "digits")
    await rec.reconcile("team-x", "other")
    assert sorted(api.pods) == ["digits-g0", "digits-g1", "digits-g2"]
    assert api.jobs[("team-x", "other")]["status"]["phase"] == "Pending"
    clock[0] += 121  # a hold the index never confirms expires: the next start plans again
    await rec.reconcile("team-x", "other")
    assert {"other-g0", "other-g1", "other-g2"} <= set(api.pods)
