"""The membership protocol of an elastic job (``spec.elastic``, issue 31): generations of members
announced through a store that the supervisor hosts, so that it outlives any rank.

A *member* is a rank process named by its rank at launch (``HTJ_ELASTIC_MEMBER``); generation 0 is
every member. When a member is lost (its process exits, is SIGKILLed, its node goes), the
supervisor announces generation ``g + 1``: the surviving members in launch order, and who was lost
(:meth:`MembershipHost.announce`). When a lost member's GPU is free again, the supervisor announces
a generation that adds it back (:meth:`MembershipHost.grow`; ``joined``) and starts its process
with ``HTJ_ELASTIC_JOIN_GENERATION``; the process says it is ready (``READY_KEY``) at its first
step, and the running members switch to the new generation at the next step every one of them
agrees on (the stop agreement's third integer), so the job grows at a step boundary. A survivor's new ``RANK`` is its index in that list and the new
world size its length; the process groups of generation ``g`` rendezvous under the store prefix
:func:`generation_prefix` (``gen<g>/``), so a new generation never meets an old one's keys.

Keys (defined here once, read by ``hetero_worker.membership`` and written by ``heterotrain run``'s
supervisor through :class:`hetero_operator.local.membership.MembershipHost`; the store itself is
torch's ``TCPStore``, which this module, like all of ``heterotrain_common``, does not import):

* ``elastic/generation/<g>``: JSON ``{"members": [...], "lost": [{"member", "gpu_product",
  "node", "exit_code"}], "reason": str}``, written once per generation ``g >= 1``;
* ``elastic/steps/<g>``: JSON ``{"step": int, "redone": int, "recovery_s": float, "reform_s":
  float}``, written by the
  new generation's rank 0 once it has re-formed (the step it continues from);
* ``elastic/ready/<g>/<member>``: written by a joining member once its Trainer is built (the
  running members wait for it before they agree to switch);
* ``elastic/admitted/<g>``: written by the running ranks' rank 0 once they agreed to switch (the
  joining member waits for it, or for ``elastic/finished``: the job ended before it could join);
* ``elastic/finished``: the job is done (a member still waiting to join exits 0).

On Kubernetes no supervisor sees the rank processes: the *membership keeper*
(``python -m hetero_worker.membership.keeper``, one pod per elastic job) hosts the store and tells
a lost member by its heartbeat, with these keys besides:

* ``elastic/beat/<member>``: a counter every rank increments (``store.add``) every
  :data:`HEARTBEAT_S` from a daemon thread; a current member whose counter has not changed for the
  keeper's timeout (:data:`HEARTBEAT_TIMEOUT_S` by default) is lost;
* ``elastic/info/<member>``: JSON ``{"gpu_product", "node"}``, written by a rank when it joins;
* ``elastic/want/<member>``: written (its info JSON) by a rank started with
  ``HTJ_ELASTIC_JOIN_GENERATION=next`` (:data:`JOIN_NEXT`) once its Trainer is built: it asks the
  keeper for the generation that adds it;
* ``elastic/assigned/<member>``: the keeper's answer, the number of that generation (text);
* ``elastic/done/<member>``: set by a rank whose training ended well (a done member is never lost;
  once every current member is done the keeper sets ``elastic/finished`` and exits 0).

:func:`next_generation` is the one rule both hosts use to derive a generation from the last.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GENERATION_KEY = "elastic/generation/{generation}"
"""The announcement of generation ``generation`` (>= 1)."""
RESUMED_KEY = "elastic/steps/{generation}"
"""What the new generation's rank 0 reports once re-formed."""
READY_KEY = "elastic/ready/{generation}/{member}"
"""A joining member's "my Trainer is built" for generation ``generation``."""
ADMITTED_KEY = "elastic/admitted/{generation}"
"""Set by the running ranks' rank 0 when they agreed to switch to generation ``generation``: its
joining members stop waiting and join."""
FINISHED_KEY = "elastic/finished"
"""Set by the supervisor when every running rank ended well while a member still waited to join:
the job is done, and the waiting member exits 0 without joining."""
BEAT_KEY = "elastic/beat/{member}"
"""A member's heartbeat counter (``store.add(key, 1)`` every :data:`HEARTBEAT_S`)."""
INFO_KEY = "elastic/info/{member}"
"""A member's JSON ``{"gpu_product", "node"}``, written when it joins."""
WANT_KEY = "elastic/want/{member}"
"""A member started with :data:`JOIN_NEXT` asks to join (its info JSON as the value)."""
ASSIGNED_KEY = "elastic/assigned/{member}"
"""The keeper's answer to :data:`WANT_KEY`: the number of the generation that adds the member."""
DONE_KEY = "elastic/done/{member}"
"""Set by a member whose training ended well."""
HEARTBEAT_S = 1.0
"""Seconds between two increments of a member's :data:`BEAT_KEY`."""
HEARTBEAT_TIMEOUT_S = 10.0
"""The keeper's default: seconds without a change of a member's beat counter before it is lost."""
JOIN_NEXT = "next"
"""``HTJ_ELASTIC_JOIN_GENERATION`` of a rank that asks the keeper which generation adds it."""
UNKNOWN = "?"
"""``gpu_product`` / ``node`` of a member whose info is not known."""


