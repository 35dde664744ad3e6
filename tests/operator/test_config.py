"""Operator settings from HTJ_* variables and flags."""

from __future__ import annotations

import pytest

from hetero_operator.config import DEFAULT_IMAGES, OperatorConfig, parse_images
from hetero_operator.errors import ConfigError


def test_documented_defaults() -> None:
    cfg = OperatorConfig.from_env({})
    assert (cfg.metrics_port, cfg.health_port, cfg.master_port) == (8080, 8081, 29500)
    assert cfg.namespaces == () and cfg.peering == "heterotrain"
    assert (cfg.pending_timeout_s, cfg.unschedulable_retry_s) == (300.0, 30.0)
    assert (cfg.backoff_base_s, cfg.backoff_max_s, cfg.resync_s) == (10.0, 300.0, 10.0)
    assert cfg.default_images == DEFAULT_IMAGES and cfg.simulate_devices is False
    assert cfg.launcher == ("heterotrain", "launch", "--")
    assert 1 <= cfg.peering_priority <= 1_000_000


def test_env_is_read_and_flags_win() -> None:
    env = {"HTJ_NAMESPACES": "team-a, team-b", "HTJ_METRICS_PORT": "9000", "HTJ_PENDING_TIMEOUT_S": "60",
           "HTJ_SIMULATE_DEVICES": "true", "HTJ_PEERING": "", "HTJ_PEERING_PRIORITY": "7",
           "HTJ_DEFAULT_IMAGES": "img:cu124=12.4=8.0/9.0"}
    cfg = OperatorConfig.from_env(env, metrics_port=9100)
    assert cfg.namespaces == ("team-a", "team-b")
    assert cfg.metrics_port == 9100 and cfg.pending_timeout_s == 60.0
    assert cfg.simulate_devices is True and cfg.peering == ""  # empty = standalone
    assert cfg.peering_priority == 7
    assert [(i.image, i.cuda_version, i.compute_capabilities) for i in cfg.default_images] == [
        ("img:cu124", (12, 4), ("8.0", "9.0"))]


@pytest.mark.parametrize("env,message", [
    ({"HTJ_METRICS_PORT": "http"}, "HTJ_METRICS_PORT='http' does not parse"),
    ({"HTJ_HEALTH_PORT": "70000"}, "health_port must be a TCP port"),
    ({"HTJ_RESYNC_S": "0"}, "resync_s must be > 0 seconds"),
    ({"HTJ_BACKOFF_BASE_S": "50", "HTJ_BACKOFF_MAX_S": "10"}, "backoff_max_s (10.0) must be >= backoff_base_s"),
    ({"HTJ_SIMULATE_DEVICES": "maybe"}, "HTJ_SIMULATE_DEVICES='maybe' does not parse"),
    ({"HTJ_DEFAULT_IMAGES": "img-only"}, "HTJ_DEFAULT_IMAGES='img-only' does not parse"),
], ids=["port not a number", "port out of range", "zero resync", "backoff max below base",
        "bad boolean", "image entry incomplete"])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        OperatorConfig.from_env(env)
    assert message in str(err.value)


def test_parse_images_keeps_order() -> None:
    images = parse_images("a=11.8=7.0;b=12.8=9.0/10.0")
    assert [(i.image, i.cuda_version) for i in images] == [("a", (11, 8)), ("b", (12, 8))]
