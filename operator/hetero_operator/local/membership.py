"""The supervisor's side of an elastic job's membership (``spec.elastic``, issue 31): the store
that outlives every rank, and the announcement of each new generation
(the protocol: :mod:`heterotrain_common.membership`)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from heterotrain_common import membership


def connect(address: str, *, timeout_s: float, is_master: bool = False) -> Any:
    """A ``TCPStore`` at ``address`` (``host:port``; port 0 with ``is_master``: any free port)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=is_master, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


class MembershipHost:
    """The supervisor's side: hosts the store and announces generations.

    Args:
        host: address to listen on (``127.0.0.1`` for ``heterotrain run``).
        timeout_s: the store's timeout for its own operations.

    Attributes:
        address: ``host:port`` for ``HTJ_ELASTIC_STORE``.
        generation: the last announced generation (0 before any loss).
        members: the current members.
    """

    def __init__(self, members: int, *, host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
        self.store = connect(f"{host}:0", timeout_s=timeout_s, is_master=True)
        self.address = f"{host}:{self.store.port}"
        self.generation = 0
        self.members: tuple[int, ...] = tuple(range(members))

    def announce(self, lost: list[dict[str, Any]], reason: str, *,
                 lost_at_s: float = 0.0) -> membership.Generation:
        """Announce the next generation without the ``lost`` members (each a dict with at least
        ``member``), seen lost at ``lost_at_s`` (``time.time()``). Returns it.

        Raises:
            ValueError: a lost member is not a member (:func:`membership.next_generation`).
        """
        return self._publish(membership.next_generation(
            self.generation, self.members, lost=lost, reason=reason, at_s=lost_at_s))

    def grow(self, joined: list[dict[str, Any]], reason: str, *,
             announced_at_s: float = 0.0) -> membership.Generation:
        """Announce the next generation with the ``joined`` members added (each a dict with at
        least ``member``; members stay in launch order), at ``announced_at_s`` (``time.time()``:
        the new generation's rank 0 reports the seconds from it to its first completed step).
        Start the joining processes after this (``HTJ_ELASTIC_JOIN_GENERATION``). Returns it.

        Raises:
            ValueError: a joining member is already a member.
        """
        return self._publish(membership.next_generation(
            self.generation, self.members, joined=joined, reason=reason, at_s=announced_at_s))

    def _publish(self, generation: membership.Generation) -> membership.Generation:
        """Write ``generation``'s announcement and make it the current one."""
        self.generation, self.members = generation.generation, generation.members
        self.store.set(membership.GENERATION_KEY.format(generation=self.generation),
                       generation.to_json())
        return generation

    def finished(self) -> None:
        """Say that the job is done: a member still waiting to join exits 0 without joining."""
        self.store.set(membership.FINISHED_KEY, "1")

    def resumed(self, generation: int) -> dict[str, Any] | None:
        """What generation ``generation``'s rank 0 reported once re-formed (None before)."""
        key = membership.RESUMED_KEY.format(generation=generation)
        if not self.store.check([key]):
            return None
        return dict(json.loads(self.store.get(key)))
