"""The worker container of a job (``spec.worker``): what each rank runs, its resources and its
``/dev/shm`` (pure).

:func:`parse_worker` reads the section; :func:`merged_resources` and :func:`shared_memory_bytes`
are what the pod renderer asks of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.api import podtemplate
from hetero_operator.api.errors import SpecError
from hetero_operator.api.fields import integer, mapping, quantity, string_list
from hetero_operator.api.quantities import (QuantityError, check_quantity, parse_quantity,
                                             scale_quantity)
from heterotrain_common import defaults


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerTemplate:
    """The worker container: what each rank process runs.

    Attributes:
        command / args: argv of one rank process (the launcher starts one per GPU).
        env: extra environment, as Kubernetes ``EnvVar`` dicts.
        resources: Kubernetes ``ResourceRequirements`` for CPU/memory of each pod (GPUs are
            added by us).
        resources_per_rank: the same per rank (``spec.worker.resourcesPerRank``, Kubeflow's
            per-replica sizing): a pod of n ranks gets n times them (:func:`pod_resources`).
        metrics_port: Prometheus port of local rank 0; local rank i uses ``metrics_port + i``.
        template: the pod template (``spec.worker.template``, a ``PodTemplateSpec`` dict, ``{}``
            for none), checked by :func:`hetero_operator.api.podtemplate.check_template`.
        shared_memory_bytes: ``spec.worker.sharedMemorySize`` in bytes; None for the default
            (:func:`shared_memory_bytes`), 0 for no ``/dev/shm`` volume.
    """

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    resources_per_rank: Mapping[str, Any] = field(default_factory=dict)
    metrics_port: int = 9480
    template: Mapping[str, Any] = field(default_factory=dict)
    shared_memory_bytes: int | None = None

    @property
    def memory_limit_bytes(self) -> int | None:
        """The worker container's memory limit (the template's container ``worker`` wins over
        ``spec.worker.resources``), bytes; None without one or when it is no whole quantity."""
        return memory_limit_bytes(merged_resources(self))

    @property
    def termination_grace_s(self) -> int:
        """The pods' ``terminationGracePeriodSeconds``: the template's, else the default."""
        value = (self.template.get("spec") or {}).get("terminationGracePeriodSeconds")
        return int(value) if value is not None else defaults.TERMINATION_GRACE_S


RESOURCE_KINDS = ("requests", "limits")


def pod_resources(worker: WorkerTemplate, ranks: int = 1) -> dict[str, Any]:
    """A pod's CPU and memory from the spec: ``spec.worker.resources`` (per pod) and
    ``spec.worker.resourcesPerRank`` times ``ranks`` (the pod's ranks), by ``requests`` and
    ``limits`` (a name is in one of the two: :func:`parse_worker` refuses both)."""
    out = {k: dict(v) for k, v in worker.resources.items() if k in RESOURCE_KINDS and v}
    for kind in RESOURCE_KINDS:
        for name, amount in (worker.resources_per_rank.get(kind) or {}).items():
            out.setdefault(kind, {})[name] = scale_quantity(amount, max(1, ranks))
    return out


def merged_resources(worker: WorkerTemplate, ranks: int = 1) -> dict[str, Any]:
    """:func:`pod_resources` of a pod of ``ranks`` ranks with the template's container
    ``worker``'s over it, per resource name (``requests`` and ``limits``; other keys of the
    template's, such as ``claims``, are refused there)."""
    out = pod_resources(worker, ranks)
    extra = podtemplate.worker_container(worker.template).get("resources") or {}
    for key in ("requests", "limits"):
        if extra.get(key):
            out.setdefault(key, {}).update(extra[key])
    return out


def memory_limit_bytes(resources: Mapping[str, Any]) -> int | None:
    """``limits.memory`` in bytes; None when absent or no whole-number quantity."""
    raw = (resources.get("limits") or {}).get("memory")
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def shared_memory_bytes(worker: WorkerTemplate, local_ranks: int) -> int:
    """Size of a pod's ``/dev/shm`` (Memory emptyDir): ``spec.worker.sharedMemorySize``, else
    :data:`heterotrain_common.defaults.SHM_PER_LOCAL_RANK_BYTES` per local rank capped at half the
    worker container's memory limit (tmpfs pages count against it); 0 = no volume."""
    if worker.shared_memory_bytes is not None:
        return worker.shared_memory_bytes
    size = defaults.SHM_PER_LOCAL_RANK_BYTES * max(1, local_ranks)
    limit = memory_limit_bytes(merged_resources(worker, local_ranks))
    return min(size, limit // 2) if limit else size


def env_list(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    """``spec.worker.env``: Kubernetes ``EnvVar`` mappings, each with a name.

    Raises:
        SpecError: not a list, an item not a mapping, or without a string ``name``.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(path, f"must be a list of {{name, value}} (Kubernetes EnvVar), got "
                        f"{type(value).__name__} {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise SpecError(f"{path}[{i}]", f"must be a mapping {{name, value}}, got {item!r}")
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise SpecError(f"{path}[{i}].name", "is required: the variable's name")
    return tuple(value)


def resource_requirements(value: Any, path: str) -> dict[str, Any]:
    """``spec.worker.resources``: Kubernetes ``ResourceRequirements`` whose ``requests`` and
    ``limits`` are quantities.

    Raises:
        SpecError: not a mapping, or a request or limit that is no quantity, naming it.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"must be a mapping with requests and limits (Kubernetes "
                        f"ResourceRequirements), got {type(value).__name__} {value!r}")
    for kind in ("requests", "limits"):
        amounts = mapping(value, kind, f"{path}.{kind}", required=False)
        for name, amount in amounts.items():
            try:
                check_quantity(amount)
            except QuantityError as exc:
                raise SpecError(f"{path}.{kind}.{name}", str(exc)) from None
    return dict(value)


def per_rank_resources(w: Mapping[str, Any]) -> dict[str, Any]:
    """``spec.worker.resourcesPerRank``: requests and limits per rank.

    Raises:
        SpecError: no quantities, or a resource also set per pod in ``spec.worker.resources``
            (which would win is unclear), naming both and the fix.
    """
    path = "spec.worker.resourcesPerRank"
    per_rank = resource_requirements(w.get("resourcesPerRank"), path)
    per_pod = w.get("resources") if isinstance(w.get("resources"), Mapping) else {}
    for kind in RESOURCE_KINDS:
        both = sorted(set(per_rank.get(kind) or {}) & set((per_pod or {}).get(kind) or {}))
        if both:
            raise SpecError(f"{path}.{kind}.{both[0]}", f"is also set per pod in "
                            f"spec.worker.resources.{kind}.{both[0]}: set it per rank "
                            "(resourcesPerRank: the pod gets it times its ranks) or per pod "
                            "(resources), not both")
    return {k: dict(v) for k, v in per_rank.items() if k in RESOURCE_KINDS and v}


def parse_worker(w: Mapping[str, Any]) -> WorkerTemplate:
    """Parse ``spec.worker``.

    Raises:
        SpecError: no command, a bad template or port, or a ``sharedMemorySize`` above the
            worker container's memory limit.
    """
    command = string_list(w, "command", "spec.worker.command", required=True)
    if not command:
        raise SpecError("spec.worker.command", "must name the program each rank runs, "
                        "e.g. [python, -m, hetero_worker.examples.digits]")
    template = mapping(w, "template", podtemplate.TEMPLATE_PATH, required=False)
    podtemplate.check_template(template)
    shm = w.get("sharedMemorySize")
    worker = WorkerTemplate(
        command=command, args=string_list(w, "args", "spec.worker.args"),
        env=env_list(w.get("env"), "spec.worker.env"),
        resources=resource_requirements(w.get("resources"), "spec.worker.resources"),
        resources_per_rank=per_rank_resources(w),
        metrics_port=integer(w, "metricsPort", "spec.worker.metricsPort", 9480, 0, 65535),
        template=dict(template),
        shared_memory_bytes=None if shm is None else quantity(w, "sharedMemorySize",
                                                               "spec.worker.sharedMemorySize"),
    )
    limit = worker.memory_limit_bytes
    if worker.shared_memory_bytes and limit is not None and worker.shared_memory_bytes > limit:
        raise SpecError("spec.worker.sharedMemorySize", f"{shm} exceeds the worker container's memory "
                        f"limit ({limit} bytes): tmpfs pages count against it; lower it or raise "
                        "limits.memory")
    return worker
