"""``heterotrain plan``: table and JSON output, exit codes, one-line errors naming the field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import job_manifest, make_node

from hetero_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits.yaml")
MIXED = str(ROOT / "examples" / "clusters" / "mixed.yaml")
FLEET = str(ROOT / "examples" / "clusters" / "fleet.yaml")
CASES = ROOT / "tests" / "fixtures" / "cases"


def test_table_on_the_mixed_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", DIGITS, "--nodes", MIXED]) == 0
    out = capsys.readouterr().out
    ranks_table = out.split("Expected speed-up")[0]  # the per-GPU-type model table follows
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in ranks_table.splitlines()
            if line.startswith("│")]
    assert rows == [
        ["0", "0", "node-a100", "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu", "ghcr.io/heterotrain/worker:0.1.0-cu126", "bf16", "70", "55.0%"],
        ["1", "1", "node-v100", "Tesla-V100-SXM2-16GB", "nvidia.com/gpu", "ghcr.io/heterotrain/worker:0.1.0-cu126", "fp16", "28", "22.0%"],
        ["2", "2", "node-t4", "Tesla-T4", "nvidia.com/gpu", "ghcr.io/heterotrain/worker:0.1.0-cu128", "fp16", "15", "11.5%"],
        ["3", "2", "node-t4", "Tesla-T4", "nvidia.com/gpu", "ghcr.io/heterotrain/worker:0.1.0-cu128", "fp16", "15", "11.5%"]]
    assert "Expected speed-up over an equal split: 2.13x" in out
    # driver 550 (CUDA 12.4) and 535 (12.2) run the cu126 image only by minor-version compatibility
    warned = sorted(line.split()[1] for line in out.splitlines()
                    if line.startswith("Warning") and "CudaMinorVersionCompatibility" in line)
    assert warned == ["node-a100", "node-v100"]


def test_fleet_lists_every_excluded_node_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", DIGITS, "--nodes", FLEET]) == 0
    out = capsys.readouterr().out
    for node, reason in [("a100-mig-1", "MigReconfigurationPending"), ("cpu-0", "NoGPUs"), ("l4-0", "NotReady"),
                         ("rtx-0", "Tainted"), ("t4-1", "Unschedulable"), ("v100-0", "NoCompatibleImage")]:
        assert any(node in line and reason in line for line in out.splitlines()), node
    assert "Warning l40s-0 GpuFamilyLabelMismatch" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", DIGITS, "--nodes", MIXED, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["result"], data["world_size"], data["expected_speedup_over_equal"]) == ("planned", 4, 2.133333)
    assert [r["local_batch"] for r in data["ranks"]] == [70, 28, 15, 15]
    assert [g["ranks"] for g in data["groups"]] == [[0], [1], [2, 3]]


def test_unschedulable_exits_2_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_manifest(ranks=8, gpus={"allowedProducts": ["Tesla-T4"]})))
    assert main(["plan", str(job), "--nodes", FLEET]) == 2
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "Unschedulable (InsufficientGPUs): Tesla-T4: need 8, free 2 (t4-0: 2 free, t4-1: cordoned)" in flat
    # ends with what to change: lower minRanks, add capacity, allow a denied product, fix a node
    assert ("To plan: set spec.gpus.minRanks to 2 or less (it defaults to spec.gpus.ranks); or add 6 "
            "more Tesla-T4 GPUs (a node, or free used ones); or allow ") in flat
    assert "or uncordon t4-1 (kubectl uncordon t4-1)" in flat
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    assert ["Tesla-T4", "8", "2", "t4-0: 2 free; t4-1: cordoned"] in rows  # the why column is filled
    assert main(["plan", str(job), "--nodes", FLEET, "-o", "json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert (data["result"], data["shortfalls"]) == ("unschedulable", [
        {"gpu_type": "Tesla-T4", "need": 8, "free": 2, "reasons": ["t4-0: 2 free", "t4-1: cordoned"]}])


def test_pods_file_marks_gpus_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"kind": "Pod", "spec": {"nodeName": "node-t4", "containers": [
            {"name": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}, "status": {"phase": "Running"}}]}))
    assert main(["plan", DIGITS, "--nodes", MIXED, "--pods", str(pods), "-o", "json"]) == 0
    assert [r["node"] for r in json.loads(capsys.readouterr().out)["ranks"]] == ["node-a100", "node-v100"]


def test_multi_document_node_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", DIGITS, "--nodes", str(CASES / "05-h100-hopper-node-and-mig-switch.yaml"), "-o", "json"]) == 0
    assert {r["node"] for r in json.loads(capsys.readouterr().out)["ranks"]} == {"node-a"}
    docs = tmp_path / "nodes.yaml"
    items = yaml.safe_load(Path(MIXED).read_text())["items"]
    docs.write_text(yaml.safe_dump_all(items))
    assert main(["plan", DIGITS, "--nodes", str(docs), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 4


@pytest.mark.parametrize(("job_text", "nodes", "expected"), [
    (None, MIXED, "missing.yaml: no such file"),
    ("kind: [unclosed", MIXED, "job.yaml: not valid YAML: line 1, column 16: expected ',' or ']', "
                               "but got '<stream end>' (while parsing a flow sequence)"),
    ("kind: a\n  bad: indent: here", MIXED, "job.yaml: not valid YAML: line 2, column 6: mapping "
                                           "values are not allowed here"),
    (b"kind: HeteroTrainingJob\nmetadata: {name: caf\xe9}\n", MIXED,
     "job.yaml: not UTF-8 text (byte 0xe9 on line 2); save it as UTF-8"),
    ("directory", MIXED, ": is a directory, not a YAML file"),
    ("misspelled", MIXED, "spec.gpus.minRank: unknown field; did you mean minRanks?"),
    ("misspelled-batch", MIXED, "spec.training.globalBatchSze: unknown field; did you mean globalBatchSize?"),
    ("no-globalBatchSize", MIXED, "spec.training.globalBatchSize: is required"),
    ("ok", "/nonexistent/nodes.yaml", "/nonexistent/nodes.yaml: no such file"),
    ("ok", DIGITS, "items: no Node objects"),
], ids=["missing job file", "job is not YAML", "YAML indentation", "job not UTF-8", "job is a directory",
        "misspelled minRanks", "misspelled globalBatchSize", "job without a batch size",
        "missing node file", "node file without nodes"])
def test_bad_input_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          job_text: str | bytes | None, nodes: str, expected: str) -> None:
    job = tmp_path / ("missing.yaml" if job_text is None else "job.yaml")
    if isinstance(job_text, bytes):
        job.write_bytes(job_text)
    elif job_text == "directory":
        job.mkdir()
    elif job_text == "misspelled":  # the issue's case: ran as if no minimum was set
        manifest = yaml.safe_load(Path(DIGITS).read_text())
        manifest["spec"]["gpus"] = {"ranks": 4, "minRank": 2}
        job.write_text(yaml.safe_dump(manifest))
    elif job_text == "misspelled-batch":
        manifest = yaml.safe_load(Path(DIGITS).read_text())
        manifest["spec"]["training"]["globalBatchSze"] = manifest["spec"]["training"].pop("globalBatchSize")
        job.write_text(yaml.safe_dump(manifest))
    elif job_text == "no-globalBatchSize":
        job.write_text(yaml.safe_dump(job_manifest(global_batch=None)))
    elif job_text == "ok":
        job.write_text(yaml.safe_dump(job_manifest()))
    elif job_text is not None:
        job.write_text(job_text)
    assert main(["plan", str(job), "--nodes", nodes]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("heterotrain plan: error: ") and expected in lines[0]


@pytest.mark.timeout(60)
def test_module_entry_point_as_a_subprocess() -> None:
    proc = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", DIGITS, "--nodes", MIXED,
                           "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["world_size"] == 4


def test_two_torch_versions_exit_2_naming_the_variants(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    manifest = yaml.safe_load(Path(DIGITS).read_text())
    manifest["spec"]["images"][1]["torchVersion"] = "2.12.1"  # cu128 (the T4s) on another release
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest))
    assert main(["plan", str(job), "--nodes", MIXED]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "Unschedulable (TorchVersionMismatch):" in out
    assert ("ghcr.io/heterotrain/worker:0.1.0-cu128 (torchVersion 2.12.1) on node-t4; "
            "ghcr.io/heterotrain/worker:0.1.0-cu126 (torchVersion 2.13.0) on node-a100, node-v100") in out


def test_usage_errors_exit_64_never_the_unschedulable_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as no_job:
        main(["plan"])
    assert no_job.value.code == 64
    assert "the following arguments are required: JOB.yaml" in capsys.readouterr().err
    for argv in (["plan", DIGITS, "--nodes", MIXED, "--no-such-flag"], ["no-such-command"],
                 ["run", DIGITS, "--max-steps", "many"], ["run", DIGITS, "--keep-runs", "-1"], []):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 64, argv


@pytest.mark.timeout(60)
@pytest.mark.parametrize("output", ["json", "table"])
def test_a_closed_pipe_ends_quietly_with_141(output: str, tmp_path: Path) -> None:
    """``heterotrain plan -o json | head -c 1``: the reader goes away after one byte; the output
    (300 excluded nodes) is far above a pipe's buffer, so writing it must meet the closed pipe."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        make_node(f"cordoned-node-with-a-long-name-{i}", product="Tesla-T4", cc="7.5", unschedulable=True)
        for i in range(300)] + [make_node("a100")]}))
    proc = subprocess.Popen([sys.executable, "-m", "hetero_operator.cli", "plan", DIGITS, "--nodes", str(nodes),
                             "-o", output], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)
    proc.stdout.close()  # before the plan is written: the whole output is far above one byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""  # no BrokenPipeError traceback


