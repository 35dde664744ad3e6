"""Issue 32, F2: the pod template is held to Pod Security Standards "restricted"
(:mod:`hetero_operator.api.podsecurity`).  Each refusal, with its field path and fix, is in
``test_podtemplate.REFUSED`` (RESTRICTED_REFUSED) against the parser and the CRD's CEL rules;
here: what "restricted" allows is accepted and merged, the rule lists agree with Kubernetes'
schema, and the operator's own settings keep the pods restricted.  The real API server refusing
the same manifests: tests/cluster/test_podtemplate_real.py."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from k8s import crdcheck  # noqa: E402
from test_podtemplate import _body, _mixed_nodes, _render, _strict  # noqa: E402

from hetero_operator.api import podsecurity  # noqa: E402
from hetero_operator.api.spec import parse_job  # noqa: E402

TEMPLATE_SPEC = ("spec", "versions", 0, "schema", "openAPIV3Schema", "properties", "spec", "properties",
                 "worker", "properties", "template", "properties", "spec")

ALLOWED: dict[str, Any] = {
    "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/fetch": "runtime/default"}},
    "spec": {
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                            "supplementalGroups": [10001, 20000],
                            "appArmorProfile": {"type": "RuntimeDefault"},
                            "seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"}},
        "volumes": [
            {"name": "cm", "configMap": {"name": "settings"}},
            {"name": "csi", "csi": {"driver": "s3.csi.aws.com", "readOnly": True}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
            {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
            {"name": "proj", "projected": {"sources": [{"secret": {"name": "s3"}}]}},
            {"name": "creds", "secret": {"secretName": "s3"}},
        ],
        "initContainers": [{"name": "fetch", "image": "busybox:1.36",
                            "securityContext": {"seccompProfile": {"type": "Localhost",
                                                                   "localhostProfile": "profiles/fetch.json"}}}],
        "containers": [{
            "name": "worker",
            "ports": [{"containerPort": 8080, "name": "http"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
            "readinessProbe": {"tcpSocket": {"port": 8080, "host": ""}},
            "securityContext": {"runAsUser": 10001, "runAsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"},
                                "appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-worker"},
                                "seLinuxOptions": {"type": "container_init_t"}},
        }],
    },
}
"""What "restricted" allows, all at once."""


def _schema_at(crd: dict[str, Any], *path: Any) -> dict[str, Any]:
    node: Any = crd
    for key in (*TEMPLATE_SPEC, *path):
        node = node[key]
    return node


def test_the_volume_allowlist_and_the_cel_denylist_cover_every_volume_type_of_the_crd() -> None:
    props = set(_schema_at(crdcheck.load_crd(), "properties", "volumes", "items", "properties"))
    assert props - {"name"} == set(podsecurity.ALLOWED_VOLUME_TYPES) | set(podsecurity.FORBIDDEN_VOLUME_TYPES)
    assert not set(podsecurity.ALLOWED_VOLUME_TYPES) & set(podsecurity.FORBIDDEN_VOLUME_TYPES)


def test_what_restricted_allows_is_accepted_and_merged_into_pods_that_stay_restricted() -> None:
    crdcheck.validate(_body(template=ALLOWED))
    job = parse_job(_body(template=ALLOWED))
    _, pods = _render(job, _mixed_nodes())
    for pod in pods:
        _strict(pod)
        spec, worker = pod["spec"], pod["spec"]["containers"][0]
        # ours win where restricted needs them, theirs kept beside
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["supplementalGroups"] == [10001, 20000]
        assert worker["securityContext"]["allowPrivilegeEscalation"] is False
        assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert worker["securityContext"]["appArmorProfile"] == {"type": "Localhost", "localhostProfile": "k8s-worker"}
        assert [v["name"] for v in spec["volumes"]] == ["dshm", *(v["name"] for v in ALLOWED["spec"]["volumes"])]
        assert spec["initContainers"][0]["securityContext"]["seccompProfile"]["type"] == "Localhost"


def _minimal(schema: dict[str, Any]) -> Any:
    """The smallest value the schema admits: required properties filled in, recursively."""
    kind = schema.get("type")
    if kind == "object":
        return {k: _minimal(schema["properties"][k]) for k in schema.get("required", ())}
    return {"string": "x", "integer": 1, "boolean": False, "array": []}.get(kind, "x")


@pytest.mark.parametrize("volume_type", podsecurity.FORBIDDEN_VOLUME_TYPES)
def test_every_other_volume_type_is_refused_by_the_parser_and_the_crd(volume_type: str) -> None:
    source = _minimal(_schema_at(crdcheck.load_crd(), "properties", "volumes", "items", "properties", volume_type))
    template = {"spec": {"volumes": [{"name": "ok", "emptyDir": {}}, {"name": "bad", volume_type: source}]}}
    path = f"spec.worker.template.spec.volumes[1].{volume_type}"
    with pytest.raises(Exception, match=rf"^{path.replace('.', chr(92) + '.').replace('[', chr(92) + '[')}: refused"):
        parse_job(_body(template=template))
    with pytest.raises(crdcheck.Invalid, match="allows only the volume types configMap"):
        crdcheck.validate(_body(template=template))


def test_a_safe_sysctl_of_the_profile_is_refused_too_stricter_than_restricted() -> None:
    template = copy.deepcopy(ALLOWED)
    template["spec"]["securityContext"]["sysctls"] = [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]
    with pytest.raises(Exception, match=r"securityContext\.sysctls: refused: sysctls change the node"):
        parse_job(_body(template=template))
