"""The local cluster complete (issue 33 item 7), on the real control plane with the local kubelet:
``examples/queued-job.yaml`` as written is admitted by real Kueue on the queues ``cluster up --kueue``
makes (devcluster/queues.py) and succeeds with its checkpoints in its claim's folder; the kubelet
mounts a PVC, an emptyDir, a ConfigMap and a Secret as folders under the cluster dir and refuses a
hostPath with an Event; the real Prometheus finds every rank through pod discovery against the API
server (devcluster/monitoring.py: ``kubernetes_sd_configs``, or with Debian's binary, built without
it, the stand-in devcluster/podsd.py answering the same ``role: pod`` targets)."""

from __future__ import annotations

import json
import stat
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from realcluster import REPO, RealCluster

from hetero_operator.devcluster import controlplane, monitoring, queues, volumes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
EXAMPLE = REPO / "examples" / "queued-job.yaml"


def _wl_cond(wl: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((wl or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def _workload(cl: RealCluster, ns: str, job: str) -> dict[str, Any] | None:
    items = cl.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
    return next((w for w in items if w["metadata"]["labels"].get("heterotrain.io/job-name") == job), None)


def _pv_of(cl: RealCluster, ns: str, claim: str) -> str:
    return cl.core.read_namespaced_persistent_volume_claim(claim, ns).spec.volume_name or ""


def _pv_gone(cl: RealCluster, name: str) -> bool:
    return name not in {pv.metadata.name for pv in cl.core.list_persistent_volume().items}


def test_the_example_names_the_queue_and_priority_class_cluster_up_makes() -> None:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    job = next(d for d in docs if d["kind"] == "HeteroTrainingJob")
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queues.LOCAL_QUEUE
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"queue": queues.LOCAL_QUEUE,
                                                            "priorityClass": queues.PRIORITY_CLASS}
    assert job["spec"]["training"]["checkpoint"]["persistentVolumeClaim"] == claim["metadata"]["name"]
    assert "namespace" not in job["metadata"] and queues.LOCAL_QUEUE_NAMESPACE == "default"


def test_queued_job_example_as_written_is_admitted_and_succeeds_with_checkpoints_in_its_claim(
        kueue: RealCluster) -> None:
    cl = kueue
    cl.idle()
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    made = queues.install(cl.dir, nodes)
    assert [d["metadata"]["name"] for d in made if d["kind"] == "ResourceFlavor"] == [
        "nvidia-a100-sxm4-40gb", "tesla-t4", "tesla-v100-sxm2-16gb"]
    ns = "default"
    try:
        cl.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        pv = cl.wait_for(lambda: _pv_of(cl, ns, "digits-checkpoints"), 30, "the claim bound by the provisioner")
        wl = cl.wait_for(lambda: _wl_cond(_workload(cl, ns, "digits-queued"), "Admitted").get("status") == "True"
                         and _workload(cl, ns, "digits-queued"), 60, "Kueue to admit the example's Workload")
        assert wl["status"]["admission"]["clusterQueue"] == queues.CLUSTER_QUEUE
        assert wl["spec"]["priorityClassRef"]["name"] == queues.PRIORITY_CLASS
        assert {a["flavors"]["nvidia.com/gpu"] for a in wl["status"]["admission"]["podSetAssignments"]} == {
            "nvidia-a100-sxm4-40gb", "tesla-t4", "tesla-v100-sxm2-16gb"}
        job = cl.finished("digits-queued", ns, 240)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        folder = Path(cl.core.read_persistent_volume(pv).spec.host_path.path)
        assert folder.is_relative_to(volumes.volume_root(cl.dir)), folder
        saved = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        # the claim is mounted at the checkpoint path /checkpoints/digits: intervalSteps 50's save
        assert any(p.startswith("step-00000050-") and p.endswith("/MANIFEST.json") for p in saved), saved
        assert not Path("/checkpoints").exists()
    finally:
        cl.kubectl("delete", "-n", ns, "--ignore-not-found", "--wait=false", "-f", str(EXAMPLE))
        cl.wait_for(lambda: not cl.pods(ns), 90, "the example's pods gone")
        queues.uninstall(cl.dir, made)
    cl.wait_for(lambda: _pv_gone(cl, pv), 60, f"the released volume {pv} deleted")
    assert not folder.exists()


def _answers(url: str) -> bool:
    """Whether ``url`` answers a GET with 2xx within 1 s."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return 200 <= response.status < 300
    except OSError:
        return False


def _volume_pod(name: str, node: str, code: str, volumes_: list[dict[str, Any]],
                mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "volumes": volumes_, "containers": [{
                         "name": "main", "image": "python", "command": ["python", "-c", code],
                         "env": [{"name": "DATA", "value": "/data/out"}], "volumeMounts": mounts}]}}


def test_the_kubelet_mounts_pvc_empty_dir_config_map_and_secret_under_the_cluster_dir_and_refuses_host_path(
        real: RealCluster) -> None:
    cl = real
    ns = cl.namespace("local-volumes")
    try:
        cl.core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"lr": "0.1", "x": "y"}})
        cl.core.create_namespaced_secret(ns, {"metadata": {"name": "sec"}, "stringData": {"token": "s3cret"}})
        cl.core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": volumes.STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}}}})
        pv = cl.wait_for(lambda: _pv_of(cl, ns, "data"), 30, "the claim bound")
        code = ("import os, sys\n"  # paths in the env and the args are rewritten, not inside the code
                "open(os.environ['DATA'], 'w').write('written')\n"
                "open(sys.argv[3], 'w').write('x')\n"
                "print('lr', open(sys.argv[1]).read(), 'token', open(sys.argv[2]).read())\n")
        pod = _volume_pod("mounts", "node-a100", code, [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "lr", "path": "train/lr"}],
                                          "defaultMode": 0o640}},
            {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}}],
            [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"},
             {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
             {"name": "sec", "mountPath": "/var/run/sec", "readOnly": True}])
        pod["spec"]["containers"][0]["args"] = ["/etc/cfg/train/lr", "/var/run/sec/token", "/scratch/t"]
        cl.core.create_namespaced_pod(ns, pod)
        cl.wait_for(lambda: cl.core.read_namespaced_pod("mounts", ns).status.phase in ("Succeeded", "Failed"), 60,
                    "the volume pod to finish")
        assert "lr 0.1 token s3cret" in cl.log(ns, "mounts"), cl.log(ns, "mounts")
        assert cl.core.read_namespaced_pod("mounts", ns).status.phase == "Succeeded"
        host = Path(cl.core.read_persistent_volume(pv).spec.host_path.path)
        assert (host / "out").read_text() == "written" and host.is_relative_to(cl.dir / "volumes")
        made = cl.core.read_namespaced_pod("mounts", ns)
        folder = volumes.pod_folder(cl.dir / "pods", cl.client.sanitize_for_serialization(made))
        assert (folder / "volumes" / "scratch" / "t").read_text() == "x"
        assert stat.S_IMODE((folder / "volumes" / "cfg" / "train" / "lr").stat().st_mode) == 0o640
        assert stat.S_IMODE((folder / "volumes" / "sec" / "token").stat().st_mode) == 0o400
        assert not (folder / "volumes" / "cfg" / "x").exists()  # items: only the key asked for
        # a hostPath: refused with an Event naming why, the pod stays Pending and runs nothing
        cl.core.create_namespaced_pod(ns, _volume_pod("hostpath", "node-a100", "print('ran')", [
            {"name": "root", "hostPath": {"path": "/etc"}}], [{"name": "root", "mountPath": "/host"}]))
        event = cl.wait_for(lambda: next((e for e in cl.events("hostpath", ns) if e["reason"] == "FailedMount"), None),
                            30, "the FailedMount Event")
        assert event["type"] == "Warning" and "hostPath is refused" in event["message"], event
        assert str(cl.dir.resolve()) in event["message"]
        assert cl.core.read_namespaced_pod("hostpath", ns).status.phase == "Pending"
        assert "ran" not in cl.log(ns, "hostpath")
    finally:
        cl.core.delete_namespace(ns)
        cl.wait_for(lambda: not cl.pods(ns), 60, f"the pods of {ns} gone")
    assert not folder.exists()  # the pod's own volumes go with it
    cl.wait_for(lambda: _pv_gone(cl, pv), 60, f"the released volume {pv} deleted")


def _targets(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as resp:
        return json.loads(resp.read())["data"]["activeTargets"]


def test_prometheus_finds_every_rank_through_pod_discovery_against_the_api_server(cluster: RealCluster,
                                                                          tmp_path: Path) -> None:
    from builders import script_job
    cl = cluster
    ns = cl.namespace("local-prom")
    flag = tmp_path / "go"
    code = ("import os, time\nfrom prometheus_client import start_http_server\n"
            "start_http_server(int(os.environ['HTJ_METRICS_PORT']), addr='127.0.0.1')\n"
            f"while not os.path.exists({str(flag)!r}):\n"
            "    time.sleep(0.2)  # sync-ok: serves until the test has seen every target up\n")
    url = monitoring.start(cl.dir, scrape_interval_s=1)
    pids = {name: p["pid"] for name, p in controlplane.read_state(cl.dir)["processes"].items()
            if name in (monitoring.PROCESS, monitoring.SD_PROCESS)}
    try:
        cl.apply(script_job("prom", code), ns)

        def all_up() -> list[dict[str, Any]] | None:
            mine = [t for t in _targets(url) if t["labels"].get("namespace") == ns]
            return mine if len(mine) == 4 and all(t["health"] == "up" for t in mine) else None
        up = cl.wait_for(all_up, 90, "one up target per rank")
        assert sorted((t["labels"]["pod"], t["labels"]["port_name"]) for t in up) == [
            ("prom-g0", "metrics"), ("prom-g1", "metrics"), ("prom-g2", "metrics"), ("prom-g2", "metrics-1")]
        real_ports = {p["metadata"]["name"]: json.loads(p["metadata"]["annotations"][
            "local.heterotrain.io/named-ports"]) for p in cl.pods(ns)}
        assert {t["labels"]["instance"] for t in up} == {
            f"127.0.0.1:{port}" for named in real_ports.values() for n, port in named.items() if n.startswith("metrics")}
        flag.write_text("1")
        assert cl.finished("prom", ns, 90)["status"]["phase"] == "Succeeded"
    finally:
        flag.write_text("1")
        controlplane.stop_pids(pids, cl.dir)
        cl.core.delete_namespace(ns)
        cl.wait_for(lambda: not cl.pods(ns), 60, f"the pods of {ns} gone")


def test_a_service_address_in_a_pods_args_reaches_the_remapped_port_as_helm_test_does(real: RealCluster) -> None:
    """The chart's ``helm test`` pod runs ``sh -c "wget ... http://<svc>.<ns>.svc:8080/metrics | grep
    -q ..."``: the kubelet routes the Service's port to the port its endpoint really listens on."""
    cl = real
    ns = cl.namespace("local-svc")
    serve = ("import http.server, os\n"
             "class H(http.server.BaseHTTPRequestHandler):\n"
             "    def do_GET(self):\n"
             "        self.send_response(200); self.end_headers(); self.wfile.write(b'htj_operator_up 1\\n')\n"
             "http.server.HTTPServer(('127.0.0.1', int(os.environ['HTJ_METRICS_PORT'])), H).serve_forever()\n")
    try:
        server = _volume_pod("server", "node-a100", serve, [], [])
        server["metadata"]["labels"] = {"app": "op"}
        server["spec"]["containers"][0].update(env=[{"name": "HTJ_METRICS_PORT", "value": "8080"}], ports=[
            {"name": "metrics", "containerPort": 8080}])
        cl.core.create_namespaced_pod(ns, server)
        cl.core.create_namespaced_service(ns, {"metadata": {"name": "op-metrics"}, "spec": {
            "selector": {"app": "op"}, "ports": [{"name": "http", "port": 8080, "targetPort": "metrics"}]}})
        ports = cl.wait_for(lambda: (cl.core.read_namespaced_pod("server", ns).metadata.annotations or {}).get(
            "local.heterotrain.io/ports"), 30, "the server's port remapped")
        # the client's wget tries once: start it only once the server answers on its real port
        # (CI saw the client fail while the server's Python was still starting)
        cl.wait_for(lambda: _answers(f"http://127.0.0.1:{json.loads(ports)['8080']}/metrics"), 30,
                    "the server answering")
        client = _volume_pod("client", "node-t4", "", [], [])
        client["spec"]["containers"][0].update(command=["sh", "-c"], args=[
            f"wget -q -T 10 -O - http://op-metrics.{ns}.svc:8080/metrics | grep -q '^htj_operator_'"])
        cl.core.create_namespaced_pod(ns, client)
        cl.wait_for(lambda: cl.core.read_namespaced_pod("client", ns).status.phase in ("Succeeded", "Failed"), 60,
                    "the client pod to finish")
        assert cl.core.read_namespaced_pod("client", ns).status.phase == "Succeeded", cl.log(ns, "client")
    finally:
        cl.core.delete_namespace(ns)
        cl.wait_for(lambda: not cl.pods(ns), 60, f"the pods of {ns} gone")
