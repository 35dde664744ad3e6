"""The local kubelet's volumes: a local-path provisioner for PersistentVolumeClaims, and each pod's
volumes (PVC, emptyDir, ConfigMap, Secret) as folders under the cluster dir.

The local kubelet runs a pod's containers as processes on the host, so a volume cannot be mounted
at its ``mountPath``; instead every volume is a folder under the cluster dir and the container's
env values, args and ``workingDir`` that name a path under a ``mountPath`` are rewritten to that
folder (:func:`rewrite`): ``HTJ_CHECKPOINT_DIR=/checkpoints/digits`` with the checkpoint claim
mounted at ``/checkpoints/digits`` becomes ``<cluster dir>/volumes/<ns>_<claim>_<uid>``.  A process
that builds a path some other way (a constant in its code) is not redirected: docs/cluster.md.

* **PersistentVolumeClaims**: :func:`provision` plays a local-path provisioner (as kind's and
  k3s's do): for a pending claim of the StorageClass :data:`STORAGE_CLASS` (or of no class) it
  creates a ``hostPath`` PersistentVolume on a new folder under ``<cluster dir>/volumes``,
  pre-bound to the claim (``claimRef``); kube-controller-manager's PV controller binds them. A
  released volume of ours (its claim deleted) is deleted with its folder.
* **emptyDir, ConfigMap, Secret, downwardAPI, projected**: folders under the pod's folder
  ``pods/<ns>_<pod>_<uid>/``; ConfigMap and Secret keys become files with the volume's ``items``,
  ``mode`` / ``defaultMode``; downward-API items their ``fieldRef`` value; a projected
  ``serviceAccountToken`` a TokenRequest token of the pod's service account (the API server's
  ServiceAccount admission adds such a ``kube-api-access-*`` volume to every pod that mounts a
  token).
* **Refused** (:class:`Refused`, the kubelet posts a ``FailedMount`` Event and leaves the pod
  ``Pending`` as a kubelet does): ``hostPath`` (it would reach outside the cluster dir), a claim
  whose volume is not a folder under ``<cluster dir>/volumes``, a ``subPath`` leaving its volume,
  ``subPathExpr``, a missing ConfigMap/Secret that is not ``optional``, and any other volume type
  (``csi``, ``ephemeral``, ``image``, ...).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_operator.api.labels import LOCAL_PATH_PROVISIONER

from . import podenv
from .kubeapi import Api, ApiError

STORAGE_CLASS = "local-path"
"""The StorageClass of the local cluster's provisioner (created by :func:`provision`)."""
PROVISIONER = LOCAL_PATH_PROVISIONER
"""Its ``provisioner``, also the ``pv.kubernetes.io/provisioned-by`` of the volumes it makes."""
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
VOLUMES_DIR = "volumes"
"""Folder of the cluster dir that holds every PersistentVolume's folder."""
DEFAULT_MODE = 0o644
"""A ConfigMap or Secret volume's file mode when it names none (Kubernetes' default)."""
SUPPORTED = ("persistentVolumeClaim", "emptyDir", "configMap", "secret", "projected", "downwardAPI")
MOUNT_EVENT_REASON = "FailedMount"


class Refused(Exception):
    """A volume the local kubelet does not mount; the message says why and what to use."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A container's mount: its ``mountPath`` and the host folder standing in for it."""

    mount_path: str
    host_path: Path
    read_only: bool = False


def volume_root(cluster_dir: Path) -> Path:
    """Where PersistentVolume folders live: ``<cluster dir>/volumes``."""
    return cluster_dir / VOLUMES_DIR


def pod_folder(pod_dir: Path, pod: Mapping[str, Any]) -> Path:
    """The pod's own folder (emptyDir, ConfigMap and Secret volumes): ``pods/<ns>_<name>_<uid8>``."""
    meta = pod["metadata"]
    return pod_dir / f"{meta['namespace']}_{meta['name']}_{str(meta['uid'])[:8]}"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _safe_join(base: Path, rel: str, what: str) -> Path:
    """``base / rel`` for a relative path that stays inside ``base``.

    Raises:
        Refused: ``rel`` is absolute or leaves ``base`` (``..``).
    """
    if not rel:
        return base
    if rel.startswith("/") or ".." in Path(rel).parts:
        raise Refused(f"{what} {rel!r} must be a relative path inside the volume")
    return base / rel


