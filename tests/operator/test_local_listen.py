"""``heterotrain run``'s ranks listen on 127.0.0.1 only (issue 32, F11): the Prometheus endpoint of
every rank and rank 0's rendezvous ``TCPStore`` (which torch would open on every interface), and
a job that spans hosts still listens on every interface."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from builders import local_job

from heterotrain_common import listen

RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]

# A rank joins the job and starts its metrics server as the Trainer does (rendezvous, then
# WorkerMetrics.start_server with no address), then writes every TCP socket it listens on
# (its own: /proc/net/tcp{,6} rows whose inode is one of its fds) to OUT/rank-<r>.json.
RANK = textwrap.dedent("""
    import json, os, socket, sys
    from heterotrain_common.contract import parse_contract
    from hetero_worker.metrics import WorkerMetrics
    from hetero_worker.runtime import rendezvous
    ct = parse_contract(os.environ)
    rendezvous.init_distributed(rank=ct.dist.rank, world_size=ct.dist.world_size,
                                master_addr=ct.dist.master_addr, master_port=ct.dist.master_port,
                                backend="gloo", timeout_s=60)
    metrics = WorkerMetrics(ct)
    served = metrics.start_server()
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    listening = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/self/net/{table}").read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in ours:  # 0A: LISTEN
                ip, port = f[1].split(":")
                raw = bytes.fromhex(ip)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
                listening.append([socket.inet_ntop(family, raw), int(port, 16)])
    with open(os.path.join(os.environ["OUT"], f"rank-{ct.dist.rank}.json"), "w") as out:
        json.dump({"listening": listening, "metrics_port": served,
                   "master_port": ct.dist.master_port}, out)
    import torch.distributed as dist
    dist.barrier()  # every rank has looked before rank 0's store goes away
    metrics.stop_server()
    dist.destroy_process_group()
""")


def _job(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return local_job(tmp_path / "listen.yaml", "listen", ["python", "-c", RANK], env={"OUT": str(tmp_path / "out")})


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_every_rank_of_heterotrain_run_listens_on_loopback_only(tmp_path: Path) -> None:
    done = subprocess.run([*RUN, str(_job(tmp_path)), "--grace-s", "3"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank-*.json"))]
    assert len(ranks) == 4  # examples/clusters/mixed.yaml: A100, V100, 2x T4
    for r in ranks:
        ports = {port for _, port in r["listening"]}
        assert r["metrics_port"] > 0 and r["metrics_port"] in ports
        assert {addr for addr, _ in r["listening"]} == {"127.0.0.1"}, r
    rank0 = json.loads((tmp_path / "out" / "rank-0.json").read_text())
    assert [addr for addr, port in rank0["listening"] if port == rank0["master_port"]] == ["127.0.0.1"]


@pytest.mark.parametrize(("master_addr", "bind"), [
    ("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("::1", "::1"),
    ("job-g0-0.job.ns.svc.cluster.local", "0.0.0.0"), ("10.0.0.7", "0.0.0.0"), ("0.0.0.0", "0.0.0.0"),
])
def test_a_one_host_job_serves_on_its_loopback_address_any_other_on_every_interface(
        master_addr: str, bind: str) -> None:
    assert listen.server_address(master_addr) == bind


def test_localhost_is_its_loopback_address_without_dns() -> None:
    assert listen.loopback_address("localhost") in {"127.0.0.1", "::1"}


def test_the_store_socket_listens_on_the_masters_loopback_address_only() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    fd = listen.loopback_listener("127.0.0.1", port)
    assert fd is not None
    with socket.socket(fileno=fd) as sock:
        assert sock.getsockname() == ("127.0.0.1", port)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        with pytest.raises(OSError):  # the port is ours: a second listener is refused
            listen.loopback_listener("127.0.0.1", port)
    assert listen.loopback_listener("job-g0-0.job.ns.svc", port) is None
