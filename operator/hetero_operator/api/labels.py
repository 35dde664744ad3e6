"""Labels and annotations on the objects the operator creates, and the selector that finds them
(pure)."""

from __future__ import annotations

LABEL_JOB = "heterotrain.io/job-name"
LABEL_GROUP = "heterotrain.io/group-index"
LABEL_ARCH = "heterotrain.io/arch"
LABEL_RANK = "heterotrain.io/rank"
LABEL_ATTEMPT = "heterotrain.io/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "heterotrain-operator"
ANNOTATION_GPU_TYPE = "heterotrain.io/gpu-type"
ANNOTATION_RANKS = "heterotrain.io/ranks"
ANNOTATION_LOCAL_PORTS = "local.heterotrain.io/ports"
"""Set by the local kubelet (``heterotrain cluster``, devcluster/kubelet.py) on the pods it runs: JSON
container port -> the host port it remapped it to (all its pods share 127.0.0.1)."""
LOCAL_POD_IP = "127.0.0.1"
"""The pod IP the local kubelet reports; no real kubelet puts a pod on the host's loopback."""


def selector(job_name: str) -> dict[str, str]:
    """Labels that select every pod of a job."""
    return {LABEL_JOB: job_name, LABEL_MANAGED_BY: MANAGED_BY}
