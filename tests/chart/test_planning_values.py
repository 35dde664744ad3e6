"""Helm values of the planner's decision aid reach the operator as the settings it parses."""

from __future__ import annotations

import pytest
from test_chart import env_of, operator_container

from hetero_operator.api.settings import OperatorConfig

pytestmark = pytest.mark.timeout(120)


def test_prices_and_links_become_operator_settings() -> None:
    env = env_of(operator_container("default", "operator.gpuPricesPerHour.Tesla-T4=0.35",
                                    "operator.gpuPricesPerHour.NVIDIA-A100-SXM4-40GB=2.9",
                                    "operator.planningLinks.interNodeGbps=25"))
    assert (env["HTJ_GPU_PRICES"], env["HTJ_LINK_INTRA_NODE_GBPS"], env["HTJ_LINK_INTER_NODE_GBPS"]) == (
        "NVIDIA-A100-SXM4-40GB=2.9,Tesla-T4=0.35", "100", "25")
    config = OperatorConfig.from_env({k: v for k, v in env.items() if k.startswith("HTJ_")
                                      and k in ("HTJ_GPU_PRICES", "HTJ_LINK_INTRA_NODE_GBPS",
                                                "HTJ_LINK_INTER_NODE_GBPS")})
    assert config.planning.gpu_prices == {"NVIDIA-A100-SXM4-40GB": 2.9, "Tesla-T4": 0.35}
    assert (config.links.intra_node_gbps, config.links.inter_node_gbps) == (100.0, 25.0)


def test_no_prices_no_variable() -> None:
    assert "HTJ_GPU_PRICES" not in env_of(operator_container())
