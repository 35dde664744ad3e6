"""The operator's own list-then-watch informer (hetero_operator.controller.informer, issue 32 item 9).

A scripted ``list_fn`` stands in for ``CoreV1Api.list_node``: LIST pages (``limit``/``continue``)
and WATCH streams (lines of JSON events, as the API server sends them), with the arguments of
every call recorded.  The informer runs in its thread as in the operator; the tests wait for what
they assert on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from builders import make_node
from hetero_operator.cluster.nodeindex import IndexedNode, trim_node
from hetero_operator.controller.clustercache import gpu_pod_value, our_pod_job
from hetero_operator.controller.informer import Informer, WatchLimits

FAST = WatchLimits(page_size=2, retry_s=0.01, max_retry_s=0.02)


def node(name: str, rv: int, **kw: Any) -> dict[str, Any]:
    body = make_node(name, **kw)
    body["metadata"]["resourceVersion"] = str(rv)
    body["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    return body


class Resp:
    """An urllib3 response as the client returns it with ``_preload_content=False``."""

    def __init__(self, *, data: bytes = b"", lines: list[dict[str, Any]] | None = None, status: int = 200,
                 hold: threading.Event | None = None) -> None:
        self.status, self.data, self.lines, self.hold = status, data, lines or [], hold
        self.closed = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        for event in self.lines:
            yield (json.dumps(event) + "\n").encode()
        if self.hold is not None:  # the script is over: a quiet watch until the test ends
            self.hold.wait(10)

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class Server:
    """Scripted answers: ``lists`` (each a list of pages) and ``watches`` (each a Resp), in order."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[Resp]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[dict[str, Any]] = []
        self.done = threading.Event()
        self._pages: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Resp:
        self.calls.append({k: v for k, v in kwargs.items() if k != "_request_timeout"})
        if kwargs.get("watch"):
            return self.watches.pop(0) if self.watches else Resp(hold=self.done)
        if not kwargs.get("_continue"):
            self._pages = list(self.lists.pop(0))
        page = self._pages.pop(0)
        return Resp(data=json.dumps(page).encode())


def page(items: list[dict[str, Any]], rv: str, cont: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "NodeList", "metadata": meta, "items": items}


