"""The membership keeper of an elastic job on Kubernetes (``spec.elastic``, issue 31).

On Kubernetes no supervisor process sees the rank processes, so the operator runs one extra pod
per elastic job, from the worker image (docs/elastic.md, "On Kubernetes")::

    heterotrain keeper --members N --min-ranks m --max-ranks M \\
        [--heartbeat-timeout-s S] [--host 0.0.0.0]

(or ``python -m hetero_worker.membership.keeper`` with the same arguments)

with ``MASTER_PORT`` (the store's port) and ``HTJ_METRICS_PORT`` (the status port; unset or 0:
none). It hosts the job's membership store (a ``TCPStore``; the keys:
:mod:`heterotrain_common.membership`) and, every :data:`POLL_S`:

* **loss**: a current member whose beat counter has not changed for the heartbeat timeout (or
  that never beat within :func:`startup_bound_s` of the keeper's start), and that is not done, is
  lost: the keeper announces the next generation without it while at least ``--min-ranks``
  survive (several lost in one poll, and those silent within two beats of the timeout with them:
  one generation); below that it announces nothing and says
  why (the ranks' own wait for an announcement ends and they fail; the gang is restarted);
* **grow**: a launch member that is not a current member and asks to join
  (``elastic/want/<member>``, a rank started with ``HTJ_ELASTIC_JOIN_GENERATION=next``) is added
  by one generation once the current one has resumed (completed a step), up to ``--max-ranks``;
  the keeper answers it the generation's number (``elastic/assigned/<member>``);
* **finish**: once every current member is done (``elastic/done/<member>``), it sets
  ``elastic/finished``, serves :data:`FINISH_GRACE_S` longer and exits 0.

The rules are :class:`KeeperRules`, free of I/O and clock (unit-tested with a fake clock);
:class:`Keeper` is the loop around the store. ``GET /membership`` on the status port answers the
current generation and every change as JSON, ``GET /healthz`` ``ok``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from heterotrain_common import envnames, membership

POLL_S = 0.2
"""Seconds between two looks of the keeper at the store."""
FINISH_GRACE_S = 2.0
"""Seconds the keeper keeps serving after it set ``elastic/finished`` (a waiting joiner sees it)."""
JOIN_BATCH_S = 10.0
"""How long the keeper holds a grow while fewer members ask in than are missing (and fit): the
ranks of one pod started again ask within seconds of each other, and one generation re-forms the
running ranks once instead of once per rank. All missing members asking: no wait."""
STARTUP_FLOOR_S = 60.0
"""The least seconds a member has, from the keeper's start, to beat a first time."""
UNKNOWN = membership.UNKNOWN
"""``gpu_product`` / ``node`` of a member whose info was never written."""


def startup_bound_s(heartbeat_timeout_s: float) -> float:
    """Seconds from the keeper's start within which a member must beat once, or it is lost:
    ``max(60, 6 * heartbeat_timeout_s)`` (a rank's start-up: image, Python, torch)."""
    return max(STARTUP_FLOOR_S, 6.0 * heartbeat_timeout_s)


@dataclass(frozen=True)
class Change:
    """A new generation to announce.

    Attributes:
        generation: the announcement.
        kind: ``"shrink"`` or ``"grow"``.
        before: ranks before it.
    """

    generation: membership.Generation
    kind: str
    before: int


@dataclass(frozen=True)
class Refusal:
    """Members lost but not announced: the survivors would be fewer than ``min_ranks``."""

    lost: tuple[int, ...]
    survivors: int
    text: str


@dataclass(frozen=True)
class Finish:
    """Every current member is done: set ``elastic/finished`` and exit 0."""


Action = Change | Refusal | Finish


@dataclass
class _Beat:
    count: int  # the counter's last value seen (0: never beat)
    since_s: float  # keeper time it last changed (or was reset)


