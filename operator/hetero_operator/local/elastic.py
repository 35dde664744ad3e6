"""``heterotrain run`` with ``spec.elastic`` (issue 31): the supervisor hosts the membership store,
goes on without a lost rank while at least ``minRanks`` live, starts the lost rank again so that it
joins the running job (the job grows back), and reports each change.

A rank process that exits non-zero (a crash, a SIGKILL from the user) is *lost*: unless that would
leave fewer than ``spec.elastic.minRanks`` ranks, or it is a graceful stop (exit 75, a signal to
the supervisor), the gang is not stopped; the next membership generation is announced
(:class:`hetero_operator.local.membership.MembershipHost`) and the survivors re-form without it
(``hetero_worker.membership``). Below ``minRanks`` the gang stops and the run policy restarts it
from its checkpoint, as without ``spec.elastic``.

Growing back: a lost rank's simulated GPU is free again the moment its process is gone. Once the
survivors have completed a step in their generation, and while the job has fewer than
``spec.elastic.maxRanks`` ranks, the supervisor announces a generation that adds the lost rank
(:meth:`~hetero_operator.local.membership.MembershipHost.grow`) and starts its process again with
``HTJ_ELASTIC_JOIN_GENERATION``: it joins at a step boundary and takes a peer's state
(``hetero_worker.membership``); no other rank restarts. A rank is started again at most
``spec.runPolicy.backoffLimit`` times in one attempt (a rank that crashes each time it starts
would otherwise loop). Each change is kept in ``membership.json`` in the run directory and summed
up after the run: ``shrank from 4 to 3 ranks at step N (Tesla-T4 on node-t4 lost)``, ``grew from
3 to 4 ranks at step M (Tesla-T4 on node-t4 joined)``.
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
"""The run directory's record of every membership change (``heterotrain run``'s report reads it)."""


class ElasticWatch:
    """One attempt's membership: the store, the rule, the record.

    Args:
        plan: the plan (each rank's GPU product and node).
        min_ranks: ``spec.elastic.minRanks``.
        max_ranks: ``spec.elastic.maxRanks`` (lost ranks are started again up to it).
        restart_limit: how many times lost ranks may be started again in this attempt
            (``spec.runPolicy.backoffLimit``).
        console: where each change is said when it happens.
        workdir: the run directory (``membership.json``).
    """

    def __init__(self, plan: Any, *, min_ranks: int, max_ranks: int, restart_limit: int,
                 console: Any, workdir: Path) -> None:
        self.plan, self.min_ranks, self.console, self.workdir = plan, min_ranks, console, workdir
        self.max_ranks, self.restart_limit = max_ranks, restart_limit
        self.host = MembershipHost(plan.world_size)
        self.events: list[dict[str, Any]] = []
        self.lost: list[int] = []  # lost members, oldest first, not started again yet
        self.restarted = 0
        self._gang: procs.Gang | None = None
        self._said_finished = False

    def add_env(self, envs: list[dict[str, str]]) -> None:
        """Every rank joins through the store, under its launch rank as member id."""
        for r, env in enumerate(envs):
            env[envnames.ELASTIC_STORE] = self.host.address
            env[envnames.ELASTIC_MEMBER] = str(r)

    def on_failure(self, gang: procs.Gang) -> Callable[[int], bool]:
        """``Gang.wait``'s ``on_failure``: True (go on without rank ``i``) when the survivors
        still number ``minRanks`` or more and the exit was no graceful stop."""
        self._gang = gang
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
            self.lost.append(i)
            self.events.append({"kind": "shrink", "generation": generation.generation, "from": before,
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

    def regrow(self, start: Callable[[int, dict[str, str]], None]) -> Callable[[], None]:
        """A tick for ``Gang.wait``: start the oldest lost rank again once the last change has
        settled (the new generation's rank 0 reported a completed step), while the job has fewer
        than ``maxRanks`` ranks and restarts are left. ``start(i, extra_env)`` starts rank ``i``
        with its launch environment plus ``extra_env``."""
        def tick() -> None:
            host = self.host
            self._finish_if_done()
            if (not self.lost or len(host.members) >= self.max_ranks
                    or host.resumed(host.generation) is None):
                return
            if self.restarted >= self.restart_limit:
                if self.restarted == self.restart_limit:  # said once
                    self.restarted += 1
                    self.console.print(f"[yellow]Not starting lost ranks again[/]: "
                                       f"{self.restart_limit} restarts of lost ranks in this "
                                       "attempt (spec.runPolicy.backoffLimit)", highlight=False)
                return
            i = self.lost.pop(0)
            placed, before = self.plan.ranks[i], len(host.members)
            generation = host.grow([{"member": i, "gpu_product": placed.product,
                                     "node": placed.node}],
                                   reason=f"rank {i}'s GPU is free again",
                                   announced_at_s=time.time())
            start(i, {envnames.ELASTIC_JOIN_GENERATION: str(generation.generation)})
            self.restarted += 1
            self.events.append({"kind": "grow", "generation": generation.generation,
                                "from": before, "to": len(generation.members), "rank": i,
                                "gpu_product": placed.product, "node": placed.node,
                                "announced_at_s": generation.lost_at_s})
            self.console.print(f"[green]Rank {i} ({placed.product} on {placed.node}) started "
                               f"again[/]: growing from {before} to {len(generation.members)} "
                               f"ranks at a step boundary (generation {generation.generation}); "
                               "it takes a peer's state", highlight=False)
        return tick

    def _finish_if_done(self) -> None:
        """Every running rank ended well while a started-again rank waits to join: tell it the
        job is done (it exits 0 without joining)."""
        gang = self._gang
        if gang is None or self._said_finished:
            return
        joined = {int(m) for m in self.host.members}
        waiting = [e["rank"] for e in self.events if e["kind"] == "grow"
                   and self.host.resumed(e["generation"]) is None]
        others = [i for i in joined if i not in waiting]
        if waiting and all(gang.procs[i].poll() == 0 for i in others):
            self.host.finished()
            self._said_finished = True

    def finish(self) -> list[dict[str, Any]]:
        """Add what each generation's rank 0 reported (the step it went on at, the seconds from
        the change to that step completing), write ``membership.json``; returns the events."""
        for event in self.events:
            resumed = self.host.resumed(event["generation"]) or {}
            event["step"] = resumed.get("step")
            event["recovery_s"] = resumed.get("recovery_s")
            event["reform_s"] = resumed.get("reform_s")
        if self.events:
            (self.workdir / MEMBERSHIP_FILE).write_text(json.dumps({"events": self.events},
                                                                   indent=1))
        return self.events


def report_lines(workdir: Path) -> list[str]:
    """One line per membership change of the run in ``workdir`` (none when there was none)."""
    try:
        events = json.loads((workdir / MEMBERSHIP_FILE).read_text())["events"]
    except (OSError, ValueError, KeyError):
        return []
    lines = []
    for e in events:
        grew = e.get("kind") == "grow"
        if grew and e.get("step") is None:
            lines.append(f"Elastic: rank {e['rank']} ({e['gpu_product']} on {e['node']}) was "
                         "started again to grow the job, which finished before it joined")
            continue
        if grew:
            paused = (f"; the running ranks paused {e['reform_s']:.2f} s to let it in"
                      if e.get("reform_s") is not None else "")
            lines.append(f"Elastic: grew from {e['from']} to {e['to']} ranks at step {e['step']} "
                         f"({e['gpu_product']} on {e['node']} joined with a peer's state){paused}; "
                         "no checkpoint was read")
            continue
        at = f" at step {e['step']}" if e.get("step") is not None else ""
        took = (f"; {e['recovery_s']:.1f} s from the loss to the next completed step"
                if e.get("recovery_s") is not None else "; no step completed after it")
        lines.append(f"Elastic: shrank from {e['from']} to {e['to']} ranks{at} "
                     f"({e['gpu_product']} on {e['node']} lost){took}; no checkpoint was read")
    return lines