def test_unknown_fields_come_from_the_crd_schema() -> None:
    from hetero_operator.api.strictfields import crd_schema, unknown_fields

    schema = yaml.load((ROOT / "crds" / "heterotrainingjobs.heterotrain.io.yaml").read_text(), Loader=yaml.CSafeLoader)
    assert crd_schema() == schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    manifest = yaml.safe_load(Path(DIGITS).read_text())
    manifest["spec"]["images"][0]["torchVerison"] = "2.13.0"
    manifest["spec"]["worker"]["env"] = [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    manifest["spec"]["worker"]["resources"] = {"limits": {"memory": "4Gi", "cpu": 2}}
    manifest["spec"]["training"]["rebalance"] = {"intervalStep": 10}
    manifest["spec"]["whatever"] = 1
    found = [(u.path, u.suggestion) for u in unknown_fields(manifest)]
    # valueFrom (preserve-unknown-fields) and resource names (additionalProperties) are allowed
    assert found == [("spec.images[0].torchVerison", "torchVersion"),
                     ("spec.training.rebalance.intervalStep", "intervalSteps"), ("spec.whatever", "")]
    # a field that exists only in a schema (as one another helper adds to the CRD) is known at once
    extra = copy.deepcopy(schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    extra["properties"]["spec"]["properties"]["whatever"] = {"type": "integer"}
    assert [u.path for u in unknown_fields(manifest, extra)] == [
        "spec.images[0].torchVerison", "spec.training.rebalance.intervalStep"]


def test_empty_images_name_the_default_images_and_a_short_plan_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = yaml.safe_load(Path(DIGITS).read_text())
    manifest["spec"]["images"] = []
    manifest["spec"]["gpus"] = {"ranks": 10, "minRanks": 2}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest))
    assert main(["plan", str(job), "--nodes", MIXED]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "│ ghcr.io/heterotrain/worker:0.1.0-cu126 │" in out  # not "-"
    assert ("Note: spec.images is empty: planned with the operator's default images "
            "(ghcr.io/heterotrain/worker:0.1.0-cu126, ghcr.io/heterotrain/worker:0.1.0-cu128)") in out
    assert ("Note: 4 of 10 ranks asked (spec.gpus.ranks): only 4 eligible GPUs are free (the excluded "
            "nodes and devices in use are listed below); it plans 4 because spec.gpus.minRanks is 2 "
            "(the fewest it may start with). Set minRanks to 10 to wait for all of them instead") in out
    assert main(["plan", str(job), "--nodes", MIXED, "-o", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert len(notes) == 2 and notes[1].startswith("4 of 10 ranks asked")
    manifest["spec"]["training"]["globalBatchSize"] = 3
    manifest["spec"]["gpus"]["selection"] = "All"  # with 3 samples a T4 would not pay (Throughput)
    job.write_text(yaml.safe_dump(manifest))
    assert main(["plan", str(job), "--nodes", MIXED, "-o", "json"]) == 0
    assert ("3 of 10 ranks asked (spec.gpus.ranks): spec.training.globalBatchSize is 3, and every rank "
            "needs at least one sample") in json.loads(capsys.readouterr().out)["notes"][1]


def test_plan_without_nodes_plans_onto_the_default_node_list_like_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", DIGITS, "-o", "json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["plan", DIGITS, "--nodes", MIXED, "-o", "json"]) == 0
    assert default == json.loads(capsys.readouterr().out)


def test_an_unknown_flag_prints_the_usage_of_its_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["plan", DIGITS, "--nodez", MIXED])
    assert usage.value.code == 64
    err = capsys.readouterr().err
    assert err.startswith("usage: heterotrain plan [-h] [--nodes NODES.yaml]")
    assert err.rstrip().endswith(
        f"heterotrain plan: error: unrecognized arguments: --nodez {MIXED}; did you mean --nodes?")


@pytest.mark.timeout(60)
def test_a_flag_is_taken_only_as_spelled_in_full() -> None:
    """argparse's prefix matching is off: ``--node`` is not ``--nodes`` (issue 22, point 12); the
    real console script, its exit code and its stderr."""
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", DIGITS,
                           "--node", MIXED], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert done.returncode == 64 and done.stdout == ""
    assert done.stderr.startswith("usage: heterotrain plan [-h] [--nodes NODES.yaml]")
    assert done.stderr.rstrip().endswith(
        f"heterotrain plan: error: unrecognized arguments: --node {MIXED}; did you mean --nodes?")


def test_an_unknown_flag_of_a_nested_subcommand_prints_that_subcommands_usage(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["cluster", "up", "--nodez", MIXED])
    assert usage.value.code == 64
    err = capsys.readouterr().err
    assert err.startswith("usage: heterotrain cluster up [-h] [--nodes NODES]")
    assert err.rstrip().endswith(
        f"heterotrain cluster up: error: unrecognized arguments: --nodez {MIXED}; did you mean --nodes?")


def test_an_unknown_flag_far_from_every_flag_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["run", DIGITS, "--zzz"])
    assert usage.value.code == 64
    assert capsys.readouterr().err.rstrip().endswith(
        "heterotrain run: error: unrecognized arguments: --zzz")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """``-V`` is ``--version`` (issue 22: it was a usage error, exit 64)."""
    from importlib import metadata
    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"heterotrain {metadata.version('heterotrain')}\n"
