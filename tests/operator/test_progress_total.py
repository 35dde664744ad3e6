"""``status.progress`` carries the job's step, its total and an ETA for ``kubectl get htj``'s
Step / Total / ETA columns (issue 22, point 12)."""

from __future__ import annotations

from pathlib import Path

import yaml

from hetero_operator.controller.progress import duration_text, parse_progress, progress_status

# rank 0 resumed at step 40, took 52 more steps of a 132-step job, its last step did 70 samples
# in 0.25 s (280 samples/s locally -> 512 samples/s for the global batch of 128)
METRICS = """\
# TYPE htj_steps_total counter
htj_steps_total{job="digits",rank="0",group="0",gpu_product="A100"} 52.0
# TYPE htj_throughput_samples_per_second gauge
htj_throughput_samples_per_second{job="digits",rank="0",group="0",gpu_product="A100"} 280.0
# TYPE htj_local_batch_size gauge
htj_local_batch_size{job="digits",rank="0",group="0",gpu_product="A100"} 70.0
# TYPE htj_planned_steps gauge
htj_planned_steps{job="digits",rank="0",group="0",gpu_product="A100"} 132.0
# TYPE htj_resumed_step gauge
htj_resumed_step{job="digits",rank="0",group="0",gpu_product="A100"} 40.0
"""


def test_progress_has_the_jobs_step_its_total_and_the_time_left():
    progress = parse_progress(METRICS, 128)
    assert progress is not None and (progress.step, progress.total_steps) == (92, 132)
    status = progress_status(progress, now_s=0.0, global_batch=128)
    # 40 steps left x 128 samples / 512 samples/s = 10 s
    assert (status["step"], status["totalSteps"], status["eta"]) == (92, 132, "10s")
    unknown = parse_progress(METRICS.split("# TYPE htj_planned_steps")[0], 128)
    assert "totalSteps" not in progress_status(unknown, now_s=0.0, global_batch=128)


def test_durations_read_like_kubectl_ages():
    assert [duration_text(s) for s in (0, 9.6, 245, 3725)] == ["0s", "10s", "4m05s", "1h02m"]


def test_kubectl_shows_step_total_and_eta_in_both_crd_copies():
    for path in ("crds/heterotrainingjobs.heterotrain.io.yaml",
                 "charts/heterotrain/crds/heterotrainingjobs.heterotrain.io.yaml"):
        crd = yaml.safe_load((Path(__file__).parents[2] / path).read_text())
        columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
        assert {k: columns[k] for k in ("Step", "Total", "ETA")} == {
            "Step": ".status.progress.step", "Total": ".status.progress.totalSteps",
            "ETA": ".status.progress.eta"}
