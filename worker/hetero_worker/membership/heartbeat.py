"""An elastic rank's heartbeat for the membership keeper (Kubernetes), and its early cut.

On Kubernetes no supervisor sees the rank processes: the keeper
(:mod:`hetero_worker.membership.keeper`) tells a lost member by its beat counter
(:data:`heterotrain_common.membership.BEAT_KEY`), which :class:`Heartbeat` increments every
:data:`~heterotrain_common.membership.HEARTBEAT_S` from a daemon thread on its own store
connection (a ``TCPStore`` client is not safe to share across threads).

The same thread looks each round whether a generation newer than the rank's current one that
*loses* members is announced. If so it cuts the rank's connections of the current generation
(:func:`hetero_worker.membership.sockets.cut`): a machine that dies sends no FIN, so a collective
blocked on a live peer would otherwise fail only at the collective timeout. It takes the rank's
re-forming lock without waiting (a busy lock skips the cut this round; the beat never waits on
it). A generation that only adds members is never cut: the running ranks switch to it at a step
boundary.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Protocol

from hetero_worker.membership import sockets
from heterotrain_common import membership


class Beating(Protocol):
    """What the heartbeat sees of the rank's membership
    (:class:`~hetero_worker.membership.elastic.Membership`)."""

    member: int
    generation: int
    joining: Any
    sockets: dict[int, str]
    lock: threading.Lock


def newer_loss(store: Any, after: int) -> int | None:
    """The newest generation announced after ``after`` when one of those generations loses
    members (a non-empty ``lost``); None when none is announced or they only add members.

    Raises:
        RuntimeError: the store is unreachable (torch's ``DistStoreError`` and kin).
    """
    generation, loses = after, False
    while store.check([membership.GENERATION_KEY.format(generation=generation + 1)]):
        generation += 1
        announced = membership.Generation.from_json(
            generation, store.get(membership.GENERATION_KEY.format(generation=generation)))
        loses = loses or bool(announced.lost)
    return generation if loses else None


class Heartbeat:
    """Beat for ``owner`` (its ``member``) on a store connection of its own, and cut its current
    generation's connections once a loss is announced.

    Args:
        store: a ``TCPStore`` client used by this heartbeat's thread only (connect it in the
            calling thread *before* the rank records its generation's sockets, so that the cut
            never shuts the heartbeat's own connection).
        owner: the rank's membership (:class:`Beating`).
        interval_s: seconds between beats (:data:`~heterotrain_common.membership.HEARTBEAT_S`).

    Attributes:
        cut_for: the generation whose announcement made this heartbeat cut last (None: never).
        beats: beats sent so far.
    """

    def __init__(self, store: Any, owner: Beating, *,
                 interval_s: float = membership.HEARTBEAT_S) -> None:
        self.store, self.owner, self.interval_s = store, owner, interval_s
        self.key = membership.BEAT_KEY.format(member=owner.member)
        self.cut_for: int | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{owner.member}",
                                        daemon=True)

    def start(self) -> Heartbeat:
        """Start the daemon thread (the first beat at once). Returns self."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop beating (waits up to ``timeout_s`` for the thread; no-op when not started)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(self.key, 1)
                self.beats += 1
                self._watch()
            except Exception as exc:  # noqa: BLE001  the keeper gone or slow: keep trying
                if not self._warned:
                    self._warned = True
                    first = (str(exc).splitlines() or [type(exc).__name__])[0]  # not torch's C++ trace
                    print(f"heterotrain: member {self.owner.member}: heartbeat failed ({first}); "
                          "retrying", file=sys.stderr, flush=True)
            self._stop.wait(self.interval_s)

    def _watch(self) -> None:
        """Cut the current generation's connections when a newer generation loses members."""
        owner = self.owner
        if owner.joining is not None or not owner.lock.acquire(blocking=False):
            return  # a joiner holds no generation's connections; a re-forming rank: next round
        try:
            newer = newer_loss(self.store, owner.generation)
            if newer is not None and newer != self.cut_for:
                self.cut_for = newer
                sockets.cut(owner.sockets)
        finally:
            owner.lock.release()
