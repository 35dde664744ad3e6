"""A Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``) as a ``HeteroTrainingJob`` (pure).

:func:`convert_pytorchjob` maps every field it can (docs/migrating-from-kubeflow.md has the table)
and lists each field of the input it could not map with the reason, so nothing is dropped
silently: every leaf of the input is either mapped, server-set, or listed.  The result passes
:func:`hetero_operator.api.spec.parse_job` (checked before it is returned).
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.jobnames import dns_1035_name
from hetero_operator.api.podtemplate import OWNED_ENV, SHM_PATH, RESERVED_VOLUMES, WORKER_CONTAINER
from hetero_operator.api.spec import API_VERSION, KIND, parse_job
from hetero_operator.convert.images import image_entry
from hetero_operator.convert.launchers import split_launcher
from hetero_operator.convert.templatefit import fit_template

SOURCE_KINDS = {"PyTorchJob": "kubeflow.org/v1"}
"""What :func:`convert_pytorchjob` reads: kind -> apiVersion."""
KUBEFLOW_CONTAINER = "pytorch"
"""The container Kubeflow's training operator runs the ranks in (the one we convert)."""
KUBEFLOW_PORT_NAME = "pytorchjob-port"
REPLICA_TYPES = ("Master", "Worker")
DEFAULT_BATCH_PER_RANK = 32
"""``spec.training.globalBatchSize`` per rank when not given (a PyTorchJob has none)."""
SERVER_SET = ("metadata.uid", "metadata.resourceVersion", "metadata.generation",
              "metadata.creationTimestamp", "metadata.managedFields", "metadata.selfLink",
              "metadata.finalizers", "metadata.ownerReferences", "status", "apiVersion", "kind",
              "metadata.annotations[kubectl.kubernetes.io/last-applied-configuration]")
"""Input paths written by the API server or the tools, not by the user: neither mapped nor listed."""
GANG_RESTART = ("HeteroTrain restarts the whole gang when a rank fails (every rank's process group "
                "must be rebuilt), counted against spec.runPolicy.backoffLimit; there is no "
                "per-replica restart")
RENDEZVOUS = ("the operator runs the rendezvous itself (MASTER_ADDR is the job's rank-0 pod, "
              "heterotrain launch starts one process per planned GPU): no c10d/etcd rendezvous "
              "to configure")
class ConvertError(ValueError):
    """The input is no convertible PyTorchJob; names the field and the fix.

    Attributes:
        path: the input's field path.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True, kw_only=True, slots=True)
class Unmapped:
    """A field of the input with no place in the output.

    Attributes:
        path: the input's field path, e.g. ``spec.pytorchReplicaSpecs.Worker.restartPolicy``.
        reason: why, and what to do instead.
    """

    path: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Conversion:
    """What :func:`convert_pytorchjob` made.

    Attributes:
        job: the HeteroTrainingJob manifest (a dict for ``yaml.safe_dump``).
        unmapped: every input field not mapped, in the input's order.
        notes: what to check in the output (values the input did not state).
    """

    job: dict[str, Any]
    unmapped: tuple[Unmapped, ...]
    notes: tuple[str, ...]


def child_path(path: str, key: Any) -> str:
    """``path.key``, ``path[i]`` for a list index, ``path[key]`` for a key with ``.`` or ``/``
    (a label, a resource name)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if "." in str(key) or "/" in str(key):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class _Ledger:
    """Which input paths were used, and why the others were not."""

    def __init__(self) -> None:
        self.used: set[str] = set(SERVER_SET)
        self.why: dict[str, str] = {}
        self.notes: list[str] = []

    def use(self, *paths: str) -> None:
        self.used.update(paths)

    def skip(self, path: str, reason: str) -> None:
        self.why.setdefault(path, reason)

    def unmapped(self, doc: Any) -> tuple[Unmapped, ...]:
        out: list[Unmapped] = []

        def covered(path: str) -> bool:
            return any(path == u or path.startswith((f"{u}.", f"{u}[")) for u in self.used)

        def walk(node: Any, path: str) -> None:
            if path in self.why:
                out.append(Unmapped(path=path, reason=self.why[path]))
                return
            below = any(p.startswith((f"{path}.", f"{path}[")) for p in self.why) if path else True
            if covered(path) and not below:
                return
            items = (list(node.items()) if isinstance(node, Mapping) else list(enumerate(node))
                     if isinstance(node, list) else [])
            if not items:
                if not covered(path):
                    out.append(Unmapped(path=path, reason="no HeteroTrainingJob field holds it"))
                return
            for key, value in items:
                walk(value, child_path(path, key))
        walk(doc, "")
        return tuple(out)


