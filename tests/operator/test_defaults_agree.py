"""One default, one definition: the CRD, the chart's copy of the CRD, the spec, the env contract
and the code all carry :mod:`heterotrain_common.defaults`."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import make_job

from hetero_operator.api import settings, spec
from hetero_operator.lifecycle import decisions
from hetero_worker.speed.codecs import CompressionConfig
from heterotrain_common import contract, defaults, envnames

REPO = Path(__file__).resolve().parents[2]
CRDS = {
    "crds/": REPO / "crds" / "heterotrainingjobs.heterotrain.io.yaml",
    "chart crds/": REPO / "charts" / "heterotrain" / "crds" / "heterotrainingjobs.heterotrain.io.yaml",
}
SPEC_DEFAULTS = [
    # (CRD path under .spec, the default, what the parsed JobSpec holds when the field is left out)
    ("training.checkpoint.intervalSteps", defaults.CHECKPOINT_INTERVAL_STEPS,
     lambda j: j.training.checkpoint_interval_steps),
    ("training.rebalance.intervalSteps", defaults.REBALANCE_INTERVAL_STEPS,
     lambda j: j.training.rebalance_interval_steps),
    ("training.compression.powerSGDRank", defaults.POWERSGD_RANK, lambda j: j.training.powersgd_rank),
    ("runPolicy.backoffLimit", defaults.BACKOFF_LIMIT, lambda j: j.run_policy.backoff_limit),
    ("runPolicy.nodeLossGraceSeconds", defaults.NODE_LOSS_GRACE_S,
     lambda j: j.run_policy.node_loss_grace_seconds),
]


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    # libyaml: the CRD embeds Kubernetes' PodTemplateSpec schema (seconds with the Python loader)
    return yaml.load(path.read_text(), Loader=yaml.CSafeLoader)


def _crd_default(crd: dict[str, Any], path: str) -> Any:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path.split("."):
        schema = schema["properties"][part]
    return schema["default"]


@pytest.mark.parametrize("crd", sorted(CRDS), ids=lambda c: f"the default in {c} is the one in defaults")
@pytest.mark.parametrize(("path", "value", "_"), SPEC_DEFAULTS, ids=[p for p, _, _ in SPEC_DEFAULTS])
def test_the_crd_carries_the_default(crd: str, path: str, value: Any, _: Any) -> None:
    assert _crd_default(_load(CRDS[crd]), path) == value


@pytest.mark.parametrize(("path", "value", "parsed"), SPEC_DEFAULTS, ids=[p for p, _, _ in SPEC_DEFAULTS])
def test_a_job_without_the_field_parses_to_the_default(path: str, value: Any, parsed: Any) -> None:
    assert parsed(make_job()) == value


def test_the_contract_and_the_worker_carry_the_defaults() -> None:
    ckpt, comm, run = (contract.CheckpointSettings(), contract.CommSettings(hierarchy="flat"),
                       contract.RunSettings())
    assert ckpt.interval_steps == defaults.CHECKPOINT_INTERVAL_STEPS
    assert comm.powersgd_rank == defaults.POWERSGD_RANK
    assert comm.rebalance_interval_steps == defaults.REBALANCE_INTERVAL_STEPS
    assert comm.rendezvous_timeout_s == defaults.RENDEZVOUS_TIMEOUT_S
    assert run.sim_delay_per_sample_s == defaults.SIM_DELAY_PER_SAMPLE_S
    for name, value in ((envnames.POWERSGD_RANK, defaults.POWERSGD_RANK),
                        (envnames.REBALANCE_INTERVAL_STEPS, defaults.REBALANCE_INTERVAL_STEPS),
                        (envnames.RENDEZVOUS_TIMEOUT_S, defaults.RENDEZVOUS_TIMEOUT_S),
                        (envnames.SIM_DELAY_PER_SAMPLE_S, defaults.SIM_DELAY_PER_SAMPLE_S)):
        assert contract.read_var({}, name) == value  # unset: the parsed default
    assert CompressionConfig().powersgd_rank == defaults.POWERSGD_RANK


def test_the_operator_settings_and_the_lifecycle_carry_the_same_timing() -> None:
    """The lifecycle decides with the operator's own restart settings (one class), whose
    defaults are :mod:`heterotrain_common.defaults`'."""
    config, timing = settings.OperatorConfig(), decisions.RestartSettings()
    assert config.restart == timing
    assert (timing.pending_timeout_s, timing.backoff_base_s, timing.backoff_max_s) == (
        defaults.PENDING_TIMEOUT_S, defaults.BACKOFF_BASE_S, defaults.BACKOFF_MAX_S)


def test_the_chart_carries_the_same_crd() -> None:
    assert CRDS["crds/"].read_text() == CRDS["chart crds/"].read_text()
