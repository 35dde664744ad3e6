"""Every DCGM-backed dashboard query, run by ``promtool test rules`` on dcgm-exporter-shaped series.

The expressions are read from the dashboard JSON (Grafana variables set to "All"), so the test
follows the shipped panels. Scenarios (label shapes as dcgm-exporter writes them: ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``, and ``GPU_I_ID``/``GPU_I_PROFILE`` on MIG series only):

* ``case29``: tests/fixtures/cases/29 as given: a busy A100 MIG 3g.40gb slice whose
  ``DCGM_FI_DEV_GPU_UTIL`` is 0, a T4 with both metrics, an M60 (Maxwell) without profiling metrics.
  The cluster utilisation panel must give 0.85 / 0.88 / 0.70 (the case's 85 / 88 / 70 as ratios).
* ``fleet``: the same three devices used by ranks 0-2 of job ``ml/mixed`` (each rank's
  ``htj_gpu_info``; no DCGM pod labels, as on MIG), framebuffer series, and a fourth device (a T4
  of another team, with DCGM pod labels) that no HeteroTrain panel may attribute to the job.
* ``case30``: tests/fixtures/cases/30: a 1g.10gb MIG slice without pod labels (rank 0) and a
  whole A100 with them (rank 1); both ranks are attributed (0.80 / 0.90) where a pod join finds
  only rank 1 (negative control).
* ``no_info``: a whole GPU whose worker exported no ``htj_gpu_info`` (no NVML in the container):
  the aggregate panels still attribute it through dcgm-exporter's namespace/pod labels, the job
  view falls back to the worker's NVML reading.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import REPO, Query, load_dashboards, queries, substitute

CASES = REPO / "tests" / "fixtures" / "cases"
ALL = {"namespace": ".*", "job": ".*", "gpu": ".*", "__rate_interval": "1m", "__range": "1h"}
A100 = "NVIDIA A100 80GB PCIe"
pytestmark = pytest.mark.timeout(120)

# panel keys
GPUS = "heterotrain-cluster/GPUs by model (DCGM)/A"
UTIL = "heterotrain-cluster/Utilisation by model (DCGM)/A"
FB = "heterotrain-cluster/Framebuffer used by model (DCGM)/A"
OUR_UTIL = "heterotrain-cluster/HeteroTrain pods: utilisation by model (DCGM)/A"
OUR_FB = "heterotrain-cluster/HeteroTrain pods: framebuffer used by model (DCGM)/A"
TABLE = "heterotrain-cluster/HeteroTrain pods on GPUs (DCGM)/A"
RANK_UTIL = "heterotrain-job/GPU utilisation per rank/A"


def case_metrics(prefix: str) -> dict[str, Any]:
    (path,) = CASES.glob(f"{prefix}-*.yaml")
    return next(yaml.safe_load_all(path.read_text()))


def info(rank: int, uuid: str, gi_id: str = "", profile: str = "", *, namespace: str = "ml",
         job: str = "mixed", product: str, pod: str | None = None) -> dict[str, str]:
    """One rank's ``htj_gpu_info`` series as the PodMonitor scrapes it (namespace, pod added)."""
    labels = {"namespace": namespace, "pod": pod or f"{job}-g{rank}", "job": job,
              "rank": str(rank), "group": str(rank), "gpu_product": product, "UUID": uuid,
              "gpu": "0", "GPU_I_ID": gi_id, "GPU_I_PROFILE": profile}
    return {"series": "htj_gpu_info" + _labels(labels), "values": "1x8"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": name + _labels(labels), "values": values}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items() if v != "") + "}"


def scenario_case29() -> list[dict[str, str]]:
    return case_metrics("29")["input_series"]


MIG_A = {"UUID": "GPU-aaaa0000", "gpu": "0", "GPU_I_ID": "2", "GPU_I_PROFILE": "3g.40gb",
         "modelName": A100, "Hostname": "node-a"}
