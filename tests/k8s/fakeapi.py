"""A Kubernetes API server for tests, served over HTTP by kmock (kopf's author's mock server).

kmock's ``KubernetesEmulator`` keeps objects as plain dicts; this subclass of its
``KubernetesScaffold`` (discovery, error rendering) adds what an operator relies on:

* ``metadata.uid``, ``resourceVersion`` (one global counter), ``creationTimestamp``,
  ``generation`` (bumped on spec changes only);
* 409 ``AlreadyExists`` on duplicate create, 404 on missing objects, 422 ``Invalid`` for
  HeteroTrainingJobs that fail the CRD schema or its CEL rules (``crdcheck``), with defaults
  applied and undeclared status fields pruned, like a structural schema does;
* label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``) and
  ``metadata.name``/``metadata.namespace``/``spec.nodeName`` field selectors on lists;
* watches: without ``resourceVersion`` they start with ADDED for every object; with one they
  send only later events (resume without replay), ``410 Gone`` when it is older than the kept
  history; ``timeoutSeconds`` ends the stream;
* the ``status`` subresource: a status PATCH changes only ``status``, a main PATCH never does;
* merge-patch (RFC 7386) and JSON-patch (RFC 6902); a merge patch carrying
  ``metadata.resourceVersion`` is refused with 409 ``Conflict`` unless that is the object's
  current one (optimistic concurrency);
* deletion: finalizers hold an object (``deletionTimestamp``); pods bound to a node with a
  kubelet attached terminate gracefully: ``deletionTimestamp`` is the request time plus the
  grace period (``gracePeriodSeconds``, else the pod's ``terminationGracePeriodSeconds``, 30)
  and ``deletionGracePeriodSeconds`` is set, like the real API server; the kubelet finishes
  them, and a pod whose kubelet is gone stays Terminating until a force delete
  (``gracePeriodSeconds=0``) removes it at once; pods already terminated go at once;
  owner-reference cascade (background garbage collection) when an owner goes;
* fault injection: :meth:`FakeApiServer.stall` makes the next matching requests hang without
  an answer (a silently dropped connection, shared/cases/25).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime as dt
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import attrs
import jsonpatch
import kmock
from kmock._internal import dsl as kmock_dsl
from kmock._internal import rendering

from . import crdcheck

HTJ = ("heterotrain.io", "v1alpha1", "heterotrainingjobs")
CRDS = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
PEERINGS = ("kopf.dev", "v1", "clusterkopfpeerings")
RESOURCES: dict[tuple[str, str, str], dict[str, Any]] = {
    ("", "v1", "pods"): dict(kind="Pod", namespaced=True, subresources=["status"]),
    ("", "v1", "services"): dict(kind="Service", namespaced=True),
    ("", "v1", "configmaps"): dict(kind="ConfigMap", namespaced=True),
    ("", "v1", "persistentvolumeclaims"): dict(kind="PersistentVolumeClaim", namespaced=True),
    ("", "v1", "events"): dict(kind="Event", namespaced=True),
    ("", "v1", "nodes"): dict(kind="Node", namespaced=False, subresources=["status"]),
    ("", "v1", "namespaces"): dict(kind="Namespace", namespaced=False),
    HTJ: dict(kind="HeteroTrainingJob", namespaced=True, subresources=["status"],
              shortnames=["htj"], singular="heterotrainingjob"),
    ("networking.k8s.io", "v1", "networkpolicies"): dict(kind="NetworkPolicy", namespaced=True),
    CRDS: dict(kind="CustomResourceDefinition", namespaced=False),
    PEERINGS: dict(kind="ClusterKopfPeering", namespaced=False),  # kopf peering: no status subresource
    # Kueue (v1beta2), PriorityClasses and DRA (resource.k8s.io/v1): issue 15's integrations
    ("kueue.x-k8s.io", "v1beta2", "workloads"): dict(kind="Workload", namespaced=True,
                                                     subresources=["status"]),
    ("kueue.x-k8s.io", "v1beta2", "resourceflavors"): dict(kind="ResourceFlavor", namespaced=False),
    ("scheduling.k8s.io", "v1", "priorityclasses"): dict(kind="PriorityClass", namespaced=False),
    ("resource.k8s.io", "v1", "resourceslices"): dict(kind="ResourceSlice", namespaced=False),
    ("resource.k8s.io", "v1", "resourceclaims"): dict(kind="ResourceClaim", namespaced=True,
                                                      subresources=["status"]),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"): dict(kind="ResourceClaimTemplate",
                                                              namespaced=True),
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
HISTORY = 20000


class ApiError(kmock.KubernetesError):
    """An error with a Kubernetes ``Status`` body."""


def _err(status: int, reason: str, message: str) -> ApiError:
    return ApiError(status=status, reason=reason, message=message, details={})


def now_iso(after_s: float = 0.0) -> str:
    """RFC 3339 UTC time, seconds precision, ``after_s`` from now."""
    when = dt.datetime.now(tz=dt.UTC) + dt.timedelta(seconds=after_s)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class FakeApiServer(kmock.KubernetesScaffold):
    """The stateful fake; objects live in :attr:`store` keyed by (resource, namespace, name).

    Attributes:
        graceful_pods: when True (a kubelet is attached), deleting a running pod bound to a
            node only sets ``deletionTimestamp``; the kubelet removes it after its process ends.
        validate_htj: validate and default HeteroTrainingJobs against the shipped CRD.
    """

    graceful_pods: bool = False
    validate_htj: bool = True
    kueue_version: str = "v1beta2"
    """The one version Kueue's resources are served in (``v1beta1``: a Kueue <= 0.14, case 49)."""
    served: dict[tuple[str, str, str], dict[str, Any]] = attrs.field(factory=dict)
    """:data:`RESOURCES` with Kueue's in :attr:`kueue_version` (what this server serves)."""
    store: dict[tuple[tuple[str, str, str], str | None, str], dict[str, Any]] = attrs.field(factory=dict)
    _rv: Any = attrs.field(factory=lambda: itertools.count(1))
    _last_rv: int = 0
    _history: dict[tuple[str, str, str], collections.deque] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=HISTORY)))
    _watchers: list[tuple[tuple[str, str, str], str | None, asyncio.Queue]] = attrs.field(factory=list)
    _crd: dict[str, Any] = attrs.field(factory=crdcheck.load_crd)
    listeners: list[Any] = attrs.field(factory=list)
    created: list[tuple[Any, ...]] = attrs.field(factory=list)
    deletions: list[tuple[Any, ...]] = attrs.field(factory=list)
    """Every DELETE: ``(resource, namespace, name, gracePeriodSeconds or None)``."""
    _stalls: list[list[Any]] = attrs.field(factory=list)
    _unstall: asyncio.Event | None = None
    stalled: int = 0
    """Requests that were held without an answer so far."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.served = {(g, self.kueue_version if g == "kueue.x-k8s.io" else v, p): info
                       for (g, v, p), info in RESOURCES.items()}
        for (group, version, plural), info in self.served.items():
            key = f"{group}/{version}/{plural}" if group else f"v1/{plural}"
            self.resources[key] = kmock.ResourceInfo(verbs=set(VERBS), **info)
        self.fallback[kmock.action.LIST] << self._serve_list
        self.fallback[kmock.action.WATCH] << self._serve_watch
        self.fallback[kmock.action.FETCH] << self._serve_fetch
        self.fallback[kmock.action.CREATE] << self._serve_create
        self.fallback[kmock.action.UPDATE] << self._serve_patch
        self.fallback[kmock.action.DELETE] << self._serve_delete

    # --- Python API (tests and the kubelet use it directly) ---------------------------------

    def objects(self, resource: tuple[str, str, str], namespace: str | None = None) -> list[dict[str, Any]]:
        """Live copies of objects of ``resource`` (all namespaces when ``namespace`` is None)."""
        return [copy.deepcopy(o) for (r, ns, _), o in sorted(self.store.items(), key=lambda kv: (kv[0][1] or "", kv[0][2]))
                if r == resource and (namespace is None or ns == namespace)]

    def get(self, resource: tuple[str, str, str], namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.store.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, resource: tuple[str, str, str], namespace: str | None,
                     obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create like POST; raises :class:`ApiError` 409/422."""
        obj = copy.deepcopy(dict(obj))
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            meta["namespace"] = namespace
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not name:
            raise _err(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        key = (resource, namespace, name)
        if key in self.store:
            raise _err(409, "AlreadyExists", f'{resource[2]} "{name}" already exists')
        if resource == HTJ and self.validate_htj:
            obj = self._validate_htj(obj, None)
            obj.pop("status", None)
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        meta.pop("deletionTimestamp", None)
        self._stamp(obj)
        self.store[key] = obj
        self.created.append((resource, namespace, name, meta["uid"], dict(meta.get("labels") or {})))
        await self._notify(resource, "ADDED", obj)
        return copy.deepcopy(obj)

    async def patch(self, resource: tuple[str, str, str], namespace: str | None, name: str,
                    patch: Any, *, subresource: str | None = None) -> dict[str, Any]:
        """PATCH (merge or JSON patch); raises :class:`ApiError` 404/422."""
        key = (resource, namespace, name)
        old = self.store.get(key)
        if old is None:
            raise _err(404, "NotFound", f'{resource[2]} "{name}" not found')
        wanted_rv = ((patch.get("metadata") or {}).get("resourceVersion")
                     if isinstance(patch, dict) else None)
        if wanted_rv is not None and wanted_rv != old["metadata"].get("resourceVersion"):
            raise _err(409, "Conflict", f'Operation cannot be fulfilled on {resource[2]} "{name}": '
                       "the object has been modified; please apply your changes to the latest "
                       "version and try again")
        new = jsonpatch.apply_patch(old, patch) if isinstance(patch, list) else _merge(old, patch)
        info = self.served.get(resource, {})
        if "status" in info.get("subresources", ()):
            if subresource == "status":
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    new.pop("status")
            else:
                new["status"] = copy.deepcopy(old.get("status"))
                if new["status"] is None:
                    new.pop("status")
        for fixed in ("uid", "creationTimestamp", "namespace", "name"):
            if fixed in old["metadata"]:
                new["metadata"][fixed] = old["metadata"][fixed]
        if old["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        if resource == HTJ and self.validate_htj:
            new = self._validate_htj(new, old, status_only=subresource == "status")
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if new == old:
            return copy.deepcopy(old)
        self._stamp(new)
        self.store[key] = new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._remove(key)
        else:
            await self._notify(resource, "MODIFIED", new)
        return copy.deepcopy(new)

    async def delete(self, resource: tuple[str, str, str], namespace: str | None, name: str, *,
                     grace_s: int | None = None) -> dict[str, Any]:
        """DELETE; finalizers and graceful pods only mark ``deletionTimestamp``."""
        key = (resource, namespace, name)
        self.deletions.append((resource, namespace, name, grace_s))
        obj = self.store.get(key)
        if obj is None:
            raise _err(404, "NotFound", f'{resource[2]} "{name}" not found')
        graceful = (resource[2] == "pods" and self.graceful_pods and grace_s != 0
                    and obj.get("spec", {}).get("nodeName")
                    and obj.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
        if obj["metadata"].get("finalizers") or graceful:
            if not obj["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(obj)
                grace = 0 if not graceful else (
                    grace_s if grace_s is not None
                    else int(obj.get("spec", {}).get("terminationGracePeriodSeconds", 30)))
                obj["metadata"]["deletionTimestamp"] = now_iso(grace)
                if graceful:
                    obj["metadata"]["deletionGracePeriodSeconds"] = grace
                self._stamp(obj)
                self.store[key] = obj
                await self._notify(resource, "MODIFIED", obj)
            return copy.deepcopy(obj)
        return await self._remove(key)

    # --- fault injection --------------------------------------------------------------------

    def stall(self, verb: str, plural: str, count: int = 1) -> None:
        """Hold the next ``count`` HTTP requests ``verb`` (``get``, ``list``, ``create``,
        ``patch``, ``delete``) on ``plural`` without ever answering, like a connection that a
        proxy dropped silently; :meth:`release_stalls` (or the server's exit) lets them go."""
        self._stalls.append([verb, plural, count])

    def release_stalls(self) -> None:
        """Answer every held request now and hold no more."""
        self._stalls.clear()
        if self._unstall is not None:
            self._unstall.set()

    async def _maybe_stall(self, verb: str, resource: tuple[str, str, str]) -> None:
        for entry in self._stalls:
            if entry[0] == verb and entry[1] == resource[2] and entry[2] > 0:
                entry[2] -= 1
                self.stalled += 1
                if self._unstall is None:
                    self._unstall = asyncio.Event()
                await self._unstall.wait()
                return

    async def __aexit__(self, *exc: Any) -> None:
        self.release_stalls()
        await super().__aexit__(*exc)

    # --- HTTP handlers ----------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> Any:
        """kmock's dispatch (``RawHandler._handle``: payloads by priority, first one whose view
        sees the request) without its scan of every request served so far.

        kmock decides ``request in view`` by iterating the whole request history through the
        view's filters, so each request costs O(requests served): in bench/bench_operator.py the
        10th job's pods came 2.4 s after its create instead of 0.2 s, all of it this process's
        CPU (issue 11).  A view built only of plain filters and priorities sees a request iff
        the request passes its criteria, which does not depend on the history; for those the
        check runs against the request alone.  Slices, groups and exclusions (history-dependent)
        keep kmock's full check.
        """
        priorities = [tuple(-p for p in payload.priorities) for payload in self._payloads]
        width = max((len(p) for p in priorities), default=0)
        priorities = [p + (0,) * (width - len(p)) for p in priorities]
        order = sorted(range(len(priorities)), key=lambda i: priorities[i])
        for payload in [self._payloads[i] for i in order]:
            if not payload._disabled.is_set() and self._sees(payload._source, request):
                try:
                    return await payload(request)
                except rendering.ReactionMismatchError:  # mismatch or depletion, as kmock
                    payload._disabled.set()
                except NotImplementedError:
                    pass
        raise NotImplementedError("no reaction matches the request")

    def _sees(self, view: Any, request: rendering.Request) -> bool:
        """``request in view``, O(1) for history-free views (see :meth:`_handle`)."""
        if not all(isinstance(v, kmock_dsl.Root) or type(v) in (kmock_dsl.Filter, kmock_dsl.Priority)
                   for v in view._walk(kmock_dsl.View)):
            return request in view
        everything, self._requests = self._requests, [request]
        try:
            return request in view
        finally:
            self._requests = everything

    async def _serve_list(self, request: rendering.Request) -> dict[str, Any]:
        resource = self._resource(request)
        await self._maybe_stall("list", resource)
        items = [o for o in self._select(resource, request.namespace, request.params)]
        return {"apiVersion": "v1", "kind": self.served[resource]["kind"] + "List",
                "metadata": {"resourceVersion": str(self._last_rv)}, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        resource = self._resource(request)
        params = request.params
        since = params.get("resourceVersion")
        queue: asyncio.Queue = asyncio.Queue()
        entry = (resource, request.namespace, queue)
        if since not in (None, "", "0"):
            history = self._history[resource]
            if history and int(since) < history[0][0] - 1 and int(since) < self._last_rv:
                raise _err(410, "Expired", f"too old resource version: {since} ({history[0][0]})")
            backlog = [(t, o) for rv, t, o in history if rv > int(since)]
        else:
            backlog = [("ADDED", o) for o in self._select(resource, request.namespace, {})]
        self._watchers.append(entry)
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            yield b""
            for type_, obj in backlog:
                if _matches(obj, request.namespace, params):
                    yield {"type": type_, "object": obj}
            while True:
                wait = None if deadline is None else deadline - loop.time()
                if wait is not None and wait <= 0:
                    return
                try:
                    type_, obj = await asyncio.wait_for(queue.get(), wait)
                except asyncio.TimeoutError:
                    return
                if _matches(obj, request.namespace, params):
                    yield {"type": type_, "object": obj}
        finally:
            self._watchers.remove(entry)

    async def _serve_fetch(self, request: rendering.Request) -> dict[str, Any]:
        resource = self._resource(request)
        await self._maybe_stall("get", resource)
        obj = self.get(resource, request.namespace, request.name)
        if obj is None:
            raise _err(404, "NotFound", f'{resource[2]} "{request.name}" not found')
        return obj

    async def _serve_create(self, request: rendering.Request) -> dict[str, Any]:
        resource = self._resource(request)
        await self._maybe_stall("create", resource)
        if not isinstance(request.data, dict):
            raise _err(400, "BadRequest", "the body must be a JSON object")
        namespace = request.namespace if self.served[resource]["namespaced"] else None
        return await self.create(resource, namespace, request.data)

    async def _serve_patch(self, request: rendering.Request) -> dict[str, Any]:
        resource = self._resource(request)
        await self._maybe_stall("patch", resource)
        return await self.patch(resource, request.namespace, request.name, request.data,
                                subresource=request.subresource)

    async def _serve_delete(self, request: rendering.Request) -> dict[str, Any]:
        resource = self._resource(request)
        await self._maybe_stall("delete", resource)
        grace = request.params.get("gracePeriodSeconds")
        if grace is None and isinstance(request.data, dict):
            grace = request.data.get("gracePeriodSeconds")
        return await self.delete(resource, request.namespace, request.name,
                                 grace_s=None if grace is None else int(grace))

    # --- internals --------------------------------------------------------------------------

    def _resource(self, request: rendering.Request) -> tuple[str, str, str]:
        r = request.resource
        key = (r.group or "", r.version or "", r.plural or "")
        if key not in self.served:
            raise _err(404, "NotFound", f"the server could not find the requested resource {key}")
        return key

    def _select(self, resource: tuple[str, str, str], namespace: str | None,
                params: Mapping[str, str]) -> list[dict[str, Any]]:
        out = []
        for (r, ns, name), obj in self.store.items():
            if r == resource and _matches(obj, namespace, params):
                out.append(copy.deepcopy(obj))
        return sorted(out, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    def _stamp(self, obj: dict[str, Any]) -> None:
        self._last_rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self._last_rv)

    async def _notify(self, resource: tuple[str, str, str], type_: str, obj: Mapping[str, Any]) -> None:
        snapshot = copy.deepcopy(dict(obj))
        self._history[resource].append((int(snapshot["metadata"]["resourceVersion"]), type_, snapshot))
        for r, _, queue in list(self._watchers):
            if r == resource:
                queue.put_nowait((type_, snapshot))
        for listener in list(self.listeners):
            listener(resource, type_, snapshot)

    async def _remove(self, key: tuple[tuple[str, str, str], str | None, str]) -> dict[str, Any]:
        obj = self.store.pop(key)
        obj = copy.deepcopy(obj)
        self._stamp(obj)
        await self._notify(key[0], "DELETED", obj)
        await self._collect_garbage(obj["metadata"]["uid"])
        return obj

    async def _collect_garbage(self, owner_uid: str) -> None:
        """Background cascade: delete every object with an owner reference to ``owner_uid``."""
        dependents = [k for k, o in self.store.items()
                      if any(ref.get("uid") == owner_uid
                             for ref in o["metadata"].get("ownerReferences") or ())]
        for resource, ns, name in dependents:
            if (resource, ns, name) in self.store:
                await self.delete(resource, ns, name)

    def _validate_htj(self, obj: dict[str, Any], old: Mapping[str, Any] | None, *,
                      status_only: bool = False) -> dict[str, Any]:
        """Default+validate (not for status writes: unchanged spec is not re-validated, like the
        API server's validation ratcheting) and prune undeclared status fields."""
        schema = crdcheck.openapi_schema(self._crd)
        if status_only:
            checked = copy.deepcopy(obj)
            if "status" in obj:
                checked["status"] = crdcheck.prune(schema["properties"]["status"], obj["status"])
            return checked
        try:
            checked = crdcheck.validate({k: v for k, v in obj.items() if k != "status"},
                                        old={k: v for k, v in old.items() if k != "status"} if old else None,
                                        crd=self._crd)
        except crdcheck.Invalid as exc:
            raise _err(422, "Invalid", str(exc)) from None
        if "status" in obj:
            checked["status"] = crdcheck.prune(schema["properties"]["status"], obj["status"])
        return checked


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


_SEL = re.compile(r"^\s*(!)?\s*([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def parse_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """Parse a label selector into ``(key, op, values)``; op in ``= != in notin exists !``.

    Raises:
        ApiError: 400 for a malformed selector.
    """
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    out = []
    for part in parts:
        m = _SEL.match(part)
        if not m:
            raise _err(400, "BadRequest", f"unable to parse requirement: {part!r}")
        neg, key, op, value, setop, values = m.groups()
        if neg:
            out.append((key, "!", ()))
        elif op:
            out.append((key, "!=" if op == "!=" else "=", (value,)))
        elif setop:
            out.append((key, setop, tuple(v.strip() for v in values.split(",") if v.strip())))
        else:
            out.append((key, "exists", ()))
    return out


def labels_match(labels: Mapping[str, str], selector: Iterable[tuple[str, str, tuple[str, ...]]]) -> bool:
    """Kubernetes label-selector semantics."""
    for key, op, values in selector:
        has, val = key in labels, labels.get(key)
        ok = {"=": has and val == values[0], "!=": not has or val != values[0],
              "in": has and val in values, "notin": not has or val not in values,
              "exists": has, "!": not has}[op]
        if not ok:
            return False
    return True


def _fields_match(obj: Mapping[str, Any], text: str) -> bool:
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        negate = key.endswith("!")
        key = key.rstrip("!=")
        current: Any = obj
        for p in key.split("."):
            current = current.get(p) if isinstance(current, Mapping) else None
        if (str(current or "") == value) == negate:
            return False
    return True


def _matches(obj: Mapping[str, Any], namespace: str | None, params: Mapping[str, str]) -> bool:
    meta = obj.get("metadata") or {}
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    if params.get("labelSelector") and not labels_match(meta.get("labels") or {},
                                                       parse_selector(params["labelSelector"])):
        return False
    if params.get("fieldSelector") and not _fields_match(obj, params["fieldSelector"]):
        return False
    return True


def kubeconfig(url: str) -> str:
    """A kubeconfig pointing at ``url`` with no auth."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
    })
