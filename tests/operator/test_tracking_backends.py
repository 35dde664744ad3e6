"""Weights & Biases and MLflow per GPU type (issue 33, item 6), for real: W&B offline and MLflow's
local file store written by the worker's writers, then read back with each library's own reader
(W&B's transaction-log reader ``wandb leet inspect --json``; MLflow's ``MlflowClient``), in process
and in a real multi-rank ``heterotrain run`` of ``examples/digits.yaml``; the W&B service process
(``wandb-core``) each run starts is gone afterwards; the online backends' tokens reach the worker
pods as ``secretKeyRef`` env entries only, and never land in a run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from waiting import wait_until
from builders import plan_batches_by_type

from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.env import render_rank_envs
from hetero_worker import tracking
from heterotrain_common import contract as c

wandb = pytest.importorskip("wandb")
mlflow_client = pytest.importorskip("mlflow.tracking")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10
TYPE_SERIES = {"samples_per_s", "compute_samples_per_s_per_gpu", "batch_share", "local_batch",
               "step_s", "compute_s", "comm_wait_s", "ranks", "loss"}


def _digits(tracking_spec: object, name: str = "digits-tracked") -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["training"]["tracking"] = tracking_spec
    return job


def _processes_with(marker: str) -> list[int]:
    """Live pids whose environment holds ``marker`` (the test's own children and theirs)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found


def _wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of an offline W&B run, read by W&B's own transaction-log reader."""
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _wandb_runs(wandb_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every offline run under ``wandb_dir`` by its display name, as records."""
    runs = {}
    for run_dir in sorted(wandb_dir.glob("offline-run-*")):
        records = _wandb_records(run_dir)
        name = next(r["run"]["display_name"] for r in records if r["type"] == "run")
        runs[name] = records
    return runs


def _history(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["history"]["step"]["num"], r["history"]["item"][key])
            for r in records if r["type"] == "history" and key in r["history"]["item"]]


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B offline with every folder it uses under ``tmp_path``; afterwards the W&B service of
    this process is shut down and no process of it is left."""
    marker = f"HTJ_TEST_WANDB={uuid.uuid4().hex}"
    for name, sub in (("WANDB_DIR", "wandb-dir"), ("WANDB_CONFIG_DIR", "wandb-config"),
                      ("WANDB_CACHE_DIR", "wandb-cache"), ("WANDB_DATA_DIR", "wandb-data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the writer sets for a file: URI
    monkeypatch.setenv("HTJ_TEST_WANDB", marker.split("=", 1)[1])
    yield tmp_path / "wandb-dir"
    wandb.teardown()
    wait_until(lambda: not _processes_with(marker), timeout_s=20,
               what="the W&B service processes of this test to end")


def _contract(rank: int, products: tuple[str, ...], batches: tuple[int, ...],
              tracking_spec: dict[str, Any],
              prices: dict[str, float | None] | None = None) -> c.Contract:
    topology = tuple(c.RankEntry(rank=i, group=i, node=f"n{i}", gpu_product=p,
                                 compute_capability="7.5", local_batch=batches[i])
                     for i, p in enumerate(products))
    return c.Contract(
        dist=c.RankInfo(rank=rank, world_size=len(products), local_rank=0, local_world_size=1,
                        master_addr="x", master_port=1, job_name="j", group=rank, group_rank=0,
                        group_size=1, job_uid="0f1e2d3c-aaaa-bbbb"),
        precision="fp32", comm=c.CommSettings(hierarchy="flat"),
        device=c.DeviceProfile(product=products[rank], compute_capability="7.5", memory_mib=1,
                               relative_speed=1.0, simulated=True),
        topology=topology, run=c.RunSettings(tracking=tracking_spec, prices_per_hour=prices))


def test_wandb_offline_and_mlflow_file_store_read_back_per_gpu_type(
        wandb_env: Path, tmp_path: Path) -> None:
    products, batches = ("NVIDIA A100", "Tesla T4", "Tesla T4"), (16, 4, 4)
    store = tmp_path / "mlruns"
    spec = {"wandb": {"project": "digits", "mode": "offline", "secretRef": None},
            "mlflow": {"trackingUri": store.as_uri(), "experiment": "digits", "secretRef": None}}
    prices = {"NVIDIA A100": 2.5, "Tesla T4": 0.35}  # HTJ_PRICES_PER_HOUR, as the plan prices them
    trackers = [tracking.Tracker(_contract(r, products, batches, spec, prices)) for r in range(3)]
    assert [sorted(t.writers) for t in trackers] == [["mlflow", "wandb"], ["mlflow", "wandb"], []]
    for step in (1, 2, 3):
        for t, samples in zip(trackers, batches):
            t.observe_step(step, step_s=0.5, compute_s=0.4, comm_wait_s=0.1, samples=samples,
                           loss=1.0 / step, local_batches=list(batches))
    run_ids = [t.writers["mlflow"].run_id for t in trackers[:2]]
    for t in trackers:
        t.close()

    # W&B: one offline run per writing rank, read back with W&B's reader
    runs = _wandb_runs(wandb_env / "wandb")
    assert set(runs) == {"rank-0-NVIDIA-A100", "rank-1-Tesla-T4"}
    t4 = runs["rank-1-Tesla-T4"]
    meta = next(r["run"] for r in t4 if r["type"] == "run")
    assert meta["tags"] == ["Tesla-T4"] and meta["project"] == "digits"
    assert meta["run_group"] == "j-0f1e2d3c"  # the job's uid: its restarts join the group
    assert next(r["run"]["run_group"] for r in runs["rank-0-NVIDIA-A100"]
                if r["type"] == "run") == "j-0f1e2d3c"
    assert meta["config"]["update"]["gpu_mix"] == {"NVIDIA A100": 1, "Tesla T4": 2}
    config = meta["config"]["update"]
    assert config["prices_per_hour"] == {"NVIDIA A100": 2.5, "Tesla T4": 0.35}
    assert config["cost_per_hour"] == pytest.approx(2.5 + 2 * 0.35)
    assert {t: v["price_per_hour"] for t, v in config["gpu_types"].items()} == {
        "NVIDIA-A100": 2.5, "Tesla-T4": 0.35}
    assert _history(t4, "gpu_type/Tesla-T4/batch_share") == [(s, 8 / 24) for s in (1, 2, 3)]
    assert _history(t4, "gpu_type/Tesla-T4/samples_per_s") == [(s, 16.0) for s in (1, 2, 3)]
    assert _history(t4, "gpu_type/Tesla-T4/ranks") == [(s, 2) for s in (1, 2, 3)]
    a100 = runs["rank-0-NVIDIA-A100"]
    assert _history(a100, "job/samples_per_s") == [(s, 48) for s in (1, 2, 3)]
    assert _history(a100, "job/loss") == [(1, 1), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert _history(a100, "gpu_type/NVIDIA-A100/batch_share") == [(s, 16 / 24) for s in (1, 2, 3)]
    assert not any(k.startswith("job/") for r in t4 if r["type"] == "history"
                   for k in r["history"]["item"])

    # MLflow: a run per writing rank in the experiment (no process group here, so no parent:
    # the multi-rank run below checks that), read back with MLflow's client
    client = mlflow_client.MlflowClient(tracking_uri=store.as_uri())
    job_run, t4_run = (client.get_run(i) for i in run_ids)
    assert job_run.info.experiment_id == t4_run.info.experiment_id
    assert client.get_experiment(t4_run.info.experiment_id).name == "digits"
    assert t4_run.data.tags["heterotrain.gpu_type"] == "Tesla T4"
    assert t4_run.info.run_name == "j-rank-1-Tesla-T4" and t4_run.info.status == "FINISHED"
    assert job_run.data.params["gpu_mix"] == "1 x NVIDIA A100, 2 x Tesla T4"
    assert job_run.data.params["gpu_type/Tesla-T4/planned_batch"] == "8"
    assert {k: v for k, v in job_run.data.params.items() if "price" in k or "cost" in k} == {
        "gpu_type/NVIDIA-A100/price_per_hour": "2.5", "gpu_type/Tesla-T4/price_per_hour": "0.35",
        "cost_per_hour": "3.2"}

    def series(run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    assert series(run_ids[1], "gpu_type/Tesla-T4/batch_share") == [(s, 8 / 24) for s in (1, 2, 3)]
    assert series(run_ids[1], "gpu_type/Tesla-T4/comm_wait_s") == [(s, 0.1) for s in (1, 2, 3)]
    assert series(run_ids[0], "job/global_batch") == [(s, 24.0) for s in (1, 2, 3)]
    assert set(t4_run.data.metrics) == {f"gpu_type/Tesla-T4/{n}" for n in TYPE_SERIES}
    plan = client.download_artifacts(run_ids[0], "plan.md", str(tmp_path / "art"))
    assert "| 2 | 2 | n2 | Tesla T4 | 4 |" in Path(plan).read_text()
    assert "price per device-hour: NVIDIA A100 2.5/h, Tesla T4 0.35/h; job: 3.2/h" in Path(plan).read_text()
    run_json = json.loads(Path(client.download_artifacts(run_ids[0], "run.json",
                                                         str(tmp_path / "art2"))).read_text())
    assert run_json["prices_per_hour"] == {"NVIDIA A100": 2.5, "Tesla T4": 0.35}


def test_an_unpriced_type_is_null_in_the_metadata_never_0() -> None:
    products, batches = ("NVIDIA A100", "Tesla T4"), (16, 8)
    info = tracking.series.RunInfo.of(_contract(0, products, batches, {}, {"NVIDIA A100": 2.5}))
    meta = info.metadata()
    assert meta["prices_per_hour"] == {"NVIDIA A100": 2.5, "Tesla T4": None}
    assert [t["price_per_hour"] for t in meta["gpu_types"].values()] == [2.5, None]
    assert meta["cost_per_hour"] is None
    nothing = tracking.series.RunInfo.of(_contract(0, products, batches, {}))  # no prices given
    assert nothing.metadata()["prices_per_hour"] == {"NVIDIA A100": None, "Tesla T4": None}


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    spec = {"wandb": {"project": "p", "mode": "offline", "secretRef": None}}
    with pytest.raises(RuntimeError, match=r"needs wandb: pip install 'heterotrain\[tracking\]' "
                                           r"\(wandb==0.31.0\)"):
        tracking.Tracker(_contract(0, ("Tesla T4",), (4,), spec))


def test_a_backend_that_fails_mid_run_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    class Flaky:
        def __init__(self, directory: str) -> None:
            self.scalars: list[tuple[str, int]] = []
            self.closed = False

        def add_text(self, tag: str, text: str, step: int) -> None:
            pass

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            if step == 2:
                raise OSError(28, "No space left on device")
            self.scalars.append((tag, step))

        def flush(self) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    made: list[Flaky] = []
    spec = {"tensorboard": {"logDir": str(tmp_path)},
            "wandb": {"project": "p", "mode": "disabled", "secretRef": None}}
    t = tracking.Tracker(_contract(0, ("Tesla T4",), (4,), spec),
                         writer_factory=lambda d: made.append(Flaky(d)) or made[-1])
    assert list(t.writers) == ["tensorboard"]  # W&B's disabled mode: no run at all
    for step in (1, 2, 3):  # step 2's write fails: dropped, no exception reaches training
        t.observe_step(step, step_s=0.5, compute_s=0.4, comm_wait_s=0.1, samples=4, loss=1.0,
                       local_batches=[4])
    assert t.writers == {} and made[0].closed
    assert {step for _, step in made[0].scalars} == {1}
    t.close()


def test_the_trainer_argument_selects_a_backend_over_the_spec() -> None:
    base = _contract(0, ("Tesla T4",), (4,), {"tensorboard": {"logDir": "/tb"}})
    merged = tracking.with_tracking(base, {"mlflow": {"trackingUri": "file:/m", "experiment": "e"}})
    assert merged.run.tracking == {"tensorboard": {"logDir": "/tb"},
                                   "mlflow": {"trackingUri": "file:/m", "experiment": "e",
                                              "secretRef": None}}
    assert tracking.with_tracking(base, None) is base
    with pytest.raises(ValueError, match=r"Trainer\(tracking=...\)\.wandb\.project: is required"):
        tracking.with_tracking(base, {"wandb": {}})


def test_pods_get_the_tokens_from_the_named_secrets_only() -> None:
    body = _digits({"wandb": {"project": "digits", "mode": "online", "secretRef": {"name": "wb"}},
                    "mlflow": {"trackingUri": "https://mlflow.example", "experiment": "digits",
                               "secretRef": {"name": "ml", "key": "token"}}})
    body["spec"]["worker"]["env"] = [{"name": "WANDB_API_KEY", "value": "pasted-in-the-spec"},
                                     {"name": "TZ", "value": "UTC"}]
    job = parse_job(body)
    nodes = yaml.safe_load((ROOT / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    plan = plan_job(job, build_inventory(nodes))
    envs = render_rank_envs(plan, job, master_addr="m", master_port=29500, simulated=False)
    pods = rendering.render_pods(job, plan, envs, launcher=("heterotrain", "launch", "--"))
    assert len(pods) == 3
    for pod in pods:
        env = pod["spec"]["containers"][0]["env"]
        tokens = [e for e in env if e["name"] in ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN")]
        assert tokens == [
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wb", "key": "WANDB_API_KEY"}}},
            {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ml", "key": "token"}}}]
        assert {"name": "TZ", "value": "UTC"} in env
        assert "pasted-in-the-spec" not in json.dumps(pod)
        kubernetes_validate.validate(pod, "1.30.0", strict=True)
    plain = parse_job(_digits({"wandb": {"project": "digits"}}))
    plan = plan_job(plain, build_inventory(nodes))
    envs = render_rank_envs(plan, plain, master_addr="m", master_port=29500, simulated=False)
    for pod in rendering.render_pods(plain, plan, envs, launcher=("heterotrain", "launch", "--")):
        assert not any("valueFrom" in e for e in pod["spec"]["containers"][0]["env"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_heterotrain_run_of_digits_writes_wandb_and_mlflow_per_gpu_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "mlruns"
    job = _digits({"wandb": {"project": "digits", "mode": "offline"},
                   "mlflow": {"trackingUri": store.as_uri(), "experiment": "digits"}})
    job["spec"]["training"]["checkpoint"]["path"] = str(tmp_path / "ckpt")  # no other run's
    manifest = tmp_path / "digits-tracked.yaml"
    manifest.write_text(yaml.safe_dump(job))
    work = tmp_path / "run"
    secret, marker = f"htj-secret-{uuid.uuid4().hex}", uuid.uuid4().hex
    env = {**os.environ, "WANDB_API_KEY": secret, "MLFLOW_TRACKING_TOKEN": secret,
           "HTJ_TEST_WANDB": marker, "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
           "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}
    for name in ("WANDB_DIR", "MLFLOW_ALLOW_FILE_STORE"):  # RUNDIR/wandb; set by the writer
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(manifest),
                           "--workdir", str(work), "--max-steps", str(STEPS),
                           "--metrics-port-base", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wait_until(lambda: not _processes_with(f"HTJ_TEST_WANDB={marker}"), timeout_s=30,
               what="the ranks' W&B service processes to end")
    plan = json.loads((work / "plan.json").read_text())
    global_batch = job["spec"]["training"]["globalBatchSize"]
    by_type = plan_batches_by_type(work)
    assert len(by_type) == 3  # examples/clusters/mixed.yaml: A100, V100, T4 x 2
    steps = list(range(1, STEPS + 1))
    runs = _wandb_runs(work / "wandb")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this reader's opt-in to the file store
    client = mlflow_client.MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("digits")
    ml_runs = {r.data.tags["heterotrain.rank"]: r for r in
               client.search_runs([experiment.experiment_id])}
    first_rank = {p: min(r for g in plan["groups"] if g["product"] == p for r in g["ranks"])
                  for p in by_type}
    assert set(runs) == {f"rank-{first_rank[p]}-{tracking.gpu_tag(p)}" for p in by_type}
    assert set(ml_runs) == {str(r) for r in first_rank.values()}
    parent = ml_runs["0"].info.run_id
    for product, batches in by_type.items():
        tag, rank = tracking.gpu_tag(product), first_rank[product]
        share = sum(batches) / global_batch  # no rebalancing in the example: the plan's split
        records = runs[f"rank-{rank}-{tag}"]
        key = f"gpu_type/{tag}/batch_share"
        assert _history(records, key) == [(s, pytest.approx(share)) for s in steps], product
        assert _history(records, f"gpu_type/{tag}/ranks") == [(s, len(batches)) for s in steps]
        run = ml_runs[str(rank)]
        assert run.info.status == "FINISHED" and run.data.tags["heterotrain.gpu_type"] == product
        assert set(run.data.metrics) >= {f"gpu_type/{tag}/{n}" for n in TYPE_SERIES}
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(s, pytest.approx(share)) for s in steps]
        for m_step, m_compute, m_wait in zip(*(client.get_metric_history(run.info.run_id,
                                                                         f"gpu_type/{tag}/{n}")
                                               for n in ("step_s", "compute_s", "comm_wait_s"))):
            assert m_step.value > 0
            assert m_compute.value + m_wait.value == pytest.approx(m_step.value, rel=1e-5)
        stats = json.loads((work / f"rank-{rank}.json").read_text())  # the rank's own last loss
        assert history and client.get_metric_history(run.info.run_id, f"gpu_type/{tag}/loss")[-1].value \
            == pytest.approx(stats["loss"], rel=1e-6)
        if rank != 0:
            assert run.data.tags["mlflow.parentRunId"] == parent
    job_series = _history(runs[f"rank-0-{tracking.gpu_tag(plan['groups'][0]['product'])}"],
                          "job/global_batch")
    assert job_series == [(s, global_batch) for s in steps]
    assert [m.value for m in client.get_metric_history(parent, "job/global_batch")] == [global_batch] * STEPS
    # the tokens were in every rank's environment; no file of the run holds them
    leaked = [p for root in (work, store) for p in root.rglob("*")
              if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []
