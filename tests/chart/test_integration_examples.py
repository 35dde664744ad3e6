"""The manifests of examples/integrations/ (shown in docs/monitoring.md, docs/kueue.md,
docs/dra.md) validate: built-in kinds strictly with kubernetes-validate, custom kinds against
their schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from custom_schemas import validate_custom

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "integrations"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def test_dcgm_exporter_servicemonitor_validates_and_keeps_dcgm_labels() -> None:
    (sm,) = docs("dcgm-exporter-servicemonitor.yaml")
    validate_custom(sm)
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["metricRelabelings"] == [
        {"sourceLabels": ["uuid"], "regex": "(GPU-.+)", "targetLabel": "UUID",
         "replacement": "$1", "action": "replace"}]


def test_docs_link_the_examples() -> None:
    text = (REPO / "docs" / "monitoring.md").read_text()
    assert "examples/integrations/dcgm-exporter-servicemonitor.yaml" in text