async def until(predicate: Callable[[], Any], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # sync-ok: polls the predicate; the informer's changes arrive on this loop


@pytest.fixture
def running() -> Iterator[list[tuple[Informer, Server]]]:
    started: list[tuple[Informer, Server]] = []
    yield started
    for informer, server in started:
        server.done.set()
        informer.stop()


def start(running: list[tuple[Informer, Server]], server: Server, changed: list[str] | None = None,
          **kw: Any) -> Informer:
    informer = Informer(kind="nodes", list_fn=server, trim=kw.pop("trim", trim_node),
                        on_change=None if changed is None else changed.append, limits=FAST, **kw)
    informer.start()
    running.append((informer, server))
    return informer


async def test_the_first_listing_fills_every_page_at_once_then_watches_from_its_version(running: Any) -> None:
    server = Server([[page([node("a", 5), node("b", 6)], "10", cont="next"), page([node("c", 7)], "10")]], [])
    changed: list[str] = []
    informer = start(running, server, changed)
    await asyncio.wait_for(informer.wait_synced(), 10)
    assert sorted(informer.store) == ["a", "b", "c"]  # both pages before it is synced: never a part
    assert all(isinstance(v, IndexedNode) and "managedFields" not in v["metadata"] for v in informer.values())
    assert changed == []  # the first listing notifies nobody: nothing runs before it
    await until(lambda: len(server.calls) == 3, "the watch")
    assert server.calls[0] == {"limit": 2, "_preload_content": False}
    assert server.calls[1] == {"limit": 2, "_continue": "next", "_preload_content": False}
    assert server.calls[2] == {"watch": True, "resource_version": "10", "allow_watch_bookmarks": True,
                               "timeout_seconds": 300, "_preload_content": False}
    assert informer.relists == 0


async def test_a_bookmark_moves_the_resource_version_on_and_changes_nothing(running: Any) -> None:
    server = Server([[page([node("a", 5)], "10")]],
                    [Resp(lines=[{"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "42"}}}])])
    changed: list[str] = []
    informer = start(running, server, changed)
    await asyncio.wait_for(informer.wait_synced(), 10)
    kept = informer.store["a"]
    await until(lambda: len([c for c in server.calls if c.get("watch")]) == 2, "the second watch")
    assert [c["resource_version"] for c in server.calls if c.get("watch")] == ["10", "42"]
    assert informer.bookmarks == 1 and informer.store == {"a": kept} and changed == []


async def test_an_expired_watch_410_lists_again_and_replaces_the_store_as_a_whole(running: Any) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version: 10 (50)"}}
    server = Server([[page([node("a", 5), node("b", 6)], "10")], [page([node("a", 5), node("c", 55)], "60")]],
                    [Resp(lines=[gone])])
    changed: list[str] = []
    informer = start(running, server, changed)
    await asyncio.wait_for(informer.wait_synced(), 10)
    a = informer.store["a"]
    await until(lambda: informer.relists == 1 and "c" in informer.store, "the re-listing")
    assert sorted(informer.store) == ["a", "c"]
    assert informer.store["a"] is a  # unchanged: the stored value and the parse it remembers stay
    assert sorted(changed) == ["b", "c"]  # gone and new; "a" did not change
    await until(lambda: [c.get("resource_version") for c in server.calls if c.get("watch")] == ["10", "60"],
                "the watch from the new listing's version")


async def test_a_410_status_on_the_watch_request_lists_again_too(running: Any) -> None:
    server = Server([[page([node("a", 5)], "10")], [page([node("b", 70)], "80")]],
                    [Resp(status=410, data=b'{"kind":"Status","code":410,"reason":"Expired"}')])
    informer = start(running, server, [])
    await until(lambda: informer.relists == 1 and list(informer.store) == ["b"], "the re-listing")


async def test_deleted_removes_and_a_heartbeat_keeps_the_stored_value(running: Any) -> None:
    beat = node("a", 11)
    for cond in beat["status"]["conditions"]:
        cond["lastHeartbeatTime"] = "2026-12-05T13:00:00Z"  # not kept: the trimmed value is equal
    tainted = node("b", 12, taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}])
    events = [{"type": "MODIFIED", "object": beat}, {"type": "MODIFIED", "object": tainted},
              {"type": "DELETED", "object": node("c", 13)}, {"type": "ADDED", "object": node("d", 14)}]
    server = Server([[page([node("a", 5), node("b", 6), node("c", 7)], "10")]], [Resp(lines=events)])
    changed: list[str] = []
    informer = start(running, server, changed)
    await asyncio.wait_for(informer.wait_synced(), 10)
    a = informer.store["a"]
    await until(lambda: "d" in informer.store, "the watch events")
    assert sorted(informer.store) == ["a", "b", "d"]
    assert informer.store["a"] is a
    assert informer.store["b"]["spec"]["taints"][0]["value"] == "broken"
    assert changed == ["b", "c", "d"]
    assert informer.resource_version == "14"


async def test_a_failed_watch_is_retried_from_where_it_was_without_listing_again(running: Any) -> None:
    broken = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError",
                                          "message": "etcd leader changed"}}
    server = Server([[page([node("a", 5)], "10")]],
                    [Resp(lines=[{"type": "ADDED", "object": node("b", 20)}, broken])])
    informer = start(running, server, [])
    await until(lambda: len([c for c in server.calls if c.get("watch")]) == 2, "the retried watch")
    assert [c["resource_version"] for c in server.calls if c.get("watch")] == ["10", "20"]
    assert informer.relists == 0 and sorted(informer.store) == ["a", "b"]


async def test_pods_keep_only_gpu_pods_and_notice_ours_by_job() -> None:
    ours = {"metadata": {"name": "digits-g0", "namespace": "team-x", "labels": {
        "app.kubernetes.io/managed-by": "heterotrain-operator", "heterotrain.io/job-name": "digits"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}
    cpu = {"metadata": {"name": "web", "namespace": "team-x", "labels": {}},
           "spec": {"nodeName": "n1", "containers": [{"name": "w", "resources": {}}]}, "status": {"phase": "Running"}}
    kept = gpu_pod_value(ours)
    assert kept["spec"] == {"nodeName": "n1", "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    assert gpu_pod_value(cpu) is None
    assert our_pod_job("MODIFIED", ours) == ("team-x", "digits") and our_pod_job("ADDED", cpu) is None
