"""The worker pod template (``spec.worker.template``): what a user may set, what the operator owns,
and the rules that refuse the rest (pure).

The template is a Kubernetes ``PodTemplateSpec`` (its schema in the CRD is generated from the
Kubernetes OpenAPI by ``scripts/gen-crd-podtemplate.py``, so ``kubectl explain
htj.spec.worker.template.spec`` shows every field).  The operator merges it with what it must own
(:func:`hetero_operator.render.pods.render_pods`): the GPU resources, the env contract, the image per
node, the hardened securityContext, the rank's hostname and subdomain, the node it was planned
onto.  A field the user may not set is refused at admission by a CEL rule of the CRD naming the
field and why, and by :func:`check_template` (the same :data:`RULES`, in Python) where a manifest
never went through an API server (``heterotrain plan``/``run``) or an old CRD let it through.

Each :class:`Rule` is the one definition: its CEL text and message go into the CRD (the
generator), its Python twin (:attr:`Rule.check`) runs in :func:`check_template` and in
``tests/k8s/crdcheck.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.api import podsecurity
from hetero_operator.api.errors import SpecError
from hetero_operator.api.labels import OWN_PREFIX
from hetero_operator.api.templaterules import (CONTAINER, INIT, POD, Path, Rule, _at, _cel_list,
                                               _forbid, _items, _keys, cel_message, cel_text)
from heterotrain_common import envnames

TEMPLATE_PATH = "spec.worker.template"
WORKER_CONTAINER = "worker"
"""The one entry of ``template.spec.containers`` a user may give: merged into the rank container."""
CHECKPOINT_VOLUME = "checkpoint"
SHM_VOLUME = "dshm"
RESERVED_VOLUMES = (CHECKPOINT_VOLUME, SHM_VOLUME)
SHM_PATH = "/dev/shm"
GPU_RESOURCE_PREFIX = "nvidia.com/"
OWNED_LABEL_PREFIX = OWN_PREFIX

OWNED_ENV: tuple[str, ...] = tuple(sorted({
    *envnames.TORCHRUN_VARS, *envnames.REQUIRED_VARS, *envnames.OPTIONAL_VARS,
    *envnames.MEMORY_VARS, envnames.FIRST_RANK, envnames.PROFILE_STEPS,
    envnames.PREDICTED_SAMPLES_PER_S, *envnames.RESILIENCE_VARS, envnames.TRACKING,
    envnames.PRICES_PER_HOUR,
    *envnames.PIPELINE_VARS,
}))
"""Variables the operator (or ``heterotrain launch``) sets in every rank: the env contract.  A
template that sets one is refused; ``spec.worker.env`` entries of these names are dropped as
before (ours win)."""

def _gpu_resources(obj: Mapping[str, Any]) -> str | None:
    res = obj.get("resources") or {}
    for kind in ("limits", "requests"):
        for key in res.get(kind) or {}:
            if str(key).startswith(GPU_RESOURCE_PREFIX):
                return f".{kind}[{key}]"
    return ".claims" if "claims" in res else None


def _owned_env(item: Mapping[str, Any]) -> str | None:
    return ".name" if item.get("name") in OWNED_ENV else None


_HOW_PLACED = "the planner places every pod on one node with free GPUs of its plan"
_SECURITY_WHY = ("the operator hardens every container (Pod Security Standards \"restricted\": no "
                 "privilege escalation, no privileged mode, every capability dropped, runAsNonRoot "
                 "by the operator's HTJ_WORKER_RUN_AS_NON_ROOT)")

RULES: tuple[Rule, ...] = (
    _forbid(POD, "nodeName", f"{_HOW_PLACED}; narrow the nodes with nodeSelector or affinity instead"),
    _forbid(POD, "hostNetwork", "ranks talk over the pod network (the job's headless Service and "
            "NetworkPolicy); hostNetwork is refused by Pod Security \"baseline\" too"),
    _forbid(POD, "hostPID", "refused by Pod Security \"baseline\"; the ranks need no host processes"),
    _forbid(POD, "hostIPC", "refused by Pod Security \"baseline\"; shared memory comes from the "
            "Memory emptyDir the operator mounts at /dev/shm (spec.worker.sharedMemorySize)"),
    _forbid(POD, "hostname", "the operator names every pod's host <pod> under the job's Service, "
            "so MASTER_ADDR resolves the same on every rank"),
    _forbid(POD, "hostnameOverride", "the operator owns each pod's hostname (MASTER_ADDR)"),
    _forbid(POD, "subdomain", "the operator sets the subdomain to the job's headless Service "
            "(MASTER_ADDR)"),
    _forbid(POD, "setHostnameAsFQDN", "the operator owns each pod's hostname (MASTER_ADDR)"),
    _forbid(POD, "restartPolicy", "the operator restarts the whole gang itself (restartPolicy "
            "Never, spec.runPolicy.backoffLimit)"),
    _forbid(POD, "activeDeadlineSeconds", "use spec.runPolicy.activeDeadlineSeconds: the job's "
            "deadline counts from its first start, over every restart"),
    _forbid(POD, "priorityClassName", "use spec.runPolicy.schedulingPolicy.priorityClass (Kueue "
            "reads it from there)"),
    _forbid(POD, "priority", "set by the API server from the PriorityClass; use "
            "spec.runPolicy.schedulingPolicy.priorityClass"),
    _forbid(POD, "ephemeralContainers", "ephemeral containers are added to running pods with "
            "kubectl debug, not created"),
    _forbid(POD, "resourceClaims", "the operator claims the GPUs (DRA ResourceClaimTemplates on "
            "DRA nodes)"),
    _forbid(POD, "resources", "set CPU and memory on the worker container (spec.worker.resources "
            "or the template's container named worker); the operator adds the GPUs"),
    _forbid(POD, "overhead", "set by the RuntimeClass admission controller"),
    Rule(at=POD, field="containers", cel=f"self.containers.all(c, c.name == '{WORKER_CONTAINER}')",
         message=(f"only a container named {WORKER_CONTAINER} may be given (it is merged into every "
                  "rank's container); put sidecars in initContainers with restartPolicy Always "
                  "(Kubernetes native sidecars, which stop when the worker exits: a plain extra "
                  "container would keep the pod Running after training ends)"),
         check=_items("containers", lambda c: ".name" if c.get("name") != WORKER_CONTAINER else None)),
    Rule(at=POD, field="volumes",
         cel=f"self.volumes.all(v, !(v.name in {_cel_list(RESERVED_VOLUMES)}))",
         message=(f"the volume names {', '.join(RESERVED_VOLUMES)} are the operator's (the "
                  "checkpoint PersistentVolumeClaim and /dev/shm); rename yours"),
         check=_items("volumes", lambda v: ".name" if v.get("name") in RESERVED_VOLUMES else None)),
    _forbid(("spec", "securityContext"), "seccompProfile",
            "the operator sets seccompProfile RuntimeDefault on every pod"),
    _forbid(("spec", "securityContext"), "runAsNonRoot",
            "the operator sets runAsNonRoot (its setting HTJ_WORKER_RUN_AS_NON_ROOT)"),
    _forbid(CONTAINER, "image", "the operator picks the image per node from spec.images (the CUDA "
            "build its driver runs)"),
    _forbid(CONTAINER, "command", "set spec.worker.command: the operator runs it through "
            "heterotrain launch, one process per GPU"),
    _forbid(CONTAINER, "args", "set spec.worker.args (appended to spec.worker.command)"),
    Rule(at=CONTAINER, field="env", cel=f"self.env.all(e, !(e.name in {_cel_list(OWNED_ENV)}))",
         message=("the variables of the env contract (RANK, WORLD_SIZE, MASTER_ADDR, HTJ_* ...) are "
                  "set by the operator for every rank; use other names"),
         check=_items("env", _owned_env)),
    Rule(at=CONTAINER, field="volumeMounts",
         cel=f"self.volumeMounts.all(m, m.mountPath != '{SHM_PATH}')",
         message=(f"the operator mounts a Memory emptyDir at {SHM_PATH}; size it with "
                  "spec.worker.sharedMemorySize"),
         check=_items("volumeMounts", lambda m: ".mountPath" if m.get("mountPath") == SHM_PATH else None)),
    *(Rule(at=at, field="resources",
           cel=("(!has(self.resources.limits) || self.resources.limits.all(k, "
                f"!k.startsWith('{GPU_RESOURCE_PREFIX}'))) && (!has(self.resources.requests) || "
                f"self.resources.requests.all(k, !k.startsWith('{GPU_RESOURCE_PREFIX}'))) && "
                "!has(self.resources.claims)"),
           message=("the operator requests the GPUs of each pod's plan (nvidia.com/gpu or a MIG "
                    "resource, or a DRA claim); set only CPU, memory and other resources here"),
           check=_gpu_resources) for at in (CONTAINER, INIT)),
    *(_forbid((*at, "securityContext"), field, _SECURITY_WHY) for at in (CONTAINER, INIT)
      for field in ("privileged", "allowPrivilegeEscalation", "capabilities", "procMount",
                    "runAsNonRoot")),
    Rule(at=("metadata",), field="labels",
         cel=f"self.labels.all(k, !k.startsWith('{OWNED_LABEL_PREFIX}'))",
         message=f"labels under {OWNED_LABEL_PREFIX} are the operator's (job, group, rank, attempt)",
         check=_keys("labels", lambda k: k.startswith(OWNED_LABEL_PREFIX))),
    Rule(at=("metadata",), field="annotations",
         cel=f"self.annotations.all(k, !k.startsWith('{OWNED_LABEL_PREFIX}'))",
         message=f"annotations under {OWNED_LABEL_PREFIX} are the operator's (ranks, GPU type)",
         check=_keys("annotations", lambda k: k.startswith(OWNED_LABEL_PREFIX))),
    *podsecurity.RULES,
)
"""What the operator owns, then what Pod Security "restricted" refuses
(:data:`hetero_operator.api.podsecurity.RULES`)."""


SHAPE: tuple[tuple[Path, str], ...] = (
    (("metadata",), "mapping"), (("metadata", "labels"), "mapping"), (("metadata", "annotations"), "mapping"),
    (("spec",), "mapping"), (("spec", "securityContext"), "mapping"),
    *(((("spec", key), "list")) for key in ("containers", "initContainers", "volumes", "tolerations",
                                              "imagePullSecrets")),
    *(((("spec", key, "*"), "mapping")) for key in ("containers", "initContainers", "volumes", "tolerations",
                                                  "imagePullSecrets")),
    *(((("spec", key, "*", sub), "list")) for key in ("containers", "initContainers")
      for sub in ("env", "envFrom", "volumeMounts", "ports")),
    *(((("spec", key, "*", sub), "mapping")) for key in ("containers", "initContainers")
      for sub in ("resources", "securityContext")),
    (("spec", "securityContext", "supplementalGroups"), "list"),
    (("spec", "terminationGracePeriodSeconds"), "seconds"),
)
"""The types of the template's fields that the operator and ``heterotrain run`` read (Python
code walks them; a wrong type would be a traceback there, not a message).  The API server
checks the rest against Kubernetes' schema."""
MAX_GRACE_S = 10**9
"""The largest ``terminationGracePeriodSeconds`` taken, seconds (Kubernetes takes any int64)."""


