"""Static checks of the Grafana dashboards (charts/heterotrain/dashboards/*.json).

Stable uids, the data source variable everywhere, a unit on every panel, $__rate_interval in every
rate window, the namespace/job/gpu filters on every worker series, only metric names from
docs/internal-api.md (plus DCGM exporter's), and the panels the job and cluster views promise.
"""

from __future__ import annotations

import re

import pytest

from dashboards import REPO, load_dashboards, panels, queries

BOARDS = load_dashboards()
EXPECTED_UIDS = {"heterotrain-job.json": "heterotrain-job",
                 "heterotrain-cluster.json": "heterotrain-cluster"}
DS = {"type": "prometheus", "uid": "${datasource}"}
METRIC_RE = re.compile(r"\b((?:htj|DCGM)_[A-Za-z0-9_]+)\b")
RANGE_RE = re.compile(r"\[([^\]]*)\]")
DCGM_METRICS = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
"""dcgm-exporter's default counters (https://github.com/NVIDIA/dcgm-exporter,
etc/default-counters.csv; the PROF one is a DCP metric: Volta and newer, the one that works on MIG)."""


def internal_api_metrics() -> set[str]:
    """Metric names fixed in docs/internal-api.md, with histogram series suffixes."""
    text = (REPO / "docs" / "internal-api.md").read_text()
    names = set(re.findall(r"`(htj_[a-z_]+)", text))
    histograms = {n for n in names if n.endswith("_seconds") and "duration" in n}
    return names | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}


def test_dashboard_files_and_uids_are_stable() -> None:
    assert {name: b["uid"] for name, b in BOARDS.items()} == EXPECTED_UIDS


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_metadata(name: str) -> None:
    board = BOARDS[name]
    assert board["title"].startswith("HeteroTrain / ")
    assert {"heterotrain", "gpu"} <= set(board["tags"])
    assert board["schemaVersion"] >= 36
    assert "id" not in board or board["id"] is None, "a fixed id breaks import into another Grafana"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "gpu"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name_ in ("namespace", "job", "gpu"):
        var = variables[name_]
        assert var["datasource"] == DS and var["includeAll"] and var["allValue"] == ".*"
    assert "$namespace" in variables["job"]["definition"], "job is chained to namespace"
    assert "$job" in variables["gpu"]["definition"], "gpu type is chained to job"
    assert "gpu_product" in variables["gpu"]["definition"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_has_a_unit_the_data_source_variable_and_a_description(name: str) -> None:
    board = BOARDS[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        where = f"{name}: {panel['title']}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel["datasource"] == DS, where
        assert panel.get("description"), where
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["datasource"] == DS, where
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, where


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_window_uses_rate_interval_or_range(name: str) -> None:
    for q in queries(BOARDS[name]):
        windows = RANGE_RE.findall(q.expr)
        assert windows == [] or set(windows) <= {"$__rate_interval", "$__range"}, q.id
        if re.search(r"\b(rate|increase)\(", q.expr):
            assert "$__rate_interval" in q.expr or "$__range" in q.expr, q.id


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_worker_series_is_filtered_by_namespace_job_and_gpu(name: str) -> None:
    for q in queries(BOARDS[name]):
        for match in re.finditer(r"\b(htj_(?!operator_)[a-z_]+)(\{[^}]*\})?", q.expr):
            selector = match.group(2) or ""
            for var in ("$namespace", "$job", "$gpu"):
                assert var in selector, f"{q.id}: {match.group(1)} lacks {var}"


def test_only_documented_metric_names_are_used() -> None:
    allowed = internal_api_metrics() | DCGM_METRICS
    used = {m for board in BOARDS.values() for q in queries(board) for m in METRIC_RE.findall(q.expr)}
    assert used - allowed == set()
    assert {"htj_steps_total", "htj_local_batch_size", "htj_loss"} <= used


def titles(uid: str) -> list[str]:
    board = next(b for b in BOARDS.values() if b["uid"] == uid)
    return [p["title"] for p in panels(board)]


@pytest.mark.parametrize("needle", [
    "Throughput per GPU type", "Throughput", "Compute time per step", "Communication wait per step",
    "Local batch per rank", "Loss", "Straggler ratio", "Rebalancing events", "restarts",
    "GPU memory used per rank",
])
def test_job_view_has_the_promised_panels(needle: str) -> None:
    assert any(needle.lower() in t.lower() for t in titles("heterotrain-job")), needle


@pytest.mark.parametrize("needle", [
    "GPUs in use by type", "Utilisation per GPU type", "Memory used per GPU type",
    "Utilisation by model (DCGM)", "HeteroTrain pods: utilisation by model (DCGM)",
])
def test_cluster_view_has_the_promised_panels(needle: str) -> None:
    assert any(t.startswith(needle) for t in titles("heterotrain-cluster")), needle


def test_dcgm_panels_join_on_device_identity_and_group_by_model_name() -> None:
    """MIG series often lack dcgm-exporter's pod label (case 30): every join to our ranks goes
    through htj_gpu_info's (UUID, GPU_I_ID); values per panel: tests/dashboards/test_dcgm_panels.py."""
    board = next(b for b in BOARDS.values() if b["uid"] == "heterotrain-cluster")
    dcgm = [q for q in queries(board) if "DCGM_" in q.expr]
    assert dcgm and all("modelName" in q.expr for q in dcgm)
    joined = [q for q in dcgm if "htj_" in q.expr]
    assert joined and all("on (UUID, GPU_I_ID)" in q.expr and "htj_gpu_info{" in q.expr
                          for q in joined)


def test_straggler_ratio_is_max_over_median_of_compute_per_step() -> None:
    board = next(b for b in BOARDS.values() if b["uid"] == "heterotrain-job")
    expr = next(q.expr for q in queries(board) if q.panel == "Straggler ratio")
    assert expr.index("max by (namespace, job)") < expr.index("quantile by (namespace, job) (0.5,")
    assert expr.count("htj_compute_seconds_total") == 2 and expr.count("htj_steps_total") == 2