def generation_prefix(generation: int) -> str:
    """The store prefix of generation ``generation``'s process groups (``gen<g>/``)."""
    return f"gen{int(generation)}/"


@dataclass(frozen=True, kw_only=True, slots=True)
class Generation:
    """One membership generation.

    Attributes:
        generation: its number (0: the launch).
        members: the member ids (launch ranks) in it, in launch order; a member's rank is its index.
        lost: what was lost since the previous generation (``member``, ``gpu_product``, ``node``,
            ``exit_code`` each).
        joined: what joins in this generation (``member``, ``gpu_product``, ``node`` each; a
            generation either loses or adds members).
        reason: why the generation changed, in words.
        lost_at_s: when the loss was seen (``time.time()``; 0.0: unknown).
    """

    generation: int
    members: tuple[int, ...]
    lost: tuple[dict[str, Any], ...] = field(default=())
    joined: tuple[dict[str, Any], ...] = field(default=())
    reason: str = ""
    lost_at_s: float = 0.0

    def to_json(self) -> str:
        """The announcement's JSON."""
        return json.dumps({"members": list(self.members), "lost": list(self.lost),
                           "joined": list(self.joined), "reason": self.reason,
                           "lost_at_s": self.lost_at_s})

    @classmethod
    def from_json(cls, generation: int, text: str | bytes) -> Generation:
        """Parse an announcement of ``generation``."""
        data = json.loads(text)
        return cls(generation=generation, members=tuple(int(m) for m in data["members"]),
                   lost=tuple(data.get("lost") or ()),
                   joined=tuple(data.get("joined") or ()), reason=str(data.get("reason") or ""),
                   lost_at_s=float(data.get("lost_at_s") or 0.0))


def next_generation(generation: int, members: tuple[int, ...], *,
                    lost: Sequence[Mapping[str, Any]] = (),
                    joined: Sequence[Mapping[str, Any]] = (), reason: str,
                    at_s: float) -> Generation:
    """The generation after ``generation`` (whose members are ``members``): without the ``lost``
    members, with the ``joined`` ones (each a mapping with at least ``member``), members in launch
    order, seen at ``at_s`` (``time.time()``; :attr:`Generation.lost_at_s`).

    Raises:
        ValueError: a lost member is not a member, a joining member already is one, or a member
            is named twice.
    """
    current = set(members)
    gone = [int(x["member"]) for x in lost]
    adding = [int(x["member"]) for x in joined]
    if len(set(gone)) != len(gone) or len(set(adding)) != len(adding):
        raise ValueError(f"a member is named twice (lost {gone}, joined {adding})")
    if set(gone) - current:
        raise ValueError(f"members {sorted(set(gone) - current)} are not in generation "
                         f"{generation} ({list(members)})")
    if set(adding) & current:
        raise ValueError(f"members {sorted(set(adding) & current)} are already in generation "
                         f"{generation}")
    return Generation(generation=generation + 1,
                      members=tuple(sorted((current - set(gone)) | set(adding))),
                      lost=tuple(dict(x) for x in lost), joined=tuple(dict(x) for x in joined),
                      reason=reason, lost_at_s=at_s)