T4_B = {"UUID": "GPU-bbbb0000", "gpu": "0", "modelName": "Tesla T4", "Hostname": "node-b"}
M60_C = {"UUID": "GPU-cccc0000", "gpu": "0", "modelName": "Tesla M60", "Hostname": "node-c"}
T4_OTHER = {"UUID": "GPU-ffff0000", "gpu": "1", "modelName": "Tesla T4", "Hostname": "node-b",
            "namespace": "other", "pod": "notebook-0", "container": "jupyter"}


def scenario_fleet() -> list[dict[str, str]]:
    fb = [(MIG_A, 30000, 10000), (T4_B, 12000, 3000), (M60_C, 2000, 6000), (T4_OTHER, 3000, 12000)]
    return [
        *scenario_case29(),
        series("DCGM_FI_DEV_GPU_UTIL", T4_OTHER, "12x8"),
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", T4_OTHER, "0.10x8"),
        *(series("DCGM_FI_DEV_FB_USED", dev, f"{used}x8") for dev, used, _ in fb),
        *(series("DCGM_FI_DEV_FB_FREE", dev, f"{free}x8") for dev, _, free in fb),
        info(0, "GPU-aaaa0000", "2", "3g.40gb", product="NVIDIA-A100-80GB-PCIe-MIG-3g.40gb"),
        info(1, "GPU-bbbb0000", product="Tesla-T4"),
        info(2, "GPU-cccc0000", product="Tesla-M60"),
        # the worker's own NVML reading of the T4 (DCGM's GR-engine value wins in the job view)
        series("htj_gpu_utilization_ratio", {"namespace": "ml", "pod": "mixed-g1", "job": "mixed",
                                             "rank": "1", "group": "1", "gpu_product": "Tesla-T4"},
               "0.91x8"),
        *(series("htj_local_batch_size", {"namespace": "ml", "pod": f"mixed-g{r}", "job": "mixed",
                                          "rank": str(r), "group": str(r), "gpu_product": p}, "16x8")
          for r, p in enumerate(("NVIDIA-A100-80GB-PCIe-MIG-3g.40gb", "Tesla-T4", "Tesla-M60"))),
    ]


def scenario_case30() -> list[dict[str, str]]:
    dcgm = [s for s in case_metrics("30")["input_series"] if s["series"].startswith("DCGM_")]
    mig = {"UUID": "GPU-dddd0000", "gpu": "0", "device": "nvidia0", "GPU_I_ID": "12",
           "GPU_I_PROFILE": "1g.10gb", "modelName": A100, "Hostname": "node-a"}
    whole = {"UUID": "GPU-eeee0000", "gpu": "0", "device": "nvidia0", "modelName": A100,
             "Hostname": "node-b", "namespace": "team-x", "pod": "job-mig-rank-1",
             "container": "worker"}
    return [
        *dcgm,
        series("DCGM_FI_DEV_FB_USED", mig, "5000x8"), series("DCGM_FI_DEV_FB_FREE", mig, "5000x8"),
        series("DCGM_FI_DEV_FB_USED", whole, "60000x8"),
        series("DCGM_FI_DEV_FB_FREE", whole, "20000x8"),
        info(0, "GPU-dddd0000", "12", "1g.10gb", namespace="team-x", job="job-mig",
             product="NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", pod="job-mig-rank-0"),
        info(1, "GPU-eeee0000", namespace="team-x", job="job-mig", product="NVIDIA-A100-80GB-PCIe",
             pod="job-mig-rank-1"),
        *(series("htj_local_batch_size", {"namespace": "team-x", "pod": f"job-mig-rank-{r}",
                                          "job": "job-mig", "rank": str(r), "group": str(r),
                                          "gpu_product": p}, "8x8")
          for r, p in enumerate(("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", "NVIDIA-A100-80GB-PCIe"))),
    ]


def scenario_no_info() -> list[dict[str, str]]:
    whole = {"UUID": "GPU-9999", "gpu": "0", "modelName": A100, "Hostname": "node-b",
             "namespace": "ml", "pod": "solo-g0", "container": "worker"}
    return [
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", whole, "0.6x8"),
        series("DCGM_FI_DEV_GPU_UTIL", whole, "64x8"),
        series("DCGM_FI_DEV_FB_USED", whole, "20000x8"),
        series("DCGM_FI_DEV_FB_FREE", whole, "60000x8"),
        series("htj_local_batch_size", {"namespace": "ml", "pod": "solo-g0", "job": "solo",
                                        "rank": "0", "group": "0",
                                        "gpu_product": "NVIDIA-A100-80GB-PCIe"}, "32x8"),
        series("htj_gpu_utilization_ratio", {"namespace": "ml", "pod": "solo-g0", "job": "solo",
                                             "rank": "0", "group": "0",
                                             "gpu_product": "NVIDIA-A100-80GB-PCIe"}, "0.62x8"),
    ]