# --- the provisioner --------------------------------------------------------------------------

def storage_class() -> dict[str, Any]:
    """The StorageClass object of :data:`STORAGE_CLASS` (not the default class: claims without
    a class are served too)."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
            "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}


def wants_volume(pvc: Mapping[str, Any]) -> bool:
    """A claim this provisioner serves: pending, not bound to a volume, of our class or none."""
    spec = pvc.get("spec") or {}
    return ((pvc.get("status") or {}).get("phase", "Pending") == "Pending" and not spec.get("volumeName")
            and not (pvc.get("metadata") or {}).get("deletionTimestamp")
            and spec.get("storageClassName") in (None, "", STORAGE_CLASS)
            and not spec.get("selector") and not spec.get("dataSource"))


def persistent_volume(pvc: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """The ``hostPath`` PersistentVolume for ``pvc`` on the folder ``root/<ns>_<claim>_<uid8>``,
    pre-bound to the claim, with the claim's access modes, size and class."""
    meta, spec = pvc["metadata"], pvc.get("spec") or {}
    uid = str(meta["uid"])
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{uid}", "annotations": {PROVISIONED_BY: PROVISIONER},
                         "labels": {LOCAL_PATH_PROVISIONER: "true"}},
            "spec": {"capacity": {"storage": size},
                     "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                     "persistentVolumeReclaimPolicy": "Delete",
                     "storageClassName": spec.get("storageClassName") or "",
                     "volumeMode": spec.get("volumeMode") or "Filesystem",
                     "hostPath": {"path": str(root / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"),
                                  "type": "DirectoryOrCreate"},
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "namespace": meta["namespace"], "name": meta["name"], "uid": uid}}}


