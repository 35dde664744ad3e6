"""Parse a ``HeteroTrainingJob`` manifest (a dict, as the API or ``yaml.safe_load`` returns it).

Pure: no kopf, no kubernetes.  The CRD schema in ``crds/`` is the first line of validation; this
module re-checks what a manifest that skipped the API server (``heterotrain plan``/``run``) or an old
CRD may carry, and raises :class:`SpecError` naming the field path and the fix.
Defaults here equal the CRD's defaults.  The job's name and profile key
(:mod:`~hetero_operator.api.jobnames`) and the worker container
(:mod:`~hetero_operator.api.workerspec`) have modules of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.fields import (boolean, claim_name, enum, integer, mapping, optional_integer,
                                        optional_string, quantity, string, string_list)
from hetero_operator.api.jobnames import default_profile_key, job_name, parse_profile_key
from hetero_operator.api.labels import ANNOTATION_PROFILE_STEPS
from hetero_operator.api.platforms import DEFAULT_PLATFORMS, parse_platform
from hetero_operator.api.elasticspec import ElasticSpec, parse_elastic
from hetero_operator.api.pipelinespec import PipelineSpec, parse_pipeline
from hetero_operator.api.strictfields import unknown_fields
from hetero_operator.api.workerspec import WorkerTemplate, parse_worker
from heterotrain_common import defaults
from heterotrain_common.envread import ContractError, parse_step_range
from heterotrain_common.tracking import TrackingError, parse_tracking, tracking_to_json

API_GROUP = "heterotrain.io"
VERSION = "v1alpha1"
API_VERSION = f"{API_GROUP}/{VERSION}"
KIND = "HeteroTrainingJob"
PLURAL = "heterotrainingjobs"

BATCH_SPLITS = ("Proportional", "Equal")
PRECISIONS = ("Auto", "BF16", "FP16", "FP32")
HIERARCHIES = ("Auto", "Flat", "Group", "PerNode", "PerArchitecture")
COMPRESSIONS = ("None", "FP16", "BF16", "Int8", "PowerSGD")
CLEAN_POD_POLICIES = ("All", "Running", "None")
SELECTIONS = ("Throughput", "All")
SHARDINGS = ("Auto", "None", "Group", "Full")
OPTIMIZERS = ("AdamW", "Adam", "Momentum", "SGD")
_CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}$")
_CC_RE = re.compile(r"^\d{1,2}\.\d$")
_RESUME_FROM_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$|^AnyJob$")
"""``resumeFrom``: a job's ``metadata.name`` (DNS subdomain) or ``metadata.uid``, or ``AnyJob``."""
_TORCH_RE = re.compile(r"^\d{1,2}\.\d{1,3}(\.\d{1,3})?([+.-][0-9A-Za-z.]{1,24})?$")


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageVariant:
    """One worker image of the job's catalog.

    Attributes:
        image: image reference, e.g. ``"ghcr.io/heterotrain/worker:0.1.0-cu124"``.
        cuda_version: CUDA runtime inside the image, ``(major, minor)``.
        compute_capabilities: compute capabilities it has kernels for, e.g. ``("7.0", "8.0")``.
        torch_version: PyTorch release inside the image, e.g. ``"2.13.0"``; ``""`` when not
            declared.  When any variant declares one, a plan whose chosen variants differ is
            refused (ranks of one job must run one PyTorch build).
        cuda_minor_version_compatible: the image relies on CUDA minor-version compatibility, so a
            driver of the same CUDA major family (>= 450 for 11.x, >= 525 for 12.x, >= 580 for
            13.x) may run it even below the release's own minimum driver.
        platforms: ``os/arch[/variant]`` the image is built for (``spec.images[].platforms``,
            default :data:`~hetero_operator.api.platforms.DEFAULT_PLATFORMS`, linux/amd64): a
            node gets only a variant built for its ``kubernetes.io/os``/``kubernetes.io/arch``.
    """

    image: str
    cuda_version: tuple[int, int]
    compute_capabilities: tuple[str, ...]
    torch_version: str = ""
    cuda_minor_version_compatible: bool = False
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuRequest:
    """What GPUs the job may use.

    Attributes:
        ranks: ranks wanted (one GPU or MIG device each).
        min_ranks: all-or-nothing minimum to start; ``<= ranks``.
        allowed_products / denied_products: GFD product values (base product, without a
            ``-MIG-…`` or ``-SHARED`` suffix); empty allow list means all.
        allowed_mig_profiles / denied_mig_profiles: e.g. ``"3g.40gb"``; empty allow list means
            all; ``allow_mig=False`` excludes MIG devices.
        min_memory_mib: minimum device memory in MiB.
        speed_overrides: product or MIG profile -> relative speed in percent of the reference
            device (A100 = 100), replacing the built-in table.
        selection: ``"Throughput"`` (leave out GPU types whose predicted gain is below
            ``min_gain_percent`` once their communication is counted) or ``"All"``.
        min_gain_percent: smallest predicted throughput gain, percent, for which a GPU type is
            kept under ``Throughput``.
    """

    ranks: int
    min_ranks: int
    allowed_products: tuple[str, ...] = ()
    denied_products: tuple[str, ...] = ()
    allowed_mig_profiles: tuple[str, ...] = ()
    denied_mig_profiles: tuple[str, ...] = ()
    allow_mig: bool = True
    min_memory_mib: int = 0
    speed_overrides: Mapping[str, int] = field(default_factory=dict)
    selection: str = "Throughput"
    min_gain_percent: int = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSpec:
    """Training settings.

    Attributes:
        global_batch_size: samples per optimizer step over all ranks.
        batch_split: ``"Proportional"`` (to speed, capped by memory) or ``"Equal"``.
        precision: ``"Auto"`` (bf16 on cc >= 8.0, fp16 + scaler on 7.x, fp32 below) or forced.
        hierarchy: gradient reduction layout (see ``HIERARCHIES``).
        memory_per_sample_mib: activation memory per sample in MiB; caps a device's batch.
        memory_reserve_mib: memory kept free per device (framework, NCCL) in MiB.
        checkpoint_path: directory inside the worker for checkpoints; ``""`` disables.
        checkpoint_pvc: PersistentVolumeClaim mounted at ``checkpoint_path``; ``""`` for none.
        checkpoint_interval_steps: steps between checkpoints.
        checkpoint_keep: verified checkpoints kept on disk (``spec.training.checkpoint.keep``).
        checkpoint_timeout_s: timeout of the checkpoint process group (save and agreement).
        checkpoint_resume_from: ``spec.training.checkpoint.resumeFrom``: another job's name or
            UID whose checkpoints in ``checkpoint_path`` this job may resume, ``"AnyJob"`` for any,
            ``""`` for its own only (a checkpoint belongs to its job, issue 33).
        collective_timeout_s: timeout of the training collectives.
        rebalance_interval_steps: steps between split re-solves; 0 disables rebalancing.
        compression: inter-group gradient compression (see ``COMPRESSIONS``).
        powersgd_rank: matrix rank for PowerSGD compression.
        profile_key: what counts as "the same model" for learned speeds; ``""`` means the job
            name without suffixes (see :func:`default_profile_key`).
        gradient_mib: fp32 gradient size per sync, MiB (parameters x 4 / 2^20); 0 leaves
            communication out of the planner's step-time model.
        reference_samples_per_second: samples/s of one speed-1.0 device (an A100) for this
            model; 0 = unknown (learned speeds set the scale once a job of the same profileKey
            ran).
        model_parameters: trainable parameters of the model (``spec.training.model.parameters``);
            0 = not given, no memory model (every rank holds the whole model, as before).
        optimizer: ``AdamW|Adam|Momentum|SGD``: how much optimizer state each parameter has.
        activation_bytes_per_sample: activations saved for backward per sample, bytes
            (``spec.training.model.activationBytesPerSample``).
        checkpointed_activation_bytes_per_sample: the same with activation checkpointing of the
            model's blocks, bytes; 0 = unknown (the planner never turns checkpointing on).
        sharding: ``Auto|None|Group|Full`` (:mod:`hetero_operator.planning.memory`).
    """

    global_batch_size: int
    batch_split: str = "Proportional"
    precision: str = "Auto"
    hierarchy: str = "Auto"
    memory_per_sample_mib: int = 0
    memory_reserve_mib: int = 1024
    checkpoint_path: str = ""
    checkpoint_pvc: str = ""
    checkpoint_interval_steps: int = defaults.CHECKPOINT_INTERVAL_STEPS
    checkpoint_keep: int = defaults.CHECKPOINT_KEEP
    checkpoint_timeout_s: int = defaults.CHECKPOINT_TIMEOUT_S
    checkpoint_resume_from: str = ""
    collective_timeout_s: int = int(defaults.COLLECTIVE_TIMEOUT_S)
    rebalance_interval_steps: int = defaults.REBALANCE_INTERVAL_STEPS
    compression: str = "None"
    powersgd_rank: int = defaults.POWERSGD_RANK
    profile_key: str = ""
    gradient_mib: int = 0
    reference_samples_per_second: int = 0
    model_parameters: int = 0
    optimizer: str = "AdamW"
    activation_bytes_per_sample: int = 0
    checkpointed_activation_bytes_per_sample: int = 0
    sharding: str = "Auto"
    tracking_json: str = ""
    """``spec.training.tracking`` as ``HTJ_TRACKING``'s compact JSON (normal form of
    :func:`heterotrain_common.tracking.parse_tracking`); ``""`` for no tracking."""
    pipeline: PipelineSpec | None = None
    """``spec.training.pipeline`` (:mod:`hetero_operator.api.pipelinespec`); None for no pipeline.
    Parsed only: not yet planned, rendered or run (docs/pipeline.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPolicy:
    """Kubeflow-style run policy.

    Attributes:
        backoff_limit: restarts of the whole job before it fails.
        active_deadline_seconds: wall-clock limit from start, None for none.
        ttl_seconds_after_finished: delete the job this long after it finished, None to keep.
        clean_pod_policy: which pods to delete when finished (``All``/``Running``/``None``).
        suspend: True keeps no pods running (Kueue admission un-suspends).
        queue: the job's Kueue LocalQueue, ``""`` for none: the ``kueue.x-k8s.io/queue-name``
            label, else ``schedulingPolicy.queue`` (the two may not disagree).
        priority_class: PriorityClass of the pods, ``""`` for none.
        node_loss_grace_seconds: how long a node may be NotReady/Unknown or unreachable before
            the job's pods on it are force-deleted and the gang restarts elsewhere (default
            300 s, Kubernetes' default ``tolerationSeconds`` for the unreachable taint).
    """

    backoff_limit: int = defaults.BACKOFF_LIMIT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: str = "Running"
    suspend: bool = False
    queue: str = ""
    priority_class: str = ""
    node_loss_grace_seconds: int = defaults.NODE_LOSS_GRACE_S


PROFILE_STEPS_ANNOTATION = ANNOTATION_PROFILE_STEPS
"""Job annotation: steps every rank traces with the PyTorch Profiler, e.g. ``"20-25"``
(``HTJ_PROFILE_STEPS`` in the env contract; docs/embedded.md, "Profiling")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """A parsed ``HeteroTrainingJob``: name, namespace and the four spec sections.

    Attributes:
        profile_steps: ``(first, last)`` 1-based inclusive steps to trace with the PyTorch
            Profiler (annotation :data:`PROFILE_STEPS_ANNOTATION`), None for none.
        elastic: ``spec.elastic`` (:mod:`hetero_operator.api.elasticspec`); None: not elastic.
    """

    name: str
    namespace: str
    worker: WorkerTemplate
    images: tuple[ImageVariant, ...]
    gpus: GpuRequest
    training: TrainingSpec
    run_policy: RunPolicy
    profile_steps: tuple[int, int] | None = None
    elastic: ElasticSpec | None = None