@dataclass
class KeeperRules:
    """The keeper's decisions, free of I/O and of the clock.

    Args:
        launch: members at launch (generation 0 is ``range(launch)``).
        min_ranks: fewest ranks a generation may have (a loss below it is not announced).
        max_ranks: most ranks a generation may have (a grow stops there).
        heartbeat_timeout_s: seconds without a change of a member's beat counter before it is lost.
        start_s: the keeper's start on its own monotonic clock (the start-up bound counts from it).

    Attributes:
        generation: the last announced generation (0 at launch).
        members: its members, in launch order.
        finished: True once :class:`Finish` was returned (no further actions).

    Raises:
        ValueError: the counts are inconsistent (need ``1 <= min_ranks <= launch`` and
            ``min_ranks <= max_ranks``, ``heartbeat_timeout_s > 0``).
    """

    launch: int
    min_ranks: int
    max_ranks: int
    heartbeat_timeout_s: float = membership.HEARTBEAT_TIMEOUT_S
    start_s: float = 0.0
    generation: int = field(default=0, init=False)
    members: tuple[int, ...] = field(default=(), init=False)
    finished: bool = field(default=False, init=False)
    _beats: dict[int, _Beat] = field(default_factory=dict, init=False, repr=False)
    _joined: tuple[int, ...] = field(default=(), init=False, repr=False)  # the last grow's
    _refused: tuple[int, ...] = field(default=(), init=False, repr=False)  # said once
    _first_want_s: float | None = field(default=None, init=False, repr=False)  # of a partial batch

    def __post_init__(self) -> None:
        if not 1 <= self.min_ranks <= min(self.launch, self.max_ranks):
            raise ValueError(f"need 1 <= min-ranks <= members and max-ranks (members "
                             f"{self.launch}, min-ranks {self.min_ranks}, max-ranks "
                             f"{self.max_ranks})")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat timeout must be > 0 s, not {self.heartbeat_timeout_s}")
        self.members = tuple(range(self.launch))

    def tick(self, now_s: float, beats: Mapping[int, int], *,
             infos: Mapping[int, Mapping[str, Any]], wants: Mapping[int, Mapping[str, Any]],
             done: set[int] | frozenset[int], resumed: bool, at_s: float = 0.0) -> list[Action]:
        """One look at the store; returns what to do (and takes each :class:`Change` as made).

        A current member that asks to join again (in ``wants``) is lost at once: only a process
        started again asks, so its previous one is gone (and its counter goes on beating).

        Args:
            now_s: the keeper's monotonic clock, seconds.
            beats: each member's beat counter (absent or 0: never beat).
            infos: each member's info (``gpu_product``, ``node``) where written.
            wants: members asking to join -> their info.
            done: members whose training ended well.
            resumed: the current generation completed a step (generation 0 counts as resumed).
            at_s: wall time (``time.time()``) for the announcements.
        """
        if self.finished:
            return []
        for member in self.members:
            self._see(member, int(beats.get(member, 0)), now_s)
        resumed = resumed or self.generation == 0
        running = [m for m in self.members if resumed or m not in self._joined]
        if running and all(m in done for m in running):  # a joiner not let in yet: told finished
            self.finished = True
            return [Finish()]
        lost = [m for m in self.members
                if m not in done and (m in wants or self._timed_out(m, now_s))]
        if any(m not in wants for m in lost):  # one dead machine's ranks go in one generation
            lost = sorted({*lost, *(m for m in self.members if m not in done
                                    and self._timed_out(m, now_s, early_s=self._window_s))})
        if lost:
            action = self._lose(lost, wants, infos, at_s)
            return [action] if action is not None else []
        self._refused = ()
        if resumed:
            grow = self._grow(wants, now_s, beats, at_s)
            if grow is not None:
                return [grow]
        return []

    def _see(self, member: int, count: int, now_s: float) -> None:
        beat = self._beats.get(member)
        if beat is None:
            self._beats[member] = _Beat(count, now_s if count else self.start_s)
        elif count != beat.count:
            beat.count, beat.since_s = count, now_s

    @property
    def _window_s(self) -> float:
        """Members silent this much less than the timeout are lost with one that timed out (their
        last beats were up to a beat apart): two beats, at most a third of the timeout."""
        return min(2 * membership.HEARTBEAT_S, self.heartbeat_timeout_s / 3)

    def _timed_out(self, member: int, now_s: float, early_s: float = 0.0) -> bool:
        beat = self._beats[member]
        if beat.count:
            return now_s - beat.since_s >= self.heartbeat_timeout_s - early_s
        return now_s - beat.since_s >= startup_bound_s(self.heartbeat_timeout_s)

    def _lose(self, lost: list[int], wants: Mapping[int, Any],
              infos: Mapping[int, Mapping[str, Any]], at_s: float) -> Action | None:
        survivors = len(self.members) - len(lost)
        if survivors < self.min_ranks:
            if tuple(lost) == self._refused:
                return None  # said once
            self._refused = tuple(lost)
            return Refusal(tuple(lost), survivors, (
                f"keeper: member(s) {lost} lost: {survivors} ranks would be left, below "
                f"--min-ranks {self.min_ranks}; announcing nothing (the ranks fail and the gang "
                "is restarted)"))
        entries = [{"member": m, "gpu_product": str(infos.get(m, {}).get("gpu_product", UNKNOWN)),
                    "node": str(infos.get(m, {}).get("node", UNKNOWN)), "exit_code": None}
                   for m in lost]
        why = {m: ("started again" if m in wants else
                   f"heartbeat lost for {self.heartbeat_timeout_s:g} s" if self._beats[m].count
                   else f"no heartbeat within {startup_bound_s(self.heartbeat_timeout_s):g} s "
                        "of the keeper's start") for m in lost}
        reason = "; ".join(dict.fromkeys(why.values()))
        return self._take(membership.next_generation(
            self.generation, self.members, lost=entries, reason=reason, at_s=at_s), "shrink")

    def _grow(self, wants: Mapping[int, Mapping[str, Any]], now_s: float,
              beats: Mapping[int, int], at_s: float) -> Change | None:
        room = self.max_ranks - len(self.members)
        wanting = sorted(m for m in wants if 0 <= m < self.launch and m not in self.members)
        if room <= 0 or not wanting:
            self._first_want_s = None
            return None
        missing = self.launch - len(self.members)
        if len(wanting) < min(room, missing):  # the pod's other ranks may still be starting
            if self._first_want_s is None:
                self._first_want_s = now_s
            if now_s - self._first_want_s < JOIN_BATCH_S:
                return None
        self._first_want_s = None
        joining = wanting[:room]  # launch order
        entries = [{"member": m, "gpu_product": str(wants[m].get("gpu_product", UNKNOWN)),
                    "node": str(wants[m].get("node", UNKNOWN))} for m in joining]
        for m in joining:  # a new process: its counter is watched afresh from now
            self._beats[m] = _Beat(int(beats.get(m, 0)), now_s)
        return self._take(membership.next_generation(
            self.generation, self.members, joined=entries, reason="started again to join",
            at_s=at_s), "grow")

    def _take(self, generation: membership.Generation, kind: str) -> Change:
        before = len(self.members)
        self.generation, self.members = generation.generation, generation.members
        self._joined = tuple(int(j["member"]) for j in generation.joined)
        self._refused = ()
        return Change(generation, kind, before)


