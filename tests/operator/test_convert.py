"""``heterotrain convert``: a Kubeflow PyTorchJob becomes a HeteroTrainingJob that parses and plans,
with every field it could not map listed (as comments in the output and on stderr) with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hetero_operator.api.spec import parse_job
from hetero_operator.cli import main
from hetero_operator.convert.launchers import split_launcher
from hetero_operator.convert.pytorchjob import ConvertError, convert_pytorchjob

ROOT = Path(__file__).resolve().parents[2]
PYTORCHJOB = ROOT / "examples" / "kubeflow" / "pytorchjob.yaml"
MIXED = str(ROOT / "examples" / "clusters" / "mixed.yaml")
W = "spec.pytorchReplicaSpecs.Worker"
GANG = ("HeteroTrain restarts the whole gang when a rank fails (every rank's process group must be "
        "rebuilt), counted against spec.runPolicy.backoffLimit; there is no per-replica restart")

EXPECTED_JOB = {
    "apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
    "metadata": {"name": "mnist-ddp", "namespace": "research", "labels": {"team": "vision"}},
    "spec": {
        "worker": {
            "command": ["python", "/workspace/train.py"],
            "args": ["--epochs", "10", "--data", "/data"],
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "WANDB_MODE", "value": "offline"}],
            "resourcesPerRank": {"requests": {"cpu": "2", "memory": "8Gi"},
                                 "limits": {"cpu": "4", "memory": "16Gi"}},
            "sharedMemorySize": "4Gi",
            "template": {"spec": {
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "mnist-data"}}],
                "containers": [{"name": "worker", "imagePullPolicy": "IfNotPresent",
                                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}]}},
        },
        "images": [{"image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "cudaVersion": "12.4",
                    "computeCapabilities": ["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"],
                    "torchVersion": "2.5.1"}],
        "gpus": {"ranks": 4, "minRanks": 2},
        "training": {"globalBatchSize": 128},
        "runPolicy": {"backoffLimit": 4, "cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 3600,
                      "schedulingPolicy": {"queue": "team-vision"}},
    },
}
EXPECTED_UNMAPPED = [
    ("spec.pytorchReplicaSpecs.Master.restartPolicy", GANG),
    (f"{W}.restartPolicy", GANG),
    (f"{W}.template.spec.hostIPC", "refused by Pod Security \"baseline\"; shared memory comes from the "
     "Memory emptyDir the operator mounts at /dev/shm (spec.worker.sharedMemorySize)"),
    (f"{W}.template.spec.containers[0].env[2]", "MASTER_PORT is set by the operator for every rank "
     "(the env contract)"),
    (f"{W}.template.spec.containers[0].ports[0]", "the rendezvous port is the operator's (MASTER_PORT)"),
]


def _load() -> dict:
    return yaml.safe_load(PYTORCHJOB.read_text())


def test_master_and_three_workers_with_a_pvc_env_and_a_node_selector_map_exactly() -> None:
    conversion = convert_pytorchjob(_load())
    assert conversion.job == EXPECTED_JOB
    assert [(u.path, u.reason) for u in conversion.unmapped] == EXPECTED_UNMAPPED
    assert parse_job(conversion.job).gpus.ranks == 4


def test_the_converted_job_plans_on_the_mixed_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.yaml"
    assert main(["convert", str(PYTORCHJOB), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert [line.split(": ", 2)[2].split(": ")[0] for line in err.splitlines()
            if line.startswith("heterotrain convert: not mapped: ")] == [p for p, _ in EXPECTED_UNMAPPED]
    text = out.read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert "# Not mapped:" in comments and "# Check:" in comments
    assert [line[4:].split(": ")[0] for line in comments if line.startswith("# - spec.pytorch")][:5] == [
        p for p, _ in EXPECTED_UNMAPPED]
    assert yaml.safe_load(text) == EXPECTED_JOB
    assert main(["plan", str(out), "--nodes", MIXED, "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # the V100's driver (CUDA 12.2) cannot run the job's only image (CUDA 12.4): 3 of 4 ranks,
    # above minRanks 2 (the PyTorchJob's minAvailable of 2 one-GPU replicas)
    assert [(r["node"], r["product"]) for r in plan["ranks"]] == [
        ("node-a100", "NVIDIA-A100-SXM4-40GB"), ("node-t4", "Tesla-T4"), ("node-t4", "Tesla-T4")]
    assert [(e["node"], e["reason"]) for e in plan["excluded"]] == [("node-v100", "NoCompatibleImage")]


def test_torchrun_is_taken_off_and_its_processes_per_node_count_as_ranks() -> None:
    launch = split_launcher(["torchrun", "--nnodes", "2", "--nproc_per_node=4", "--standalone", "train.py"],
                            ["--lr", "0.1"])
    assert (launch.command, launch.args, launch.nproc_per_node) == (("python", "train.py"), ("--lr", "0.1"), 4)
    assert launch.dropped == ("--nnodes 2", "--nproc_per_node=4", "--standalone")
    module = split_launcher(["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "pkg.train"], [])
    assert (module.command, module.args, module.nproc_per_node) == (("python", "-m", "pkg.train"), (), 2)
    plain = split_launcher(["python", "train.py"], ["--x"])
    assert (plain.command, plain.args, plain.launcher) == (("python", "train.py"), ("--x",), "")
    doc = _load()
    for r in ("Master", "Worker"):
        doc["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][0]["command"][1] = "--nproc-per-node=2"
    two = convert_pytorchjob(doc).job["spec"]
    assert two["gpus"] == {"ranks": 8, "minRanks": 4}
    # a replica's CPU and memory are for its 2 ranks: per rank, half (3 CPUs -> 1500m)
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
    assert convert_pytorchjob(doc).job["spec"]["worker"]["resourcesPerRank"] == {
        "requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "1500m", "memory": "8Gi"}}


def test_what_cannot_be_mapped_is_listed_with_the_rule_that_refuses_it() -> None:
    doc = _load()
    worker = doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    pod["volumes"].insert(0, {"name": "scratch", "hostPath": {"path": "/mnt/scratch"}})
    pod["containers"][0]["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})
    pod["containers"][0]["image"] = "registry.example.com/team/trainer:v7"
    pod["containers"].append({"name": "logshipper", "image": "fluent-bit:3"})
    pod["containers"][0]["securityContext"] = {"privileged": True, "runAsUser": 1000}
    doc["spec"]["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 5}
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {"pool": "cpu"}
    conversion = convert_pytorchjob(doc)
    found = {u.path: u.reason for u in conversion.unmapped}
    assert sorted(found) == sorted([
        "spec.runPolicy.schedulingPolicy.minAvailable", "spec.elasticPolicy.rdzvBackend",
        "spec.pytorchReplicaSpecs.Master.restartPolicy",
        "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image",
        "spec.pytorchReplicaSpecs.Master.template.spec.nodeSelector.pool",
        f"{W}.restartPolicy", f"{W}.template.spec.hostIPC",
        f"{W}.template.spec.volumes[0]",
        f"{W}.template.spec.containers[0].image",
        f"{W}.template.spec.containers[0].env[2]", f"{W}.template.spec.containers[0].ports[0]",
        f"{W}.template.spec.containers[0].securityContext.privileged",
        f"{W}.template.spec.containers[0].volumeMounts[2]",
        f"{W}.template.spec.containers[1]"])
    assert found[f"{W}.template.spec.volumes[0]"].startswith("Pod Security Standards \"restricted\" allows only")
    assert "put a sidecar in initContainers" in found[f"{W}.template.spec.containers[1]"]
    assert "add registry.example.com/team/trainer:v7 there" in found[f"{W}.template.spec.containers[0].image"]
    assert "differs from Worker's" in found["spec.pytorchReplicaSpecs.Master.template.spec.nodeSelector.pool"]
    job = conversion.job
    assert "images" not in job["spec"]  # the default images, with the image listed above
    assert job["spec"]["gpus"] == {"ranks": 5, "minRanks": 1}  # elastic 1..5 one-GPU replicas
    assert job["spec"]["worker"]["template"]["spec"]["containers"][0]["securityContext"] == {"runAsUser": 1000}
    assert [v["name"] for v in job["spec"]["worker"]["template"]["spec"]["volumes"]] == ["data"]
    parse_job(job)


def test_a_trainjob_or_another_kind_is_refused_naming_the_way() -> None:
    with pytest.raises(ConvertError, match="ClusterTrainingRuntime"):
        convert_pytorchjob({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"})
    with pytest.raises(ConvertError, match="must be PyTorchJob"):
        convert_pytorchjob({"kind": "TFJob"})
    with pytest.raises(ConvertError, match="needs a Master or a Worker"):
        convert_pytorchjob({"kind": "PyTorchJob", "metadata": {"name": "x"}, "spec": {"pytorchReplicaSpecs": {}}})


def test_a_name_that_cannot_name_a_service_is_fixed_and_said(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    doc = _load()
    doc["metadata"]["name"] = "llama-3.1-8b"
    src = tmp_path / "pj.yaml"
    src.write_text(yaml.safe_dump(doc))
    assert main(["convert", str(src), "--global-batch-size", "256"]) == 0
    captured = capsys.readouterr()
    job = yaml.safe_load(captured.out)
    assert (job["metadata"]["name"], job["spec"]["training"]) == ("llama-3-1-8b", {"globalBatchSize": 256})
    assert "check: metadata.name: 'llama-3.1-8b' is not a DNS-1035 label" in captured.err
    assert main(["convert", str(tmp_path / "missing.yaml")]) == 1


@pytest.mark.parametrize(("image", "cuda", "torch", "newest_cc"), [
    ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "12.4", "2.5.1", "9.0"),
    ("registry:5000/team/train:2.3.0-cu121", "12.1", "2.3.0", "9.0"),
    ("nvcr.io/x/pytorch:cu118-py310", "11.8", None, "9.0"),
    ("ghcr.io/x/trainer:2.7.0-cuda12.8", "12.8", "2.7.0", "12.0")])
def test_an_image_tagged_with_its_cuda_version_becomes_an_image_entry(image: str, cuda: str, torch: str | None,
                                                                      newest_cc: str) -> None:
    from hetero_operator.convert.images import image_entry
    entry = image_entry(image)
    assert entry is not None
    assert (entry["image"], entry["cudaVersion"], entry.get("torchVersion"), entry["computeCapabilities"][-1]) == (
        image, cuda, torch, newest_cc)
    assert image_entry("registry:5000/team/train") is None and image_entry("team/train:v7") is None
