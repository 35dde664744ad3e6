"""What ``spec.elastic`` cannot be planned with, each refusal naming why and the fix (pure; issue 31).

An elastic job shrinks by re-forming its process groups among the survivors and re-splitting the
global batch (``hetero_worker.membership``); that needs every survivor to hold the whole model
state and the job's admission to allow a shrink:

* a Kueue queue: Kueue's elastic workloads must keep one ResourceFlavor, and a heterogeneous job
  spans several, so Kueue could not admit the shrunk workload;
* sharded model state (``sharding`` Group or Full, chosen or picked by ``Auto``): a lost rank's
  shard exists on no survivor, so the job could not heal from its peers;
* pipeline stages (``spec.training.pipeline``): a lost stage's blocks exist on no other stage;
* rebalancing or compression (``spec.training.rebalance``, ``compression``): the speed
  controller's per-rank state is not re-formed after a shrink yet.

For the last two the job's way back is today's gang restart from its checkpoint, which a job
without ``spec.elastic`` already does; so they are refused rather than planned to fall back on
every loss (docs/elastic.md).
"""

from __future__ import annotations

from hetero_operator.api.spec import JobSpec

ELASTIC_NOT_PLANNED = "ElasticNotSupported"
"""``Unschedulable.reason`` of an elastic job refused here."""


def refusal(job: JobSpec) -> str:
    """Why ``job`` (with ``spec.elastic``) cannot be planned from its spec alone; ``""`` when it
    can (the sharding ``Auto`` picks is checked by :func:`sharding_refusal`)."""
    if job.elastic is None:
        return ""
    if job.run_policy.queue:
        return (f"spec.elastic with the Kueue queue {job.run_policy.queue!r}: Kueue's elastic "
                "workloads must keep one ResourceFlavor and this job spans several GPU types, so "
                "Kueue could not admit it after a shrink; remove spec.elastic (a lost rank then "
                "restarts the job from its checkpoint) or remove the queue "
                "(spec.runPolicy.schedulingPolicy.queue / the kueue.x-k8s.io/queue-name label)")
    if job.training.pipeline is not None:
        return ("spec.elastic with spec.training.pipeline: a lost stage's blocks are held by no "
                "other rank, so the survivors cannot heal from their peers (the job could only "
                "restart from its checkpoint, as it does without spec.elastic); remove "
                "spec.elastic or spec.training.pipeline")
    if job.training.rebalance_interval_steps > 0 or job.training.compression != "None":
        what = ("spec.training.rebalance.intervalSteps" if job.training.rebalance_interval_steps
                else f"spec.training.compression {job.training.compression}")
        return (f"spec.elastic with {what}: the speed controller's per-rank state (measured "
                "speeds, error feedback) is not re-formed after a shrink yet; remove "
                f"{what.split(' ')[0]} or spec.elastic")
    return sharding_refusal(job.training.sharding)


def sharding_refusal(mode: str) -> str:
    """Why an elastic job cannot run with sharding ``mode`` (``"Group"`` / ``"Full"``, as
    written or as ``Auto`` picked it); ``""`` for ``None`` and ``Auto`` (checked once picked)."""
    if mode not in ("Group", "Full"):
        return ""
    return (f"spec.elastic with sharding {mode}: a lost rank's shard of the model state is held "
            "by no survivor, so the job cannot heal from its peers; set "
            "spec.training.sharding: None (every rank holds the whole model: it must fit the "
            "smallest GPU) or remove spec.elastic (a lost rank then restarts the job from its "
            "checkpoint)")
