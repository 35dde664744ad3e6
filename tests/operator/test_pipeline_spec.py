"""``spec.training.pipeline`` (issue 30, item 1): parsed values and errors that name the field
and the fix, read by ``parse_job`` and declared in the CRD (planned in tests/operator/test_pipeline_plan.py; docs/pipeline.md)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s import crdcheck  # noqa: E402

from hetero_operator.api import spec as spec_mod  # noqa: E402
from hetero_operator.api.errors import SpecError  # noqa: E402
from hetero_operator.api.pipelinespec import PipelineSpec, parse_pipeline  # noqa: E402

P = "spec.training.pipeline"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None),
    ({}, PipelineSpec(stages=None, micro_batches=8, schedule="1F1B")),
    ({"stages": 3, "microBatches": 12, "schedule": "GPipe"},
     PipelineSpec(stages=3, micro_batches=12, schedule="GPipe")),
    ({"stages": "Auto", "microBatches": 1}, PipelineSpec(stages=None, micro_batches=1, schedule="1F1B")),
    ({"blocks": 12, "boundaryBytesPerSample": 4096},
     PipelineSpec(stages=None, micro_batches=8, schedule="1F1B", blocks=12,
                  boundary_bytes_per_sample=4096)),
], ids=["blocks and boundary", "absent", "defaults", "every field", "Auto with one micro-batch"])
def test_pipeline_values(raw: object, expected: PipelineSpec | None) -> None:
    assert parse_pipeline(raw) == expected


@pytest.mark.parametrize(("raw", "path", "message"), [
    ("3", P, "must be a mapping (stages, microBatches, schedule), got str"),
    ({"stage": 3}, f"{P}.stage", "is no pipeline field: did you mean stages?"),
    ({"zzz": 1}, f"{P}.zzz", "is no pipeline field (known: blockCosts, blocks, boundaryBytesPerSample, microBatches, schedule, stages)"),
    ({"stages": 1}, f"{P}.stages", "must be Auto or an integer in 2..16, got 1"),
    ({"stages": "auto"}, f"{P}.stages", "must be Auto or an integer in 2..16, got 'auto'"),
    ({"stages": True}, f"{P}.stages", "must be Auto or an integer in 2..16, got True"),
    ({"microBatches": 0}, f"{P}.microBatches", "must be an integer in 1..1024, got 0"),
    ({"stages": 4, "microBatches": 3}, f"{P}.microBatches",
     "3 micro-batches cannot fill 4 stages (every stage would idle most of the step): set "
     "microBatches to at least 4"),
    ({"schedule": "Interleaved1F1B"}, f"{P}.schedule", "must be one of 1F1B, GPipe; got 'Interleaved1F1B'"),
    ({"blocks": -1}, f"{P}.blocks", "must be the model's number of blocks, an integer in 1..4096, got -1"),
    ({"stages": 3, "blocks": 2}, f"{P}.blocks", "2 blocks cannot fill 3 stages: every stage holds "
                                                "at least one block"),
    ({"boundaryBytesPerSample": "4k"}, f"{P}.boundaryBytesPerSample",
     "must be an integer of bytes >= 0, got '4k'"),
], ids=["too few blocks", "blocks below stages", "boundary not an integer", "not a mapping", "a near miss", "an unknown field", "one stage", "auto in lower case",
        "a boolean", "no micro-batch", "fewer micro-batches than stages", "an unbuilt schedule"])
def test_a_bad_pipeline_names_the_field(raw: object, path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_pipeline(raw)
    assert err.value.path == path
    assert str(err.value) == f"{path}: {message}"


REPO = Path(__file__).resolve().parents[2]


def _digits_with(pipeline: object) -> dict:
    job = next(d for d in yaml.safe_load_all((REPO / "examples" / "digits.yaml").read_text())
               if isinstance(d, dict) and d.get("kind") == "HeteroTrainingJob")
    job["spec"]["training"]["pipeline"] = pipeline
    return job


def test_parse_job_reads_the_pipeline_and_the_crd_admits_it() -> None:
    job = _digits_with({"stages": 3, "microBatches": 6, "schedule": "GPipe"})
    crdcheck.validate(copy.deepcopy(job), crd=crdcheck.load_crd())
    assert spec_mod.parse_job(job).training.pipeline == PipelineSpec(stages=3, micro_batches=6,
                                                                     schedule="GPipe")
    auto = _digits_with({"stages": "Auto"})
    crdcheck.validate(copy.deepcopy(auto), crd=crdcheck.load_crd())
    assert spec_mod.parse_job(auto).training.pipeline == PipelineSpec(stages=None, micro_batches=8,
                                                                      schedule="1F1B")
    plain = _digits_with(None)
    del plain["spec"]["training"]["pipeline"]
    assert spec_mod.parse_job(plain).training.pipeline is None


def test_parse_job_names_a_bad_pipeline_field() -> None:
    with pytest.raises(SpecError) as err:
        spec_mod.parse_job(_digits_with({"stages": 4, "microBatches": 2}))
    assert err.value.path == f"{P}.microBatches"
    with pytest.raises(crdcheck.Invalid, match="microBatches"):
        crdcheck.validate(_digits_with({"microBatches": 0}), crd=crdcheck.load_crd())
    with pytest.raises(crdcheck.Invalid, match="schedule"):
        crdcheck.validate(_digits_with({"schedule": "ZeroBubble"}), crd=crdcheck.load_crd())


@pytest.mark.parametrize(("raw", "field", "needle"), [
    ({"blockCosts": []}, "spec.training.pipeline.blockCosts", "must be a list of 1..4096 entries"),
    ({"blockCosts": [{"parameters": 3, "flops": 2}]}, "spec.training.pipeline.blockCosts[0].flops",
     "is no block cost field"),
    ({"blockCosts": [{"compute": 1}]}, "spec.training.pipeline.blockCosts[0].parameters",
     "must be the block's parameter count, an integer >= 0, got None"),
    ({"blockCosts": [{"parameters": 3, "compute": 0}]},
     "spec.training.pipeline.blockCosts[0].compute", "must be a positive integer or decimal"),
    ({"blockCosts": [{"parameters": 3, "compute": 1.5}]},
     "spec.training.pipeline.blockCosts[0].compute", "got 1.5"),
    ({"blocks": 3, "blockCosts": [{"parameters": 3}, {"parameters": 4}]},
     "spec.training.pipeline.blockCosts", "has 2 entries and blocks is 3"),
])
def test_bad_block_costs_are_refused_naming_the_entry(raw: dict, field: str, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_pipeline(raw)
    assert err.value.path == field and needle in str(err.value)


def test_block_costs_give_the_block_count_and_their_figures() -> None:
    spec = parse_pipeline({"blockCosts": [
        {"parameters": 40960, "activationBytesPerSample": "1Ki", "compute": "0.5"},
        {"parameters": 198272, "outputBytesPerSample": 32768}]})
    assert spec is not None and spec.blocks == 2
    assert [(c.parameters, c.activation_bytes_per_sample, c.output_bytes_per_sample, c.compute)
            for c in spec.block_costs] == [(40960, 1024, None, 0.5), (198272, 0, 32768, 1.0)]


def test_the_crd_admits_measured_block_costs_and_refuses_a_float() -> None:
    costs = [{"parameters": 40960, "activationBytesPerSample": 512, "outputBytesPerSample": 32768,
              "compute": "0.076"},
             {"parameters": 198272, "activationBytesPerSample": "386Ki", "compute": 2}]
    job = _digits_with({"blockCosts": costs})
    crdcheck.validate(copy.deepcopy(job), crd=crdcheck.load_crd())
    parsed = spec_mod.parse_job(job).training.pipeline
    assert parsed is not None and parsed.blocks == 2
    assert [c.compute for c in parsed.block_costs] == [0.076, 2.0]
    with pytest.raises(crdcheck.Invalid, match="compute"):
        crdcheck.validate(_digits_with({"blockCosts": [{"parameters": 1, "compute": "fast"}]}),
                          crd=crdcheck.load_crd())
