"""How the operator's API client (controller/k8s.py) reads the server's answers, one helper each:
a read answered 404 is None, a create answered 409 is False, a patch or delete answered 404 is
done; any other status is raised for the reconciler's retry."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from hetero_operator.controller.k8s import Api


def _api(status: int | None, calls: list[tuple[Any, ...]]) -> Api:
    """An Api whose every call records its arguments and answers ``{"ok": 1}`` or raises
    ``ApiException(status)``."""
    api = Api(kubernetes.client.Configuration())

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((fn.__name__, args, kwargs))
        if status is not None:
            raise kubernetes.client.ApiException(status=status)
        return {"ok": 1}

    api._call = call  # type: ignore[method-assign]
    return api


async def test_reads_answer_the_object_or_none_when_absent() -> None:
    calls: list[tuple[Any, ...]] = []
    assert await _api(None, calls).get_pvc("ns", "data") == {"ok": 1}
    assert calls == [("read_namespaced_persistent_volume_claim", ("data", "ns"), {})]
    gone = _api(404, calls)
    assert [await gone.get_pvc("ns", "x"), await gone.get_configmap("ns", "x"), await gone.get_crd("x"),
            await gone.get_event("ns", "x"), await gone.get_job("ns", "x"), await gone.get_peering("x", None),
            await gone.read({"kind": "Pod", "metadata": {"name": "x", "namespace": "ns"}})] == [None] * 7
    with pytest.raises(kubernetes.client.ApiException) as refused:
        await _api(403, calls).get_configmap("ns", "x")
    assert refused.value.status == 403


async def test_creates_answer_false_when_the_name_exists() -> None:
    calls: list[tuple[Any, ...]] = []
    event = {"metadata": {"name": "e"}}
    assert await _api(None, calls).create_event("ns", event) is True
    assert calls[-1] == ("create_namespaced_event", ("ns", event), {})
    taken = _api(409, calls)
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
    assert [await taken.create(pod), await taken.create_configmap("ns", {}), await taken.create_event("ns", event)] == [
        False, False, False]
    with pytest.raises(kubernetes.client.ApiException):
        await _api(404, calls).create(pod)


async def test_patches_and_deletes_of_a_gone_object_are_done() -> None:
    calls: list[tuple[Any, ...]] = []
    gone = _api(404, calls)
    await gone.delete_pod("ns", "p", grace_s=0)
    await gone.delete_job("ns", "j")
    await gone.patch_job_status("ns", "j", {"phase": "Failed"})
    assert calls[0] == ("delete_namespaced_pod", ("p", "ns"), {"grace_period_seconds": 0})
    assert calls[1][2] == {"propagation_policy": "Background"}
    with pytest.raises(kubernetes.client.ApiException):
        await _api(409, calls).delete_pod("ns", "p")
