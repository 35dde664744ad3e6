"""Operator settings from HTJ_* variables and flags."""

from __future__ import annotations

import pytest

from hetero_operator.api.errors import ConfigError
from hetero_operator.api.settings import DEFAULT_IMAGES, OperatorConfig, parse_images


def test_documented_defaults() -> None:
    cfg = OperatorConfig.from_env({})
    assert (cfg.ports.metrics, cfg.ports.health, cfg.ports.master) == (8080, 8081, 29500)
    assert cfg.watch.namespaces == () and cfg.peering.name == "heterotrain"
    assert (cfg.restart.pending_timeout_s, cfg.restart.unschedulable_retry_s) == (300.0, 30.0)
    assert (cfg.restart.backoff_base_s, cfg.restart.backoff_max_s, cfg.intervals.resync_s) == (
        10.0, 300.0, 10.0)
    assert cfg.planning.default_images == DEFAULT_IMAGES and cfg.pods.simulate_devices is False
    assert cfg.pods.launcher == ("heterotrain", "launch", "--")
    assert 1 <= cfg.peering.priority <= 1_000_000


def test_env_is_read_and_flags_win() -> None:
    env = {"HTJ_NAMESPACES": "team-a, team-b", "HTJ_METRICS_PORT": "9000", "HTJ_PENDING_TIMEOUT_S": "60",
           "HTJ_SIMULATE_DEVICES": "true", "HTJ_PEERING": "", "HTJ_PEERING_PRIORITY": "7",
           "HTJ_DEFAULT_IMAGES": "img:cu124=12.4=8.0/9.0"}
    cfg = OperatorConfig.from_env(env, {"ports.metrics": 9100, "ports.health": None})
    assert cfg.watch.namespaces == ("team-a", "team-b")
    assert cfg.ports.metrics == 9100 and cfg.restart.pending_timeout_s == 60.0
    assert cfg.ports.health == 8081  # a None override (a flag not given) is none
    assert cfg.pods.simulate_devices is True and cfg.peering.name == ""  # empty = standalone
    assert cfg.peering.priority == 7
    assert [(i.image, i.cuda_version, i.compute_capabilities) for i in cfg.planning.default_images] == [
        ("img:cu124", (12, 4), ("8.0", "9.0"))]