def row(rank: int, namespace: str, job: str, pod: str, host: str, model: str,
        gi_id: str = "", profile: str = "") -> dict[str, str]:
    """Labels of one row of the per-rank DCGM table."""
    return {"namespace": namespace, "job": job, "rank": str(rank), "pod": pod, "Hostname": host,
            "modelName": model, "GPU_I_ID": gi_id, "GPU_I_PROFILE": profile}


MIG3 = {"modelName": A100, "GPU_I_PROFILE": "3g.40gb"}
T4 = {"modelName": "Tesla T4"}
M60 = {"modelName": "Tesla M60"}
Expected = list[tuple[dict[str, str], float]]
SCENARIOS: dict[str, tuple[Any, dict[str, Expected]]] = {
    "case29": (scenario_case29, {
        GPUS: [], FB: [], OUR_UTIL: [], OUR_FB: [], TABLE: [], RANK_UTIL: [],
        UTIL: [(MIG3, 0.85), (T4, 0.88), (M60, 0.70)],   # case 29: 85 / 88 / 70
    }),
    "fleet": (scenario_fleet, {
        GPUS: [(MIG3, 1), (T4, 2), (M60, 1)],
        UTIL: [(MIG3, 0.85), (T4, (0.88 + 0.10) / 2), (M60, 0.70)],
        FB: [(MIG3, 0.75), (T4, 15000 / 30000), (M60, 0.25)],
        OUR_UTIL: [(MIG3, 0.85), (T4, 0.88), (M60, 0.70)],        # the other team's T4 left out
        OUR_FB: [(MIG3, 0.75), (T4, 12000 / 15000), (M60, 0.25)],
        TABLE: [(row(0, "ml", "mixed", "mixed-g0", "node-a", A100, "2", "3g.40gb"), 0.85),
                (row(1, "ml", "mixed", "mixed-g1", "node-b", "Tesla T4"), 0.88),
                (row(2, "ml", "mixed", "mixed-g2", "node-c", "Tesla M60"), 0.70)],
        RANK_UTIL: [({"rank": "0", "gpu_product": "NVIDIA-A100-80GB-PCIe-MIG-3g.40gb"}, 0.85),
                    ({"rank": "1", "gpu_product": "Tesla-T4"}, 0.88),
                    ({"rank": "2", "gpu_product": "Tesla-M60"}, 0.70)],
    }),
    "case30": (scenario_case30, {
        GPUS: [({"modelName": A100, "GPU_I_PROFILE": "1g.10gb"}, 1), ({"modelName": A100}, 1)],
        UTIL: [({"modelName": A100, "GPU_I_PROFILE": "1g.10gb"}, 0.80), ({"modelName": A100}, 0.90)],
        FB: [({"modelName": A100, "GPU_I_PROFILE": "1g.10gb"}, 0.5), ({"modelName": A100}, 0.75)],
        OUR_UTIL: [({"modelName": A100, "GPU_I_PROFILE": "1g.10gb"}, 0.80),
                   ({"modelName": A100}, 0.90)],
        OUR_FB: [({"modelName": A100, "GPU_I_PROFILE": "1g.10gb"}, 0.5),
                 ({"modelName": A100}, 0.75)],
        TABLE: [(row(0, "team-x", "job-mig", "job-mig-rank-0", "node-a", A100, "12", "1g.10gb"), 0.80),
                (row(1, "team-x", "job-mig", "job-mig-rank-1", "node-b", A100), 0.90)],
        RANK_UTIL: [({"rank": "0", "gpu_product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb"}, 0.80),
                    ({"rank": "1", "gpu_product": "NVIDIA-A100-80GB-PCIe"}, 0.90)],
    }),
    "no_info": (scenario_no_info, {
        GPUS: [({"modelName": A100}, 1)], UTIL: [({"modelName": A100}, 0.6)],
        FB: [({"modelName": A100}, 0.25)],
        OUR_UTIL: [({"modelName": A100}, 0.6)], OUR_FB: [({"modelName": A100}, 0.25)],
        TABLE: [],
        RANK_UTIL: [({"rank": "0", "gpu_product": "NVIDIA-A100-80GB-PCIe"}, 0.62)],  # NVML
    }),
}
NEGATIVE_CONTROLS: dict[str, list[tuple[str, Expected]]] = {
    # case 29: the naive average counts the busy MIG slice as idle
    "case29": [("round(avg(DCGM_FI_DEV_GPU_UTIL), 0.01)", [({}, 53.33)]),
               ('DCGM_FI_DEV_GPU_UTIL{GPU_I_ID="2"}',
                [({"__name__": "DCGM_FI_DEV_GPU_UTIL", **MIG_A}, 0)])],
    # case 30: a join on dcgm-exporter's pod label attributes only rank 1
    "case30": [("DCGM_FI_PROF_GR_ENGINE_ACTIVE * on (namespace, pod) group_left (rank) "
                "htj_local_batch_size",
                [({"UUID": "GPU-eeee0000", "gpu": "0", "device": "nvidia0", "modelName": A100,
                   "Hostname": "node-b", "namespace": "team-x", "pod": "job-mig-rank-1",
                   "container": "worker", "rank": "1"}, 0.90 * 8)])],
}


