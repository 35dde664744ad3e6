"""What the operator renders for an elastic job (issue 31): the membership keeper pod, the ranks'
store address, a rank pod created again to join, and the local kubelet's port remapping of the
store address."""

from __future__ import annotations

from builders import a100_and_two_t4_plan, job_manifest, make_node

from hetero_operator.api.spec import parse_job
from hetero_operator.api import types as model
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.controller.elasticpods import ElasticPods
from hetero_operator.devcluster import podenv
from hetero_operator.lifecycle import status as st
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import keeper
from hetero_operator.render.env import render_rank_envs
from hetero_operator.render.pods import render_pods
from heterotrain_common import envnames

A100 = "NVIDIA-A100-SXM4-40GB"
PORT = 29500


def _job(elastic: bool = True):
    body = job_manifest(name="el", ranks=3, global_batch=96)
    body["metadata"]["namespace"] = "team"
    body["spec"]["worker"]["metricsPort"] = 9480
    if elastic:
        body["spec"]["elastic"] = {"minRanks": 2}
    return parse_job(body)


def _plan(job) -> model.Plan:
    return a100_and_two_t4_plan(job)


def test_the_keeper_pod_hosts_the_store_on_rank_0s_node_with_no_gpu_and_no_token() -> None:
    job = _job()
    plan = _plan(job)
    pods = ElasticPods.keeper_pods(job, plan, master_port=PORT, attempt=2, run_as_non_root=True)
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["name"] == "el-membership"
    assert pod["metadata"]["labels"] == {"heterotrain.io/job-name": "el", "heterotrain.io/attempt": "2",
                                         "app.kubernetes.io/managed-by": "heterotrain-operator",
                                         "heterotrain.io/role": "membership-keeper"}
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["heterotrain", "keeper", "--members", "3", "--min-ranks", "2",
                            "--max-ranks", "3"]
    assert c["env"] == [{"name": "MASTER_PORT", "value": "29500"},
                        {"name": "HTJ_METRICS_PORT", "value": "9480"}]
    assert c["image"] == plan.groups[0].image
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                    "capabilities": {"drop": ["ALL"]}}
    assert (spec["automountServiceAccountToken"], spec["hostname"], spec["subdomain"]) == (False, "el-membership", "el")
    assert spec["securityContext"]["runAsNonRoot"] is True
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [plan.groups[0].node]}]}]
    assert ElasticPods.keeper_pods(_job(elastic=False), plan, master_port=PORT, attempt=1,
                                   run_as_non_root=True) == []


def test_every_rank_meets_through_the_keepers_store_and_a_regrown_pod_joins_next() -> None:
    job = _job()
    plan = _plan(job)
    addr = ElasticPods.master_addr(job, plan, "svc")
    assert addr == "el-membership.el.team.svc"
    envs = ElasticPods.rank_envs(job, render_rank_envs(plan, job, master_addr=addr, master_port=PORT,
                                                       simulated=True), master_addr=addr, master_port=PORT)
    assert {e[envnames.ELASTIC_STORE] for e in envs} == {"el-membership.el.team.svc:29500"}
    assert {e[envnames.MASTER_ADDR] for e in envs} == {addr}
    plain = _job(elastic=False)
    assert envnames.ELASTIC_STORE not in ElasticPods.rank_envs(
        plain, render_rank_envs(plan, plain, master_addr="x", master_port=PORT, simulated=True),
        master_addr="x", master_port=PORT)[0]
    pod = render_pods(job, plan, envs, launcher=["heterotrain", "launch", "--"])[-1]
    again = keeper.joining(pod)
    env = {e["name"]: e.get("value") for e in again["spec"]["containers"][0]["env"]}
    assert env[envnames.ELASTIC_JOIN_GENERATION] == "next"
    assert envnames.ELASTIC_JOIN_GENERATION not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert again["metadata"] == pod["metadata"] and again["spec"]["affinity"] == pod["spec"]["affinity"]
    moved = keeper.on_node(again, "node-t4-b")
    terms = moved["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": ["node-t4-b"]}]}]
    assert st.pod_state(moved, planned_node="node-t4").node == "node-t4-b"  # pinned, not yet bound
    assert st.pod_state(pod, planned_node="node-t4").node == "node-t4"


def test_the_local_kubelet_remaps_the_store_address_to_the_attempts_master_port() -> None:
    pod = {"metadata": {"namespace": "team", "name": "el-g1"}}
    container = {"env": [{"name": "MASTER_PORT", "value": "29500"},
                         {"name": "HTJ_ELASTIC_STORE", "value": "el-membership.el.team.svc:29500"}]}
    asked: list[str] = []

    def port_for(name: str, count: int) -> int:
        asked.append(name)
        return 41234

    env = podenv.container_env(pod, container, {}, lookup=lambda *a: None, port_for=port_for)
    assert (env["MASTER_PORT"], env["HTJ_ELASTIC_STORE"]) == ("41234", "127.0.0.1:41234")
    assert asked == ["MASTER_PORT", "MASTER_PORT"]


def test_free_whole_gpus_counts_what_no_pod_holds_on_usable_nodes_only() -> None:
    from builders import make_pod

    from hetero_operator.controller.planner import free_whole_gpus

    nodes = [make_node("node-t4", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5"),
             make_node("node-t4-b", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5"),
             make_node("node-t4-c", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5",
                       unschedulable=True),
             make_node("node-mig", mig_single="1g.5gb")]
    pods = [make_pod("node-t4-b", {"nvidia.com/gpu": 1}), make_pod("node-t4", {"nvidia.com/gpu": 2})]
    assert free_whole_gpus(_job(), nodes, pods) == {"Tesla-T4": {"node-t4": 0, "node-t4-b": 1}}
