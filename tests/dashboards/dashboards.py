"""Load the chart's Grafana dashboards and walk their PromQL (shared by the dashboard tests)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "charts" / "heterotrain" / "dashboards"
VARIABLE_RE = re.compile(r"\$(?:\{)?(__rate_interval|__interval|__range|namespace|job|gpu)\b(?:\})?")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard.

    Attributes:
        uid: dashboard uid.
        panel: panel title ("annotation: NAME" for annotation queries).
        ref_id: the target's refId.
        expr: the expression with Grafana variables still in it.
        legend: the target's legendFormat.
    """

    uid: str
    panel: str
    ref_id: str
    expr: str
    legend: str

    @property
    def id(self) -> str:
        return f"{self.uid}/{self.panel}/{self.ref_id}"


def load_dashboards() -> dict[str, dict[str, Any]]:
    """``{file name: dashboard}`` of every charts/heterotrain/dashboards/*.json."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel (rows' nested panels included), rows themselves excluded."""
    for panel in board["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(board: dict[str, Any]) -> Iterator[Query]:
    """Every PromQL expression of panels and annotations."""
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield Query(board["uid"], panel["title"], target["refId"], target["expr"],
                        target.get("legendFormat", ""))
    for ann in board.get("annotations", {}).get("list", []):
        if "expr" in ann:
            yield Query(board["uid"], f"annotation: {ann['name']}", "A", ann["expr"],
                        ann.get("textFormat", ""))


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus data source interpolates it into ``=~``."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables (``$job``, ``${gpu}``, ``$__rate_interval``, ...) by ``values``.

    Raises:
        KeyError: the expression uses a variable ``values`` lacks.
    """
    out = VARIABLE_RE.sub(lambda m: values[m.group(1)], expr)
    assert "$" not in out, f"unsubstituted variable left in {out!r}"
    return out
