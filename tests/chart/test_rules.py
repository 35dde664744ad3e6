"""The Prometheus alert rules of the chart: `promtool check rules` and `promtool test rules`.

promtool is Debian's (package ``prometheus``, installed by ``scripts/setup.sh --test``). The unit
tests live in tests/rules/*.yaml; each alert has a firing case with exact labels and annotations
and a case that must not fire.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "charts" / "heterotrain" / "rules").glob("*.yaml"))
RULE_TESTS = sorted((REPO / "tests" / "rules").glob("*_test.yaml"))
REQUIRED_ALERTS = {
    "HeteroTrainJobStuckPending", "HeteroTrainRestartsGrowing", "HeteroTrainStragglerRatioHigh",
    "HeteroTrainGPUMemoryNearFull", "HeteroTrainWorkerMetricsMissing",
}
pytestmark = pytest.mark.timeout(120)


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool is not installed: run `bash scripts/setup.sh --test` (Debian package prometheus)")
    return found


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]
            for r in g["rules"] if "alert" in r}


def test_promtool_check_rules_passes() -> None:
    proc = subprocess.run([promtool(), "check", "rules", *map(str, RULE_FILES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules_passes(test_file: Path) -> None:
    proc = subprocess.run([promtool(), "test", "rules", test_file.name], cwd=test_file.parent,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rule_unit_tests_cover_every_alert_firing_and_silent() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for test_file in RULE_TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert set(alerts()) == fired, "every alert needs a case where it fires"
    assert set(alerts()) == silent, "every alert needs a case where it stays silent"


def test_the_required_alerts_exist_with_severity_and_runbook() -> None:
    rules = alerts()
    assert REQUIRED_ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower(), name
        docs = (REPO / "docs" / "monitoring.md").read_text()
        assert re.search(rf"^#+ {name}$", docs, flags=re.M), f"docs/monitoring.md lacks a {name} section"