def convert_pytorchjob(doc: Mapping[str, Any], *, global_batch_size: int | None = None) -> Conversion:
    """Convert a PyTorchJob manifest.

    Args:
        doc: the PyTorchJob as ``yaml.safe_load`` returns it.
        global_batch_size: ``spec.training.globalBatchSize`` (samples per optimizer step over all
            ranks); None: :data:`DEFAULT_BATCH_PER_RANK` x ranks, with a note to check it.

    Raises:
        ConvertError: not a PyTorchJob, no Master or Worker replica, no container to run.
    """
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    if kind == "TrainJob":
        raise ConvertError("kind", "a Kubeflow Trainer v2 TrainJob keeps its pod template in the "
                           "ClusterTrainingRuntime it references: not converted here; convert a "
                           "PyTorchJob (kubeflow.org/v1) or write spec.worker from the runtime's "
                           "trainer container (docs/migrating-from-kubeflow.md)")
    if kind not in SOURCE_KINDS:
        raise ConvertError("kind", f"must be PyTorchJob (kubeflow.org/v1), got {kind!r}")
    led = _Ledger()
    meta = dict(doc.get("metadata") or {})
    spec = dict(doc.get("spec") or {})
    replicas = dict(spec.get("pytorchReplicaSpecs") or {})
    present = [r for r in REPLICA_TYPES if r in replicas]
    if not present:
        raise ConvertError("spec.pytorchReplicaSpecs", "needs a Master or a Worker replica spec")
    for other in replicas:
        if other not in REPLICA_TYPES:
            led.skip(f"spec.pytorchReplicaSpecs.{other}", "only Master and Worker replicas run ranks")
    main = "Worker" if "Worker" in present else "Master"
    base = f"spec.pytorchReplicaSpecs.{main}"
    template = copy.deepcopy(dict(replicas[main].get("template") or {}))
    pod = dict(template.get("spec") or {})
    containers = list(pod.get("containers") or [])
    if not containers:
        raise ConvertError(f"{base}.template.spec.containers", "has no container to run")
    index = next((i for i, c in enumerate(containers) if c.get("name") == KUBEFLOW_CONTAINER), 0)
    cbase = f"{base}.template.spec.containers[{index}]"
    container = dict(containers[index])

    worker, launcher_procs = _worker(container, cbase, spec, led)
    ranks, min_ranks, procs = _ranks(replicas, present, spec, launcher_procs, container, led)
    _resources(worker, procs, led)
    pod_priority = pod.get("priorityClassName")
    worker["template"] = _template(template, pod, containers, index, base, cbase, container,
                                   worker, spec, led)
    for other in present:
        if other != main:
            _same_as_main(replicas[other], replicas[main], f"spec.pytorchReplicaSpecs.{other}", main, led)
        led.use(f"spec.pytorchReplicaSpecs.{other}.replicas", f"spec.pytorchReplicaSpecs.{other}.template")
        led.skip(f"spec.pytorchReplicaSpecs.{other}.restartPolicy", GANG_RESTART)
    job: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": _metadata(meta, led),
                           "spec": {"worker": worker}}
    images = _images(container.get("image"), f"{cbase}.image", led)
    if images:
        job["spec"]["images"] = images
    job["spec"]["gpus"] = {"ranks": ranks, **({"minRanks": min_ranks} if min_ranks < ranks else {})}
    if global_batch_size is None:
        global_batch_size = DEFAULT_BATCH_PER_RANK * ranks
        led.notes.append(f"spec.training.globalBatchSize is {global_batch_size} "
                         f"({DEFAULT_BATCH_PER_RANK} per rank x {ranks} ranks): a PyTorchJob states "
                         "no batch size; set your script's per-rank batch x ranks "
                         "(--global-batch-size)")
    job["spec"]["training"] = {"globalBatchSize": global_batch_size}
    run_policy = _run_policy(dict(spec.get("runPolicy") or {}), pod_priority,
                             f"{base}.template.spec.priorityClassName", led)
    if run_policy:
        job["spec"]["runPolicy"] = run_policy
    try:
        parse_job(job)
    except SpecError as exc:  # a mapping this module got wrong: say so, never write it
        raise ConvertError(exc.path, f"the converted job does not parse: {exc}") from exc
    return Conversion(job=job, unmapped=led.unmapped(doc), notes=tuple(led.notes))