def released_ours(pv: Mapping[str, Any]) -> bool:
    """A volume this provisioner made whose claim is gone (``Released``, reclaim ``Delete``)."""
    ann = (pv.get("metadata") or {}).get("annotations") or {}
    return (ann.get(PROVISIONED_BY) == PROVISIONER and (pv.get("status") or {}).get("phase") == "Released"
            and (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete")


async def provision(api: Api, root: Path) -> None:
    """Run the local-path provisioner until cancelled (see the module doc)."""
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(ApiError):
        await api.create("/apis/storage.k8s.io/v1/storageclasses", storage_class())
    await asyncio.gather(_claims(api, root), _released(api, root))


async def _claims(api: Api, root: Path) -> None:
    async for type_, pvc in api.watch("/api/v1/persistentvolumeclaims"):
        if type_ in ("ADDED", "MODIFIED") and wants_volume(pvc):
            pv = persistent_volume(pvc, root)
            Path(pv["spec"]["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)
            try:
                await api.create("/api/v1/persistentvolumes", pv)
            except ApiError as exc:
                if exc.status != 409:
                    print(f"kubelet: provisioning {pvc['metadata']['name']}: {exc}", file=sys.stderr, flush=True)


async def _released(api: Api, root: Path) -> None:
    async for type_, pv in api.watch("/api/v1/persistentvolumes"):
        if type_ in ("ADDED", "MODIFIED") and released_ours(pv):
            folder = Path(pv["spec"]["hostPath"]["path"])
            if _inside(folder, root):
                shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(ApiError):
                await api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


# --- a pod's volumes --------------------------------------------------------------------------

async def prepare(api: Api, pod: Mapping[str, Any], container: Mapping[str, Any], *, pod_dir: Path,
                  cluster_dir: Path) -> list[Mount]:
    """The host folders of ``container``'s ``volumeMounts`` (made and filled), longest
    ``mountPath`` first.

    Raises:
        Refused: a volume or mount the local kubelet does not mount (see the module doc).
    """
    ns = pod["metadata"]["namespace"]
    volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or ()}
    folder = pod_folder(pod_dir, pod)
    made: dict[str, Path] = {}
    mounts = []
    for m in container.get("volumeMounts") or ():
        if m.get("subPathExpr"):
            raise Refused(f"volumeMount {m['name']}: subPathExpr is not supported by the local kubelet")
        vol = volumes.get(m["name"])
        if vol is None:
            raise Refused(f"volumeMount {m['name']}: no volume of that name")
        if m["name"] not in made:
            made[m["name"]] = await _volume_folder(api, pod, vol, folder / "volumes" / vol["name"], cluster_dir)
        host = _safe_join(made[m["name"]], m.get("subPath") or "", f"volumeMount {m['name']}: subPath")
        host.mkdir(parents=True, exist_ok=True)
        if not _inside(host, cluster_dir):
            raise Refused(f"volumeMount {m['name']}: {host} is outside the cluster dir {cluster_dir}")
        mounts.append(Mount(str(m["mountPath"]).rstrip("/") or "/", host, bool(m.get("readOnly"))))
    return sorted(mounts, key=lambda x: -len(x.mount_path))


async def _volume_folder(api: Api, pod: Mapping[str, Any], vol: Mapping[str, Any], folder: Path,
                         cluster_dir: Path) -> Path:
    name, ns = vol["name"], pod["metadata"]["namespace"]
    if "hostPath" in vol:
        raise Refused(f"volume {name}: hostPath is refused by the local kubelet: it runs the pod's "
                      f"processes on this machine and mounts nothing outside the cluster dir {cluster_dir}; "
                      "use a persistentVolumeClaim or an emptyDir")
    kind = next((k for k in SUPPORTED if k in vol), None)
    if kind is None:
        other = next((k for k in vol if k != "name"), "?")
        raise Refused(f"volume {name}: {other} is not supported by the local kubelet "
                      f"(it mounts {', '.join(SUPPORTED)})")
    if kind == "persistentVolumeClaim":
        return await _claim_folder(api, ns, name, vol[kind], cluster_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "emptyDir":
        return folder
    if kind in ("projected", "downwardAPI"):
        await _projected(api, pod, vol, folder)
        return folder
    src = vol[kind]
    ref = src.get("name") if kind == "configMap" else src.get("secretName")
    plural = "configmaps" if kind == "configMap" else "secrets"
    try:
        obj = await api.get(f"/api/v1/namespaces/{ns}/{plural}/{ref}")
    except ApiError as exc:
        if exc.status == 404 and src.get("optional"):
            return folder
        raise Refused(f"volume {name}: {kind} {ns}/{ref}: {exc.message or exc}") from None
    _write_keys(folder, _keys(kind, obj), src.get("items"), int(src.get("defaultMode", DEFAULT_MODE)), f"volume {name}")
    return folder


async def _claim_folder(api: Api, ns: str, name: str, src: Mapping[str, Any], cluster_dir: Path) -> Path:
    claim = src.get("claimName", "")
    try:
        pvc = await api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        if not pv_name:
            raise Refused(f"volume {name}: persistentvolumeclaim {claim} is not bound")
        pv = await api.get(f"/api/v1/persistentvolumes/{pv_name}")
    except ApiError as exc:
        raise Refused(f"volume {name}: persistentvolumeclaim {claim}: {exc.message or exc}") from None
    path = ((pv.get("spec") or {}).get("hostPath") or {}).get("path")
    root = volume_root(cluster_dir)
    if not path or not _inside(Path(path), root):
        raise Refused(f"volume {name}: persistentvolumeclaim {claim} is bound to {pv_name}, which is not a "
                      f"folder under {root}: the local kubelet mounts only volumes of its provisioner "
                      f"(StorageClass {STORAGE_CLASS})")
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


async def _projected(api: Api, pod: Mapping[str, Any], vol: Mapping[str, Any], folder: Path) -> None:
    """A ``projected`` (or ``downwardAPI``) volume's files: its sources' ConfigMap and Secret keys,
    downward-API values and service-account token."""
    from .podenv import field_value
    meta, name = pod["metadata"], vol["name"]
    src = vol.get("projected") or {}
    default_mode = int(src.get("defaultMode", (vol.get("downwardAPI") or {}).get("defaultMode", DEFAULT_MODE)))
    sources = [{"downwardAPI": vol["downwardAPI"]}] if "downwardAPI" in vol else list(src.get("sources") or [])
    for source in sources:
        if "serviceAccountToken" in source:
            tok = source["serviceAccountToken"]
            sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
            answer = await api.create(
                f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                    "expirationSeconds": int(tok.get("expirationSeconds", 3600)),
                    **({"audiences": [tok["audience"]]} if tok.get("audience") else {}),
                    "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}}})
            _write_keys(folder, {"token": answer["status"]["token"].encode()},
                        [{"key": "token", "path": tok.get("path") or "token"}], default_mode, f"volume {name}")
        elif "downwardAPI" in source:
            items = (source["downwardAPI"] or {}).get("items") or []
            data = {i["path"]: (field_value(pod, i["fieldRef"]["fieldPath"]) if "fieldRef" in i else "0").encode()
                    for i in items}
            _write_keys(folder, data, [{"key": i["path"], "path": i["path"], **({"mode": i["mode"]} if "mode" in i
                                                                                   else {})} for i in items],
                        default_mode, f"volume {name}")
        elif "configMap" in source or "secret" in source:
            kind = "configMap" if "configMap" in source else "secret"
            ref = source[kind]
            plural = "configmaps" if kind == "configMap" else "secrets"
            try:
                obj = await api.get(f"/api/v1/namespaces/{meta['namespace']}/{plural}/{ref.get('name')}")
            except ApiError as exc:
                if exc.status == 404 and ref.get("optional"):
                    continue
                raise Refused(f"volume {name}: {kind} {ref.get('name')}: {exc.message or exc}") from None
            _write_keys(folder, _keys(kind, obj), ref.get("items"), default_mode, f"volume {name}")
        else:
            raise Refused(f"volume {name}: projected source {next(iter(source), '?')} is not supported "
                          "by the local kubelet")


def _keys(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's or Secret's keys as bytes (``data``, then ``binaryData``)."""
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()} if kind == "configMap" else \
        {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _write_keys(folder: Path, data: Mapping[str, bytes], items: Sequence[Mapping[str, Any]] | None,
                default_mode: int, what: str) -> None:
    """The keys of a ConfigMap/Secret as files: all of them, or ``items`` (``key``, ``path``,
    ``mode``); a missing key of ``items`` is refused as a kubelet does."""
    chosen = [(i["key"], i.get("path") or i["key"], int(i.get("mode", default_mode))) for i in items] if items \
        else [(k, k, default_mode) for k in sorted(data)]
    for key, rel, mode in chosen:
        if key not in data:
            raise Refused(f"{what}: no key {key!r}")
        path = _safe_join(folder, rel, f"{what}: item path")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, data[key])
        finally:
            os.close(fd)
        os.chmod(path, mode)  # the umask narrows os.open's mode


def rewrite(value: str, mounts: Sequence[Mount]) -> str:
    """``value`` with every path under a mount's ``mountPath`` (the path itself, or followed by
    ``/``; standing alone or after ``=``, ``:``, ``,`` or a space) replaced by the mount's host
    folder, in one pass (a host folder is never rewritten again), the longest ``mountPath`` first."""
    paths = {m.mount_path: str(m.host_path) for m in mounts if m.mount_path != "/"}
    if not paths:
        return value
    alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    pattern = rf"(?<![^\s=:,])({alternatives})(?=/|$|[\s:,])"
    return re.sub(pattern, lambda m: paths[m.group(1)], value)


def working_dir(container: Mapping[str, Any], mounts: Sequence[Mount], default: Path) -> str:
    """The container's working directory: its ``workingDir`` with a path under a ``mountPath``
    rewritten (:func:`rewrite`), else ``default`` (the checkout) as it is: the kubelet's own
    directory is no path of the container, so a volume mounted at a parent of it (an emptyDir at
    ``/tmp`` with the checkout under ``/tmp``) does not move it."""
    return rewrite(str(container["workingDir"]), mounts) if container.get("workingDir") else str(default)


def remove_pod_folder(pod_dir: Path, pod: Mapping[str, Any]) -> None:
    """Delete the pod's folder (its emptyDir, ConfigMap and Secret volumes), as a kubelet does
    once the pod is gone; PersistentVolume folders stay."""
    folder = pod_folder(pod_dir, pod)
    if _inside(folder, pod_dir):
        shutil.rmtree(folder, ignore_errors=True)


def refused_event(pod: Mapping[str, Any], message: str, now: str) -> dict[str, Any]:
    """The Warning Event (``FailedMount``) a refused volume posts on its pod."""
    return podenv.warning_event(pod, MOUNT_EVENT_REASON, message, now)


def refused_status(pod: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The pod's status while a volume is refused: ``Pending``, containers waiting in
    ``ContainerCreating`` with the reason (as a kubelet whose mount fails leaves it)."""
    return {"phase": "Pending",
            "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                                   "started": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": "ContainerCreating", "message": message}}}
                                  for c in pod["spec"]["containers"]]}