def parse_job(body: Mapping[str, Any]) -> JobSpec:
    """Parse a whole manifest.

    Raises:
        SpecError: naming the first invalid field (path such as ``spec.gpus.ranks``).
    """
    if body.get("kind") != KIND:
        raise SpecError("kind", f"must be {KIND}, got {body.get('kind')!r}")
    _refuse_unknown_fields(body)
    meta = mapping(body, "metadata", "metadata")
    spec = mapping(body, "spec", "spec")
    labels = mapping(meta, "labels", "metadata.labels", required=False)
    run_policy = _run_policy(mapping(spec, "runPolicy", "spec.runPolicy", required=False))
    label_queue = str(labels.get("kueue.x-k8s.io/queue-name") or "")
    if label_queue and run_policy.queue and label_queue != run_policy.queue:  # one queue source
        raise SpecError("spec.runPolicy.schedulingPolicy.queue",
                        f"{run_policy.queue!r} and the label kueue.x-k8s.io/queue-name="
                        f"{label_queue!r} name different queues: set one of them, or both to the "
                        "same LocalQueue")
    if label_queue and not run_policy.queue:
        run_policy = replace(run_policy, queue=label_queue)
    name = job_name(meta)
    worker = parse_worker(mapping(spec, "worker", "spec.worker"))
    images = _images(spec.get("images", []), "spec.images")
    gpus = _gpus(mapping(spec, "gpus", "spec.gpus"))
    training = _training(mapping(spec, "training", "spec.training"))
    if training.global_batch_size < gpus.min_ranks:  # no cluster can ever run it: not a wait
        raise SpecError("spec.training.globalBatchSize", f"{training.global_batch_size} is below "
                        f"spec.gpus.minRanks {gpus.min_ranks}: every rank needs at least one "
                        "sample, so no cluster can ever start this job; raise globalBatchSize to "
                        f"{gpus.min_ranks} or more, or lower spec.gpus.minRanks (and ranks)")
    return JobSpec(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        worker=worker,
        images=images,
        gpus=gpus,
        training=training,
        run_policy=run_policy,
        profile_steps=_profile_steps(mapping(meta, "annotations", "metadata.annotations", required=False)),
        elastic=parse_elastic(spec.get("elastic"), ranks=gpus.ranks),
    )