def _worker(c: dict[str, Any], cbase: str, spec: Mapping[str, Any],
            led: _Ledger) -> tuple[dict[str, Any], int | None]:
    """``spec.worker`` without its template, and the launcher's ranks per replica (or None)."""
    launch = split_launcher([str(a) for a in c.get("command") or []], [str(a) for a in c.get("args") or []])
    if launch.launcher:
        led.notes.append(f"{cbase}: torchrun taken off ({' '.join(launch.dropped) or 'no options'}): "
                         "heterotrain launch starts one process per planned GPU")
    command, args = list(launch.command), list(launch.args)
    if not command:
        command, args = args, []
        led.notes.append(f"{cbase}.command: none (the image's ENTRYPOINT runs); spec.worker.command "
                         "is its args: put the ENTRYPOINT in front of them if it is not a launcher")
    if not command:
        raise ConvertError(f"{cbase}.command", "no command and no args: set spec.worker.command "
                           "to the program each rank runs")
    led.use(f"{cbase}.command", f"{cbase}.args", f"{cbase}.name")
    worker: dict[str, Any] = {"command": command}
    if args:
        worker["args"] = args
    env = []
    for i, item in enumerate(c.get("env") or []):
        if item.get("name") in OWNED_ENV:
            led.skip(f"{cbase}.env[{i}]", f"{item.get('name')} is set by the operator for every "
                     "rank (the env contract)")
        else:
            env.append(item)
            led.use(f"{cbase}.env[{i}]")
    if env:
        worker["env"] = env
    resources: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        for name, amount in ((c.get("resources") or {}).get(kind) or {}).items():
            path = f"{cbase}.resources.{kind}[{name}]"
            led.use(path)
            if not str(name).startswith("nvidia.com/"):
                resources.setdefault(kind, {})[name] = amount
    if resources:
        worker["resources"] = resources
    return worker, launch.nproc_per_node


