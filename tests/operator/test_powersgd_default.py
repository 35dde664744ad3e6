"""PowerSGD's default rank is the same at every layer a job passes through (CRD, operator spec,
worker contract, codec config), and it is the rank that meets the loss target (docs/speed.md)."""

from __future__ import annotations

from pathlib import Path

import yaml

from hetero_operator.api import spec as spec_mod
from hetero_worker.speed.codecs import CompressionConfig
from heterotrain_common import contract, envnames

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RANK = 16  # rank 4 ended the speed benchmark 4.5-6.7 % above uncompressed; 16 within 1.4 %


def _crd_rank_schema() -> dict:
    crd = yaml.load((REPO / "crds" / "heterotrainingjobs.heterotrain.io.yaml").read_text(), Loader=yaml.CSafeLoader)
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return props["spec"]["properties"]["training"]["properties"]["compression"]["properties"][
        "powerSGDRank"]


def test_every_layer_defaults_to_the_same_rank() -> None:
    schema = _crd_rank_schema()
    assert schema["default"] == DEFAULT_RANK and "default 16" in schema["description"]
    assert spec_mod.TrainingSpec.__dataclass_fields__["powersgd_rank"].default == DEFAULT_RANK
    assert spec_mod._training({"globalBatchSize": 64, "compression": {"mode": "PowerSGD"}}).powersgd_rank == DEFAULT_RANK
    assert contract.read_var({}, envnames.POWERSGD_RANK) == DEFAULT_RANK
    assert CompressionConfig().powersgd_rank == DEFAULT_RANK
    assert CompressionConfig.from_env({"HTJ_COMPRESSION": "PowerSGD"}).powersgd_rank == DEFAULT_RANK


def test_an_explicit_rank_still_wins() -> None:
    assert spec_mod._training({"globalBatchSize": 64,
                              "compression": {"mode": "PowerSGD", "powerSGDRank": 4}}).powersgd_rank == 4
    assert CompressionConfig.from_env({"HTJ_COMPRESSION": "PowerSGD",
                                       "HTJ_POWERSGD_RANK": "4"}).powersgd_rank == 4
