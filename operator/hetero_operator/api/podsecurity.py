"""The worker pods meet Pod Security Standards "restricted": what the pod template may not set for
that (pure).

The operator sets what "restricted" requires (no privilege escalation, every capability dropped,
``seccompProfile: RuntimeDefault``, ``runAsNonRoot``: :mod:`hetero_operator.render.pods`) and
refuses in ``spec.worker.template`` every value the profile forbids, in the CRD (CEL, at
admission) and in :func:`hetero_operator.api.podtemplate.check_template` (Python, where no API
server looked).  The profile's checks are Kubernetes' own
(``k8s.io/pod-security-admission/policy``, version ``latest`` of Kubernetes 1.35); where this
policy is stricter it says so: no sysctls at all (the profile allows a "safe" set) and no group 0
(``runAsGroup``, ``fsGroup``, ``supplementalGroups``: the profile allows them).  The namespace's
own Pod Security admission (``pod-security.kubernetes.io/enforce: restricted``) is the second line
(docs/install.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hetero_operator.api.templaterules import (CONTAINER, INIT, POD, Path, Rule, _cel_list,
                                               _forbid, _items)

PROFILE = 'Pod Security Standards "restricted"'
ALLOWED_VOLUME_TYPES: tuple[str, ...] = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                         "image", "persistentVolumeClaim", "projected", "secret")
"""The volume types "restricted" allows (``check_restrictedVolumes.go``); every other key of a
volume but ``name`` is refused."""
FORBIDDEN_VOLUME_TYPES: tuple[str, ...] = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "fc", "flexVolume",
    "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath", "iscsi", "nfs",
    "photonPersistentDisk", "portworxVolume", "quobyte", "rbd", "scaleIO", "storageos",
    "vsphereVolume")
"""Every other volume type of Kubernetes 1.35's ``Volume`` (the CEL rule lists them: a CEL rule
cannot iterate an object's fields); tests/operator/test_podsecurity.py holds the two lists to the
CRD's schema."""
PROFILE_TYPES: tuple[str, ...] = ("RuntimeDefault", "Localhost")
"""The seccomp and AppArmor profile types "restricted" allows."""
SELINUX_TYPES: tuple[str, ...] = ("", "container_t", "container_init_t", "container_kvm_t",
                                  "container_engine_t")
"""The SELinux types "restricted" allows (``check_seLinuxOptions.go``, 1.31+)."""
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
"""The deprecated AppArmor annotation prefix; allowed values ``runtime/default`` and
``localhost/<profile>``."""
POD_SECURITY: Path = ("spec", "securityContext")
PROBES: tuple[tuple[str, ...], ...] = (
    *((probe,) for probe in ("livenessProbe", "readinessProbe", "startupProbe")),
    ("lifecycle", "postStart"), ("lifecycle", "preStop"))
"""Handlers whose ``httpGet.host``/``tcpSocket.host`` "restricted" refuses (1.34+)."""


def _volume_type(volume: Mapping[str, Any]) -> str | None:
    for key in volume:
        if key != "name" and key not in ALLOWED_VOLUME_TYPES:
            return f".{key}"
    return None


def _not_zero(field: str, why: str) -> Rule:
    """``field`` may not be 0 (root)."""
    return Rule(at=(), field=field, cel=f"self.{field} != 0", message=why,
                check=lambda obj: "" if field in obj and obj[field] == 0 else None)


def _profile(field: str) -> Rule:
    """``field.type`` (seccompProfile, appArmorProfile) only RuntimeDefault or Localhost."""
    def check(obj: Mapping[str, Any]) -> str | None:
        if field not in obj:
            return None
        value = obj[field]
        return None if isinstance(value, Mapping) and value.get("type") in PROFILE_TYPES else ".type"
    return Rule(at=(), field=field, cel=f"self.{field}.type in {_cel_list(PROFILE_TYPES)}",
                message=(f"{PROFILE} allows only the types {' and '.join(PROFILE_TYPES)} (Unconfined "
                         "turns the filter off); use RuntimeDefault, Localhost with a "
                         "localhostProfile, or leave it unset"),
                check=check)


def _selinux(obj: Mapping[str, Any]) -> str | None:
    opts = obj.get("seLinuxOptions")
    if not isinstance(opts, Mapping):
        return None if opts is None else ""
    if opts.get("type", "") not in SELINUX_TYPES:
        return ".type"
    for key in ("user", "role"):
        if opts.get(key, ""):
            return f".{key}"
    return None


SELINUX = Rule(
    at=(), field="seLinuxOptions",
    cel=(f"(!has(self.seLinuxOptions.type) || self.seLinuxOptions.type in {_cel_list(SELINUX_TYPES)}) "
         "&& (!has(self.seLinuxOptions.user) || self.seLinuxOptions.user == '') "
         "&& (!has(self.seLinuxOptions.role) || self.seLinuxOptions.role == '')"),
    message=(f"{PROFILE} allows no SELinux user or role and only the types "
             f"{', '.join(t for t in SELINUX_TYPES if t)}; remove user and role, set one of these "
             "types or leave seLinuxOptions to the runtime (level may be set)"),
    check=_selinux)
