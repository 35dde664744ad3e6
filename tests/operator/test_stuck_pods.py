"""Issue 32, F5: every wait ends.  Pods that will not start whatever the plan (image pull errors,
an invalid image name, a missing Secret, scheduling gates left on, Multi-Attach) are job errors
with a named reason, not re-plans every 300 s forever; re-plans are counted, backed off
exponentially and capped (``HTJ_MAX_REPLANS``), then the job fails naming why.  Through the pure
:func:`hetero_operator.lifecycle.decisions.decide` and the status it writes."""

from __future__ import annotations

from typing import Any

import pytest

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import status as st
from hetero_operator.lifecycle import stuck

NOW = 1_800_000_000.0
TIMING = lc.RestartSettings(pending_timeout_s=300, backoff_base_s=10, backoff_max_s=300, max_replans=3)
NODES = {n: NodeHealth(name=n) for n in ("node-a", "node-b")}
PODS = ("job-g0", "job-g1")


def _pod(name: str, rank: int, *, created_s: float, waiting: dict[str, Any] | None = None,
         init_waiting: dict[str, Any] | None = None, gates: list[str] | None = None,
         phase: str = "Pending") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "worker", "state": {"waiting": waiting}}]
    if init_waiting is not None:
        status["initContainerStatuses"] = [{"name": "fetch", "state": {"waiting": init_waiting}}]
    spec: dict[str, Any] = {"containers": [{"name": "worker"}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    else:
        spec["nodeName"] = f"node-{'ab'[rank]}"
    return {"metadata": {"name": name, "creationTimestamp": c.now_iso(created_s),
                         "labels": {"heterotrain.io/rank": str(rank), "heterotrain.io/attempt": "1"}},
            "spec": spec, "status": status}


def _decide(pods: list[dict[str, Any]], *, now: float = NOW, replans: int = 0,
            events: dict[str, list[dict[str, Any]]] | None = None, policy: RunPolicy = RunPolicy()) -> lc.Decision:
    job = lc.JobState(phase="Created", attempt=1, start_s=NOW - 400, planned_pods=PODS, replans=replans)
    states = [st.pod_state(p, events=(events or {}).get(p["metadata"]["name"], ())) for p in pods]
    return lc.decide(job, policy, states, nodes=NODES, now_s=now, timing=TIMING)


PULL = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/heterotrain/worker:0.1.0-cu999"'}


def test_an_image_pull_error_waits_with_its_reason_and_the_fix_not_a_replan() -> None:
    pods = [_pod("job-g0", 0, created_s=NOW - 60, phase="Running"),
            _pod("job-g1", 1, created_s=NOW - 60, waiting=PULL)]
    d = _decide(pods)
    assert (d.action, d.phase, d.reason) == (lc.WAIT, "Created", "ImagePullFailed")
    assert d.message == (
        'Pod job-g1 cannot start: container worker is ImagePullBackOff: Back-off pulling image '
        '"ghcr.io/heterotrain/worker:0.1.0-cu999"; check the image and tag in spec.images and the '
        "registry's credentials (imagePullSecrets in spec.worker.template.spec). The job fails at "
        f"{c.now_iso(NOW + 240)} if it still cannot start (HTJ_PENDING_TIMEOUT_S=300).")
    assert d.requeue_s == pytest.approx(240.5) and d.delete_pods == ()


def test_an_image_pull_error_past_the_pending_timeout_fails_the_job_instead_of_replanning() -> None:
    pods = [_pod("job-g0", 0, created_s=NOW - 301, waiting=PULL),
            _pod("job-g1", 1, created_s=NOW - 301, waiting={"reason": "ErrImagePull", "message": "not found"})]
    d = _decide(pods)
    assert (d.action, d.phase, d.reason) == (lc.FAIL, "Failed", "ImagePullFailed")
    assert d.message.startswith("Pod job-g0 cannot start: container worker is ImagePullBackOff")
    assert "for 301 s; re-planning would create the same pod, so the job fails" in d.message
    assert d.delete_pods == PODS  # cleanPodPolicy Running: the pending pods go
    new = st.decided_status({"phase": "Created", "replans": 0}, d, [], generation=1, now_s=NOW)
    failed = c.get_condition(new["conditions"], "Failed")
    assert (new["phase"], failed["status"], failed["reason"]) == ("Failed", "True", "ImagePullFailed")
    assert new["replans"] == 0 and new["completionTime"] == c.now_iso(NOW)


def test_an_invalid_image_name_fails_at_once_it_never_heals() -> None:
    pods = [_pod("job-g0", 0, created_s=NOW - 5, waiting={"reason": "InvalidImageName",
                                                         "message": 'couldn\'t parse image name "Bad:Image"'}),
            _pod("job-g1", 1, created_s=NOW - 5)]
    d = _decide(pods)
    assert (d.action, d.reason) == (lc.FAIL, "InvalidImageName")
    assert d.message == ('Pod job-g0 cannot start: container worker is InvalidImageName: couldn\'t parse image '
                         'name "Bad:Image"; re-planning would create the same pod, so the job fails: fix the '
                         "image reference in spec.images, then re-create the job.")


@pytest.mark.parametrize("pod,reason,words", [
    (_pod("job-g1", 1, created_s=NOW - 10, init_waiting={
        "reason": "CreateContainerConfigError", "message": 'secret "s3-credentials" not found'}),
     "ContainerConfigError", 'container fetch is CreateContainerConfigError: secret "s3-credentials" not found; '
                             "create the Secret or ConfigMap it names"),
    (_pod("job-g1", 1, created_s=NOW - 10, gates=["example.com/quota-check"]),
     "SchedulingGated", "scheduling gate(s) example.com/quota-check still on it; the controller that added"),
    (_pod("job-g1", 1, created_s=NOW - 10, waiting={"reason": "ErrImageNeverPull", "message": "never"}),
     "ImagePullFailed", "container worker is ErrImageNeverPull: never"),
], ids=["missing secret", "scheduling gates left on", "image never pulled"])
def test_each_reason_that_no_plan_fixes_is_named_then_fails_after_the_timeout(
        pod: dict[str, Any], reason: str, words: str) -> None:
    pods = [_pod("job-g0", 0, created_s=NOW - 10), pod]
    d = _decide(pods)
    assert (d.action, d.reason) == (lc.WAIT, reason) and words in d.message, d.message
    later = _decide(pods, now=NOW + 291)
    assert (later.action, later.phase, later.reason) == (lc.FAIL, "Failed", reason)


def test_a_multi_attach_event_is_a_job_error_naming_the_volume() -> None:
    event = {"reason": "FailedAttachVolume", "type": "Warning",
             "message": 'Multi-Attach error for volume "pvc-1f3" Volume is already used by pod(s) job-g0'}
    pods = [_pod("job-g0", 0, created_s=NOW - 10), _pod("job-g1", 1, created_s=NOW - 10,
                                                        waiting={"reason": "ContainerCreating"})]
    d = _decide(pods, events={"job-g1": [event]})
    assert (d.action, d.reason) == (lc.WAIT, "VolumeMultiAttach")
    assert 'Multi-Attach error for volume "pvc-1f3"' in d.message and "ReadWriteMany" in d.message
    assert _decide(pods, now=NOW + 291, events={"job-g1": [event]}).reason == "VolumeMultiAttach"
    # without the event, ContainerCreating is an ordinary wait
    assert _decide(pods).reason == "PodsPending"


def test_replans_back_off_exponentially_and_fail_past_the_cap() -> None:
    pending = [_pod("job-g0", 0, created_s=NOW - 301), _pod("job-g1", 1, created_s=NOW - 301)]
    delays = []
    for replans in range(3):
        d = _decide(pending, replans=replans)
        assert (d.action, d.reason) == (lc.REPLAN, "PendingTimeout")
        assert d.restart_not_before_s is not None
        delays.append(d.restart_not_before_s - NOW)
        assert d.message == (f"Pod job-g0 was Pending longer than 300 s; re-plan {replans + 1} of at most 3 "
                             f"(HTJ_MAX_REPLANS) in {delays[-1]:.0f} s.")
    assert delays == [10.0, 20.0, 40.0]
    d = _decide(pending, replans=3)
    assert (d.action, d.phase, d.reason) == (lc.FAIL, "Failed", "ReplanLimitExceeded")
    assert "3 re-plan(s) reached HTJ_MAX_REPLANS=3, so the job fails" in d.message


def test_a_replan_is_counted_and_waits_its_backoff_before_the_next_start() -> None:
    pending = [_pod("job-g0", 0, created_s=NOW - 301), _pod("job-g1", 1, created_s=NOW - 301)]
    d = _decide(pending, replans=1)
    new = st.decided_status({"phase": "Created", "replans": 1}, d, [], generation=1, now_s=NOW)
    assert (new["phase"], new["replans"], new["restartNotBefore"]) == ("Pending", 2, c.now_iso(NOW + 20))
    job = st.job_state(new)
    assert job.replans == 2
    wait = lc.decide(job, RunPolicy(), [], nodes=NODES, now_s=NOW + 5, timing=TIMING)
    assert (wait.action, wait.phase, wait.reason) == (lc.WAIT, "Pending", "ReplanBackoff")
    assert wait.message == "Re-plan 2 starts in 15 s (exponential backoff)." and wait.requeue_s == pytest.approx(15)
    start = lc.decide(job, RunPolicy(), [], nodes=NODES, now_s=NOW + 20, timing=TIMING)
    assert start.action == lc.START


def test_the_reasons_are_camel_case_and_each_has_a_fix() -> None:
    assert set(stuck.FIXES) == set(stuck.JOB_REASONS)
    assert all(r[0].isupper() and r.isalnum() for r in stuck.JOB_REASONS)
