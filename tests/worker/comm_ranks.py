"""Run inside each rank process by test_comm_rule_procs.py; writes ``<out>/rank<R>.json``.

Every process group torch creates in this process is recorded (backend string and member ranks)
by a spy on ``torch.distributed.distributed_c10d._new_process_group_helper``, the one function
through which both ``init_process_group`` and ``new_group`` make a group (torch 2.13). Then:

1. the real trainer runs with ``hierarchy: auto``, int8 compression and rebalancing (start-up
   probes, re-layout, comm hook, two steps, one work-stealing step);
2. for every hierarchy mode the communicator plan is computed *as if every rank were on CUDA*
   and carried out through ``build_process_groups(create=...)``, which records the planned
   backend and creates the group on Gloo (CI has no CUDA); a hierarchical all-reduce checks the
   groups work; the groups are destroyed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

CREATED: list[tuple[str, list[int] | None]] = []
DESTROYED: list[int] = []


def _spy() -> None:
    helper = c10d._new_process_group_helper
    destroy = dist.destroy_process_group

    def recording_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):  # type: ignore[no-untyped-def]
        CREATED.append((str(backend), list(global_ranks_in_group) or None))
        return helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)

    def recording_destroy(group=None):  # type: ignore[no-untyped-def]
        DESTROYED.append(1)
        return destroy(group)

    c10d._new_process_group_helper = recording_helper
    dist.destroy_process_group = recording_destroy


def trainer_run() -> tuple[object, dict]:
    from hetero_worker import trainer as ht
    from hetero_worker.speed.stealing import MicroBatchDispenser, default_store
    t = ht.init(sync_mode="hook")
    torch.manual_seed(3)
    model = t.wrap(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 2)).double())
    g = torch.Generator().manual_seed(9)
    data = torch.utils.data.TensorDataset(torch.randn(200, 5, generator=g, dtype=torch.float64),
                                          torch.randn(200, 2, generator=g, dtype=torch.float64))
    loader = iter(t.loader(data))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x, y = next(loader)
        t.step(opt, lambda m: torch.nn.functional.mse_loss(m(x), y))
    disp = MicroBatchDispenser(store=default_store(), global_batch=sum(t.local_batches),
                               micro_batch=5, prefix="test/commsteal")
    t.steal_step(opt, disp, lambda module, idx: ((module(data[idx][0]) - data[idx][1]) ** 2).sum())
    facts = {
        "chosen": t.speed.chosen_hierarchy,
        "trainer_groups": [[g.backend, list(g.ranks)] for g in t.groups.plan.to_create()],
        "ddp_backend": dist.get_backend(t.groups.ddp_group),
        "ddp_size": dist.get_world_size(t.groups.ddp_group),
        "live_groups": len(c10d._world.pg_map),
        # pg_map holds the groups this rank is a member of: the default one and its layout's
        # (plus, on a hierarchy, the pipeline's broadcast copy of its own group, and the
        # checkpoint group: checkpoints and the stop agreement, issue 20)
        "expected_live": 1 + sum(t.rank in g.ranks for g in t.groups.plan.to_create())
        + (t.groups.intra_bcast is not None) + (t.ckpt_group is not None),
        "created_by_trainer": list(CREATED),
        "destroyed_by_trainer": len(DESTROYED),
    }
    return t, facts


def planned_as_cuda(t) -> dict:  # type: ignore[no-untyped-def]
    from hetero_worker.comm.commplan import plan_communicators
    from hetero_worker.comm.groups import build_process_groups, hierarchical_all_reduce_
    from heterotrain_common.envnames import HIERARCHIES
    from heterotrain_common.topology import build_layout
    as_cuda = [dataclasses.replace(r, on_cuda=True) for r in t.comm_ranks]
    out = {}
    for mode in HIERARCHIES:
        planned: list[tuple[str, list[int]]] = []

        def create(ranks, backend):  # type: ignore[no-untyped-def]
            planned.append((backend, list(ranks)))
            return dist.new_group(ranks=list(ranks), backend="gloo")  # no CUDA in CI

        plan = plan_communicators(as_cuda, build_layout(t.contract.topology, mode))
        groups = build_process_groups(plan, t.rank, create=create,
                                      topology_group_of=[e.group for e in t.contract.topology])
        x = torch.tensor([float(t.rank + 1)], dtype=torch.float64)
        hierarchical_all_reduce_(x, groups)
        groups.destroy()
        out[mode] = {"planned": planned, "sum": x.item(),
                     "world_backend": plan.world.backend}
    return out


def main() -> int:
    out = Path(sys.argv[1])
    _spy()
    t, facts = trainer_run()
    facts["as_cuda"] = planned_as_cuda(t)
    facts["comm_ranks"] = [dataclasses.asdict(r) for r in t.comm_ranks]
    facts["live_after_modes"] = len(c10d._world.pg_map)
    Path(out, f"rank{t.rank}.json").write_text(json.dumps(facts))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
