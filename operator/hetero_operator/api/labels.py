"""Labels and annotations on the objects the operator creates and reads, and the selector that
finds them (pure).  Every ``heterotrain.io/*`` key is defined here and nowhere else
(tests/operator/test_read_once_build_once.py holds the operator to that).
"""

from __future__ import annotations

OWN_PREFIX = "heterotrain.io/"
"""Prefix of the operator's own label and annotation keys (a template may not set them)."""
LABEL_JOB = "heterotrain.io/job-name"
LABEL_GROUP = "heterotrain.io/group-index"
LABEL_ARCH = "heterotrain.io/arch"
LABEL_RANK = "heterotrain.io/rank"
LABEL_ATTEMPT = "heterotrain.io/attempt"
"""A pod's restart generation (``status.attempt`` of the start that created it)."""
LABEL_ROLE = "heterotrain.io/role"
"""Set on a job's pods that run no rank: :data:`ROLE_KEEPER` (an elastic job's membership keeper)."""
ROLE_KEEPER = "membership-keeper"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "heterotrain-operator"
ANNOTATION_GPU_TYPE = "heterotrain.io/gpu-type"
"""GFD-style GPU type of a pod (and of a Kueue pod set's template)."""
ANNOTATION_RANKS = "heterotrain.io/ranks"
"""The global ranks a pod hosts: ``"3"`` or ``"2-5"``."""
ANNOTATION_PROFILE_STEPS = "heterotrain.io/profile-steps"
"""On a job: the optimizer steps to profile, ``"FIRST-LAST"``."""
ANNOTATION_DEACTIVATED_BY = "heterotrain.io/deactivated-by"
"""On a Kueue Workload: we set ``active: false`` (a user's suspend), so we may re-activate it."""
ANNOTATION_SIMULATED_SPEED = "heterotrain.io/simulated-speed-percent"
"""On a node of ``heterotrain run``'s node list: the speed (percent of an A100) its simulated
devices really run at, whatever the planner's table says; the operator ignores it."""
ANNOTATION_LOCAL_PORTS = "local.heterotrain.io/ports"
"""Set by the local kubelet (``heterotrain cluster``, devcluster/kubelet.py) on the pods it runs: JSON
container port -> the host port it remapped it to (all its pods share 127.0.0.1)."""
ANNOTATION_LOCAL_NAMED_PORTS = "local.heterotrain.io/named-ports"
"""Set by the local kubelet beside :data:`ANNOTATION_LOCAL_PORTS`: JSON container port *name* ->
the host port (``{"metrics": 41001, "metrics-1": 41002}``), what the local Prometheus's relabelling
can match without back-references (devcluster/monitoring.py)."""
LOCAL_POD_IP = "127.0.0.1"
"""The pod IP the local kubelet reports; no real kubelet puts a pod on the host's loopback."""


def selector(job_name: str) -> dict[str, str]:
    """Labels that select every pod of a job."""
    return {LABEL_JOB: job_name, LABEL_MANAGED_BY: MANAGED_BY}

LOCAL_PATH_PROVISIONER = "heterotrain.io/local-path"
"""The local cluster's volume provisioner (``heterotrain cluster up``): a StorageClass's
``provisioner`` and the label on each PersistentVolume it makes."""
