"""A real Prometheus server for tests: started from the Debian package on 127.0.0.1.

One server per test session (see the ``prometheus`` fixture in ``tests/prom/fixtures.py``). It
scrapes every second the targets given to :meth:`PrometheusServer.set_targets` (static targets in
its config, applied at once through the lifecycle API's ``/-/reload``; a renamed ``file_sd`` file
was not always picked up), may load rule files
(:meth:`PrometheusServer.set_rule_files`), and answers PromQL through its HTTP API.

The scrape job uses ``honor_labels: true``: worker series carry their own ``job`` label (the
HeteroTrainingJob's name), which must win over the scrape job's name (otherwise Prometheus renames
it ``exported_job``). The Helm chart's PodMonitor does the same (``honorLabels: true``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from waiting import wait_until

SCRAPE_JOB = "heterotrain-workers"
SCRAPE_INTERVAL_S = 1


class PrometheusError(RuntimeError):
    """The server did not start, rejected a query, or a wait ran out."""


def find_binary() -> str | None:
    """Path of the ``prometheus`` binary (PATH, then /usr/bin), None when not installed: the
    one ``heterotrain cluster up --monitoring`` runs (:func:`hetero_operator.devcluster.monitoring.find_binary`)."""
    from hetero_operator.devcluster.monitoring import find_binary as cluster_binary
    return cluster_binary()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One Prometheus process with its own config, data directory and port.

    Args:
        workdir: directory for the config, the targets file and the TSDB (created).
        binary: the ``prometheus`` executable.
        scrape_interval_s: scrape and rule evaluation interval, seconds.
    """

    def __init__(self, workdir: Path, *, binary: str, scrape_interval_s: int = SCRAPE_INTERVAL_S) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = binary
        self.scrape_interval_s = scrape_interval_s
        self.target_groups: list[dict[str, Any]] = []
        self.config_file = self.workdir / "prometheus.yml"
        self.log_file = self.workdir / "prometheus.log"
        self.rule_files: list[str] = []
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    # --- lifecycle ----------------------------------------------------------------------------

    def write_config(self) -> None:
        """Write ``prometheus.yml`` (scrape job over the targets file, the rule files)."""
        interval = f"{self.scrape_interval_s}s"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "rule_files": list(self.rule_files),
            "scrape_configs": [{"job_name": SCRAPE_JOB, "honor_labels": True,
                                "static_configs": self.target_groups}],
        }
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(self.config_file)

    def start(self, *, timeout_s: float = 60.0, attempts: int = 3) -> None:
        """Start the server and wait until ``/-/ready``.

        Raises:
            PrometheusError: it exited or was not ready within ``timeout_s`` seconds (the log
                tail is in the message).
        """
        self.write_config()
        for _ in range(attempts):
            self.port = free_port()
            with open(self.log_file, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, f"--config.file={self.config_file}",
                     f"--storage.tsdb.path={self.workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                     "--storage.tsdb.retention.time=1d", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(timeout_s):
                return
            self.stop()
        raise PrometheusError(f"prometheus did not become ready; log:\n{self._log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        def settled() -> str:
            if self.proc is None or self.proc.poll() is not None:
                return "exited"  # e.g. port taken between free_port() and bind: try another
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    return "ready" if r.status == 200 else ""
            except (urllib.error.URLError, OSError):
                return ""
        try:
            return wait_until(settled, timeout_s=timeout_s, what="Prometheus /-/ready", poll_s=0.2) == "ready"
        except AssertionError:
            return False

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def reload(self) -> None:
        """Re-read the config and rule files now (``POST /-/reload``)."""
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- what to scrape -----------------------------------------------------------------------

    def set_targets(self, targets: Iterable[str], labels: Mapping[str, str] | None = None, *,
                    wait_s: float = 20.0) -> None:
        """Scrape exactly these ``host:port`` targets from now on, and wait until they are up.

        Args:
            targets: e.g. ``["127.0.0.1:9480", "127.0.0.1:9481"]``; empty stops scraping.
            labels: extra target labels (e.g. ``{"namespace": "default"}``).
            wait_s: how long to wait for every target to report ``health == "up"``, seconds.

        Raises:
            PrometheusError: a target was not up in time (its last error is in the message).
        """
        wanted = sorted(targets)
        self.target_groups = [{"targets": wanted, "labels": dict(labels or {})}] if wanted else []
        self.write_config()
        self.reload()
        health: dict[str, tuple[str, str]] = {}

        def all_up() -> bool:
            active = self._api("targets", {"state": "active"})["activeTargets"]
            health.clear()
            health.update({t["labels"].get("instance", ""): (t["health"], t.get("lastError", ""))
                           for t in active if t.get("scrapePool") == SCRAPE_JOB})
            return set(health) == set(wanted) and all(h == "up" for h, _ in health.values())
        try:
            wait_until(all_up, timeout_s=wait_s, what="every target up", poll_s=0.25)
        except AssertionError:
            raise PrometheusError(f"targets not up after {wait_s:g}s: {health}") from None

    def set_rule_files(self, paths: Sequence[str | Path]) -> None:
        """Load these rule files (recording/alerting rules) and reload."""
        self.rule_files = [str(Path(p).resolve()) for p in paths]
        self.write_config()
        self.reload()

    # --- queries ------------------------------------------------------------------------------

    def _api(self, endpoint: str, params: Mapping[str, Any] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}{query}", timeout=15) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400 for a bad query: the body says why
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{endpoint} {dict(params or {})}: {body.get('errorType')}: "
                                  f"{body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Evaluate an instant query now.

        Returns:
            The result list, each ``{"metric": {label: value}, "value": [t, "v"]}`` (vector) or
            for a scalar a one-element list ``[{"metric": {}, "value": [t, "v"]}]``.

        Raises:
            PrometheusError: the server rejected the expression (its message included).
        """
        data = self._api("query", {"query": promql})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, promql: str, *, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
        """Evaluate a range query (unix seconds); returns ``[{"metric", "values": [[t, "v"], …]}]``."""
        data = self._api("query_range", {"query": promql, "start": start_s, "end": end_s,
                                         "step": step_s})
        return list(data["result"])

    def wait_for(self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool, *,
                 timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll :meth:`query` until ``predicate(result)`` holds; return that result.

        Raises:
            PrometheusError: not satisfied within ``timeout_s`` seconds (last result included).
        """
        last: list[list[dict[str, Any]]] = [[]]

        def satisfied() -> bool:
            last[0] = self.query(promql)
            return bool(predicate(last[0]))
        try:
            wait_until(satisfied, timeout_s=timeout_s, what=promql, poll_s=0.5)
        except AssertionError:
            raise PrometheusError(f"{promql!r} did not satisfy the condition within "
                                  f"{timeout_s:g}s; last result: {last[0]}") from None
        return last[0]

    def series_by(self, result: list[dict[str, Any]], label: str) -> dict[str, float]:
        """``{series[label]: float(value)}`` of an instant-vector result."""
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}
