"""List-then-watch caches of Nodes and Pods: the operator's own informer (issue 32, item 9).

kopf indexed Nodes and Pods through a worker task per object while the operator already handled
jobs: nothing said when the node index was complete, every Node event (a taint removed, a
heartbeat) kicked every job waiting for capacity, and at 2,000 nodes the operator held 665 MiB
(``bench/results/operator-real-idle.json``: 500 jobs, 2,496 plans, up to 11 for one, while the
node lifecycle controller cleared new nodes' not-ready taints at about 4-5 a second).  An
:class:`Informer` does what client-go's reflector does instead:

* one paginated LIST (``limit``/``continue``) fills the whole cache at once, from one consistent
  snapshot, and only then is the cache *synced* (:meth:`Informer.wait_synced`): the operator's
  startup waits for it, so no job is planned on a partial inventory;
* a WATCH from the list's ``resourceVersion`` (``allowWatchBookmarks``: a BOOKMARK only moves the
  resourceVersion on) keeps it current; the server ends the stream after
  ``server_timeout_s`` and the next one resumes where it left off;
* ``410 Gone`` (the resourceVersion is older than the server keeps, as an HTTP status or as an
  ERROR event) lists again; the new listing replaces the cache as a whole, so a reader never sees
  a half-filled one; any other failure is retried after a doubling delay (1 s to 30 s), resuming
  the watch;
* only what the planner reads is kept (``trim``: :func:`~hetero_operator.cluster.nodeindex.trim_node`,
  :func:`~hetero_operator.cluster.nodeindex.gpu_pod_entry`), never whole objects; a value whose
  trimmed content did not change keeps the stored one (and the parse it remembers), and its
  listeners are not called (a kubelet's status heartbeat changes nothing that is kept).

The blocking client calls run in one daemon thread per informer (the official ``kubernetes``
client, ``_preload_content=False``: JSON dicts, no model objects); every change of the cache is
made on the event loop (``call_soon_threadsafe``), so readers on the loop need no lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("heterotrain.operator.informer")
PAGE_SIZE = 500
"""Objects per LIST page: one page of 500 Nodes is about 3 MB of JSON to parse at a time."""

Trim = Callable[[Mapping[str, Any]], Any]
"""``trim(object)``: the value kept for an object, or None to keep nothing for it."""
Notice = Callable[[str, Mapping[str, Any]], Hashable | None]
"""``notice(event type, object)``: a small value handed to ``on_notice`` on the loop (None: none)."""


class Gone(Exception):
    """The server answered 410 Gone: the resourceVersion (or continue token) is too old; list again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchLimits:
    """Bounds of an informer's calls.

    Attributes:
        page_size: objects per LIST page (``limit``); bounds the memory one page takes to parse.
        server_timeout_s: the server ends each watch after this long (``timeoutSeconds``).
        client_timeout_s: the longest silence on a list or watch connection before the client
            gives up, seconds (bookmarks arrive about once a minute on a quiet stream).
        connect_timeout_s: connecting, seconds.
        retry_s / max_retry_s: delay after a failure, doubled per failure in a row up to the max.
    """

    page_size: int = PAGE_SIZE
    server_timeout_s: float = 300.0
    client_timeout_s: float = 301.0
    connect_timeout_s: float = 30.0
    retry_s: float = 1.0
    max_retry_s: float = 30.0


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer:
    """A cache of one kind of object, filled by LIST then kept by WATCH (see the module doc).

    Args:
        kind: what is cached, for logs ("nodes").
        list_fn: the client's list call (``CoreV1Api.list_node``); called with ``limit``,
            ``_continue``, ``watch``, ``resource_version``, ``allow_watch_bookmarks``,
            ``timeout_seconds``, ``_preload_content=False`` and ``_request_timeout``.
        trim: the value kept per object (None keeps nothing: a pod that holds no GPU).
        on_change: called on the loop with the key of an object whose kept value was added,
            changed or removed (not for the first listing).
        notice / on_notice: ``notice(type, object)`` runs for every watch event (and every
            object of a re-listing) in the informer's thread; a non-None result is handed to
            ``on_notice`` on the loop (our pods: kick their job).
        limits: timeouts, page size and retry delays.

    Attributes:
        store: ``{key: kept value}``; changed only on the loop.
        relists: LISTs after the first one (each after a 410 Gone).
        bookmarks: BOOKMARK events seen.
        synced_s: seconds the first listing took (None until synced).
    """

    def __init__(self, *, kind: str, list_fn: Callable[..., Any], trim: Trim,
                 on_change: Callable[[str], None] | None = None, notice: Notice | None = None,
                 on_notice: Callable[[Any], None] | None = None,
                 limits: WatchLimits = WatchLimits()) -> None:
        self.kind, self.list_fn, self.trim, self.limits = kind, list_fn, trim, limits
        self.on_change, self.notice, self.on_notice = on_change, notice, on_notice
        self.store: dict[str, Any] = {}
        self.relists = 0
        self.bookmarks = 0
        self.synced_s: float | None = None
        self.resource_version: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None

    # --- on the loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Start listing and watching in a daemon thread (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._synced = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    @property
    def synced(self) -> bool:
        """True once the first listing is in :attr:`store`."""
        return self._synced is not None and self._synced.is_set()

    async def wait_synced(self) -> None:
        """Return once the first listing is in :attr:`store` (failures are retried meanwhile).

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._synced is None:
            raise RuntimeError(f"informer {self.kind}: start() first")
        await self._synced.wait()

    def values(self) -> list[Any]:
        """The kept values, a new list (the store may change after the caller's next await)."""
        return list(self.store.values())

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread: end its connection and wait for it at most ``timeout_s``."""
        self._stopping.set()
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:  # unblock a read in the thread, as kubernetes.watch.Watch.stop does
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _apply(self, key: str, value: Any, note: Hashable | None) -> None:
        old = self.store.get(key)
        changed = False
        if value is None:
            changed = self.store.pop(key, None) is not None
        elif old is None or old != value:  # an equal value keeps the stored one and its memo
            self.store[key] = value
            changed = True
        if changed and self.on_change is not None:
            self.on_change(key)
        if note is not None and self.on_notice is not None:
            self.on_notice(note)

    def _replace(self, items: dict[str, Any], notes: list[Hashable], took_s: float) -> None:
        old, new, changed = self.store, {}, []
        for key, value in items.items():
            kept = old.get(key)
            if kept is not None and kept == value:
                new[key] = kept
            else:
                new[key] = value
                changed.append(key)
        changed += [k for k in old if k not in items]
        self.store = new
        assert self._synced is not None
        if not self._synced.is_set():
            self.synced_s = took_s
            self._synced.set()
            return  # nothing listens yet: the operator starts once every cache is synced
        for key in changed:
            if self.on_change is not None:
                self.on_change(key)
        for note in notes:
            if self.on_notice is not None:
                self.on_notice(note)

    # --- in the informer's thread -------------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the operator has stopped
            self._stopping.set()

    def _run(self) -> None:
        delay = self.limits.retry_s
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                delay = self.limits.retry_s
            except Gone as exc:
                log.info("%s: %s; listing again", self.kind, exc)
                self.resource_version = None
                self.relists += 1
            except Exception as exc:  # noqa: BLE001 - every failure is retried: the cache must live
                if self._stopping.is_set():
                    break
                log.warning("%s: cannot %s (%s: %s); retrying in %.0f s", self.kind,
                            "watch" if self.resource_version else "list", type(exc).__name__,
                            str(exc)[:300], delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, self.limits.max_retry_s)

    def _timeout(self) -> tuple[float, float]:
        return (self.limits.connect_timeout_s, self.limits.client_timeout_s)

    def _call(self, **kwargs: Any) -> Any:
        """The list call; its response with a 2xx status, else :class:`Gone` or the ApiException."""
        try:
            resp = self.list_fn(_preload_content=False, _request_timeout=self._timeout(), **kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(f"410 Gone: {exc.reason}") from exc
            raise
        status = getattr(resp, "status", 200)
        if isinstance(status, int) and not 200 <= status <= 299:
            body = getattr(resp, "data", b"")
            resp.close()
            if status == 410:
                raise Gone(f"410 Gone: {body[:200]!r}")
            raise ApiException(status=status, reason=f"{body[:300]!r}")
        return resp

    def _list(self) -> None:
        started = time.perf_counter()
        items: dict[str, Any] = {}
        notes: list[Hashable] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.limits.page_size}
            if cont:
                kwargs["_continue"] = cont
            page = json.loads(self._call(**kwargs).data)  # a 410 on an old continue token: list again
            for obj in page.get("items") or ():
                value = self.trim(obj)
                if value is not None:
                    items[object_key(obj)] = value
                if self.notice is not None:
                    note = self.notice("ADDED", obj)
                    if note is not None:
                        notes.append(note)
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            del page
            if not cont:
                break
        self.resource_version = str(meta.get("resourceVersion") or "") or None
        took_s = time.perf_counter() - started
        log.info("%s: listed %d kept object(s) in %.2f s (resourceVersion %s)", self.kind, len(items),
                 took_s, self.resource_version)
        self._post(self._replace, items, notes, took_s)

    def _watch(self) -> None:
        resp = self._call(watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
                          timeout_seconds=max(1, round(self.limits.server_timeout_s)))
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stopping.is_set():
                    return
                if not line:
                    continue
                event = json.loads(line)
                type_, obj = event.get("type"), event.get("object") or {}
                if type_ == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(f"410 Gone: {obj.get('message')}")
                    raise ApiException(status=obj.get("code") or 0,
                                       reason=f"{obj.get('reason')}: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if type_ == "BOOKMARK":
                    self.bookmarks += 1
                else:
                    note = self.notice(type_, obj) if self.notice is not None else None
                    self._post(self._apply, object_key(obj),
                               None if type_ == "DELETED" else self.trim(obj), note)
                if rv:
                    self.resource_version = str(rv)
        finally:
            self._resp = None
            resp.close()
            release = getattr(resp, "release_conn", None)
            if release is not None:
                release()
