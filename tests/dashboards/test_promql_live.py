"""Every PromQL expression of every dashboard panel and every alert rule, run against a real
Prometheus server (tests/prom, the session fixture) that scrapes a real 2-rank training run.

The run: ``heterotrain run`` of examples/digits.yaml cut to 2 ranks (the embedded default: real
torch.distributed over gloo, simulated A100/V100/T4 devices, the worker metrics on a port per rank),
plus the operator's metrics (hetero_operator.controller.metrics) served standalone and fed a few events.
Prometheus scrapes both every second with the labels the chart's PodMonitor/ServiceMonitor give
(namespace, heterotrain_io_job_name on workers; honor_labels keeps the worker's own ``job``).

Grafana variables are substituted as Grafana does: ``$namespace``/``$job``/``$gpu`` by the values
their own (chained) variable queries return, as a regex for multi-value; ``$__rate_interval`` by a
window holding several scrapes. Each expression must return at least one series (of the expected
ranks, GPU types, phases), except the panels listed in :data:`EXCEPTED`, whose series only exist on
real GPUs (NVML, CUDA allocator) or with NVIDIA's DCGM exporter; those still have to parse and run.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboards import REPO, Query, grafana_regex, load_dashboards, queries, substitute
from prom.prometheus_server import PrometheusServer, free_port
from prometheus_client import start_http_server
from waiting import wait_until

JOB = "digits-live"
NAMESPACE = "ml"
OPERATOR_NAMESPACE = "heterotrain-system"
RULE_FILES = sorted((REPO / "charts" / "heterotrain" / "rules").glob("*.yaml"))
THRESHOLD_RE = re.compile(r"(?s)^(?P<signal>.*\S)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?:bool\s+)?"
                          r"(?P<threshold>-?[0-9.]+(?:e[+-]?[0-9]+)?)$")
NVML = "NVML / CUDA allocator series: no samples on simulated devices (CPU-only run)"
DCGM = "DCGM exporter series (DCGM_FI_*): need NVIDIA's dcgm-exporter on GPU nodes"
EXCEPTED: dict[str, str] = {
    "heterotrain-job/GPU memory used per rank": NVML,
    "heterotrain-job/CUDA allocator per rank": NVML,
    "heterotrain-job/GPU utilisation per rank": NVML,
    "heterotrain-cluster/Utilisation per GPU type (workers)": NVML,
    "heterotrain-cluster/Memory used per GPU type (workers)": NVML,
    "heterotrain-cluster/GPUs by model (DCGM)": DCGM,
    "heterotrain-cluster/Utilisation by model (DCGM)": DCGM,
    "heterotrain-cluster/Framebuffer used by model (DCGM)": DCGM,
    "heterotrain-cluster/HeteroTrain pods: utilisation by model (DCGM)": DCGM,
    "heterotrain-cluster/HeteroTrain pods: framebuffer used by model (DCGM)": DCGM,
    "heterotrain-cluster/HeteroTrain pods on GPUs (DCGM)": DCGM,
}
"""``uid/panel title`` -> why the panel has no series in this run."""
EXCEPTED_ALERTS = {"HeteroTrainGPUMemoryNearFull": NVML}
NVML_METRICS = ("htj_gpu_", "htj_torch_memory_")
RATE_INTERVAL = "20s"
"""$__rate_interval: Grafana's max(4 x scrape interval, interval + scrape interval) on a 1 s scrape
would be 4 s; 20 s averages over ~20 steps, which keeps the ratios stable on a busy CPU."""
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


# --- the workload ------------------------------------------------------------------------------

def two_rank_job(path: Path) -> Path:
    """examples/digits.yaml with 2 ranks and a job name of its own, written to ``path``."""
    manifest = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    manifest["metadata"]["name"] = JOB
    manifest["spec"]["gpus"] = {**manifest["spec"]["gpus"], "ranks": 2, "minRanks": 2}
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def two_free_ports() -> int:
    """A port P such that P and P + 1 were both free on 127.0.0.1 a moment ago."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def serve_operator_metrics(port: int) -> tuple[Any, Any]:
    """Serve hetero_operator.controller.metrics on ``port``; returns (metrics, HTTP server)."""
    from hetero_operator.controller.metrics import OperatorMetrics

    op = OperatorMetrics()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=op.registry)
    op.set_phases(["Running", "Pending"])
    return op, server


def record_operator_events(op: Any) -> None:
    """What the operator records while it places a job: plans, pods, a restart, reconciles."""
    op.record_plan("unschedulable")
    op.record_plan("planned")
    op.pods_created.inc(2)
    op.restarts.inc()
    for duration_s in (0.004, 0.02, 0.3):
        op.reconcile_duration.observe(duration_s)


def write_targets(prometheus: PrometheusServer, groups: list[dict[str, Any]]) -> None:
    """Scrape several target groups with labels of their own (set_targets takes one label set)."""
    prometheus.target_groups = groups
    prometheus.write_config()
    prometheus.reload()


