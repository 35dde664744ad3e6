"""The CRD: structural schema equal to api/spec.py, examples valid, bad manifests refused clearly."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s import crdcheck  # noqa: E402

from hetero_operator.api import spec as spec_mod  # noqa: E402
from hetero_operator.lifecycle.elastic import ELASTIC_KEYS, LOST_POD_KEYS
from hetero_operator.lifecycle.status import (GROUP_KEYS, MEMORY_KEYS,  # noqa: E402
                                              MEMORY_TYPE_KEYS, PLAN_KEYS, PROGRESS_KEYS,
                                              STATUS_KEYS)

REPO = Path(__file__).resolve().parents[2]
CRD = crdcheck.load_crd()
SCHEMA = crdcheck.openapi_schema(CRD)
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml")
                  if any(d.get("kind") == "HeteroTrainingJob"
                         for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)))


def _jobs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)
            and d.get("kind") == "HeteroTrainingJob"]


def _digits() -> dict[str, Any]:
    return _jobs(REPO / "examples" / "digits.yaml")[0]


def test_names_group_version_and_short_name() -> None:
    assert CRD["spec"]["group"] == spec_mod.API_GROUP
    assert CRD["spec"]["names"]["kind"] == spec_mod.KIND
    assert CRD["spec"]["names"]["plural"] == spec_mod.PLURAL
    assert CRD["spec"]["names"]["shortNames"] == ["htj"]
    assert CRD["metadata"]["name"] == f"{spec_mod.PLURAL}.{spec_mod.API_GROUP}"
    version = CRD["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns_show_state_ranks_gpu_types_throughput_age() -> None:
    cols = {c["name"]: c for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["State"]["jsonPath"] == ".status.phase"
    assert cols["Ranks"]["jsonPath"] == ".status.ranksSummary"
    assert cols["GPU Types"]["jsonPath"] == ".status.gpuTypes"
    assert cols["Samples/s"]["jsonPath"] == ".status.progress.samplesPerSecond"
    assert cols["Age"]["jsonPath"] == ".metadata.creationTimestamp"


def _walk(schema: dict[str, Any], path: str = ""):
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}" if path else name, name, sub
        yield from _walk(sub, f"{path}.{name}" if path else name)
    if "items" in schema:
        yield from _walk(schema["items"], path + "[]")


TEMPLATE = "spec.worker.template.spec"
"""Kubernetes' own PodSpec schema (scripts/gen-crd-podtemplate.py): its descriptions are
Kubernetes' documentation and its bounds are checked on the pods the API server admits, so the
two rules below apply to our own fields only."""


def test_every_field_has_a_description_starting_with_its_name() -> None:
    missing = []
    for path, name, sub in _walk(SCHEMA):
        if path == "metadata" or path.startswith(TEMPLATE):
            continue
        desc = sub.get("description", "")
        if not desc.split(" ")[0].lower().startswith(name.lower().split("[")[0]):
            missing.append(path)
    assert missing == []


def test_numbers_are_bounded_and_lists_capped_in_spec() -> None:
    unbounded = []
    for path, _, sub in _walk(SCHEMA["properties"]["spec"], "spec"):
        if path.startswith(TEMPLATE):
            continue
        if sub.get("type") == "integer" and ("minimum" not in sub or "maximum" not in sub):
            unbounded.append(path)
        if sub.get("type") == "array" and "maxItems" not in sub:
            unbounded.append(path)
        assert sub.get("type") != "number", f"{path}: no floats in spec"
    assert unbounded == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_job_validates_against_the_crd(path: Path) -> None:
    for job in _jobs(path):
        defaulted = crdcheck.validate(job, crd=CRD)
        assert spec_mod.parse_job(defaulted) == spec_mod.parse_job(job)


def test_defaults_equal_spec_py_defaults() -> None:
    """A minimal job defaulted by the schema parses to the same JobSpec as without defaults."""
    minimal = {"apiVersion": spec_mod.API_VERSION, "kind": spec_mod.KIND, "metadata": {"name": "m"},
               "spec": {"worker": {"command": ["python"]}, "gpus": {"ranks": 2},
                        "training": {"globalBatchSize": 8, "checkpoint": {"path": "/c"},
                                     "rebalance": {}, "compression": {}},
                        "runPolicy": {"schedulingPolicy": {}}}}
    defaulted = crdcheck.validate(minimal, crd=CRD)
    s = defaulted["spec"]
    assert s["worker"]["metricsPort"] == 9480
    assert s["gpus"]["allowMig"] is True and s["gpus"]["minMemoryMiB"] == 0
    assert (s["training"]["batchSplit"], s["training"]["precision"], s["training"]["hierarchy"]) == (
        "Proportional", "Auto", "Auto")
    assert s["training"]["memoryReserveMiB"] == 1024
    assert s["training"]["checkpoint"]["intervalSteps"] == 50
    assert s["training"]["rebalance"]["intervalSteps"] == 0
    assert s["training"]["compression"] == {"mode": "None", "powerSGDRank": 16}
    assert s["runPolicy"]["backoffLimit"] == 3 and s["runPolicy"]["cleanPodPolicy"] == "Running"
    assert s["runPolicy"]["suspend"] is False
    assert spec_mod.parse_job(defaulted) == spec_mod.parse_job(minimal)


def test_enums_equal_spec_py_choices() -> None:
    t = SCHEMA["properties"]["spec"]["properties"]["training"]["properties"]
    r = SCHEMA["properties"]["spec"]["properties"]["runPolicy"]["properties"]
    assert tuple(t["batchSplit"]["enum"]) == spec_mod.BATCH_SPLITS
    assert tuple(t["precision"]["enum"]) == spec_mod.PRECISIONS
    assert tuple(t["hierarchy"]["enum"]) == spec_mod.HIERARCHIES
    assert tuple(t["compression"]["properties"]["mode"]["enum"]) == spec_mod.COMPRESSIONS
    assert tuple(r["cleanPodPolicy"]["enum"]) == spec_mod.CLEAN_POD_POLICIES


def test_every_cel_rule_has_a_python_twin() -> None:
    rules = crdcheck.cel_rules(SCHEMA)
    assert "!has(self.minRanks) || self.minRanks <= self.ranks" in rules
    assert rules.count("self == oldSelf") == 4
    assert set(rules) <= set(crdcheck.CEL_RULES)


BAD = [
    ("minRanks above ranks", lambda j: j["spec"]["gpus"].update(ranks=2, minRanks=3),
     "spec.gpus: Invalid value: spec.gpus.minRanks must not exceed spec.gpus.ranks"),
    ("zero ranks", lambda j: j["spec"]["gpus"].update(ranks=0), "spec.gpus.ranks: 0 is less than the minimum of 1"),
    ("unknown precision", lambda j: j["spec"]["training"].update(precision="FP8"),
     "spec.training.precision: 'FP8' is not one of ['Auto', 'BF16', 'FP16', 'FP32']"),
    ("unquoted CUDA version", lambda j: j["spec"]["images"][0].update(cudaVersion=11.8),
     "spec.images.0.cudaVersion: 11.8 is not of type 'string'"),
    ("missing command", lambda j: j["spec"]["worker"].pop("command"),
     "spec.worker: 'command' is a required property"),
    ("PVC without path", lambda j: j["spec"]["training"]["checkpoint"].update(path="", persistentVolumeClaim="ckpt"),
     "spec.training.checkpoint: Invalid value: spec.training.checkpoint.path is required"),
    ("name too long", lambda j: j["metadata"].update(name="x" * 51),
     "<root>: Invalid value: metadata.name must be at most 50 characters"),
    ("name with a dot (case 44)", lambda j: j["metadata"].update(name="llama-3.1-8b"),
     "<root>: Invalid value: metadata.name must be a DNS-1035 label"),
    ("name with a leading digit (case 44)", lambda j: j["metadata"].update(name="7b-sft"),
     "<root>: Invalid value: metadata.name must be a DNS-1035 label"),
    ("hostNetwork in the template", lambda j: j["spec"]["worker"].update(template={"spec": {"hostNetwork": True}}),
     "spec.worker.template.spec: Invalid value: hostNetwork: refused: ranks talk over the pod network"),
    ("a second container", lambda j: j["spec"]["worker"].update(
        template={"spec": {"containers": [{"name": "worker"}, {"name": "side"}]}}),
     "spec.worker.template.spec: Invalid value: containers: refused: only a container named worker may be given"),
    ("a GPU in the template", lambda j: j["spec"]["worker"].update(
        template={"spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}),
     "spec.worker.template.spec.containers[0]: Invalid value: resources: refused: the operator requests the GPUs"),
]


@pytest.mark.parametrize("mutate,message", [(m, msg) for _, m, msg in BAD], ids=[b[0] for b in BAD])
def test_invalid_manifest_is_refused_with_the_field_path(mutate: Any, message: str) -> None:
    job = _digits()
    mutate(job)
    with pytest.raises(crdcheck.Invalid) as err:
        crdcheck.validate(job, crd=CRD)
    assert message in str(err.value)
    assert str(err.value).startswith(f'HeteroTrainingJob.heterotrain.io "{job["metadata"]["name"]}" is invalid: ')


def test_immutable_spec_sections_refuse_changes_but_run_policy_may_change() -> None:
    old = _digits()
    changed = copy.deepcopy(old)
    changed["spec"]["gpus"]["ranks"] = 8
    with pytest.raises(crdcheck.Invalid, match="spec.gpus is immutable"):
        crdcheck.validate(changed, old=old, crd=CRD)
    suspended = copy.deepcopy(old)
    suspended["spec"]["runPolicy"]["suspend"] = True
    assert crdcheck.validate(suspended, old=old, crd=CRD)["spec"]["runPolicy"]["suspend"] is True


def test_status_declares_every_field_the_operator_writes() -> None:
    """shared/cases/24: undeclared status fields are pruned by a structural schema."""
    status = SCHEMA["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    assert set(status["properties"]) == STATUS_KEYS
    assert set(status["properties"]["plan"]["properties"]) == PLAN_KEYS
    assert set(status["properties"]["plan"]["properties"]["groups"]["items"]["properties"]) == GROUP_KEYS
    assert set(status["properties"]["progress"]["properties"]) == PROGRESS_KEYS
    elastic = status["properties"]["elastic"]["properties"]
    assert set(elastic) == ELASTIC_KEYS
    assert set(elastic["lostPods"]["items"]["properties"]) == LOST_POD_KEYS
    memory = status["properties"]["plan"]["properties"]["memory"]
    assert set(memory["properties"]) == MEMORY_KEYS
    assert set(memory["properties"]["gpuTypes"]["items"]["properties"]) == MEMORY_TYPE_KEYS


def test_pruning_drops_an_undeclared_status_field() -> None:
    """The check of case 24 can fail: a field missing from the schema disappears."""
    status = SCHEMA["properties"]["status"]
    pruned = crdcheck.prune(status, {"phase": "Running", "plannedRanks": 1, "plan": {"worldSize": 2, "x": 1}})
    assert pruned == {"phase": "Running", "plan": {"worldSize": 2}}
