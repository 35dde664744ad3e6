"""The operator reads rank 0's metrics where the local kubelet put them (issue 18): on the
``heterotrain cluster`` path every pod is 127.0.0.1 and the kubelet remaps ``HTJ_METRICS_PORT``
to a free host port, named in the pod annotation ``local.heterotrain.io/ports``; the operator
honours that annotation only on a pod at 127.0.0.1 (which no real kubelet reports)."""

from __future__ import annotations

import json
from typing import Any

from hetero_operator.api.labels import ANNOTATION_LOCAL_PORTS
from hetero_operator.controller.progress import default_metrics_url
from hetero_operator.devcluster import kubelet


def _pod(ip: str | None, ports: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "digits-0", "namespace": "team"}
    if ports is not None:
        meta["annotations"] = {ANNOTATION_LOCAL_PORTS: ports if isinstance(ports, str) else json.dumps(ports)}
    return {"metadata": meta, "status": {"podIP": ip} if ip else {}}


def test_a_local_kubelet_pod_is_read_at_its_remapped_port() -> None:
    pod = _pod("127.0.0.1", {"9480": 41234, "9481": 41235, "29500": 40000})
    assert default_metrics_url(pod, 9480) == "http://127.0.0.1:41234/metrics"
    assert default_metrics_url(pod, 9480) == kubelet.LocalKubelet.metrics_url(None, pod, 9480)  # type: ignore[arg-type]
    assert kubelet.PORTS_ANNOTATION == ANNOTATION_LOCAL_PORTS


def test_the_annotation_is_ignored_off_the_local_kubelet() -> None:
    assert default_metrics_url(_pod("10.4.2.7", {"9480": 41234}), 9480) == "http://10.4.2.7:9480/metrics"


def test_without_a_usable_annotation_the_declared_port_is_read() -> None:
    assert default_metrics_url(_pod("127.0.0.1"), 9480) == "http://127.0.0.1:9480/metrics"
    assert default_metrics_url(_pod("127.0.0.1", {"29500": 40000}), 9480) == "http://127.0.0.1:9480/metrics"
    assert default_metrics_url(_pod("127.0.0.1", "not json"), 9480) == "http://127.0.0.1:9480/metrics"
    assert default_metrics_url(_pod("127.0.0.1", ["9480"]), 9480) == "http://127.0.0.1:9480/metrics"
    assert default_metrics_url(_pod("127.0.0.1", {"9480": "x"}), 9480) == "http://127.0.0.1:9480/metrics"
    assert default_metrics_url(_pod(None, {"9480": 41234}), 9480) is None
