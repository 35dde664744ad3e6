"""Experiment tracking per GPU type (issue 33, item 6): ``spec.training.tracking`` is parsed with
errors naming the field, reaches every rank as ``HTJ_TRACKING``, and a real ``heterotrain run`` of
``examples/digits.yaml`` with ``tracking: {tensorboard: {}}`` leaves TensorBoard event files in the
run directory whose tags name each GPU type of the plan, read back with TensorBoard's own
``EventAccumulator``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from builders import plan_batches_by_type

from hetero_operator.api.errors import SpecError
from hetero_operator.api.spec import parse_job
from hetero_worker import tracking
from heterotrain_common import contract as c
from heterotrain_common import envnames

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def _digits(tracking_spec: object, name: str = "digits-tracked") -> dict:
    job = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["training"]["tracking"] = tracking_spec
    return job


@pytest.mark.parametrize(("spec", "path", "needle"), [
    ({"comet": {}}, "spec.training.tracking.comet",  # the CRD's strict fields say it first
     "unknown field; known fields here: mlflow, tensorboard, wandb"),
    ({"tensorboard": {"logdir": "/x"}}, "spec.training.tracking.tensorboard.logdir", "unknown field"),
    ({"wandb": {"mode": "offline"}}, "spec.training.tracking.wandb.project", "is required"),
    ({"wandb": {"project": "p", "mode": "sometimes"}}, "spec.training.tracking.wandb.mode",
     "'sometimes' is not one of offline, online, disabled"),
    ({"mlflow": {"trackingUri": "file:/m"}}, "spec.training.tracking.mlflow.experiment", "is required"),
    ({"mlflow": {"trackingUri": "http://m", "experiment": "e", "secretRef": "tok"}},
     "spec.training.tracking.mlflow.secretRef", "must be {name: SECRET, key: KEY}"),
    ("tensorboard", "spec.training.tracking", "must be a mapping"),
])
def test_a_bad_tracking_spec_names_the_field(spec: object, path: str, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(_digits(spec))
    assert err.value.path == path
    assert needle in str(err.value)


def test_the_spec_reaches_every_rank_as_htj_tracking() -> None:
    from hetero_operator.cluster.inventory import build_inventory
    from hetero_operator.local.plan import load_objects
    from hetero_operator.planning.plan import plan_job
    from hetero_operator.render.env import render_rank_envs

    job = parse_job(_digits({"tensorboard": {}, "wandb": {"project": "p",
                                                          "secretRef": {"name": "wb"}}}))
    assert json.loads(job.training.tracking_json) == {
        "tensorboard": {"logDir": ""},
        "wandb": {"project": "p", "mode": "offline",
                  "secretRef": {"name": "wb", "key": "WANDB_API_KEY"}}}
    nodes = load_objects(ROOT / "examples" / "clusters" / "mixed.yaml", "Node")
    plan = plan_job(job, build_inventory(nodes))
    envs = render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=29500, simulated=True)
    assert len(envs) == 4
    assert {e[envnames.TRACKING] for e in envs} == {
        '{"tensorboard":{"logDir":""},"wandb":{"mode":"offline","project":"p",'
        '"secretRef":{"key":"WANDB_API_KEY","name":"wb"}}}'}
    assert c.parse_contract(envs[0]).run.tracking["wandb"]["secretRef"]["name"] == "wb"
    # no tracking: no variable (the operator's pods carry exactly the contract)
    plain = parse_job(_digits(None))
    assert plain.training.tracking_json == ""
    assert not any(envnames.TRACKING in e or envnames.PRICES_PER_HOUR in e for e in
                   render_rank_envs(plan_job(plain, build_inventory(nodes)), plain,
                                    master_addr="127.0.0.1", master_port=29500, simulated=True))


def test_the_plans_prices_reach_every_rank_unpriced_types_as_null() -> None:
    from hetero_operator.cluster.inventory import build_inventory
    from hetero_operator.local.plan import load_objects
    from hetero_operator.planning.marginal import PlanInputs
    from hetero_operator.planning.plan import plan_job
    from hetero_operator.render.env import render_rank_envs

    nodes = load_objects(ROOT / "examples" / "clusters" / "mixed.yaml", "Node")
    inputs = PlanInputs(prices={"NVIDIA-A100-SXM4-40GB": 2.5, "Tesla-T4": 0.35})  # V100: none
    job = parse_job(_digits({"tensorboard": {}}))
    plan = plan_job(job, build_inventory(nodes), inputs=inputs)
    assert {t.gpu_type: t.price_per_hour for t in plan.value.types} == {
        "NVIDIA-A100-SXM4-40GB": 2.5, "Tesla-V100-SXM2-16GB": None, "Tesla-T4": 0.35}
    envs = render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=29500, simulated=True)
    assert {e[envnames.PRICES_PER_HOUR] for e in envs} == {
        '{"NVIDIA-A100-SXM4-40GB":2.5,"Tesla-T4":0.35,"Tesla-V100-SXM2-16GB":null}'}
    info = tracking.series.RunInfo.of(c.parse_contract(envs[0]))
    assert info.metadata()["prices_per_hour"] == {"NVIDIA-A100-SXM4-40GB": 2.5,
                                                  "Tesla-V100-SXM2-16GB": None, "Tesla-T4": 0.35}
    assert info.cost_per_hour() is None  # a V100 is in the plan, unpriced: no job price
    assert ("price per device-hour: NVIDIA-A100-SXM4-40GB 2.5/h, Tesla-V100-SXM2-16GB unpriced, "
            "Tesla-T4 0.35/h; job: unpriced (a type has no price)") in info.plan_markdown()
    # a priced type and no tracking: the prices still go (a script may pass Trainer(tracking=))
    plain = parse_job(_digits(None))
    envs = render_rank_envs(plan_job(plain, build_inventory(nodes), inputs=inputs), plain,
                            master_addr="127.0.0.1", master_port=29500, simulated=True)
    assert c.parse_contract(envs[3]).run.prices_per_hour["Tesla-T4"] == 0.35
    with pytest.raises(c.ContractError, match="Tesla-T4: a price must be null or a number >= 0"):
        c.parse_contract({**envs[0], envnames.PRICES_PER_HOUR: '{"Tesla-T4":-1}'})


def _contract(rank: int, products: tuple[str, ...], **run: object) -> c.Contract:
    topology = tuple(c.RankEntry(rank=i, group=i, node=f"n{i}", gpu_product=p,
                                 compute_capability="7.5", local_batch=4 * (i + 1))
                     for i, p in enumerate(products))
    return c.Contract(
        dist=c.RankInfo(rank=rank, world_size=len(products), local_rank=0, local_world_size=1,
                        master_addr="x", master_port=1, job_name="j", group=rank, group_rank=0,
                        group_size=1),
        precision="fp32", comm=c.CommSettings(hierarchy="flat"),
        device=c.DeviceProfile(product=products[rank], compute_capability="7.5", memory_mib=1,
                               relative_speed=1.0, simulated=True),
        topology=topology, run=c.RunSettings(**run))


class _Recorder:
    """A writer that keeps what it is given (stands in for SummaryWriter in the unit tests)."""

    def __init__(self, directory: str) -> None:
        self.directory, self.scalars, self.texts, self.closed = directory, {}, {}, False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.setdefault(tag, []).append((step, value))

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.texts[tag] = text

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_rank_0_writes_the_job_and_the_first_rank_of_each_gpu_type_its_type(tmp_path: Path) -> None:
    products = ("NVIDIA A100", "Tesla T4", "Tesla T4")
    on = {"tracking": {"tensorboard": {"logDir": str(tmp_path)}}}
    made: list[_Recorder] = []

    def factory(d: str) -> _Recorder:
        made.append(_Recorder(d))
        return made[-1]

    trackers = [tracking.Tracker(_contract(r, products, **on), writer_factory=factory) for r in range(3)]
    assert [(t.is_job, t.is_type_leader, t.active) for t in trackers] == [
        (True, True, True), (False, True, True), (False, False, False)]
    assert [Path(w.directory).name for w in made] == ["rank-0-NVIDIA-A100", "rank-1-Tesla-T4"]
    for t in trackers:  # local batches 4, 8, 12: T4s hold 20 of 24
        t.observe_step(1, step_s=0.5, compute_s=0.4, comm_wait_s=0.1, samples=8, loss=2.0,
                       local_batches=[4, 8, 12])
    job, t4 = made
    assert job.scalars["job/samples_per_s"] == [(1, 48.0)]
    assert job.scalars["job/loss"] == [(1, 2.0)]
    assert "1 x NVIDIA A100, 2 x Tesla T4" in job.texts["run/plan"]
    assert t4.scalars["gpu_type/Tesla-T4/samples_per_s"] == [(1, 40.0)]
    assert t4.scalars["gpu_type/Tesla-T4/batch_share"] == [(1, 20 / 24)]
    assert t4.scalars["gpu_type/Tesla-T4/compute_samples_per_s_per_gpu"] == [(1, 20.0)]
    assert t4.scalars["gpu_type/Tesla-T4/ranks"] == [(1, 2)]
    assert not any(tag.startswith("job/") for tag in t4.scalars)
    for t in trackers:
        t.close()
    assert job.closed and t4.closed


def test_a_pipelined_ranks_type_series_name_its_stage(tmp_path: Path) -> None:
    from heterotrain_common.pipelineenv import PipelineSettings

    products = ("NVIDIA A100", "Tesla T4", "NVIDIA A100", "Tesla T4")  # stage 0: A100s, 1: T4s
    made: list[_Recorder] = []
    trackers = []
    for r in range(4):
        pipe = PipelineSettings(stage=r % 2, stage_blocks=(3, 1), stage_ranks=((0, 2), (1, 3)),
                                micro_batches=4)
        contract = replace(_contract(r, products, tracking={"tensorboard": {"logDir": str(tmp_path)}}),
                           pipeline=pipe)
        trackers.append(tracking.Tracker(contract, writer_factory=lambda d: made.append(_Recorder(d))
                                         or made[-1]))
    assert [t.info.stage for t in trackers] == [0, 1, 0, 1]
    for t in trackers:  # local batches 4, 8, 12, 16
        t.observe_step(1, step_s=0.5, compute_s=0.4, comm_wait_s=0.1, samples=4, loss=2.0,
                       local_batches=[4, 8, 12, 16])
    a100, t4 = made
    assert a100.scalars["gpu_type/NVIDIA-A100/stage"] == [(1, 0.0)]
    assert t4.scalars["gpu_type/Tesla-T4/stage"] == [(1, 1.0)]
    assert t4.scalars["gpu_type/Tesla-T4/batch_share"] == [(1, 24 / 40)]
    assert "| 3 | 3 | n3 | Tesla T4 | 16 | 1 |" in a100.texts["run/plan"]
    assert trackers[0].info.metadata()["plan"][1] == {"rank": 1, "group": 1, "node": "n1",
                                                      "gpu": "Tesla T4", "local_batch": 8,
                                                      "stage": 1}
    no_pipe = tracking.Tracker(_contract(0, products, tracking={"tensorboard": {"logDir": str(tmp_path)}}),
                               writer_factory=lambda d: made.append(_Recorder(d)) or made[-1])
    no_pipe.observe_step(1, step_s=0.5, compute_s=0.4, comm_wait_s=0.1, samples=4, loss=2.0,
                         local_batches=[4, 8, 12, 16])
    assert no_pipe.info.stage is None and "gpu_type/NVIDIA-A100/stage" not in made[-1].scalars
    for t in (*trackers, no_pipe):
        t.close()


def test_the_log_dir_defaults_to_the_run_dir_then_the_checkpoint_path() -> None:
    products = ("Tesla T4",)
    tb = {"tensorboard": {"logDir": ""}}
    assert tracking.log_dir(_contract(0, products)) is None
    assert tracking.from_contract(_contract(0, products)) is None
    assert tracking.log_dir(_contract(0, products, tracking=tb, dir="/run")) == Path("/run/tensorboard")
    in_pod = replace(_contract(0, products, tracking=tb), checkpoint=c.CheckpointSettings(dir="/ckpt"))
    assert tracking.log_dir(in_pod) == Path("/ckpt/tensorboard/j")
    assert tracking.log_dir(_contract(0, products, tracking={"tensorboard": {"logDir": "/tb"}},
                                      dir="/run")) == Path("/tb")
    assert tracking.gpu_tag("NVIDIA H100 80GB HBM3 (MIG 1g.10gb)") == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_heterotrain_run_of_digits_leaves_event_files_tagged_per_gpu_type(tmp_path: Path) -> None:
    job = _digits({"tensorboard": {}})
    job["spec"]["training"]["checkpoint"]["path"] = str(tmp_path / "ckpt")  # no other run's
    manifest = tmp_path / "digits-tracked.yaml"
    manifest.write_text(yaml.safe_dump(job))
    work = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(manifest),
                           "--workdir", str(work), "--max-steps", str(STEPS),
                           "--metrics-port-base", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = json.loads((work / "plan.json").read_text())
    global_batch = job["spec"]["training"]["globalBatchSize"]
    by_type = plan_batches_by_type(work)
    assert len(by_type) == 3  # examples/clusters/mixed.yaml: A100, V100, T4 x 2
    runs = {d.name: d for d in (work / "tensorboard").iterdir()}
    steps = list(range(1, STEPS + 1))
    for product, batches in by_type.items():
        tag = tracking.gpu_tag(product)
        first = min(r for g in plan["groups"] if g["product"] == product for r in g["ranks"])
        acc = EventAccumulator(str(runs[f"rank-{first}-{tag}"]))
        acc.Reload()
        prefix = f"gpu_type/{tag}/"
        assert {t for t in acc.Tags()["scalars"] if t.startswith(prefix)} == {
            prefix + n for n in ("samples_per_s", "compute_samples_per_s_per_gpu", "batch_share",
                                 "local_batch", "step_s", "compute_s", "comm_wait_s", "ranks", "loss")}
        for name in ("samples_per_s", "batch_share", "step_s", "compute_s", "comm_wait_s", "loss"):
            assert [e.step for e in acc.Scalars(prefix + name)] == steps, (product, name)
        share = sum(batches) / global_batch  # no rebalancing in the example: the plan's split
        assert [e.value for e in acc.Scalars(prefix + "batch_share")] == pytest.approx([share] * STEPS)
        assert [e.value for e in acc.Scalars(prefix + "ranks")] == [len(batches)] * STEPS
        for step_s, compute_s, wait_s in zip(*(acc.Scalars(prefix + n) for n in
                                               ("step_s", "compute_s", "comm_wait_s"))):
            assert step_s.value > 0 and compute_s.value + wait_s.value == pytest.approx(step_s.value, rel=1e-5)
        stats = json.loads((work / f"rank-{first}.json").read_text())  # the rank's own last loss
        assert acc.Scalars(prefix + "loss")[-1].value == pytest.approx(stats["loss"], rel=1e-6)
    job_run = EventAccumulator(str(runs[f"rank-0-{tracking.gpu_tag(plan['groups'][0]['product'])}"]))
    job_run.Reload()
    assert [e.step for e in job_run.Scalars("job/loss")] == steps
    assert [e.value for e in job_run.Scalars("job/global_batch")] == [global_batch] * STEPS
    assert all(e.value > 0 for e in job_run.Scalars("job/samples_per_s"))
    assert "run/plan/text_summary" in job_run.Tags()["tensors"]
    assert len(runs) == 3  # rank 3 (the second T4) writes nothing


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_pipelined_heterotrain_run_writes_its_series_per_gpu_type_and_stage(tmp_path: Path) -> None:
    """``examples/lm-pipeline.yaml`` (one stage per GPU type: A100 stage 0, T4 stage 1) with
    ``tracking: {tensorboard: {}}``: rank 0 writes the job's loss and throughput,
    each type's first rank its series with its stage; the plan text names every rank's stage."""
    steps = 3
    job = yaml.safe_load((ROOT / "examples" / "lm-pipeline.yaml").read_text())
    job["spec"]["training"]["tracking"] = {"tensorboard": {}}
    manifest = tmp_path / "lm-pipeline.yaml"
    manifest.write_text(yaml.safe_dump(job))
    work = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(manifest),
                           "--nodes", str(ROOT / "examples" / "clusters" / "scaled-memory.yaml"),
                           "--workdir", str(work),
                           "--max-steps", str(steps), "--metrics-port-base", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = json.loads((work / "plan.json").read_text())
    stage_of = {s["gpu_type"]: s["index"] for s in plan["pipeline"]["stages"]}
    assert stage_of == {"NVIDIA-A100-SXM4-40GB": 0, "Tesla-T4": 1}
    global_batch = job["spec"]["training"]["globalBatchSize"]
    by_type = plan_batches_by_type(work)
    runs = {d.name: d for d in (work / "tensorboard").iterdir()}
    assert set(runs) == {"rank-0-NVIDIA-A100-SXM4-40GB", "rank-1-Tesla-T4"}
    losses = {}
    for rank, (product, batches) in enumerate(by_type.items()):
        tag = tracking.gpu_tag(product)
        acc = EventAccumulator(str(runs[f"rank-{rank}-{tag}"]))
        acc.Reload()
        prefix = f"gpu_type/{tag}/"
        assert {t for t in acc.Tags()["scalars"] if t.startswith(prefix)} == {
            prefix + n for n in ("samples_per_s", "compute_samples_per_s_per_gpu", "batch_share",
                                 "local_batch", "step_s", "compute_s", "comm_wait_s", "ranks",
                                 "loss", "stage")}
        assert [(e.step, e.value) for e in acc.Scalars(prefix + "stage")] == [
            (s, stage_of[product]) for s in range(1, steps + 1)]
        assert [e.value for e in acc.Scalars(prefix + "batch_share")] == pytest.approx(
            [sum(batches) / global_batch] * steps)
        assert all(e.value > 0 for e in acc.Scalars(prefix + "samples_per_s"))
        losses[product] = [e.value for e in acc.Scalars(prefix + "loss")]
        stats = json.loads((work / f"rank-{rank}.json").read_text())
        assert losses[product][-1] == pytest.approx(stats["loss"], rel=1e-6)
    first, second = losses.values()
    assert first == pytest.approx(second, rel=1e-6)  # the job's loss, sent along the pipeline
    job_run = EventAccumulator(str(runs["rank-0-NVIDIA-A100-SXM4-40GB"]))
    job_run.Reload()
    assert [e.value for e in job_run.Scalars("job/loss")] == pytest.approx(first, rel=1e-6)
    assert [(e.step, e.value) for e in job_run.Scalars("job/global_batch")] == [
        (s, global_batch) for s in range(1, steps + 1)]
    assert all(e.value > 0 for e in job_run.Scalars("job/samples_per_s"))
    text = job_run.Tensors("run/plan/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 1 | 1 | " in text and "| Tesla-T4 | 16 | 1 |" in text  # rank 1: the T4, stage 1
