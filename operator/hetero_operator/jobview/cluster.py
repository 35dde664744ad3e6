"""A HeteroTrainingJob on a cluster as ``heterotrain status`` and ``heterotrain logs`` show it,
read through the API server with the official Kubernetes client (the job's status; the log of the
pod that hosts a rank, through ``pods/log`` as ``kubectl logs`` reads it).

Credentials as kubectl finds them: ``--kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``,
else the pod's service account.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hetero_operator.api.labels import ANNOTATION_GPU_TYPE, ANNOTATION_RANKS, LABEL_ATTEMPT, LABEL_JOB
from hetero_operator.api.podtemplate import WORKER_CONTAINER
from hetero_operator.api.spec import API_GROUP, PLURAL, VERSION

TERMINAL = ("Succeeded", "Failed")
STATES = ("Succeeded", "Failed", "Suspended", "Running", "Restarting", "Created", "Scheduled", "Pending")
"""Condition types that name a state, the one that wins first (a job Running and Created is
Running)."""


class ClusterError(RuntimeError):
    """The API server cannot be reached or answers with an error; the message says which."""


def clients(kubeconfig: str | None) -> tuple[Any, Any]:
    """``(CustomObjectsApi, CoreV1Api)`` from ``kubeconfig`` (None: kubectl's search order).

    Raises:
        ClusterError: no configuration found.
    """
    import kubernetes

    config = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        else:
            try:
                kubernetes.config.load_kube_config(client_configuration=config)
            except (kubernetes.config.ConfigException, TypeError):
                kubernetes.config.load_incluster_config(client_configuration=config)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise ClusterError(f"no cluster configuration ({exc}): pass --kubeconfig or set KUBECONFIG "
                           "(heterotrain cluster up prints one)") from None
    api = kubernetes.client.ApiClient(config)
    return kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, as kubectl takes it (``default``
    without one, or in a pod: its service account's namespace)."""
    import kubernetes
    try:
        _, current = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        return str((current.get("context") or {}).get("namespace") or "default")
    except (kubernetes.config.ConfigException, OSError, TypeError):
        pod_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return pod_ns.read_text().strip() if pod_ns.is_file() else "default"


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    import kubernetes
    import urllib3
    try:
        return fn(*args, **kwargs)
    except kubernetes.client.ApiException as exc:
        reason = exc.reason if exc.status != 404 else "not found"
        raise ClusterError(f"{what}: {exc.status} {reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterError(f"{what}: the API server cannot be reached ({exc})") from None


def read_job(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    """The HeteroTrainingJob object.

    Raises:
        ClusterError: not found, forbidden, or no API server.
    """
    return _call(f"HeteroTrainingJob {namespace}/{name}", custom.get_namespaced_custom_object,
                 API_GROUP, VERSION, namespace, PLURAL, name)


def state_of(job: Mapping[str, Any]) -> tuple[str, str]:
    """(state, its condition's message) from ``status.conditions`` (``Unknown`` without one)."""
    true = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or ()
            if c.get("status") == "True"}
    for state in STATES:
        if state in true:
            return state, str(true[state].get("message") or "")
    return "Unknown", ""


def status_lines(job: Mapping[str, Any]) -> list[str]:
    """The job's status as ``field  value`` lines: state, plan, progress, result, last failure."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    state, message = state_of(job)
    plan = status.get("plan") or {}
    groups = plan.get("groups") or []
    devices = Counter()
    for g in groups:
        devices[str(g.get("gpuType") or "?")] += int(g.get("ranks") or 0)
    out = [("Job", f"{meta.get('namespace')}/{meta.get('name')} (on the cluster)"),
           ("State", state + (f": {message}" if message else ""))]
    if plan:
        out.append(("Plan", f"{plan.get('worldSize')} ranks in {len(groups)} pod"
                            f"{'s' if len(groups) != 1 else ''}"
                    + (": " + ", ".join(f"{n}x {d}" for d, n in devices.most_common()) if devices else "")))
    progress = status.get("progress") or {}
    if progress:
        text = f"step {progress.get('step')}" + (f" of {progress['totalSteps']}" if progress.get("totalSteps") else "")
        for key, label in (("loss", "loss"), ("samplesPerSecond", "samples/s"), ("eta", "eta")):
            if progress.get(key) is not None:
                text += f", {label} {progress[key]}"
        out.append(("Progress", text))
    if isinstance(status.get("result"), Mapping):
        out.append(("Result", result_text(status["result"])))
    if status.get("lastFailure"):
        out.append(("Failure", str(status["lastFailure"])))
    out.append(("Logs", f"heterotrain logs {meta.get('name')} -n {meta.get('namespace')} --rank R"))
    return [f"{k:<9} {v}" for k, v in out]


def result_text(result: Mapping[str, Any]) -> str:
    """``status.result`` in words: the metrics the script reported, then the final loss and step
    (``accuracy 0.972, final loss 0.0412 at step 120``)."""
    parts = [f"{k} {v}" for k, v in sorted((result.get("metrics") or {}).items())]
    final = f"final loss {result['loss']}" if result.get("loss") is not None else ""
    if result.get("step") is not None:
        final = f"{final} at step {result['step']}" if final else f"step {result['step']}"
    return ", ".join([*parts, *([final] if final else [])]) or "none reported"


def hosts_rank(annotation: str, rank: int) -> bool:
    """Whether a pod's :data:`ANNOTATION_RANKS` (``"3"`` or ``"2-5"``) includes ``rank``."""
    first, _, last = str(annotation).partition("-")
    try:
        return int(first) <= rank <= int(last or first)
    except ValueError:
        return False


def rank_pod(core: Any, namespace: str, job: str, rank: int, custom: Any = None) -> dict[str, Any]:
    """The job's pod that hosts ``rank`` (of the newest attempt).

    Raises:
        ClusterError: no pod hosts it (the job has no pods yet, or fewer ranks; with ``custom``, a
            finished job whose ``cleanPodPolicy`` removed it: :func:`cleaned_rank_text`).
    """
    pods = _call(f"pods of {namespace}/{job}", core.list_namespaced_pod, namespace,
                 label_selector=f"{LABEL_JOB}={job}", _preload_content=False)
    import json
    items = json.loads(pods.data).get("items") or []
    mine = [p for p in items if hosts_rank((p["metadata"].get("annotations") or {}).get(ANNOTATION_RANKS, ""), rank)]
    if not mine:
        cleaned = None
        if custom is not None:
            with contextlib.suppress(ClusterError):
                cleaned = cleaned_rank_text(read_job(custom, namespace, job), rank)
        raise ClusterError(cleaned or f"no pod of {namespace}/{job} hosts rank {rank} ({len(items)} pods: the "
                           "job has not started, or has fewer ranks; heterotrain status shows its state)")
    return max(mine, key=lambda p: int((p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "0") or 0))


def cleaned_rank_text(job: Mapping[str, Any], rank: int) -> str | None:
    """Why a finished job's ``rank`` has no pod when its ``spec.runPolicy.cleanPodPolicy``
    (``Running`` by default, or ``All``) removed it and its plan has that rank; ``None`` otherwise."""
    state, _ = state_of(job)
    set_policy = ((job.get("spec") or {}).get("runPolicy") or {}).get("cleanPodPolicy")
    policy = str(set_policy or "Running")
    plan = (job.get("status") or {}).get("plan") or {}
    world = int(plan.get("worldSize") or sum(int(g.get("ranks") or 0) for g in plan.get("groups") or ()))
    if state not in ("Succeeded", "Failed") or policy == "None" or not 0 <= rank < world:
        return None
    meta = job.get("metadata") or {}
    which = "every pod" if policy == "All" else "the pods still running when it finished"
    return (f"rank {rank} of {meta.get('namespace')}/{meta.get('name')} has no pod any more: the job {state} and "
            f"its spec.runPolicy.cleanPodPolicy ({policy}{'' if set_policy else ', the default'}) deleted {which}; to keep a finished job's pods "
            "and their logs, set spec.runPolicy.cleanPodPolicy: None")


def pod_header(pod: Mapping[str, Any]) -> str:
    """``pod X (ranks 2-3, Tesla-T4, on node-t4): Running``."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    return (f"pod {meta.get('name')} (ranks {ann.get(ANNOTATION_RANKS, '?')}, "
            f"{ann.get(ANNOTATION_GPU_TYPE, '?')}, on {(pod.get('spec') or {}).get('nodeName') or 'no node'}): "
            f"{(pod.get('status') or {}).get('phase', '?')}")


def pod_log(core: Any, namespace: str, pod: str, *, follow: bool, tail_lines: int | None = None,
            previous: bool = False) -> Iterator[bytes]:
    """The worker container's log as it comes (``pods/log``; with ``follow`` until the container
    ends, as ``kubectl logs -f``).

    Raises:
        ClusterError: the API server refuses (no such pod, container not started, the kubelet
            cannot be reached: its message is kept).
    """
    kwargs: dict[str, Any] = {"container": WORKER_CONTAINER, "follow": follow, "_preload_content": False,
                              "previous": previous}
    if tail_lines is not None:
        kwargs["tail_lines"] = tail_lines
    import kubernetes
    try:
        response = core.read_namespaced_pod_log(pod, namespace, **kwargs)
    except kubernetes.client.ApiException as exc:
        body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
        raise ClusterError(f"log of pod {namespace}/{pod}: {exc.status} {_message(body) or exc.reason}") from None
    try:
        yield from response.stream(4096)
    finally:
        response.release_conn()


def _message(body: str) -> str:
    import json
    try:
        return str(json.loads(body).get("message") or "")
    except ValueError:
        return body.strip()


def kubeconfig_hint(path: str | None) -> str:
    """``--kubeconfig PATH`` for messages, ``""`` without one."""
    return f" --kubeconfig {Path(path)}" if path else ""