@pytest.fixture(scope="module")
def live(prometheus: PrometheusServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """The Prometheus fixture scraping a running 2-rank ``heterotrain run`` and the operator metrics."""
    workdir = tmp_path_factory.mktemp("promql-live")
    job_file = two_rank_job(workdir / "digits-live.yaml")
    port_base = two_free_ports()
    log = (workdir / "run.log").open("wb")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    run = subprocess.Popen(
        [sys.executable, "-m", "hetero_operator.cli", "run", str(job_file), "--workdir",
         str(workdir / "run"), "--epochs", "200", "--metrics-port-base", str(port_base)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    op_port = free_port()
    op, op_server = serve_operator_metrics(op_port)
    workers = [f"127.0.0.1:{port_base + r}" for r in range(2)]
    operator = f"127.0.0.1:{op_port}"
    try:
        write_targets(prometheus, [
            {"targets": workers, "labels": {"namespace": NAMESPACE, "heterotrain_io_job_name": JOB}},
            {"targets": [operator], "labels": {"namespace": OPERATOR_NAMESPACE}}])
        # 20+ scrapes of each rank while it trains: rate windows of 20 s hold real steps.
        prometheus.wait_for(f'count_over_time(htj_steps_total{{job="{JOB}"}}[{RATE_INTERVAL}]) >= 15 '
                            f'and htj_steps_total{{job="{JOB}"}} > 5',
                            lambda r: len(r) == 2, timeout_s=150)
        prometheus.wait_for(f'up{{instance="{operator}"}} == 1', timeout_s=10)
        record_operator_events(op)  # between scrapes, so rates and increases see them
        prometheus.wait_for(f'rate(htj_operator_reconcile_duration_seconds_count[{RATE_INTERVAL}]) > 0',
                            timeout_s=10)
        yield prometheus
    except Exception as exc:
        log.flush()
        raise AssertionError(f"{exc}\n--- heterotrain run output:\n"
                             f"{(workdir / 'run.log').read_text(errors='replace')[-3000:]}") from exc
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGTERM)
            try:
                run.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        log.close()
        op_server.shutdown()
        op_server.server_close()
        prometheus.set_targets([])


@pytest.fixture(scope="module")
def variables(live: PrometheusServer) -> dict[str, str]:
    """Grafana's variables resolved through the dashboards' own chained variable queries."""
    board = next(iter(load_dashboards().values()))
    defs = {v["name"]: v["definition"] for v in board["templating"]["list"] if v["type"] == "query"}
    values = {"__rate_interval": RATE_INTERVAL, "__range": "5m", "__interval": "5s"}
    chosen = {"namespace": [NAMESPACE], "job": [JOB], "gpu": None}
    for name in ("namespace", "job", "gpu"):  # chained: job's query uses $namespace, gpu's $job
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", defs[name])
        assert m, defs[name]
        series, label = substitute(m.group(1), values), m.group(2)
        found = {s["metric"].get(label, "") for s in live.query(f"count by ({label}) ({series})")}
        wanted = chosen[name] if chosen[name] is not None else sorted(found)
        assert set(wanted) <= found, f"variable {name}: {wanted} not among {found}"
        values[name] = grafana_regex(wanted)
    return values


def dashboard_queries() -> list[Query]:
    return [q for board in load_dashboards().values() for q in queries(board)]


def values_of(result: list[dict[str, Any]]) -> list[float]:
    return [float(s["value"][1]) for s in result]


def gpu_products(live: PrometheusServer) -> set[str]:
    return {s["metric"]["gpu_product"] for s in live.query(f'htj_local_batch_size{{job="{JOB}"}}')}


# --- dashboards -------------------------------------------------------------------------------

@pytest.mark.parametrize("query", dashboard_queries(), ids=lambda q: q.id)
def test_dashboard_query_returns_series(live: PrometheusServer, variables: dict[str, str],
                                        query: Query) -> None:
    result = live.query(substitute(query.expr, variables))  # raises on a PromQL error
    panel_key = f"{query.uid}/{query.panel}"
    if panel_key in EXCEPTED:
        return
    if query.panel.startswith("annotation: "):
        m = THRESHOLD_RE.match(substitute(query.expr, variables).strip())
        assert m, f"annotation {query.id} must be '<signal> <op> <threshold>'"
        result = live.query(m.group("signal"))
    assert result, f"{query.id} returned no series"
    assert any(math.isfinite(v) for v in values_of(result)), f"{query.id}: {result}"
    labels = lambda name: {s["metric"].get(name) for s in result}
    if "{{rank}}" in query.legend:
        assert labels("rank") == {"0", "1"}, query.id
    if "{{gpu_product}}" in query.legend:
        assert labels("gpu_product") == gpu_products(live), query.id
    if "{{job}}" in query.legend:
        assert labels("job") == {JOB}, query.id
    if "{{phase}}" in query.legend:
        from hetero_operator.api.conditions import PHASES
        assert labels("phase") == set(PHASES), query.id
    if "{{result}}" in query.legend:
        assert labels("result") == {"planned", "unschedulable"}, query.id


def test_excepted_panels_are_exactly_the_gpu_only_ones() -> None:
    """Nothing is excepted that could be tested here: each excepted panel reads only NVML or DCGM."""
    gpu_only = set()
    for q in dashboard_queries():
        metrics = set(re.findall(r"\b((?:htj|DCGM)_[A-Za-z0-9_]+)\b", q.expr))
        if metrics and all(m.startswith(("DCGM_", *NVML_METRICS)) or m == "htj_local_batch_size"
                           and "DCGM_" in q.expr for m in metrics):
            gpu_only.add(f"{q.uid}/{q.panel}")
    assert gpu_only == set(EXCEPTED)


def test_job_view_numbers_match_the_run(live: PrometheusServer, variables: dict[str, str]) -> None:
    by_panel = {(q.uid, q.panel): q for q in dashboard_queries()}
    ask = lambda uid, panel: live.query(substitute(by_panel[(uid, panel)].expr, variables))
    batches = {s["metric"]["rank"]: float(s["value"][1])
               for s in ask("heterotrain-job", "Local batch per rank")}
    global_batch = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())[
        "spec"]["training"]["globalBatchSize"]
    assert sum(batches.values()) == global_batch
    assert batches["0"] != batches["1"], "a proportional split on two GPU types is uneven"
    assert values_of(ask("heterotrain-job", "Global batch")) == [float(global_batch)]
    assert values_of(ask("heterotrain-job", "Ranks")) == [2.0]
    assert values_of(ask("heterotrain-cluster", "GPUs in use by jobs")) == [2.0]
    [ratio] = values_of(ask("heterotrain-job", "Straggler ratio"))
    assert 1.0 <= ratio < 2.0  # max / median of two ranks
    phases = {s["metric"]["phase"]: float(s["value"][1]) for s in ask("heterotrain-cluster", "Jobs by phase")}
    assert phases["Running"] == 1 and phases["Pending"] == 1 and phases["Failed"] == 0


# --- alert rules ------------------------------------------------------------------------------

def alert_rules() -> list[dict[str, Any]]:
    return [r for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]
            for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_signal_returns_series(live: PrometheusServer, rule: dict[str, Any]) -> None:
    """The full expression runs; its signal (the part before the threshold) has series."""
    live.query(rule["expr"])
    m = THRESHOLD_RE.match(rule["expr"].strip())
    assert m, f"{rule['alert']}: expr must be '<signal> <comparison> <threshold>'"
    if rule["alert"] in EXCEPTED_ALERTS:
        return
    signal_result = live.query(m.group("signal"))
    assert signal_result, f"{rule['alert']}: signal returned no series"
    assert all(math.isfinite(v) for v in values_of(signal_result)), signal_result


def test_healthy_run_fires_no_alert_but_the_pending_job(live: PrometheusServer) -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert live.query(rules["HeteroTrainWorkerMetricsMissing"]["expr"]) == []
    assert live.query(rules["HeteroTrainJobNoProgress"]["expr"]) == []
    missing = THRESHOLD_RE.match(rules["HeteroTrainWorkerMetricsMissing"]["expr"]).group("signal")
    assert {s["metric"]["heterotrain_io_job_name"] for s in live.query(missing)} == {JOB}
    pending = live.query(rules["HeteroTrainJobStuckPending"]["expr"])
    assert values_of(pending) == [1.0]  # the operator reports one Pending job ("for" not yet met)


def rules_api(live: PrometheusServer) -> list[dict[str, Any]]:
    """Every rule as Prometheus' /api/v1/rules reports it (health, state, lastError)."""
    with urllib.request.urlopen(f"{live.url}/api/v1/rules", timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_prometheus_loads_and_evaluates_every_rule(live: PrometheusServer) -> None:
    """The rule file loaded into the real server: every rule evaluates cleanly on the run's data,
    and the pending operator job makes HeteroTrainJobStuckPending pending (its `for` is 15 m)."""
    live.set_rule_files(RULE_FILES)
    try:
        def all_evaluated() -> list[dict[str, Any]]:
            rules = rules_api(live)
            evaluated = [r for r in rules if not r.get("lastEvaluation", "").startswith("0001-")]
            return rules if len(rules) == len(alert_rules()) and len(evaluated) == len(rules) else []
        rules = wait_until(all_evaluated, timeout_s=30, what="every rule evaluated once", poll_s=0.5)
        assert {r["name"]: (r["health"], r.get("lastError", "")) for r in rules} == {
            r["alert"]: ("ok", "") for r in alert_rules()}
        states = {r["name"]: r["state"] for r in rules}
        assert states["HeteroTrainJobStuckPending"] == "pending"
        assert states["HeteroTrainWorkerMetricsMissing"] == "inactive"
        assert states["HeteroTrainJobNoProgress"] == "inactive"
    finally:
        live.set_rule_files([])