def _gpus_of(c: Mapping[str, Any]) -> int:
    res = c.get("resources") or {}
    value = (res.get("limits") or {}).get("nvidia.com/gpu", (res.get("requests") or {}).get("nvidia.com/gpu", 0))
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _ranks(replicas: Mapping[str, Any], present: list[str], spec: Mapping[str, Any],
           launcher_procs: int | None, c: Mapping[str, Any], led: _Ledger) -> tuple[int, int, int]:
    """(spec.gpus.ranks, spec.gpus.minRanks, processes per replica) from replicas x processes
    per replica."""
    elastic = dict(spec.get("elasticPolicy") or {})
    nproc = str(spec.get("nprocPerNode") or elastic.get("nProcPerNode") or "")
    gpus = _gpus_of(c)
    if launcher_procs:
        procs = launcher_procs
    elif nproc.isdigit():
        procs = int(nproc)
    else:
        procs = gpus or 1
    led.use("spec.nprocPerNode", "spec.elasticPolicy.nProcPerNode")
    if nproc == "cpu":
        led.skip("spec.nprocPerNode", "HeteroTrain runs one rank per GPU (nprocPerNode: cpu has no "
                 "equivalent; heterotrain run simulates GPUs on CPUs for a try-out)")
    if gpus and procs != gpus:
        led.notes.append(f"{procs} processes per replica but {gpus} GPUs per replica: HeteroTrain "
                         f"runs one rank per GPU, so spec.gpus.ranks counts {procs} per replica")
    pods = {r: int(replicas[r].get("replicas", 1)) for r in present}
    ranks = sum(pods.values()) * procs
    if elastic.get("maxReplicas"):
        ranks = max(ranks, int(elastic["maxReplicas"]) * procs)
        led.use("spec.elasticPolicy.maxReplicas")
    min_ranks = ranks
    if elastic.get("minReplicas"):
        min_ranks = int(elastic["minReplicas"]) * procs
        led.use("spec.elasticPolicy.minReplicas")
        led.skip("spec.runPolicy.schedulingPolicy.minAvailable", "spec.elasticPolicy.minReplicas "
                 "gives spec.gpus.minRanks (the fewest ranks the job starts with)")
    elif ((spec.get("runPolicy") or {}).get("schedulingPolicy") or {}).get("minAvailable"):
        min_ranks = int(spec["runPolicy"]["schedulingPolicy"]["minAvailable"]) * procs
        led.use("spec.runPolicy.schedulingPolicy.minAvailable")
    for key in ("rdzvBackend", "rdzvHost", "rdzvPort", "rdzvId", "rdzvConf", "standalone"):
        led.skip(f"spec.elasticPolicy.{key}", RENDEZVOUS)
    led.skip("spec.elasticPolicy.maxRestarts", GANG_RESTART)
    led.skip("spec.elasticPolicy.metrics", "HeteroTrain does not resize a running job from "
             "metrics: the planner places up to spec.gpus.ranks at each start (delete and "
             "re-create the job to resize; it resumes from its checkpoint)")
    return ranks, max(1, min(min_ranks, ranks)), procs


def _resources(worker: dict[str, Any], procs: int, led: _Ledger) -> None:
    """A replica's CPU and memory (Kubeflow's are per replica, i.e. per ``procs`` ranks) as
    ``spec.worker.resourcesPerRank`` (a pod of the plan gets them times its ranks); kept per pod
    (``spec.worker.resources``) where a quantity does not divide by ``procs``."""
    per_replica = worker.pop("resources", None)
    if not per_replica:
        return
    per_rank: dict[str, dict[str, Any]] = {}
    per_pod: dict[str, dict[str, Any]] = {}
    for kind, amounts in per_replica.items():
        for name, amount in amounts.items():
            share = _divided(amount, procs)
            if share is None:
                per_pod.setdefault(kind, {})[name] = amount
                led.notes.append(f"spec.worker.resources.{kind}.{name}: {amount} per replica does not "
                                 f"divide by its {procs} ranks: kept per pod (resourcesPerRank for a "
                                 "per-rank amount)")
            else:
                per_rank.setdefault(kind, {})[name] = share
    if per_rank:
        worker["resourcesPerRank"] = per_rank
    if per_pod:
        worker["resources"] = per_pod


def _divided(amount: Any, procs: int) -> Any:
    """``amount`` (a quantity) / ``procs`` as a quantity of the same suffix (CPU in millicores
    when needed); ``amount`` itself for one; None when it does not divide exactly."""
    if procs == 1:
        return amount
    m = re.match(r"^(\d+(?:\.\d+)?)([A-Za-z]*)$", str(amount).strip())
    if m is None:
        return None
    share = Decimal(m.group(1)) / procs
    if share == share.to_integral_value():
        return f"{int(share)}{m.group(2)}"
    if not m.group(2) and share * 1000 == (share * 1000).to_integral_value():
        return f"{int(share * 1000)}m"
    return None


