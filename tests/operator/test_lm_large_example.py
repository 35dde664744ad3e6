"""examples/lm-large.yaml on its scaled-down node list (issue 12): refused with sharding None,
planned with Auto (Group on the T4 pair, micro-batches), and trained to the stated loss within each
simulated device's memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from k8s import crdcheck

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.lifecycle.status import plan_status
from hetero_operator.planning.plan import plan_job
from hetero_worker.ckpt import checkpoint, files, store

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "lm-large.yaml"
NODES = ROOT / "examples" / "clusters" / "scaled-memory.yaml"
CRD = ROOT / "crds" / "heterotrainingjobs.heterotrain.io.yaml"
LOSS_THRESHOLD = 3.2  # stated in examples/lm-large.yaml
MIB = 2**20


def _plan(sharding: str):
    body = yaml.safe_load(JOB.read_text())
    body["spec"]["training"]["sharding"] = sharding
    nodes = yaml.safe_load(NODES.read_text())["items"]
    return plan_job(parse_job(body), build_inventory(nodes))


def test_the_node_list_says_it_is_scaled_down() -> None:
    text = NODES.read_text()
    assert "SCALED-DOWN MEMORY LABELS" in text.splitlines()[0]
    memory = {n["metadata"]["name"]: int(n["metadata"]["labels"]["nvidia.com/gpu.memory"])
              for n in yaml.safe_load(text)["items"]}
    assert memory == {"node-a100": 40, "node-t4": 6}


def test_sharding_none_is_refused_naming_the_shortfall_per_gpu_type() -> None:
    result = _plan("None")
    assert isinstance(result, model.Unschedulable) and result.reason == "ModelDoesNotFit"
    # 470528 x 16 B = 7528448 B of state + one checkpointed sample (170000 B) vs 6 MiB - 5 % usable
    short = 470528 * 16 + 170_000 - (6 * MIB - 6 * MIB * 5 // 100)
    assert f"{short / MIB:.1f}" == "1.6"
    assert ("plus one sample's activations (878.9 KiB; 166.0 KiB with activation checkpointing) "
            "does not fit: Tesla-T4 short by 1.6 MiB (5.7 MiB usable); set spec.training.sharding "
            "to Auto (it would choose Group)") in result.message


def test_auto_plans_group_with_micro_batches_on_the_t4s() -> None:
    plan = _plan("Auto")
    assert isinstance(plan, model.Plan), plan.message
    mem = plan.memory
    assert mem.mode == "Group"
    assert [r.local_batch for r in plan.ranks] == [22, 5, 5]
    assert [(r.state_bytes, r.micro_batch_size, r.micro_batches) for r in mem.ranks] == [
        (7528448, 22, 1), (3764224, 2, 3), (3764224, 2, 3)]
    assert all(r.peak_bytes <= r.usable_bytes for r in mem.ranks)


def test_the_memory_decision_goes_into_status_plan_and_survives_pruning() -> None:
    plan = _plan("Auto")
    status = {"plan": plan_status("lm-large", plan, master_addr="lm-large-0.lm-large", master_port=29500)}
    memory = status["plan"]["memory"]
    assert {k: memory[k] for k in ("requested", "mode", "stateBytes")} == {
        "requested": "Auto", "mode": "Group", "stateBytes": 7528448}
    assert memory["reasons"] == list(plan.memory.reasons) and len(memory["reasons"]) == 2
    usable = [r.usable_bytes for r in plan.memory.ranks]
    assert memory["gpuTypes"] == [
        {"gpuType": "NVIDIA-A100-SXM4-40GB", "ranks": 1, "usableBytes": usable[0],
         "stateSharePercent": "100.00", "stateBytes": 7528448, "microBatches": 1,
         "activationCheckpointing": plan.memory.ranks[0].activation_checkpointing,
         "peakBytes": plan.memory.ranks[0].peak_bytes},
        {"gpuType": "Tesla-T4", "ranks": 2, "usableBytes": usable[1], "stateSharePercent": "50.00",
         "stateBytes": 3764224, "microBatches": 3,
         "activationCheckpointing": plan.memory.ranks[1].activation_checkpointing,
         "peakBytes": max(r.peak_bytes for r in plan.memory.ranks[1:])}]
    schema = yaml.load(CRD.read_text(), Loader=yaml.CSafeLoader)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status_schema = schema["properties"]["status"]
    assert crdcheck.prune(status_schema, status) == status  # every field declared: nothing pruned
    jsonschema.validate(status, status_schema)


def test_plan_cli_exit_codes() -> None:
    ok = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", str(JOB), "--nodes",
                         str(NODES)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "a SCALED-DOWN node list" in " ".join(ok.stdout.split())  # rich wraps lines


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_heterotrain_run_trains_it_within_each_simulated_cap(tmp_path: Path) -> None:
    body = yaml.safe_load(JOB.read_text())
    body["spec"]["training"]["checkpoint"] = {"path": "/ckpt", "intervalSteps": 20}
    job = tmp_path / "lm-large.yaml"
    job.write_text(yaml.safe_dump(body))
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(job), "--nodes",
                           str(NODES), "--workdir", str(work)], capture_output=True, text=True,
                          timeout=220, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((work / "result.json").read_text())
    assert result["steps"] == 40 and result["val_loss"] < LOSS_THRESHOLD
    for rank in range(3):
        stats = json.loads((work / f"rank-{rank}.json").read_text())
        assert 0 < stats["memory_peak_bytes"] <= stats["memory_cap_bytes"]
    assert "(simulated cap)" in done.stdout
    # Group sharding checkpoints through torch.distributed.checkpoint: the newest checkpoint's
    # file names the complete DCP directory beside it (step 40); the newest 2 are kept (20, 40)
    newest = store.newest_file(work / "checkpoints")
    manifest = files.load_file(newest)
    assert (manifest["format"], manifest["step"]) == (files.SHARDED_FORMAT, 40)
    kept = sorted(c.step for c in store.candidates(work / "checkpoints"))
    assert kept == [20, 40]
    saved = sorted(p.name for p in newest.parent.iterdir() if p.is_dir())
    assert len(saved) == 1 and saved[0].startswith("sharded-") and saved[0] == manifest["sharded"]["dir"]
    assert (newest.parent / saved[0] / ".metadata").is_file()