HOST_PROCESS = Rule(
    at=(), field="windowsOptions",
    cel="!(has(self.windowsOptions.hostProcess) && self.windowsOptions.hostProcess)",
    message=f"{PROFILE} refuses Windows HostProcess containers (they run on the host); remove hostProcess",
    check=lambda obj: ".hostProcess" if (obj.get("windowsOptions") or {}).get("hostProcess") else None)
_ROOT_USER = (f"{PROFILE} refuses user 0 (root); use the image's non-root user (the worker images "
              "run as 10001) or another non-zero UID")
_ROOT_GROUP = ("group 0 (root) opens root-group files to the ranks (this operator refuses it, "
               "stricter than the profile); use a non-zero GID (the worker images use 10001)")


def _placed(rule: Rule, at: Path) -> Rule:
    """``rule`` (built at ``()``) placed at ``at``."""
    return Rule(at=at, field=rule.field, cel=rule.cel, message=rule.message, check=rule.check)


def _host(obj: Mapping[str, Any]) -> str | None:
    return "" if obj.get("host") else None


def _probe_rules(container: Path) -> tuple[Rule, ...]:
    return tuple(
        Rule(at=(*container, *probe, handler), field="host", cel="self.host == ''",
             message=(f"{PROFILE} refuses a probe or lifecycle handler aimed at another host "
                      "(1.34+); leave host unset: the kubelet then uses the pod's IP"),
             check=_host)
        for probe in PROBES for handler in ("httpGet", "tcpSocket"))


def _container_rules(at: Path) -> tuple[Rule, ...]:
    ctx = (*at, "securityContext")
    return (
        *(_placed(r, ctx) for r in (_profile("seccompProfile"), _profile("appArmorProfile"), SELINUX,
                                    HOST_PROCESS, _not_zero("runAsUser", _ROOT_USER),
                                    _not_zero("runAsGroup", _ROOT_GROUP))),
        Rule(at=at, field="ports", cel="self.ports.all(p, !has(p.hostPort) || p.hostPort == 0)",
             message=(f"{PROFILE} refuses hostPort (it binds the node's port); the ranks reach "
                      "each other through the pod network, so remove hostPort"),
             check=_items("ports", lambda p: ".hostPort" if p.get("hostPort") else None)),
        *_probe_rules(at),
    )


def _supplemental(obj: Mapping[str, Any]) -> str | None:
    for i, gid in enumerate(obj.get("supplementalGroups") or ()):
        if gid == 0:
            return f"[{i}]"
    return None


def _apparmor_annotation(key: str, value: Any) -> bool:
    return key.startswith(APPARMOR_ANNOTATION) and not (
        value == "runtime/default" or str(value).startswith("localhost/"))


def _annotations(obj: Mapping[str, Any]) -> str | None:
    for key, value in (obj.get("annotations") or {}).items():
        if _apparmor_annotation(str(key), value):
            return f"[{key}]"
    return None


RULES: tuple[Rule, ...] = (
    Rule(at=POD, field="volumes",
         cel="self.volumes.all(v, " + " && ".join(f"!has(v.{t})" for t in FORBIDDEN_VOLUME_TYPES) + ")",
         message=(f"{PROFILE} allows only the volume types {', '.join(ALLOWED_VOLUME_TYPES)} "
                  "(hostPath and network filesystems mounted by the node are refused); put the "
                  "data behind a PersistentVolumeClaim (an NFS or CephFS PersistentVolume works "
                  "that way) or a CSI driver"),
         check=_items("volumes", _volume_type)),
    *(_placed(r, POD_SECURITY) for r in (
        _profile("appArmorProfile"), SELINUX, HOST_PROCESS, _not_zero("runAsUser", _ROOT_USER),
        _not_zero("runAsGroup", _ROOT_GROUP), _not_zero("fsGroup", _ROOT_GROUP))),
    Rule(at=POD_SECURITY, field="supplementalGroups", cel="self.supplementalGroups.all(g, g != 0)",
         message=_ROOT_GROUP, check=_supplemental),
    _forbid(POD_SECURITY, "sysctls",
            "sysctls change the node's kernel settings for the pod (this operator refuses every "
            f"one, stricter than {PROFILE}); set what NCCL needs through its NCCL_* variables in "
            "spec.worker.env, or ask the cluster admin for a node setting"),
    *_container_rules(CONTAINER),
    *_container_rules(INIT),
    Rule(at=("metadata",), field="annotations",
         cel=(f"self.annotations.all(k, !k.startsWith('{APPARMOR_ANNOTATION}') || "
              "self.annotations[k] == 'runtime/default' || self.annotations[k].startsWith('localhost/'))"),
         message=(f"{PROFILE} allows only runtime/default and localhost/<profile> AppArmor "
                  "profiles; use one of them, or securityContext.appArmorProfile"),
         check=_annotations),
)
"""Pod Security "restricted" as rules on the template (after the operator's own in
:data:`hetero_operator.api.podtemplate.RULES`)."""