def _template(template: dict[str, Any], pod: dict[str, Any], containers: list[dict[str, Any]],
              index: int, base: str, cbase: str, c: Mapping[str, Any], worker: dict[str, Any],
              spec: Mapping[str, Any], led: _Ledger) -> dict[str, Any]:
    """``spec.worker.template``: the replica's pod template fitted to our rules."""
    led.use(f"{base}.template")
    for i, other in enumerate(containers):
        if i != index:
            led.skip(f"{base}.template.spec.containers[{i}]", "only the training container is "
                     "converted: put a sidecar in initContainers with restartPolicy: Always "
                     "(a native sidecar stops when the worker exits)")
    mine = {"name": WORKER_CONTAINER, **{k: copy.deepcopy(v) for k, v in c.items()
                                         if k not in ("name", "image", "command", "args", "env", "resources")}}
    ports = []
    for i, port in enumerate(mine.pop("ports", None) or []):
        if port.get("name") == KUBEFLOW_PORT_NAME or port.get("containerPort") == 23456:
            led.skip(f"{cbase}.ports[{i}]", "the rendezvous port is the operator's (MASTER_PORT)")
        else:
            ports.append(port)
    if ports:
        mine["ports"] = ports
    volumes = pod.get("volumes") or []
    mounts = mine.get("volumeMounts") or []
    shm = [m.get("name") for m in mounts if m.get("mountPath") == SHM_PATH]
    for i, v in enumerate(list(volumes)):
        if v.get("name") in shm and "emptyDir" in v:
            size = (v.get("emptyDir") or {}).get("sizeLimit")
            if size is not None:
                worker["sharedMemorySize"] = str(size)
            led.notes.append(f"{base}.template.spec.volumes[{i}] ({SHM_PATH}): the operator mounts "
                             f"/dev/shm itself; spec.worker.sharedMemorySize is "
                             f"{size if size is not None else 'its default (2 GiB per rank)'}")
        elif v.get("name") in RESERVED_VOLUMES:
            new = f"{v['name']}-volume"
            for m in mounts:
                if m.get("name") == v["name"]:
                    m["name"] = new
            led.notes.append(f"{base}.template.spec.volumes[{i}]: renamed {v['name']} -> {new} "
                             "(the name is the operator's)")
            v["name"] = new
    pod["volumes"] = [v for v in volumes if not (v.get("name") in shm and "emptyDir" in v)]
    if not pod["volumes"]:
        pod.pop("volumes")
    if mounts:
        mine["volumeMounts"] = [m for m in mounts if m.get("mountPath") != SHM_PATH]
        if not mine["volumeMounts"]:
            mine.pop("volumeMounts")
    pod.pop("priorityClassName", None)  # spec.runPolicy.schedulingPolicy.priorityClass (_run_policy)
    pod["containers"] = [mine] if len(mine) > 1 else []
    if not pod["containers"]:
        pod.pop("containers")
    template["spec"] = pod
    cmap = f"{base}.template"

    def source(rel: str) -> str:
        return cmap + rel.replace(".spec.containers[0]", f".spec.containers[{index}]", 1)
    fit_template(template, source=source, removed=led.skip)
    kept = {v.get("name") for v in pod.get("volumes") or []}
    worker_c = next(iter(pod.get("containers") or []), {})
    original = [(m.get("name"), m.get("mountPath")) for m in c.get("volumeMounts") or []]
    for m in list(worker_c.get("volumeMounts") or []):
        if m.get("name") not in kept:
            worker_c["volumeMounts"].remove(m)
            i = original.index((m.get("name"), m.get("mountPath")))
            led.skip(f"{cbase}.volumeMounts[{i}]", f"its volume {m.get('name')} was not converted")
    return {k: v for k, v in template.items() if v}


