"""Failed reconciles back off per job, a plan too large for the status is refused once, and a
deleted job leaves nothing behind in the reconciler (issue 32, F13 and F16).

Today a failed reconcile is retried every ``HTJ_RESYNC_S`` (10 s) for ever, whatever the job; a
plan of more than 4,096 pod groups is refused by the API server (``status.plan.groups``
``maxItems``) on every reconcile without an Event; and the reconciler's set of checkpoint
fallbacks already told is never pruned.  The API faults are raised by the fake API object: the
real API server cannot be made to fail one job's reads on demand."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from builders import make_node
from test_handlers import CONFIG, FakeApi, _job, _reconciler, _status

from hetero_operator.api import limits
from hetero_operator.api.spec import parse_job
from hetero_operator.controller.progress import Progress
from hetero_operator.controller.requeue import Requeue, retry_delay_s

REPO = Path(__file__).resolve().parents[2]


def test_retry_delay_doubles_per_failure_and_stops_at_the_cap() -> None:
    assert [retry_delay_s(n, 10.0, 300.0) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert retry_delay_s(10_000, 10.0, 300.0) == 300.0  # no overflow after a day of failures


async def test_a_failing_job_backs_off_alone_and_one_success_resets_it() -> None:
    loop = asyncio.get_running_loop()
    calls: dict[str, list[float]] = {"bad": [], "good": []}
    done = asyncio.Event()

    async def work(namespace: str, name: str) -> float | None:
        calls[name].append(loop.time())
        if name == "good":
            return None
        if len(calls["bad"]) <= 4:
            raise RuntimeError("API hiccup")
        done.set()
        return None

    requeue = Requeue(work, retry_s=0.02, max_retry_s=0.08)
    requeue.kick("ns", "bad")
    requeue.kick("ns", "good")
    await asyncio.wait_for(done.wait(), 5)
    gaps = [b - a for a, b in zip(calls["bad"], calls["bad"][1:])]
    for gap, wanted in zip(gaps, [0.02, 0.04, 0.08, 0.08], strict=True):
        assert gap >= wanted - 0.005, (gaps, wanted)
    assert len(calls["good"]) == 1, "the other job is not retried"
    assert requeue.failures("ns", "bad") == 0 and requeue.failures("ns", "good") == 0
    await requeue.stop()


async def test_the_reconcilers_retries_double_up_to_the_backoff_max() -> None:
    class Failing(FakeApi):
        async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
            raise ConnectionError("connection reset by peer")

    config = CONFIG.with_({"intervals.resync_s": 0.01, "restart.backoff_base_s": 0.01,
                           "restart.backoff_max_s": 0.04})
    rec = _reconciler(Failing(_job()), config=config)
    loop = asyncio.get_running_loop()
    rec.kick("team-x", "digits")
    while rec.requeue.failures("team-x", "digits") < 5:
        await asyncio.sleep(0.005)  # sync-ok: polling the asserted state
    when, _ = rec.requeue._due[("team-x", "digits")]
    assert 0.03 < when - loop.time() <= 0.04, "the fifth retry waits the cap, 0.04 s"
    rec.forget("team-x", "digits")
    assert rec.requeue.failures("team-x", "digits") == 0 and not rec.requeue._due
    await rec.stop()


async def test_a_plan_over_4096_groups_fails_once_with_a_warning_naming_the_fix() -> None:
    crd = yaml.safe_load((REPO / "crds" / "heterotrainingjobs.heterotrain.io.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["plan"]["properties"]["groups"]["maxItems"] == limits.PLAN_GROUPS_MAX == 4096
    nodes = [make_node(f"t4-{i:05d}", product="Tesla-T4", count=1, memory_mib=15360, cc="7.5")
             for i in range(4100)]
    api = FakeApi(_job(gpus={"ranks": 4100, "minRanks": 4100}, training={"globalBatchSize": 8200}))
    rec = _reconciler(api, nodes=nodes)
    assert await rec.reconcile("team-x", "digits") is None
    st = _status(api)
    assert (st["phase"], "plan" in st) == ("Failed", False)
    assert st["message"].startswith("The plan has 4,100 pod groups (one per node and GPU type) for "
                                    "4,100 ranks, more than the 4,096 a job's status holds")
    assert "lower spec.gpus.ranks (now 4,100)" in st["message"]
    assert api.pods == {} and api.services == {}
    await rec.reconcile("team-x", "digits")  # finished: not planned again, not said again
    assert [e[:2] for e in api.events] == [("Warning", "PlanTooLarge")]


async def test_a_deleted_job_leaves_no_memory_in_the_reconciler() -> None:
    """F16: every per-job record goes with the job (here: the checkpoint fallbacks told, the
    backoff count, the remembered queue, the Event memory, the phase and the nodes)."""
    api = FakeApi(_job())
    rec = _reconciler(api)
    await rec.reconcile("team-x", "digits")
    rec.progress.last[("team-x", "digits")] = Progress(step=100, samples_per_s=1.0, checkpoint_fallbacks=1,
                                                           resumed_step=100)
    job = api.jobs[("team-x", "digits")]
    await rec.ckpt_events.observe(job, parse_job(job), _status(api), rec.progress.last[("team-x", "digits")], 1.0)
    assert [e[1] for e in api.events][-1] == "CheckpointFallback"
    rec.requeue.backoff("team-x", "digits")
    rec.kueue._queues[("team-x", "digits")] = ("uid-1", "team-q")
    api.jobs.clear()
    assert await rec.reconcile("team-x", "digits") is None  # gone: forgotten
    leftovers = []
    for holder in (rec, rec.ckpt_events, rec.requeue, rec.events, rec.progress, rec.learner, rec.kueue, rec.reservations):
        for attr, value in vars(holder).items():
            if isinstance(value, (dict, set)):
                keys = value.keys() if isinstance(value, dict) else value
                leftovers += [(type(holder).__name__, attr, k) for k in keys
                              if isinstance(k, tuple) and k[:2] == ("team-x", "digits")]
    assert leftovers == []



def test_a_status_merge_patch_names_every_removed_key_as_null() -> None:
    """The reconciler's status write (lifecycle/status.merge_patch): changed keys, removed keys at
    the top and one level down as None (RFC 7386), nothing for an equal status."""
    from hetero_operator.lifecycle.status import merge_patch

    old = {"phase": "Running", "progress": {"step": 10, "eta": "5s"}, "message": "m", "restarts": 0}
    new = {"phase": "Succeeded", "progress": {"step": 30}, "restarts": 0}
    assert merge_patch(old, new) == {"phase": "Succeeded", "progress": {"eta": None, "step": 30},
                                     "message": None}
    assert merge_patch(new, new) == {}