def describe(change: Change) -> str:
    """One line per change, e.g. ``keeper: generation 1: 4 -> 3 ranks (member 2 Tesla-T4 on
    node-t4: heartbeat lost for 10 s)``."""
    g = change.generation
    who = ", ".join(f"member {x['member']} {x.get('gpu_product', UNKNOWN)} on "
                    f"{x.get('node', UNKNOWN)}" for x in (*g.lost, *g.joined))
    return (f"keeper: generation {g.generation}: {change.before} -> {len(g.members)} ranks "
            f"({who}: {g.reason})")


def rfc3339(at_s: float) -> str:
    """``time.time()`` seconds as RFC 3339 UTC (``2026-12-06T10:00:00Z``)."""
    return datetime.fromtimestamp(at_s, timezone.utc).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


class Keeper:
    """The loop around the store: reads it every :data:`POLL_S`, applies :class:`KeeperRules`.

    Args:
        store: the hosted ``TCPStore`` (or anything with ``add``, ``check``, ``get``, ``set``,
            ``delete_key``).
        rules: the decisions.
        clock_s: monotonic clock, seconds; wall_s: wall clock (``time.time()``).
        say: where the change lines go (stdout, flushed).
    """

    def __init__(self, store: Any, rules: KeeperRules, *,
                 clock_s: Callable[[], float] = time.monotonic,
                 wall_s: Callable[[], float] = time.time,
                 say: Callable[[str], None] = lambda text: print(text, flush=True)) -> None:
        self.store, self.rules, self.clock_s, self.wall_s, self.say = (store, rules, clock_s,
                                                                       wall_s, say)
        self.changes: list[dict[str, Any]] = []
        self._infos: dict[int, dict[str, Any]] = {}
        self._done: set[int] = set()
        self._resumed: set[int] = {0}

    def status(self) -> dict[str, Any]:
        """What ``GET /membership`` answers."""
        last = self.changes[-1] if self.changes else {"lost": [], "joined": [], "reason": ""}
        return {"generation": self.rules.generation, "members": list(self.rules.members),
                "ranks": len(self.rules.members), "lost": last["lost"],
                "joined": last["joined"], "reason": last["reason"], "changes": list(self.changes)}

    def poll(self) -> bool:
        """One look at the store and what follows from it. Returns True once finished."""
        store, rules = self.store, self.rules
        members = range(rules.launch)
        beats = {m: int(store.add(membership.BEAT_KEY.format(member=m), 0)) for m in members}
        for m in members:
            key = membership.INFO_KEY.format(member=m)
            if m not in self._infos and store.check([key]):
                self._infos[m] = json.loads(store.get(key))
        wants = {}
        for m in members:
            key = membership.WANT_KEY.format(member=m)
            if store.check([key]):
                wants[m] = json.loads(store.get(key))
        self._done.update(m for m in members if m not in self._done
                          and store.check([membership.DONE_KEY.format(member=m)]))
        g = rules.generation
        if g not in self._resumed and store.check([membership.RESUMED_KEY.format(generation=g)]):
            self._resumed.add(g)
        actions = rules.tick(self.clock_s(), beats, infos=self._infos, wants=wants,
                             done=self._done, resumed=g in self._resumed, at_s=self.wall_s())
        for action in actions:
            if isinstance(action, Finish):
                store.set(membership.FINISHED_KEY, "1")
                self.say(f"keeper: every member of generation {rules.generation} is done; "
                         "the job finished")
                return True
            if isinstance(action, Refusal):
                self.say(action.text)
                continue
            self._announce(action)
        return False

    def _announce(self, change: Change) -> None:
        g = change.generation
        self.store.set(membership.GENERATION_KEY.format(generation=g.generation), g.to_json())
        for joined in g.joined:
            m = int(joined["member"])
            self.store.set(membership.ASSIGNED_KEY.format(member=m), str(g.generation))
            self.store.delete_key(membership.WANT_KEY.format(member=m))
            self._infos[m] = {"gpu_product": joined["gpu_product"], "node": joined["node"]}
        self.changes.append({"generation": g.generation, "kind": change.kind,
                             "members": list(g.members), "lost": list(g.lost),
                             "joined": list(g.joined), "reason": g.reason,
                             "at": rfc3339(g.lost_at_s)})
        self.say(describe(change))

    def run(self, *, poll_s: float = POLL_S, grace_s: float = FINISH_GRACE_S) -> int:
        """Poll until the job finished, then serve ``grace_s`` longer. Returns 0."""
        while not self.poll():
            time.sleep(poll_s)
        time.sleep(grace_s)
        return 0