@pytest.mark.parametrize("env,message", [
    ({"HTJ_METRICS_PORT": "http"}, "HTJ_METRICS_PORT='http' does not parse"),
    ({"HTJ_HEALTH_PORT": "70000"}, "ports.health (HTJ_HEALTH_PORT) must be a TCP port"),
    ({"HTJ_RESYNC_S": "0"}, "intervals.resync_s (HTJ_RESYNC_S) must be > 0 seconds"),
    ({"HTJ_BACKOFF_BASE_S": "50", "HTJ_BACKOFF_MAX_S": "10"},
     "restart.backoff_max_s (10.0) must be >= restart.backoff_base_s"),
    ({"HTJ_SIMULATE_DEVICES": "maybe"}, "HTJ_SIMULATE_DEVICES='maybe' does not parse"),
    ({"HTJ_DEFAULT_IMAGES": "img-only"}, "HTJ_DEFAULT_IMAGES='img-only' does not parse"),
    ({"HTJ_PENDING_TIMEOUT_S": "inf"},
     "HTJ_PENDING_TIMEOUT_S='inf' does not parse: must be a finite number, got 'inf' (restart.pending_timeout_s)"),
    ({"HTJ_API_READ_TIMEOUT_S": "NaN"}, "HTJ_API_READ_TIMEOUT_S='NaN' does not parse: must be a finite number"),
    ({"HTJ_LINK_INTER_NODE_GBPS": "1e999"}, "HTJ_LINK_INTER_NODE_GBPS='1e999' does not parse: must be a finite"),
], ids=["port not a number", "port out of range", "zero resync", "backoff max below base",
        "bad boolean", "image entry incomplete", "infinite timeout (issue 32 F15)", "NaN timeout",
        "overflowing bandwidth"])
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
    ({"HTJ_WATCH_CLIENT_TIMEOUT_S": "300"},
     "watch.client_timeout_s (300.0) must exceed watch.server_timeout_s"),
    ({"HTJ_WATCH_INACTIVITY_TIMEOUT_S": "400", "HTJ_WATCH_CLIENT_TIMEOUT_S": "500"},
     "watch.inactivity_timeout_s (400.0) must not exceed"),
    ({"HTJ_WATCH_CONNECT_TIMEOUT_S": "0"},
     "watch.connect_timeout_s (HTJ_WATCH_CONNECT_TIMEOUT_S) must be > 0 seconds"),
    ({"HTJ_NETWORK_POLICY": "perhaps"}, "HTJ_NETWORK_POLICY='perhaps' does not parse"),
], ids=["client not above server", "inactivity above server", "zero connect", "bad boolean"])
def test_watch_and_hardening_settings_are_checked(env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        OperatorConfig.from_env(env)
    assert message in str(info.value)


def test_worker_hardening_defaults_and_env() -> None:
    cfg = OperatorConfig.from_env({})
    assert (cfg.network.policy, cfg.pods.run_as_non_root, cfg.network.metrics_namespaces) == (
        True, True, ("monitoring",))
    cfg = OperatorConfig.from_env({"HTJ_NETWORK_POLICY": "false", "HTJ_WORKER_RUN_AS_NON_ROOT": "0",
                                   "HTJ_METRICS_NAMESPACES": "prom, heterotrain-system"})
    assert (cfg.network.policy, cfg.pods.run_as_non_root, cfg.network.metrics_namespaces) == (
        False, False, ("prom", "heterotrain-system"))


# --- one declaration per setting (issue 19) -------------------------------------------------------

def _docs_table() -> list[tuple[str, str]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    section = text.split("## Settings", 1)[1]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `HTJ_")]
    return [(cells[1].strip().strip("`"), cells[2].strip().strip("`")) for cells in rows]


def test_every_setting_is_declared_once_and_documented() -> None:
    """Each variable belongs to one field of one group, and docs/operator.md lists exactly these
    variables with their setting paths, in the same order."""
    from hetero_operator.api.settings import env_table

    table = env_table()
    variables = [variable for variable, _, _ in table]
    assert len(variables) == len(set(variables)) == 35
    assert _docs_table() == [(variable, path) for variable, path, _ in table]
    for variable, path, _ in table:  # the path is the field that holds the variable
        group, name = path.split(".")
        assert hasattr(getattr(OperatorConfig(), group), name), variable


def test_settings_are_declared_with_the_contracts_field_declarations() -> None:
    """The operator's settings and the worker's contract share one declaration and one walker
    (heterotrain_common.envfields): the common walker lists the settings table, reads a settings
    group from an environment, and honours an empty HTJ_PEERING as a value while an empty
    HTJ_RESYNC_S stays unset."""
    from hetero_operator.api.settings import Intervals, Peering, Ports, env_table
    from heterotrain_common import envfields

    walked = [(v.name, path) for path, v, _ in envfields.walk(OperatorConfig)]
    assert walked == [(variable, path) for variable, path, _ in env_table()]
    assert envfields.read_fields(Ports, {"HTJ_METRICS_PORT": "9"}) == Ports(metrics=9)
    peering = dict((f.name, v) for f, v in envfields.variables(Peering))["name"]
    resync = dict((f.name, v) for f, v in envfields.variables(Intervals))["resync_s"]
    assert envfields.env_text({"HTJ_PEERING": ""}, peering) == ""
    assert envfields.env_text({"HTJ_RESYNC_S": ""}, resync) is None
    assert OperatorConfig.from_env({"HTJ_RESYNC_S": ""}).intervals.resync_s == 10.0
    assert OperatorConfig.from_env({"HTJ_PEERING": ""}).peering.name == ""


def test_settings_set_in_code_are_checked_like_the_environment() -> None:
    from hetero_operator.api.settings import Intervals, Ports

    with pytest.raises(ConfigError, match=r"intervals.resync_s \(HTJ_RESYNC_S\) must be > 0"):
        Intervals(resync_s=0)
    with pytest.raises(ConfigError, match=r"ports.master \(HTJ_MASTER_PORT\) must be a TCP port"):
        Ports(master=0)
    with pytest.raises(ConfigError, match="network has no setting polcy"):
        OperatorConfig().with_({"network.polcy": False})
    with pytest.raises(ConfigError, match="'resync_s' is no setting path"):
        OperatorConfig.from_env({}, {"resync_s": 1.0})
    changed = OperatorConfig().with_({"network.policy": False, "ports.metrics": 0})
    assert (changed.network.policy, changed.ports.metrics, changed.ports.health) == (False, 0, 8081)