def _profile_steps(annotations: Mapping[str, Any]) -> tuple[int, int] | None:

    path = f"metadata.annotations[{PROFILE_STEPS_ANNOTATION}]"
    try:
        return parse_step_range(str(annotations.get(PROFILE_STEPS_ANNOTATION) or ""), path)
    except ContractError as exc:
        raise SpecError(path, str(exc).partition(": ")[2] or str(exc)) from None


def _refuse_unknown_fields(body: Mapping[str, Any]) -> None:
    """Strict like ``kubectl apply``: a field the CRD does not define is an error (first one
    named with the nearest known name, the others listed); see :mod:`hetero_operator.api.strictfields`."""

    unknown = unknown_fields(body)
    if unknown:
        more = f" (also unknown: {', '.join(u.path for u in unknown[1:])})" if unknown[1:] else ""
        raise SpecError(unknown[0].path, unknown[0].message() + more)


def _images(items: Any, path: str) -> tuple[ImageVariant, ...]:
    if not isinstance(items, list):
        raise SpecError(path, "must be a list of {image, cudaVersion, computeCapabilities}")
    out = []
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(p, "must be a mapping with image, cudaVersion, computeCapabilities")
        raw_cuda = item.get("cudaVersion", "")
        cuda = raw_cuda if isinstance(raw_cuda, str) else ""  # 11.10 unquoted is the float 11.1
        if not _CUDA_RE.match(cuda):
            cuda = str(raw_cuda) if not isinstance(raw_cuda, str) else cuda
            raise SpecError(f"{p}.cudaVersion", f"must look like \"12.4\" (a quoted string), got "
                            f"{raw_cuda!r}")
        ccs = string_list(item, "computeCapabilities", f"{p}.computeCapabilities", required=True)
        for cc in ccs:
            if not _CC_RE.match(cc):
                raise SpecError(f"{p}.computeCapabilities", f"entries look like \"8.0\", got {cc!r}")
        major, minor = cuda.split(".")
        torch_version = str(item.get("torchVersion") or "")
        if torch_version and not _TORCH_RE.match(torch_version):
            raise SpecError(f"{p}.torchVersion", "must look like \"2.13.0\" (a quoted PyTorch "
                            f"release), got {torch_version!r}")
        out.append(ImageVariant(image=string(item, "image", f"{p}.image"),
                                cuda_version=(int(major), int(minor)), compute_capabilities=ccs,
                                torch_version=torch_version,
                                cuda_minor_version_compatible=boolean(
                                    item, "cudaMinorVersionCompatible",
                                    f"{p}.cudaMinorVersionCompatible", False),
                                platforms=_platforms(item, f"{p}.platforms")))
    return tuple(out)


