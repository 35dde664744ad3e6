"""The local kubelet starting a pod's containers, against a recording stand-in for the API
server (no control plane): the working directory a process gets, and what a container that
cannot start reports (its pod's status and a Warning Event)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from hetero_operator.devcluster import kubelet as kubelet_mod
from hetero_operator.devcluster import podenv, volumes


class _RecordingApi:
    """Answers what the kubelet asks while starting a pod; records every create and patch."""

    server, ca = "https://127.0.0.1:1", None

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, body))
        return body

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((path, body))
        return body

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        raise AssertionError(f"unexpected GET {path}")


def _pod(container: dict[str, Any], *, restart: str = "Never", mount_path: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "node-a", "restartPolicy": restart, "automountServiceAccountToken": False,
                            "containers": [container]}
    if mount_path is not None:
        spec["volumes"] = [{"name": "tmp", "emptyDir": {}}]
        container["volumeMounts"] = [{"name": "tmp", "mountPath": mount_path}]
    return {"metadata": {"name": "op", "namespace": "ns", "uid": "0123456789ab"}, "spec": spec}


def _kubelet(api: _RecordingApi, tmp_path: Path) -> kubelet_mod.LocalKubelet:
    return kubelet_mod.LocalKubelet(api, [{"metadata": {"name": "node-a"}}],  # type: ignore[arg-type]
                                    pod_dir=tmp_path / "cluster" / "pods", cluster_dir=tmp_path / "cluster")


async def test_an_emptydir_mounted_at_a_parent_of_the_checkout_keeps_the_checkout_as_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the new user's case: checkout /tmp/newuser, the chart's emptyDir at /tmp
    checkout = tmp_path / "newuser"
    checkout.mkdir()
    monkeypatch.setattr(kubelet_mod, "REPO", checkout)
    api = _RecordingApi()
    k = _kubelet(api, tmp_path)
    k.pod_dir.mkdir(parents=True)
    pod = _pod({"name": "operator", "command": [sys.executable, "-c", "import os; print('cwd=' + os.getcwd())"]},
               mount_path=str(tmp_path))
    key = ("ns", "op")
    state = k._adopt(key, pod)
    await k._start(key, state)
    await asyncio.wait_for(state.procs["operator"].wait(), 30)
    assert f"cwd={checkout}\n" in k.log("ns", "op")
    # a workingDir the container sets is still mapped through its volumes
    mounts = [volumes.Mount(str(tmp_path), tmp_path / "host")]
    assert volumes.working_dir({"workingDir": f"{tmp_path}/work"}, mounts, checkout) == f"{tmp_path / 'host'}/work"
    assert volumes.working_dir({}, mounts, checkout) == str(checkout)


@pytest.mark.parametrize("restart", ["Never", "Always"])
async def test_a_container_that_cannot_start_gets_a_visible_status_and_a_warning_event(
        tmp_path: Path, restart: str) -> None:
    api = _RecordingApi()
    k = _kubelet(api, tmp_path)
    k.pod_dir.mkdir(parents=True)
    missing = tmp_path / "no-such-dir"
    pod = _pod({"name": "operator", "command": [sys.executable, "-c", "pass"], "workingDir": str(missing)},
               restart=restart)
    key = ("ns", "op")
    state = k._adopt(key, pod)
    await k._start(key, state)
    message = (f"failed to start container 'operator' ({sys.executable!r} in {str(missing)!r}): "
               "No such file or directory")
    events = [body for path, body in api.created if path == "/api/v1/namespaces/ns/events"]
    assert [(e["type"], e["reason"], e["message"], e["involvedObject"]["name"]) for e in events] == [
        ("Warning", "Failed", message, "op")]
    statuses = [body["status"] for path, body in api.patched if path == "/api/v1/namespaces/ns/pods/op/status"]
    assert len(statuses) == 1 and state.done
    container_state = statuses[0]["containerStatuses"][0]["state"]
    if restart == "Never":
        assert statuses[0]["phase"] == "Failed"
        assert container_state["terminated"]["reason"] == "StartError"
        assert container_state["terminated"]["exitCode"] == podenv.START_FAILED_EXIT_CODE == 128
        assert container_state["terminated"]["message"] == message
    else:
        assert statuses[0]["phase"] == "Pending"
        assert container_state == {"waiting": {"reason": "RunContainerError", "message": message}}
