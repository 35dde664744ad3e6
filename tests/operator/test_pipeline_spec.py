"""``spec.training.pipeline`` (issue 30, item 1): parsed values and errors that name the field
and the fix. (Not yet read by parse_spec nor declared in the CRD: docs/pipeline.md.)"""

from __future__ import annotations

import pytest

from hetero_operator.api.errors import SpecError
from hetero_operator.api.pipelinespec import PipelineSpec, parse_pipeline

P = "spec.training.pipeline"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None),
    ({}, PipelineSpec(stages=None, micro_batches=8, schedule="1F1B")),
    ({"stages": 3, "microBatches": 12, "schedule": "GPipe"},
     PipelineSpec(stages=3, micro_batches=12, schedule="GPipe")),
    ({"stages": "Auto", "microBatches": 1}, PipelineSpec(stages=None, micro_batches=1, schedule="1F1B")),
], ids=["absent", "defaults", "every field", "Auto with one micro-batch"])
def test_pipeline_values(raw: object, expected: PipelineSpec | None) -> None:
    assert parse_pipeline(raw) == expected


@pytest.mark.parametrize(("raw", "path", "message"), [
    ("3", P, "must be a mapping (stages, microBatches, schedule), got str"),
    ({"stage": 3}, f"{P}.stage", "is no pipeline field: did you mean stages?"),
    ({"zzz": 1}, f"{P}.zzz", "is no pipeline field (known: microBatches, schedule, stages)"),
    ({"stages": 1}, f"{P}.stages", "must be Auto or an integer in 2..16, got 1"),
    ({"stages": "auto"}, f"{P}.stages", "must be Auto or an integer in 2..16, got 'auto'"),
    ({"stages": True}, f"{P}.stages", "must be Auto or an integer in 2..16, got True"),
    ({"microBatches": 0}, f"{P}.microBatches", "must be an integer in 1..1024, got 0"),
    ({"stages": 4, "microBatches": 3}, f"{P}.microBatches",
     "3 micro-batches cannot fill 4 stages (every stage would idle most of the step): set "
     "microBatches to at least 4"),
    ({"schedule": "Interleaved1F1B"}, f"{P}.schedule", "must be one of 1F1B, GPipe; got 'Interleaved1F1B'"),
], ids=["not a mapping", "a near miss", "an unknown field", "one stage", "auto in lower case",
        "a boolean", "no micro-batch", "fewer micro-batches than stages", "an unbuilt schedule"])
def test_a_bad_pipeline_names_the_field(raw: object, path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_pipeline(raw)
    assert err.value.path == path
    assert str(err.value) == f"{path}: {message}"
