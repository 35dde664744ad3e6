"""``heterotrain run`` with ``spec.elastic`` (issue 31): the supervisor hosts the membership store,
goes on without a lost rank while at least ``minRanks`` live, and reports each shrink.

A rank process that exits non-zero (a crash, a SIGKILL from the user) is *lost*: unless that would
leave fewer than ``spec.elastic.minRanks`` ranks, or it is a graceful stop (exit 75, a signal to
the supervisor), the gang is not stopped; the next membership generation is announced
(:class:`hetero_operator.local.membership.MembershipHost`) and the survivors re-form without it
(``hetero_worker.membership``). Below ``minRanks`` the gang stops and the run policy restarts it
from its checkpoint, as without ``spec.elastic``. Each shrink is kept in ``membership.json`` in the
run directory and summed up after the run: ``shrank from 4 to 3 ranks at step N (Tesla-T4 on
node-t4 lost)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_operator.local.membership import MembershipHost
from heterotrain_common import envnames, procs

MEMBERSHIP_FILE = "membership.json"
"""The run directory's record of every shrink (``heterotrain run``'s report reads it)."""


class ElasticWatch:
    """One attempt's membership: the store, the rule, the record.

    Args:
        plan: the plan (each rank's GPU product and node).
        min_ranks: ``spec.elastic.minRanks``.
        console: where each shrink is said when it happens.
        workdir: the run directory (``membership.json``).
    """

    def __init__(self, plan: Any, *, min_ranks: int, console: Any, workdir: Path) -> None:
        self.plan, self.min_ranks, self.console, self.workdir = plan, min_ranks, console, workdir
        self.host = MembershipHost(plan.world_size)
        self.events: list[dict[str, Any]] = []

    def add_env(self, envs: list[dict[str, str]]) -> None:
        """Every rank joins through the store, under its launch rank as member id."""
        for r, env in enumerate(envs):
            env[envnames.ELASTIC_STORE] = self.host.address
            env[envnames.ELASTIC_MEMBER] = str(r)

    def on_failure(self, gang: procs.Gang) -> Callable[[int], bool]:
        """``Gang.wait``'s ``on_failure``: True (go on without rank ``i``) when the survivors
        still number ``minRanks`` or more and the exit was no graceful stop."""
        def lost(i: int) -> bool:
            code = procs.exit_code_of(gang.procs[i].returncode or 0)
            if gang.signal_received is not None or code == envnames.PREEMPTED_EXIT_CODE:
                return False
            alive = [j for j, p in enumerate(gang.procs) if p.poll() is None]
            if len(alive) < self.min_ranks:
                self.console.print(f"[red]Rank {i} lost (exit {code})[/]: {len(alive)} ranks "
                                   f"left, below spec.elastic.minRanks {self.min_ranks}: stopping "
                                   "the gang (the run policy restarts it from its checkpoint)",
                                   highlight=False)
                return False
            placed = self.plan.ranks[i]
            before = len(self.host.members)
            generation = self.host.announce(
                [{"member": i, "gpu_product": placed.product, "node": placed.node,
                  "exit_code": code}], reason=f"rank {i} exited with {code}",
                lost_at_s=time.time())
            self.events.append({"generation": generation.generation, "from": before,
                                "to": len(generation.members), "rank": i,
                                "gpu_product": placed.product, "node": placed.node,
                                "exit_code": code, "lost_at_s": generation.lost_at_s})
            self.console.print(f"[yellow]Rank {i} ({placed.product} on {placed.node}) lost "
                               f"(exit {code})[/]: shrinking from {before} to "
                               f"{len(generation.members)} ranks (generation "
                               f"{generation.generation}); the others go on without a restart",
                               highlight=False)
            return True
        return lost

    def finish(self) -> list[dict[str, Any]]:
        """Add what each generation's rank 0 reported (the step it went on at, the seconds from
        the loss to that step completing), write ``membership.json``; returns the events."""
        for event in self.events:
            resumed = self.host.resumed(event["generation"]) or {}
            event["step"] = resumed.get("step")
            event["recovery_s"] = resumed.get("recovery_s")
        if self.events:
            (self.workdir / MEMBERSHIP_FILE).write_text(json.dumps({"events": self.events},
                                                                   indent=1))
        return self.events


def report_lines(workdir: Path) -> list[str]:
    """One line per shrink of the run in ``workdir`` (none when it never shrank)."""
    try:
        events = json.loads((workdir / MEMBERSHIP_FILE).read_text())["events"]
    except (OSError, ValueError, KeyError):
        return []
    lines = []
    for e in events:
        at = f" at step {e['step']}" if e.get("step") is not None else ""
        took = (f"; {e['recovery_s']:.1f} s from the loss to the next completed step"
                if e.get("recovery_s") is not None else "; no step completed after it")
        lines.append(f"Elastic: shrank from {e['from']} to {e['to']} ranks{at} "
                     f"({e['gpu_product']} on {e['node']} lost){took}; no checkpoint was read")
    return lines
