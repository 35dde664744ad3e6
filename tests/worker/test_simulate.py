"""Simulated device delay and the local contract envs it renders."""

from __future__ import annotations

import pytest

from hetero_worker.comm.sync import rank_weight
from hetero_worker.runtime.simulation import (delay_per_sample_s, local_rank_envs,
                                              simulated_cluster, simulated_delay_s)
from heterotrain_common.contract import DeviceProfile, parse_contract
from heterotrain_common.envread import ContractError


@pytest.mark.parametrize(("speed", "batch", "expected_s"), [(1.0, 32, 0.064), (0.25, 8, 0.064),
                                                            (0.5, 64, 0.256)])
def test_delay_is_batch_over_speed(speed: float, batch: int, expected_s: float) -> None:
    profile = DeviceProfile(product="x", relative_speed=speed, simulated=True)
    assert simulated_delay_s(profile, batch, 0.002) == pytest.approx(expected_s)


def test_real_device_has_no_delay() -> None:
    assert simulated_delay_s(DeviceProfile(product="A100", relative_speed=1.0), 64, 0.002) == 0.0


def test_delay_from_env_default_and_errors() -> None:
    assert delay_per_sample_s({}) == 0.002
    assert delay_per_sample_s({"HTJ_SIM_DELAY_PER_SAMPLE_S": "0.01"}) == 0.01
    with pytest.raises(ContractError, match="HTJ_SIM_DELAY_PER_SAMPLE_S"):
        delay_per_sample_s({"HTJ_SIM_DELAY_PER_SAMPLE_S": "nan"})


def test_local_envs_parse_as_valid_contracts() -> None:
    entries, profiles = simulated_cluster(
        products=[("A100", "8.0", 1.0), ("T4", "7.5", 0.25), ("T4", "7.5", 0.25)],
        nodes=["node-a", "node-b", "node-b"], local_batches=[8, 2, 2])
    contracts = [parse_contract(e) for e in local_rank_envs(entries=entries, profiles=profiles,
                                                              master_port=29500)]
    assert [(c.dist.group, c.dist.group_rank, c.dist.group_size) for c in contracts] == [(0, 0, 1), (1, 0, 2),
                                                                          (1, 1, 2)]
    assert contracts[2].global_batch == 12 and contracts[1].device.relative_speed == 0.25


def test_rank_weights_sum_to_one() -> None:
    weights = [rank_weight([3, 5, 8], r) for r in range(3)]
    assert weights == [3 / 16, 5 / 16, 8 / 16]
    with pytest.raises(ValueError):
        rank_weight([3, 0], 0)
