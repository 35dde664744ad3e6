"""The users' path of the README, exactly, on a cluster of its own: ``heterotrain cluster up``,
real ``helm install`` of charts/heterotrain (the operator Deployment's pod runs as a local process
under the local kubelet, with a token of the chart's ServiceAccount: the chart's RBAC is what it
has), ``helm test``, ``kubectl apply -f examples/digits.yaml``, ``kubectl wait --for=condition=Succeeded``,
``kubectl describe`` with the events, then ``heterotrain cluster down`` leaving no process and no
listening port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from realcluster import REPO

sys.path.insert(0, str(REPO / "tests"))
from chart.helm import helm_path  # noqa: E402

from hetero_operator.devcluster import controlplane  # noqa: E402
from hetero_operator.devcluster.cluster_cli import listening  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HETEROTRAIN = str(Path(sys.executable).parent / "heterotrain")


def run(*argv: str, timeout_s: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _our_processes(cluster_dir: Path) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if str(cluster_dir) in cmd or str(cluster_dir).encode() in environ:
            out.append(f"{proc.name}: {cmd[:120]}")
    return out


def test_cluster_up_helm_install_kubectl_apply_wait_describe_and_cluster_down(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cluster"
    up = run(HETEROTRAIN, "cluster", "up", "--dir", str(cluster_dir), timeout_s=600)
    assert f"export KUBECONFIG={cluster_dir / 'kubeconfig'}" in up.stdout, up.stdout
    state = controlplane.read_state(cluster_dir)
    env = {**os.environ, "KUBECONFIG": state["kubeconfig"], "PATH": f"{state['binDir']}:{os.environ['PATH']}"}
    try:
        version = json.loads(run("kubectl", "version", "-o", "json", env=env).stdout)["serverVersion"]
        assert (int(version["major"]), int(version["minor"])) >= (1, 34)
        run(str(helm_path()), "install", "heterotrain", str(REPO / "charts" / "heterotrain"),
            "--namespace", "heterotrain-system", "--create-namespace", "--wait", "--timeout", "180s",
            "--set-json", 'operator.extraEnv=[{"name":"HTJ_SIMULATE_DEVICES","value":"true"}]', env=env)
        # the chart NOTES' helm test: its pod reaches the operator's metrics Service (the local
        # kubelet routes <svc>.<ns>.svc:<port> to the real port) and is deleted once it succeeded
        run(str(helm_path()), "test", "heterotrain", "-n", "heterotrain-system", "--timeout", "120s", env=env)
        pods = json.loads(run("kubectl", "get", "pods", "-n", "heterotrain-system", "-o", "json", env=env).stdout)
        (operator_pod,) = pods["items"]  # no test pod left, in Error or otherwise
        assert operator_pod["status"]["phase"] == "Running"
        # the chart NOTES' logs command (without -f): the API server reads the local kubelet's log endpoint
        noted = run("kubectl", "-n", "heterotrain-system", "logs", "deployment/heterotrain", env=env).stdout
        pod_log = cluster_dir / "pods" / f"heterotrain-system_{operator_pod['metadata']['name']}.log"
        assert noted and pod_log.read_text().startswith(noted[:200]), (noted[:500], pod_log)
        run("kubectl", "apply", "-f", str(REPO / "examples" / "digits.yaml"), env=env)
        waited = subprocess.run(["kubectl", "wait", "--for=condition=Succeeded", "htj/digits", "--timeout=420s"],
                                capture_output=True, text=True, env=env, timeout=450, check=False)
        logs = (cluster_dir / "pods" / f"heterotrain-system_{operator_pod['metadata']['name']}.log")
        assert waited.returncode == 0, (waited.stderr, logs.read_text()[-3000:] if logs.exists() else "")
        described = run("kubectl", "describe", "htj", "digits", env=env).stdout
        assert "Events:" in described and "Planned" in described and "JobSucceeded" in described, described
        got = run("kubectl", "get", "htj", "digits", env=env).stdout
        assert "Succeeded" in got, got
        rank0 = run("kubectl", "logs", "digits-g0", "-c", "worker", env=env).stdout
        assert rank0 == (cluster_dir / "pods" / "default_digits-g0.log").read_text(), rank0[-2000:]
    finally:
        ports = [int(p) for p in state.get("ports", {}).values()]
        down = subprocess.run([HETEROTRAIN, "cluster", "down", "--dir", str(cluster_dir)], capture_output=True,
                              text=True, timeout=120, check=False)
    assert down.returncode == 0, down.stderr
    assert listening(ports) == []
    assert _our_processes(cluster_dir) == []
