"""The job's UID reaches every rank (``HTJ_JOB_UID``): checkpoint manifests record it beside the
restart generation, so a stale gang never publishes into or prunes a directory a newer generation
of the same job owns (issue 32, F9; hetero_worker/ckpt/ownership.py)."""

from __future__ import annotations

from builders import make_job
from test_envrender import _plan
from test_handlers import FakeApi, _job, _reconciler

from hetero_operator.render.env import render_rank_envs
from heterotrain_common.contract import expand_pod_env, parse_contract
from heterotrain_common.envnames import JOB_UID, RESTART_GENERATION


def test_the_job_uid_is_rendered_for_every_rank_and_only_when_known() -> None:
    job = make_job(name="digits", ranks=3, global_batch=96, training={"checkpoint": {"path": "/ckpt"}})
    envs = render_rank_envs(_plan(job), job, master_addr="m", master_port=1, simulated=True,
                            restart_generation=4, job_uid="0b6d3c1e-uid")
    assert [(e[JOB_UID], e[RESTART_GENERATION]) for e in envs] == [("0b6d3c1e-uid", "4")] * 3
    assert [parse_contract(e).dist.job_uid for e in envs] == ["0b6d3c1e-uid"] * 3
    assert JOB_UID not in render_rank_envs(_plan(job), job, master_addr="m", master_port=1,
                                           simulated=True)[0]


async def test_the_operator_gives_every_pod_its_job_uid() -> None:
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    envs = {name: {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"] if "value" in e}
            for name, p in api.pods.items()}
    assert envs and {name: env[JOB_UID] for name, env in envs.items()} == dict.fromkeys(envs, "uid-1")
    assert parse_contract(expand_pod_env(envs["digits-g0"], 0)).dist.job_uid == "uid-1"