def serve_status(keeper: Keeper, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``GET /membership`` (JSON, :meth:`Keeper.status`) and ``GET /healthz`` (``ok``) on
    ``host:port`` from a daemon thread; anything else is 404. Returns the server.

    Raises:
        OSError: the port cannot be bound.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if self.path == "/membership":
                body, kind = json.dumps(keeper.status()).encode(), "application/json"
            elif self.path == "/healthz":
                body, kind = b"ok", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="keeper-status", daemon=True).start()
    return server


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the keeper's options to ``parser`` (also ``heterotrain keeper``'s)."""
    parser.add_argument("--members", type=int, required=True, help="ranks at launch")
    parser.add_argument("--min-ranks", type=int, required=True,
                        help="fewest ranks a generation may have (spec.elastic.minRanks)")
    parser.add_argument("--max-ranks", type=int, required=True,
                        help="most ranks a generation may have (spec.elastic.maxRanks)")
    parser.add_argument("--heartbeat-timeout-s", type=float,
                        default=membership.HEARTBEAT_TIMEOUT_S,
                        help="seconds without a heartbeat before a member is lost")
    parser.add_argument("--host", default="0.0.0.0", help="address the store listens on")


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run the keeper of ``args`` (:func:`configure`): the store on ``MASTER_PORT``, the status
    on ``HTJ_METRICS_PORT``. Returns 0 once the job finished; 2 on inconsistent arguments or a
    missing or malformed ``MASTER_PORT``."""
    from datetime import timedelta

    import torch.distributed as dist

    env = os.environ if environ is None else environ
    try:
        rules = KeeperRules(args.members, args.min_ranks, args.max_ranks,
                            args.heartbeat_timeout_s, start_s=time.monotonic())
        port = int(env[envnames.MASTER_PORT])
        status_port = int(env.get(envnames.METRICS_PORT) or 0)
    except (KeyError, ValueError) as exc:
        print(f"keeper: bad arguments or environment: {exc} (need 1 <= --min-ranks <= --members "
              f"and --max-ranks, --heartbeat-timeout-s > 0, {envnames.MASTER_PORT})",
              file=sys.stderr, flush=True)
        return 2
    store = dist.TCPStore(args.host, port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    keeper = Keeper(store, rules)
    if status_port:
        serve_status(keeper, status_port, args.host)
    print(f"keeper: serving the membership store on {args.host}:{port} for {args.members} "
          f"members (min {args.min_ranks}, max {args.max_ranks}, heartbeat timeout "
          f"{args.heartbeat_timeout_s:g} s)", flush=True)
    return keeper.run()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``python -m hetero_worker.membership.keeper``: parse ``argv`` (argparse exits 2 on bad
    arguments) and :func:`run`."""
    parser = argparse.ArgumentParser(prog="python -m hetero_worker.membership.keeper",
                                     description="The membership keeper of an elastic job.")
    configure(parser)
    return run(parser.parse_args(argv), environ)


if __name__ == "__main__":
    sys.exit(main())
