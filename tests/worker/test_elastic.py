"""Elastic membership with real Gloo processes (issue 31): a rank SIGKILLed mid-step shrinks the
job; the survivors redo the interrupted step with the same global batch, so every sample of each
epoch is trained exactly once and every update equals one float64 process's full-batch update.
Started again, the lost member joins the running job at a step boundary with a peer's state (the
job grows back), with the same two guarantees."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from elastic_ranks import dataset, make_model, reference_params
from hetero_operator.local.membership import MembershipHost
from heterotrain_common import envnames
from rankproc import HERE, mixed_cluster_envs, start_rank
from waiting import wait_until

LOCAL_BATCHES = [4, 3, 3]
EPOCHS, KILL_MEMBER = 3, 1  # 6 steps per epoch


def _run_elastic(out: Path, kill_at_step: int) -> tuple[list, float]:
    """Start 3 elastic ranks around a membership store; announce the victim's loss the moment
    its process is seen gone (what heterotrain run's supervisor does). Returns the processes'
    (returncode, stderr) and the seconds the run took."""
    host = MembershipHost(len(LOCAL_BATCHES))
    envs = mixed_cluster_envs(LOCAL_BATCHES, hierarchy="flat")
    started = time.monotonic()
    procs = [start_rank([sys.executable, str(HERE / "elastic_ranks.py"), str(out), str(EPOCHS),
                         str(KILL_MEMBER), str(kill_at_step)], env,
                        **{envnames.ELASTIC_STORE: host.address, envnames.ELASTIC_MEMBER: str(r),
                           envnames.COLLECTIVE_TIMEOUT_S: "20"})
             for r, env in enumerate(envs)]
    victim = procs[KILL_MEMBER]
    victim.wait(timeout=60)  # it kills itself at kill_at_step
    host.announce([{"member": KILL_MEMBER, "gpu_product": "Tesla-V100-SXM2-16GB",
                    "node": "node-a", "exit_code": 128 + signal.SIGKILL}],
                  reason="process killed", lost_at_s=time.time())
    results = []
    for p in procs:
        _, err = p.communicate(timeout=60)
        results.append((p.returncode, err))
    return results, time.monotonic() - started


def _run_shrink_then_grow(out: Path, kill_at_step: int) -> tuple[list, dict]:
    """Like :func:`_run_elastic`, then, once the survivors completed a step (what heterotrain
    run's supervisor waits for), announce the lost member's return and start it again with
    ``HTJ_ELASTIC_JOIN_GENERATION``; the survivors hold after ``kill_at_step`` until it is ready.
    Returns each process's (returncode, stderr), the joiner's last, and the grow generation."""
    host = MembershipHost(len(LOCAL_BATCHES))
    envs = mixed_cluster_envs(LOCAL_BATCHES, hierarchy="flat")
    argv = [sys.executable, str(HERE / "elastic_ranks.py"), str(out), str(EPOCHS)]
    extra = {envnames.ELASTIC_STORE: host.address, envnames.COLLECTIVE_TIMEOUT_S: "20"}
    procs = [start_rank([*argv, str(KILL_MEMBER), str(kill_at_step), str(kill_at_step)], env,
                        **extra, **{envnames.ELASTIC_MEMBER: str(r)})
             for r, env in enumerate(envs)]
    procs[KILL_MEMBER].wait(timeout=60)
    lost = {"member": KILL_MEMBER, "gpu_product": "Tesla-V100-SXM2-16GB", "node": "node-a"}
    host.announce([{**lost, "exit_code": 128 + signal.SIGKILL}], reason="process killed",
                  lost_at_s=time.time())
    wait_until(lambda: host.resumed(1), timeout_s=60, what="a step completed by generation 1")
    grown = host.grow([lost], reason="its GPU is free again", announced_at_s=time.time())
    procs.append(start_rank([*argv, "-1", "0"], envs[KILL_MEMBER], **extra,
                            **{envnames.ELASTIC_MEMBER: str(KILL_MEMBER),
                               envnames.ELASTIC_JOIN_GENERATION: str(grown.generation)}))
    results = []
    for p in procs:
        _, err = p.communicate(timeout=90)
        results.append((p.returncode, err))
    return results, {"generation": grown.generation, "resumed": host.resumed(grown.generation)}


@pytest.mark.parametrize("kill_at_step", [5, 7])  # it joins after epoch 0's last step; mid-epoch 1
def test_the_lost_member_joins_back_at_a_step_boundary_with_a_peers_state(tmp_path: Path,
                                                                          kill_at_step: int) -> None:
    results, grown = _run_shrink_then_grow(tmp_path, kill_at_step)
    for i, (code, err) in enumerate(results):
        if i == KILL_MEMBER:
            assert code == -signal.SIGKILL
        else:
            assert code == 0, f"process {i} exit {code}:\n{err[-4000:]}"
            assert "resumed at step" not in err
    joined = results[-1][1]
    assert "joined; generation 2: 1 -> 3 ranks, split [4, 3, 3]" in joined, joined[-3000:]
    info = json.loads((tmp_path / "membership.json").read_text())
    global_batch = sum(LOCAL_BATCHES)
    steps_per_epoch = len(dataset()) // global_batch
    assert info["generation"] == grown["generation"] == 2 and info["members"] == [0, 1, 2]
    assert info["split"] == LOCAL_BATCHES  # the launch split again
    assert info["global_step"] == EPOCHS * steps_per_epoch and info["steps_redone"] == 1
    join_step = kill_at_step + 1  # the survivors hold after the redone step; the next one agrees
    assert grown["resumed"] is not None and grown["resumed"]["step"] == join_step + 1

    rows = [json.loads(line) for m in range(len(LOCAL_BATCHES))
            for line in (tmp_path / f"member{m}.jsonl").read_text().splitlines()]
    for epoch in range(EPOCHS):
        seen = sorted(i for row in rows if row["epoch"] == epoch for i in row["indices"])
        assert seen == list(range(len(dataset()))), f"epoch {epoch}"
    per_step: dict[int, int] = {}
    for row in rows:
        per_step[row["step"]] = per_step.get(row["step"], 0) + len(row["indices"])
    assert per_step == {s: global_batch for s in range(1, EPOCHS * steps_per_epoch + 1)}
    by_generation = {g: sorted({row["step"] for row in rows if row["generation"] == g})
                     for g in (0, 1, 2)}
    assert by_generation[1] == list(range(kill_at_step, join_step + 1))
    assert by_generation[2] == list(range(join_step + 1, EPOCHS * steps_per_epoch + 1))
    assert {row["rank"] for row in rows if row["generation"] == 2} == {0, 1, 2}

    final = torch.load(tmp_path / "final.pt")
    for got, want in zip(final, _reference_params(steps_per_epoch), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def _reference_params(steps_per_epoch: int) -> list[torch.Tensor]:
    """One float64 process's parameters after the same epochs of full global batches."""
    assert steps_per_epoch == len(dataset()) // sum(LOCAL_BATCHES)
    return reference_params(sum(LOCAL_BATCHES), EPOCHS)


@pytest.mark.parametrize("kill_at_step", [6, 7, 8])  # epoch 0's last step, epoch 1's first, second
def test_a_killed_rank_shrinks_the_job_and_the_step_is_redone(tmp_path: Path,
                                                              kill_at_step: int) -> None:
    results, _ = _run_elastic(tmp_path, kill_at_step)
    for member, (code, err) in enumerate(results):
        if member == KILL_MEMBER:
            assert code == -signal.SIGKILL
        else:
            assert code == 0, f"member {member} exit {code}:\n{err[-4000:]}"
            assert "resumed at step" not in err
            assert "2 ranks" in err or "3 -> 2 ranks" in err, err[-2000:]
    info = json.loads((tmp_path / "membership.json").read_text())
    global_batch = sum(LOCAL_BATCHES)
    steps_per_epoch = len(dataset()) // global_batch
    assert info["generation"] == 1 and info["members"] == [0, 2]
    assert info["steps_redone"] == 1 and sum(info["split"]) == global_batch
    assert info["global_step"] == EPOCHS * steps_per_epoch
    assert info["recovery_s"] is not None and info["recovery_s"] > 0

    # (b) every sample of each epoch exactly once across the change, each step complete
    rows = [json.loads(line) for m in range(len(LOCAL_BATCHES))
            for line in (tmp_path / f"member{m}.jsonl").read_text().splitlines()]
    for epoch in range(EPOCHS):
        seen = sorted(i for row in rows if row["epoch"] == epoch for i in row["indices"])
        assert seen == list(range(len(dataset()))), f"epoch {epoch}"
    per_step: dict[int, int] = {}
    for row in rows:
        per_step[row["step"]] = per_step.get(row["step"], 0) + len(row["indices"])
    assert per_step == {s: global_batch for s in range(1, EPOCHS * steps_per_epoch + 1)}
    assert {row["generation"] for row in rows if row["step"] >= kill_at_step} == {1}
    assert [row["step"] for row in rows if row["step"] < kill_at_step and row["rank"] == 1
            and row["generation"] == 0] == list(range(1, kill_at_step))  # the victim's

    # (c) every update, the redone one included, equals one float64 process's full-batch update
    final = torch.load(tmp_path / "final.pt")
    reference = _reference_params(steps_per_epoch)
    for got, want in zip(final, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_only_a_collective_failure_waits_for_a_new_generation() -> None:
    import torch.distributed as dist

    from hetero_worker.membership.elastic import peer_failure
    assert peer_failure(RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"))
    assert peer_failure(dist.DistBackendError("NCCL communicator was aborted"))
    assert not peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x4)"))


def test_the_survivors_topology_split_and_contract() -> None:
    from hetero_worker.membership import reform
    from heterotrain_common.contract import parse_contract

    envs = mixed_cluster_envs([70, 28, 15, 15], nodes=["a", "b", "c", "c"], hierarchy="group")
    launch = parse_contract(envs[0])
    topology = reform.shrunk_topology(launch.topology, [0, 1, 2])
    assert [(e.rank, e.group, e.node, e.gpu_product) for e in topology] == [
        (0, 0, "a", "NVIDIA-A100-SXM4-40GB"), (1, 1, "b", "Tesla-V100-SXM2-16GB"),
        (2, 2, "c", "Tesla-T4")]
    assert reform.member_split(128, launch.topology, [0, 1, 2]) == [79, 32, 17]
    assert reform.member_split(128, launch.topology, [0, 2]) == [105, 23]
    assert reform.member_split(128, launch.topology, [0, 1, 2, 3]) == [70, 28, 15, 15]  # grown back
    assert reform.member_split(128, launch.topology, [0, 2, 3]) == [90, 19, 19]
    two = reform.shrunk_topology(launch.topology, [0, 3])  # the second T4 is now rank 1
    contract = reform.rank_contract(parse_contract(envs[3]), two, 1)
    assert (contract.dist.rank, contract.dist.world_size, contract.dist.group,
            contract.dist.group_rank, contract.dist.group_size) == (1, 2, 1, 0, 1)


def _adopt_rank(rank: int, init_file: str, out: str) -> None:
    """A rank of the state-agreement test: distinct parameters and Adam state on each rank, then
    every rank takes rank 1's (the survivor that had completed the interrupted step)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from hetero_worker.membership.elastic import _adopt_state
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    torch.manual_seed(100 + rank)
    module = make_model()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    for _ in range(rank + 1):  # a different step count and moments on each rank
        optimizer.zero_grad()
        module(torch.randn(5, 8, dtype=torch.float64)).sum().backward()
        optimizer.step()
    _adopt_state(SimpleNamespace(parts_model=SimpleNamespace(module=module), scaler=None),
                 optimizer, source=1)
    torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict()},
               f"{out}/adopted{rank}.pt")
    dist.destroy_process_group()


def test_survivors_take_the_state_of_the_one_that_completed_the_step(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_adopt_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=3)
    states = [torch.load(tmp_path / f"adopted{r}.pt") for r in range(3)]
    for state in states:
        for key, value in states[1]["model"].items():
            assert torch.equal(state["model"][key], value)
        for index, moments in states[1]["optimizer"]["state"].items():
            assert float(state["optimizer"]["state"][index]["step"]) == float(moments["step"]) == 2
            assert torch.equal(state["optimizer"]["state"][index]["exp_avg"], moments["exp_avg"])
