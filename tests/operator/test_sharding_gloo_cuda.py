"""Group sharding never runs FSDP2 over a Gloo group on CUDA (issue 21, pytorch/pytorch#132471).

The communicator rule gives a group Gloo where its members may share a physical GPU (time-sliced
replicas, MIG slices of one card); Gloo has no CUDA reduce-scatter/all-gather.  The planner refuses
Group sharding for groups of time-sliced devices (naming the fix), and the worker refuses it from
the job-wide communicator plan for whatever the planner cannot see (the real run on a GPU:
tests/gpu/test_gpu_sharding_gloo.py).
"""

from __future__ import annotations

import pytest
from builders import job_manifest, make_node

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_worker.comm.commplan import CommRank, plan_communicators
from hetero_worker.memory.group import refuse_gloo_on_cuda
from heterotrain_common.topology import GroupLayout

CUDA_IMAGE = [{"image": "reg/w:cu124", "cudaVersion": "12.4", "torchVersion": "2.13.0",
               "computeCapabilities": ["8.0", "8.6"]}]


def sharded(sharding: str) -> object:
    return parse_job(job_manifest(ranks=2, global_batch=32, images=CUDA_IMAGE, training={
        "model": {"parameters": "100M"}, "sharding": sharding, "precision": "BF16"}))


def test_group_sharding_on_time_sliced_replicas_is_refused_at_plan_time_naming_the_fix() -> None:
    inventory = build_inventory([make_node("node-ts", product="NVIDIA-A10G", count=2, replicas=4,
                                           memory_mib=24576, cc="8.6")])
    result = plan_job(sharded("Group"), inventory)
    assert isinstance(result, model.Unschedulable), result
    assert result.reason == "ModelDoesNotFit"
    assert "Gloo group on CUDA" in result.message and "pytorch/pytorch#132471" in result.message
    assert "set spec.training.sharding Full (it stages through the CPU) or None" in result.message
    full = plan_job(sharded("Full"), inventory)  # the fix it names plans
    assert isinstance(full, model.Plan) and full.memory.mode == "Full"


def test_group_sharding_on_exclusive_gpus_still_plans() -> None:
    inventory = build_inventory([make_node("node-x", product="NVIDIA-A10G", count=2,
                                           memory_mib=24576, cc="8.6")])
    result = plan_job(sharded("Group"), inventory)
    assert isinstance(result, model.Plan) and result.memory.mode == "Group"


def ranks(*, shared: bool, cuda: bool = True) -> list[CommRank]:
    """Ranks 0 and 1 on node n (one GPU between them when ``shared``), rank 2 elsewhere."""
    gpu = ["0000:01:00.0", "0000:01:00.0" if shared else "0000:02:00.0", "0000:01:00.0"]
    return [CommRank(rank=r, node="n" if r < 2 else "m", gpu_type="NVIDIA-A10G-SHARED",
                     torch_build="2.13.0+cu128", on_cuda=cuda, physical_gpu=gpu[r])
            for r in range(3)]


@pytest.mark.parametrize(("shared", "cuda", "refused"), [
    (True, True, True), (False, True, False), (True, False, False)],
    ids=["two CUDA ranks on one physical GPU: Gloo on CUDA, refused",
         "two CUDA ranks on two GPUs: NCCL, fine",
         "two CPU ranks: Gloo on CPU tensors, fine"])
def test_the_worker_refuses_fsdp2_over_gloo_on_cuda_from_the_plan(shared, cuda, refused) -> None:
    comm = ranks(shared=shared, cuda=cuda)
    plan = plan_communicators(comm, GroupLayout(mode="group", groups=((0, 1), (2,)), leaders=(0, 2)))
    if not refused:
        refuse_gloo_on_cuda(plan, comm)
        return
    with pytest.raises(RuntimeError, match=r"ranks \[0, 1\] would run FSDP2 over a Gloo group on CUDA \(two members on one physical GPU"
                                           r".*pytorch/pytorch#132471.*sharding Full"):
        refuse_gloo_on_cuda(plan, comm)
