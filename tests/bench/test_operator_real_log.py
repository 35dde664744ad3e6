"""``bench/operator_real.py``'s reading of the operator's log (issue 32, item 9): when every node
became usable after the operator's start, and how many times each scale job was planned."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import operator_real  # noqa: E402

START = datetime.datetime(2026, 12, 5, 13, 0, 0, tzinfo=datetime.timezone.utc).timestamp()


def test_the_log_gives_the_first_moment_every_node_is_usable_and_the_plans_per_job(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    log.write_text("\n".join([
        "2026-12-05 13:00:03,500 [INFO    ] heterotrain.operator: nodes synced: 10 node(s) listed, 8 usable, "
        "2 excluded; 0 GPU pod(s); 0.40 s",
        "2026-12-05 13:00:04,000 [INFO    ] heterotrain.operator: warmup/warmup: planned over 8 usable node(s), "
        "0 GPU pod(s) bound: [('n1', 'T4', 4)]",
        "2026-12-05 13:00:06,250 [INFO    ] heterotrain.operator: team-0/job-000: planned over 10 usable node(s), "
        "2 GPU pod(s) bound: Unschedulable",
        "2026-12-05 13:00:07,000 [INFO    ] heterotrain.operator: team-0/job-000: planned over 10 usable node(s), "
        "2 GPU pod(s) bound: [('n2', 'T4', 4)]",
        "2026-12-05 13:00:07,500 [INFO    ] heterotrain.operator: team-1/job-001: planned over 9 usable node(s), "
        "4 GPU pod(s) bound: [('n3', 'T4', 4)]",
    ]) + "\n")
    got = operator_real.from_log(log, START, 10, [("team-0", "job-000"), ("team-1", "job-001"), ("team-2", "job-002")])
    assert got["operator_start_to_every_node_usable_s"] == 6.25  # the synced line said 8 of 10
    assert got["operator_synced_line"] == {"listed": 10, "usable": 8, "after_start_s": 3.5}
    assert (got["plans_per_job"], got["max_plans_of_a_job"]) == (1.0, 2)  # warmup is not a scale job
    assert got["fewest_usable_nodes_in_a_plan"] == 9


def test_a_log_without_every_node_usable_is_infinitely_late(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    log.write_text("2026-12-05 13:00:03,500 [INFO    ] heterotrain.operator: nodes synced: 10 node(s) listed, "
                   "3 usable, 7 excluded; 0 GPU pod(s); 0.40 s\n")
    got = operator_real.from_log(log, START, 10, [("team-0", "job-000")])
    assert got["operator_start_to_every_node_usable_s"] == float("inf")
    assert (got["plans_per_job"], got["max_plans_of_a_job"]) == (0.0, 0)