def _platforms(item: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """``spec.images[i].platforms``: ``os/arch[/variant]`` entries, default linux/amd64
    (:mod:`hetero_operator.api.platforms`)."""
    if "platforms" not in item or item["platforms"] is None:
        return DEFAULT_PLATFORMS
    raw = item["platforms"]
    if not isinstance(raw, list) or not raw:
        raise SpecError(path, "must be a non-empty list such as [\"linux/amd64\", \"linux/arm64\"] "
                        "(the platforms the image is built for); leave it out for linux/amd64 only")
    out: dict[str, None] = {}
    for i, entry in enumerate(raw):
        try:
            out[parse_platform(entry, f"{path}[{i}]")] = None
        except ValueError as exc:
            where, _, msg = str(exc).partition(": ")
            raise SpecError(where, msg) from None
    return tuple(out)


def _gpus(g: Mapping[str, Any]) -> GpuRequest:
    ranks = integer(g, "ranks", "spec.gpus.ranks", None, 1, 65536)
    min_ranks = integer(g, "minRanks", "spec.gpus.minRanks", ranks, 1, 65536)
    if min_ranks > ranks:
        raise SpecError("spec.gpus.minRanks", f"{min_ranks} exceeds spec.gpus.ranks={ranks}; "
                        "lower minRanks or raise ranks")
    overrides: dict[str, int] = {}
    for i, item in enumerate(g.get("speedOverrides") or []):
        p = f"spec.gpus.speedOverrides[{i}]"
        overrides[string(item, "device", f"{p}.device")] = integer(
            item, "relativeSpeedPercent", f"{p}.relativeSpeedPercent", None, 1, 100000)
    return GpuRequest(
        ranks=ranks, min_ranks=min_ranks,
        allowed_products=string_list(g, "allowedProducts", "spec.gpus.allowedProducts"),
        denied_products=string_list(g, "deniedProducts", "spec.gpus.deniedProducts"),
        allowed_mig_profiles=string_list(g, "allowedMigProfiles", "spec.gpus.allowedMigProfiles"),
        denied_mig_profiles=string_list(g, "deniedMigProfiles", "spec.gpus.deniedMigProfiles"),
        allow_mig=boolean(g, "allowMig", "spec.gpus.allowMig", True),
        min_memory_mib=integer(g, "minMemoryMiB", "spec.gpus.minMemoryMiB", 0, 0, 10**7),
        speed_overrides=overrides,
        selection=enum(g, "selection", "spec.gpus.selection", SELECTIONS),
        min_gain_percent=integer(g, "minGainPercent", "spec.gpus.minGainPercent", 5, 0, 100),
    )


def _training(t: Mapping[str, Any]) -> TrainingSpec:
    p = "spec.training"
    ckpt = mapping(t, "checkpoint", f"{p}.checkpoint", required=False)
    rebalance = mapping(t, "rebalance", f"{p}.rebalance", required=False)
    compression = mapping(t, "compression", f"{p}.compression", required=False)
    mdl = mapping(t, "model", f"{p}.model", required=False)
    parameters = quantity(mdl, "parameters", f"{p}.model.parameters", binary=False, hi=10**15)
    activation = quantity(mdl, "activationBytesPerSample", f"{p}.model.activationBytesPerSample")
    checkpointed = quantity(mdl, "checkpointedActivationBytesPerSample",
                             f"{p}.model.checkpointedActivationBytesPerSample")
    if checkpointed and checkpointed >= activation:
        raise SpecError(f"{p}.model.checkpointedActivationBytesPerSample",
                        f"must be below activationBytesPerSample ({activation}) (checkpointing "
                        f"saves activations), got {checkpointed}; leave it out when unknown")
    if parameters and t.get("memoryPerSampleMiB"):
        raise SpecError(f"{p}.memoryPerSampleMiB", "leave it out when spec.training.model.parameters "
                        "is given: the memory model uses spec.training.model.activationBytesPerSample "
                        "and gives a rank micro-batches instead of capping its batch")
    return TrainingSpec(
        global_batch_size=integer(t, "globalBatchSize", f"{p}.globalBatchSize", None, 1, 10**7),
        batch_split=enum(t, "batchSplit", f"{p}.batchSplit", BATCH_SPLITS),
        precision=enum(t, "precision", f"{p}.precision", PRECISIONS),
        hierarchy=enum(t, "hierarchy", f"{p}.hierarchy", HIERARCHIES),
        memory_per_sample_mib=integer(t, "memoryPerSampleMiB", f"{p}.memoryPerSampleMiB", 0, 0, 10**6),
        memory_reserve_mib=integer(t, "memoryReserveMiB", f"{p}.memoryReserveMiB", 1024, 0, 10**6),
        checkpoint_path=optional_string(ckpt, "path", f"{p}.checkpoint.path"),
        checkpoint_pvc=claim_name(ckpt, "persistentVolumeClaim", f"{p}.checkpoint.persistentVolumeClaim"),
        checkpoint_interval_steps=integer(ckpt, "intervalSteps", f"{p}.checkpoint.intervalSteps",
                                          defaults.CHECKPOINT_INTERVAL_STEPS, 1, 10**7),
        checkpoint_keep=integer(ckpt, "keep", f"{p}.checkpoint.keep", defaults.CHECKPOINT_KEEP, 1, 100),
        checkpoint_timeout_s=integer(ckpt, "timeoutSeconds", f"{p}.checkpoint.timeoutSeconds",
                                     defaults.CHECKPOINT_TIMEOUT_S, 1, 86400),
        checkpoint_resume_from=_resume_from(ckpt, f"{p}.checkpoint"),
        collective_timeout_s=integer(t, "collectiveTimeoutSeconds", f"{p}.collectiveTimeoutSeconds",
                                     int(defaults.COLLECTIVE_TIMEOUT_S), 1, 86400),
        rebalance_interval_steps=integer(rebalance, "intervalSteps", f"{p}.rebalance.intervalSteps",
                                         defaults.REBALANCE_INTERVAL_STEPS, 0, 10**6),
        compression=enum(compression, "mode", f"{p}.compression.mode", COMPRESSIONS),
        powersgd_rank=integer(compression, "powerSGDRank", f"{p}.compression.powerSGDRank",
                              defaults.POWERSGD_RANK, 1, 64),
        profile_key=parse_profile_key(t, f"{p}.profileKey"),
        gradient_mib=integer(t, "gradientMiB", f"{p}.gradientMiB", 0, 0, 10**7),
        reference_samples_per_second=integer(t, "referenceSamplesPerSecond",
                                          f"{p}.referenceSamplesPerSecond", 0, 0, 10**9),
        model_parameters=parameters, optimizer=enum(t, "optimizer", f"{p}.optimizer", OPTIMIZERS),
        activation_bytes_per_sample=activation,
        checkpointed_activation_bytes_per_sample=checkpointed,
        sharding=enum(t, "sharding", f"{p}.sharding", SHARDINGS),
        tracking_json=_tracking(t.get("tracking"), f"{p}.tracking"),
        pipeline=parse_pipeline(t.get("pipeline"), f"{p}.pipeline"),
    )


def _tracking(raw: Any, path: str) -> str:
    """``spec.training.tracking`` as compact JSON, ``""`` when absent or empty.

    Raises:
        SpecError: naming the invalid field (e.g. ``spec.training.tracking.wandb.project``).
    """
    try:
        parsed = parse_tracking(raw, path)
    except TrackingError as exc:
        raise SpecError(exc.path, exc.message) from None
    return tracking_to_json(parsed) if parsed else ""


def _resume_from(ckpt: Mapping[str, Any], p: str) -> str:
    """``spec.training.checkpoint.resumeFrom``: a job name or UID, or ``AnyJob``; only with a path.

    Raises:
        SpecError: not a name/UID, or set without ``spec.training.checkpoint.path``.
    """
    value = optional_string(ckpt, "resumeFrom", f"{p}.resumeFrom")
    if value and not _RESUME_FROM_RE.match(value):
        raise SpecError(f"{p}.resumeFrom", f"must name a job (its metadata.name or metadata.uid) "
                        f"or be AnyJob, got {value!r}")
    if value and not optional_string(ckpt, "path", f"{p}.path"):
        raise SpecError(f"{p}.resumeFrom", f"{value!r} resumes checkpoints found in "
                        "spec.training.checkpoint.path: set the path (and the claim that keeps "
                        "the other job's checkpoints), or leave resumeFrom out")
    return value


def profile_key(job: JobSpec) -> str:
    """``spec.training.profileKey``, or :func:`default_profile_key` of the job name."""
    return job.training.profile_key or default_profile_key(job.name)


def _run_policy(r: Mapping[str, Any]) -> RunPolicy:
    p = "spec.runPolicy"
    sched = mapping(r, "schedulingPolicy", f"{p}.schedulingPolicy", required=False)
    return RunPolicy(
        backoff_limit=integer(r, "backoffLimit", f"{p}.backoffLimit", defaults.BACKOFF_LIMIT, 0, 1000),
        active_deadline_seconds=optional_integer(r, "activeDeadlineSeconds", f"{p}.activeDeadlineSeconds"),
        ttl_seconds_after_finished=optional_integer(r, "ttlSecondsAfterFinished",
                                                    f"{p}.ttlSecondsAfterFinished"),
        clean_pod_policy=enum(r, "cleanPodPolicy", f"{p}.cleanPodPolicy", CLEAN_POD_POLICIES, "Running"),
        suspend=boolean(r, "suspend", f"{p}.suspend", False),
        queue=optional_string(sched, "queue", f"{p}.schedulingPolicy.queue"),
        priority_class=optional_string(sched, "priorityClass", f"{p}.schedulingPolicy.priorityClass"),
        node_loss_grace_seconds=integer(r, "nodeLossGraceSeconds", f"{p}.nodeLossGraceSeconds",
                                     defaults.NODE_LOSS_GRACE_S, 0, 86400),
    )


