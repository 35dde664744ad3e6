"""Case 53 against the REAL API server: ``spec.images[].platforms`` is in the CRD's schema, a
multi-arch catalog is admitted, and the CEL rule refuses the ``uname -m`` spellings with a message
naming the field and the labels' spelling (the operator's parser says the same, test_case53)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from realcluster import REPO, RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _job(name: str, platforms: list[str] | None) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    images = copy.deepcopy(body["spec"]["images"])
    for entry in images:
        if platforms is not None:
            entry["platforms"] = platforms
    body["spec"]["images"] = images
    return body


def _dry_run(real: RealCluster, ns: str, body: dict[str, Any]) -> Any:
    return real.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-n", ns,
                        "-o", "json", "-f", "-", input_text=json.dumps(body), check=False)


def test_platforms_are_admitted_and_uname_spellings_refused_naming_the_field(real: RealCluster) -> None:
    ns = real.namespace("platforms")
    ok = _dry_run(real, ns, _job("multiarch", ["linux/amd64", "linux/arm64/v8"]))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["spec"]["images"][0]["platforms"] == ["linux/amd64", "linux/arm64/v8"]
    assert _dry_run(real, ns, _job("left-out", None)).returncode == 0
    bad = _dry_run(real, ns, _job("uname", ["linux/x86_64"]))
    assert bad.returncode != 0
    assert "spec.images[0].platforms" in bad.stderr, bad.stderr
    assert "such as linux/amd64 or linux/arm64 (not x86_64 or aarch64)" in bad.stderr, bad.stderr
    empty = _dry_run(real, ns, _job("empty", []))
    assert empty.returncode != 0 and "spec.images[0].platforms" in empty.stderr, empty.stderr
