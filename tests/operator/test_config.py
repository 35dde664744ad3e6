"""Operator settings from HTJ_* variables and flags."""

from __future__ import annotations

import pytest

from hetero_operator.api.errors import ConfigError
from hetero_operator.api.settings import DEFAULT_IMAGES, OperatorConfig, parse_images


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


# --- watches, peering and worker hardening (issue 10) --------------------------------------------

def _case25_expected() -> dict:
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parent.parent / "fixtures" / "cases" / "25-kopf-watch-silently-stalls.yaml"
    return next(yaml.safe_load_all(path.read_text()))["expected_settings"]


def test_case_25_startup_bounds_every_watch() -> None:
    """Case 25's unit check: a fresh ``kopf.OperatorSettings`` after our startup has
    ``server_timeout`` set and <= 300 s, ``client_timeout`` above it, a connect timeout, and an
    inactivity timeout <= 120 s, so a silently dropped watch connection is re-opened."""
    import kopf

    from hetero_operator.controller.runner import apply_settings

    settings = kopf.OperatorSettings()
    assert settings.watching.server_timeout is None and settings.watching.client_timeout is None
    apply_settings(settings, OperatorConfig.from_env({}))
    w, expected = settings.watching, _case25_expected()
    assert (w.server_timeout, w.client_timeout, w.connect_timeout) == (
        expected["watching.server_timeout"], expected["watching.client_timeout"],
        expected["watching.connect_timeout"]) == (300, 301, 30)
    assert w.client_timeout > w.server_timeout and w.inactivity_timeout == 70 <= 120


def test_named_peering_is_mandatory_and_standalone_has_none() -> None:
    """A starting replica is paused until it has read the peering object (kopf pre-activates the
    pause for mandatory peering), so it never acts before it knows whether a live peer outranks
    it; standalone operators get no peering at all."""
    import kopf

    from hetero_operator.controller.runner import apply_settings, make_memo, operator_kwargs

    settings = kopf.OperatorSettings()
    config = OperatorConfig.from_env({"HTJ_PEERING_PRIORITY": "42"})
    apply_settings(settings, config)
    assert (settings.peering.name, settings.peering.mandatory, settings.peering.priority,
            settings.peering.clusterwide) == ("heterotrain", True, 42, True)
    kwargs = operator_kwargs(config, make_memo(config, identity="a/1/x"))
    assert (kwargs["standalone"], kwargs["peering_name"], kwargs["priority"]) == (False, "heterotrain", 42)
    alone = OperatorConfig.from_env({"HTJ_PEERING": ""})
    assert operator_kwargs(alone, make_memo(alone, identity="a/1/x"))["standalone"] is True


@pytest.mark.parametrize("env,message", [
    ({"HTJ_WATCH_CLIENT_TIMEOUT_S": "300"}, "watch_client_timeout_s (300.0) must exceed watch_server_timeout_s"),
    ({"HTJ_WATCH_INACTIVITY_TIMEOUT_S": "400", "HTJ_WATCH_CLIENT_TIMEOUT_S": "500"},
     "watch_inactivity_timeout_s (400.0) must not exceed"),
    ({"HTJ_WATCH_CONNECT_TIMEOUT_S": "0"}, "watch_connect_timeout_s must be > 0 seconds"),
    ({"HTJ_NETWORK_POLICY": "perhaps"}, "HTJ_NETWORK_POLICY='perhaps' does not parse"),
], ids=["client not above server", "inactivity above server", "zero connect", "bad boolean"])
def test_watch_and_hardening_settings_are_checked(env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        OperatorConfig.from_env(env)
    assert message in str(info.value)


def test_worker_hardening_defaults_and_env() -> None:
    cfg = OperatorConfig.from_env({})
    assert (cfg.network_policy, cfg.worker_run_as_non_root, cfg.metrics_namespaces) == (
        True, True, ("monitoring",))
    cfg = OperatorConfig.from_env({"HTJ_NETWORK_POLICY": "false", "HTJ_WORKER_RUN_AS_NON_ROOT": "0",
                                   "HTJ_METRICS_NAMESPACES": "prom, heterotrain-system"})
    assert (cfg.network_policy, cfg.worker_run_as_non_root, cfg.metrics_namespaces) == (
        False, False, ("prom", "heterotrain-system"))
