"""``heterotrain run`` with ``spec.elastic`` (issue 31, items 2 and 4): a rank SIGKILLed by the
user mid-run shrinks the job; the survivors go on without a restart and without reading a
checkpoint; the supervisor starts the lost rank again, it joins at a step boundary with a peer's
state (the job grows back), and the report says both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from waiting import wait_until

RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]


def _elastic_digits(tmp_path: Path, repo_root: Path) -> Path:
    body = yaml.safe_load((repo_root / "examples" / "digits.yaml").read_text())
    body["spec"]["elastic"] = {"minRanks": 2}
    body["spec"]["training"]["collectiveTimeoutSeconds"] = 5  # the detection bound (docs/elastic.md)
    body["spec"]["training"]["checkpoint"]["path"] = str(tmp_path / "ckpt")
    body["spec"]["worker"]["args"] = ["--epochs", "6"]  # 66 steps: time for the rank to rejoin
    job = tmp_path / "elastic-digits.yaml"
    job.write_text(yaml.safe_dump(body))
    return job


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.timeout(120)
def test_a_sigkilled_t4_rank_shrinks_the_run_and_it_succeeds(repo_root: Path, tmp_path: Path) -> None:
    work = tmp_path / "w"
    proc = subprocess.Popen([*RUN, str(_elastic_digits(tmp_path, repo_root)), "--workdir", str(work),
                             "--metrics-port-base", "0"], cwd=repo_root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: int(_read(work / "rank-0.json").get("steps") or 0) >= 3, timeout_s=60,
                   what="rank 0's third step (rank-0.json)")
        ranks = _read(work / "run.json")["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
        victim = next(r for r in reversed(ranks) if r["gpu_product"] == "Tesla-T4")
        os.kill(victim["pid"], signal.SIGKILL)
        out = proc.communicate(timeout=90)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    text = " ".join(out.split())
    assert f"Rank {victim['rank']} (Tesla-T4 on {victim['node']}) lost (exit 137)" in text
    logs = "".join((work / f"rank-{r}.log").read_text() for r in range(4))
    assert "resumed at step" not in (out + logs).lower()
    assert "--- attempt 1" not in logs  # no gang restart
    event = _read(work / "membership.json")["events"][0]
    assert (event["from"], event["to"], event["rank"]) == (4, 3, victim["rank"])
    assert event["step"] >= 4
    assert 0 < event["recovery_s"] < 5  # below the collective timeout: the survivors cut the old
    # generation's connections, so no rank waits for its timeout (membership.sockets)
    assert (f"Elastic: shrank from 4 to 3 ranks at step {event['step']} (Tesla-T4 on "
            f"{victim['node']} lost)") in text
    assert "Job succeeded" in text
    grow = _read(work / "membership.json")["events"][1]
    assert (grow["kind"], grow["from"], grow["to"], grow["rank"]) == ("grow", 3, 4, victim["rank"])
    assert grow["step"] > event["step"]
    assert (f"Elastic: grew from 3 to 4 ranks at step {grow['step']} (Tesla-T4 on "
            f"{victim['node']} joined with a peer's state)") in text
    joined = (work / f"rank-{victim['rank']}.log").read_text()
    assert "joined; generation 2: 1 -> 4 ranks, split [70, 28, 15, 15]" in joined, joined[-3000:]
    assert _read(work / "run.json")["ranks"][victim["rank"]]["pid"] != victim["pid"]
    stats = [_read(work / f"rank-{r}.json") for r in range(4)]
    assert {s.get("membership_generation") for s in stats} == {2}
    assert stats[victim["rank"]]["steps"] == 66 - grow["step"] + 1  # from the step it joined at
