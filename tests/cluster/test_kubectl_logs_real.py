"""``kubectl logs`` and ``heterotrain logs``/``status`` on the local cluster: the REAL API server
reaches the local kubelet's log endpoint (``/containerLogs``, TLS both ways) at the Node's
InternalIP and the port in its ``daemonEndpoints``."""

from __future__ import annotations

import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from builders import script_job
from realcluster import REPO, RealCluster

from hetero_operator.devcluster import kubeletlogs, pki

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SAYS = ("import os\n"
        "r = os.environ['RANK']\n"
        "print(f'rank {r} of {os.environ[\"WORLD_SIZE\"]} says hello', flush=True)\n"
        "print(f'rank {r} done', flush=True)\n")


def _cli(cluster: RealCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetero_operator.cli", *argv,
                           "--kubeconfig", cluster.state["kubeconfig"]],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_kubectl_logs_of_a_rank_pod_returns_its_lines(cluster: RealCluster) -> None:
    ns = cluster.namespace("logs")
    cluster.apply(script_job("hello", SAYS, runPolicy={"cleanPodPolicy": "None"}), ns)  # pods kept
    job = cluster.finished("hello", ns)
    assert job["status"]["phase"] == "Succeeded"
    node = cluster.node("node-t4")
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0
    # the T4 pod hosts ranks 2 and 3: kubectl logs reads it through the API server and the kubelet
    out = cluster.kubectl("logs", "-n", ns, "hello-g2", "-c", "worker").stdout
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert sorted(lines) == ["rank 2 done", "rank 2 of 4 says hello", "rank 3 done", "rank 3 of 4 says hello"]
    tail = cluster.kubectl("logs", "-n", ns, "hello-g0", "--tail=1").stdout
    assert tail == "rank 0 done\n"
    # the same pod log through heterotrain logs (the pod that hosts rank 3), and the job's status
    shown = _cli(cluster, "logs", "hello", "-n", ns, "--rank", "3")
    assert shown.returncode == 0, shown.stderr
    assert "rank 3 of 4 says hello" in shown.stdout and shown.stderr.startswith("==> pod hello-g2 (ranks 2-3, Tesla-T4")
    status = _cli(cluster, "status", "hello", "-n", ns)
    assert status.stdout.splitlines()[0] == f"Job       {ns}/hello (on the cluster)"
    assert status.stdout.splitlines()[1].startswith("State     Succeeded")
    missing = _cli(cluster, "logs", "hello", "-n", ns, "--rank", "9")
    assert missing.returncode == 1 and "no pod of logs/hello hosts rank 9" in missing.stderr


def test_the_kubelet_log_endpoint_takes_only_the_api_servers_certificate(cluster: RealCluster,
                                                                         tmp_path: Path) -> None:
    port = cluster.node("node-a100")["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    url = f"https://127.0.0.1:{port}/containerLogs/default/none/worker"
    ca = cluster.dir / "pki" / "ca.crt"

    def get(cert: tuple[Path, Path] | None) -> int:
        ctx = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            ctx.load_cert_chain(*cert)
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(None)  # no client certificate: refused in the handshake
    other = pki.ensure_client_cert(cluster.dir / "pki", "someone-else")
    assert get(other) == 403
    assert get(kubeletlogs.kubelet_pki(cluster.dir / "pki")[1]) == 404  # the API server's: no such pod here