def check_shape(template: Mapping[str, Any], path: str = TEMPLATE_PATH) -> None:
    """Refuse a field of :data:`SHAPE` of the wrong type (issue 32, F15: ``terminationGracePeriodSeconds:
    "abc"`` was a traceback in ``heterotrain run``).

    Raises:
        SpecError: naming the field and the type it must have.
    """
    for at, kind in SHAPE:
        parent_at, key = at[:-1], at[-1]
        for parent, where in _at(template, parent_at, path):
            if key == "*":
                continue
            if key not in parent or parent[key] is None:
                continue
            value = parent[key]
            if kind == "mapping" and not isinstance(value, Mapping):
                raise SpecError(f"{where}.{key}", f"must be a mapping, got {type(value).__name__} {value!r}")
            if kind == "list" and not isinstance(value, list):
                raise SpecError(f"{where}.{key}", f"must be a list, got {type(value).__name__} {value!r}")
            if kind == "seconds" and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_GRACE_S):
                raise SpecError(f"{where}.{key}", f"must be a whole number of seconds in 0..{MAX_GRACE_S}, "
                                f"got {value!r}")
        if key == "*":  # every item of the list at parent_at
            for items, where in _at(template, parent_at[:-1], path):
                values = items.get(parent_at[-1])
                for i, item in enumerate(values if isinstance(values, list) else ()):
                    if not isinstance(item, Mapping):
                        raise SpecError(f"{where}.{parent_at[-1]}[{i}]",
                                        f"must be a mapping, got {type(item).__name__} {item!r}")


def check_template(template: Mapping[str, Any], path: str = TEMPLATE_PATH) -> None:
    """Refuse what the operator owns, like the CRD's CEL rules (first violation named).

    Raises:
        SpecError: naming the field, e.g. ``spec.worker.template.spec.hostNetwork: refused: ...``.
    """
    if not isinstance(template, Mapping):
        raise SpecError(path, "must be a mapping (a Kubernetes PodTemplateSpec: metadata, spec)")
    check_shape(template, path)
    for rule in RULES:
        for obj, where in _at(template, rule.at, path):
            found = rule.check(obj)
            if found is not None:
                raise SpecError(f"{where}.{rule.field}{found}", f"refused: {rule.message}")


def worker_container(template: Mapping[str, Any]) -> dict[str, Any]:
    """The template's container named ``worker`` (``{}`` when it gives none)."""
    for c in ((template.get("spec") or {}).get("containers") or ()):
        if c.get("name") == WORKER_CONTAINER:
            return dict(c)
    return {}