def _same_as_main(other: Mapping[str, Any], main: Mapping[str, Any], base: str, main_name: str,
                  led: _Ledger) -> None:
    """List every field of another replica's template that differs from the main one's."""
    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k, v in a.items():
                walk(v, b.get(k), child_path(path, k))
        elif isinstance(a, list) and isinstance(b, list) and _named(a) and _named(b):
            by_name = {item["name"]: item for item in b}  # env, volumes, mounts, containers
            for i, x in enumerate(a):
                walk(x, by_name.get(x["name"]), f"{path}[{i}]")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif a != b:
            led.skip(path, f"differs from {main_name}'s: every rank runs one program in one pod "
                     f"template ({main_name}'s is used; rank 0 is the first rank of the plan)")
    walk(other.get("template") or {}, main.get("template") or {}, f"{base}.template")


def _named(items: list[Any]) -> bool:
    """Every item a mapping with a distinct ``name`` (env, volumes, mounts, containers)."""
    names = [item.get("name") for item in items if isinstance(item, Mapping)]
    return len(names) == len(items) and None not in names and len(set(names)) == len(names)


def _metadata(meta: Mapping[str, Any], led: _Ledger) -> dict[str, Any]:
    name = str(meta.get("name") or "")
    fixed = dns_1035_name(name)
    if fixed != name:
        led.notes.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most 50 "
                         f"characters; the job is named {fixed!r}")
    out: dict[str, Any] = {"name": fixed}
    for key in ("namespace", "labels", "annotations"):
        value = meta.get(key)
        if key == "annotations" and value:
            value = {k: v for k, v in value.items() if k != "kubectl.kubernetes.io/last-applied-configuration"}
        if value:
            out[key] = copy.deepcopy(value)
        led.use(f"metadata.{key}")
    led.use("metadata.name")
    return out


def _run_policy(rp: Mapping[str, Any], pod_priority: Any, priority_path: str,
                led: _Ledger) -> dict[str, Any]:
    """``spec.runPolicy``: the same names, and the pod template's priorityClassName as
    ``schedulingPolicy.priorityClass`` when the run policy names none."""
    out: dict[str, Any] = {}
    for key in ("backoffLimit", "cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                "suspend"):
        if key in rp:
            out[key] = rp[key]
            led.use(f"spec.runPolicy.{key}")
    sched_in = dict(rp.get("schedulingPolicy") or {})
    sched = {k: sched_in[k] for k in ("queue", "priorityClass") if sched_in.get(k)}
    led.use("spec.runPolicy.schedulingPolicy.queue", "spec.runPolicy.schedulingPolicy.priorityClass")
    if pod_priority and sched.get("priorityClass", pod_priority) != pod_priority:
        led.skip(priority_path, "differs from spec.runPolicy.schedulingPolicy.priorityClass, "
                 "which is used")
    elif pod_priority:
        sched["priorityClass"] = pod_priority
    led.skip("spec.runPolicy.schedulingPolicy.minResources", "the planner computes what the job "
             "needs from spec.gpus and the nodes; Kueue admits it from the Workload the operator "
             "writes")
    led.skip("spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds", "a job waits Pending with "
             "the shortfall until its minRanks fit; set spec.runPolicy.activeDeadlineSeconds to bound "
             "the whole run")
    led.skip("spec.runPolicy.managedBy", "the HeteroTrain operator manages every HeteroTrainingJob")
    if sched:
        out["schedulingPolicy"] = sched
    return out


def _images(image: Any, path: str, led: _Ledger) -> list[dict[str, Any]]:
    """``spec.images`` from the container's image when its tag names the CUDA version; else []
    (the default images) with the field listed."""
    if not image:
        return []
    entry = image_entry(str(image))
    if entry is None:
        led.skip(path, f"its tag names no CUDA version, and each entry of spec.images needs one "
                 f"(cudaVersion, computeCapabilities): add {image} there; meanwhile the job runs "
                 "the default images, which do not hold your script")
        return []
    led.use(path)
    led.notes.append(f"spec.images[0]: cudaVersion {entry['cudaVersion']} read from the tag; "
                     f"computeCapabilities are PyTorch's release builds for it: check your image")
    return [entry]
