"""Start-up check of the installed CRD (shared/cases/27: ``helm upgrade`` leaves the old CRD)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from k8s import crdcheck

from hetero_operator.controller import runner, schemacheck

CASE_27 = Path(__file__).resolve().parent.parent / "fixtures" / "cases" / "27-helm-upgrade-leaves-old-crd.yaml"


def _paths(crd: dict[str, Any]) -> set[str]:
    return schemacheck.schema_fields(crd)[0]


def test_required_fields_are_every_field_of_the_shipped_crd() -> None:
    """The operator relies on every field of the CRD it ships with, read from that CRD (no second
    list to keep in step): spec fields it reads, status fields it writes, list items' fields."""
    required = schemacheck.required_fields()
    assert set(required) == _paths(crdcheck.load_crd())
    assert {"spec.training.compression.mode", "status.infrastructureRestarts",
            "status.conditions[].reason", "spec.images[].torchVersion"} <= set(required)
    assert not any(p.startswith(("apiVersion", "kind", "metadata")) for p in required)


def test_the_shipped_crd_passes() -> None:
    schemacheck.check_installed_crd(crdcheck.load_crd())


def _stale_crd() -> dict[str, Any]:
    """Case 27's old-schema CRD mapped onto ours: the current CRD without the case's two kinds of
    field, a spec setting (``gradientCompression`` -> our ``spec.training.compression``) and a
    status field (``rebalances`` -> our ``status.infrastructureRestarts``, new in issue 10)."""
    case = next(yaml.safe_load_all(CASE_27.read_text()))
    assert "gradientCompression" not in case["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]
    crd = copy.deepcopy(crdcheck.load_crd())
    schema = schemacheck.schema_of(crd)
    del schema["properties"]["spec"]["properties"]["training"]["properties"]["compression"]
    del schema["properties"]["status"]["properties"]["infrastructureRestarts"]
    return crd


def test_case_27_stale_crd_is_refused_naming_both_fields() -> None:
    with pytest.raises(schemacheck.StaleCrdError) as info:
        schemacheck.check_installed_crd(_stale_crd())
    assert info.value.missing == ("spec.training.compression", "spec.training.compression.mode",
                                  "spec.training.compression.powerSGDRank",
                                  "status.infrastructureRestarts")
    message = str(info.value)
    assert message.startswith("the installed CRD heterotrainingjobs.heterotrain.io lacks 4 field(s) "
                              "this operator relies on: spec.training.compression, ")
    assert "kubectl apply --server-side --force-conflicts -f charts/heterotrain/crds/" in message


def test_fields_below_preserve_unknown_fields_are_not_missing() -> None:
    crd = _stale_crd()
    schemacheck.schema_of(crd)["properties"]["spec"]["properties"]["training"][
        "x-kubernetes-preserve-unknown-fields"] = True
    assert schemacheck.missing_fields(crd) == ("status.infrastructureRestarts",)


def test_missing_crd_or_unserved_version_is_refused() -> None:
    with pytest.raises(schemacheck.StaleCrdError, match="is not installed"):
        schemacheck.check_installed_crd(None)
    crd = copy.deepcopy(crdcheck.load_crd())
    crd["spec"]["versions"][0]["name"] = "v1alpha0"
    with pytest.raises(schemacheck.StaleCrdError, match="does not serve v1alpha1"):
        schemacheck.check_installed_crd(crd)


class _FakeApi:
    def __init__(self, crd: dict[str, Any] | None) -> None:
        self.crd, self.closed, self.asked = crd, False, []

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        self.asked.append(name)
        return self.crd

    def close(self) -> None:
        self.closed = True


def test_operator_startup_fails_permanently_on_the_stale_crd(caplog: pytest.LogCaptureFixture) -> None:
    """kopf stops the operator when a startup handler fails permanently: it never reconciles."""
    api = _FakeApi(_stale_crd())
    with pytest.raises(kopf.PermanentError, match="status.infrastructureRestarts"):
        asyncio.run(runner.check_crd(api))  # type: ignore[arg-type]
    assert api.asked == ["heterotrainingjobs.heterotrain.io"] and api.closed
    assert "refusing to start: the installed CRD" in caplog.text
    ok = _FakeApi(crdcheck.load_crd())
    asyncio.run(runner.check_crd(ok))  # type: ignore[arg-type]
    assert not ok.closed


def test_every_single_missing_field_is_caught() -> None:
    """Drop any one field of the shipped CRD: the check names exactly that field (and what lies
    below it)."""
    shipped = crdcheck.load_crd()
    for path in ("spec.runPolicy.nodeLossGraceSeconds", "status.lastNodeLoss.node",
                 "status.plan.groups[].resourceName"):
        crd = copy.deepcopy(shipped)
        node: dict[str, Any] = schemacheck.schema_of(crd)
        *parents, leaf = path.replace("[]", ".[]").split(".")
        for part in parents:
            node = node["items"] if part == "[]" else node["properties"][part]
        del node["properties"][leaf]
        assert schemacheck.missing_fields(crd) == (path,)


def test_without_a_shipped_crd_the_start_up_check_is_skipped_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(schemacheck, "required_fields", lambda: ())
    api = _FakeApi(None)
    asyncio.run(runner.check_crd(api))  # type: ignore[arg-type]
    assert api.asked == [] and "the installed CRD is not checked" in caplog.text
