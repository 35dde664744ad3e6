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


def selector(job_name: str) -> dict[str, str]:
    """Labels that select every pod of a job."""
    return {LABEL_JOB: job_name, LABEL_MANAGED_BY: MANAGED_BY}