def dcgm_queries() -> dict[str, Query]:
    return {q.id: q for board in load_dashboards().values() for q in queries(board)
            if "DCGM_" in q.expr}


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool is not installed: run `bash scripts/setup.sh --test` (Debian package prometheus)")
    return found


def _exp(expected: Expected) -> list[dict[str, Any]]:
    return [{"labels": _labels(labels), "value": value} for labels, value in expected]


def test_every_dcgm_query_has_expectations_in_every_scenario() -> None:
    found = set(dcgm_queries())
    assert found == {GPUS, UTIL, FB, OUR_UTIL, OUR_FB, TABLE, RANK_UTIL}
    for name, (_build, expected) in SCENARIOS.items():
        assert set(expected) == found, name


def test_gpu_util_is_only_a_fallback_for_the_profiling_metric() -> None:
    """Case 29's static check: every expression reading GPU_UTIL also reads GR_ENGINE_ACTIVE."""
    for q in dcgm_queries().values():
        if "DCGM_FI_DEV_GPU_UTIL" in q.expr:
            assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE or on (UUID) DCGM_FI_DEV_GPU_UTIL" in q.expr, q.id


def test_ranks_are_joined_on_device_identity_not_only_on_pod() -> None:
    for key in (OUR_UTIL, OUR_FB, TABLE, RANK_UTIL):
        assert "on (UUID, GPU_I_ID)" in dcgm_queries()[key].expr, key


def test_no_panel_reads_zero_for_a_busy_mig_slice() -> None:
    for name, (_build, expected) in SCENARIOS.items():
        for key, samples in expected.items():
            for labels, value in samples:
                if labels.get("GPU_I_PROFILE") or "MIG" in labels.get("gpu_product", ""):
                    assert value > 0, (name, key, labels)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_dcgm_panels_with_promtool(scenario: str, tmp_path: Path) -> None:
    build, expected = SCENARIOS[scenario]
    found = dcgm_queries()
    tests = [{"expr": substitute(found[key].expr, ALL), "eval_time": "1m", "exp_samples": _exp(exp)}
             for key, exp in expected.items()]
    tests += [{"expr": expr, "eval_time": "1m", "exp_samples": _exp(exp)}
              for expr, exp in NEGATIVE_CONTROLS.get(scenario, [])]
    (tmp_path / "empty.rules.yaml").write_text("groups: []\n")
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["empty.rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "15s", "input_series": build(), "promql_expr_test": tests}]},
        sort_keys=False))
    proc = subprocess.run([promtool(), "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
