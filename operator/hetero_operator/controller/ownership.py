"""Which objects are the job's: a create answered 409 is followed by a read, and the object that
exists is the job's only when it carries the job's controller ``ownerReference`` (its UID).

Every object the operator makes for a job (NetworkPolicy, Service, Pod, ResourceClaimTemplate,
Kueue Workload) has a deterministic name (``<job>``, ``<job>-g0``, ...), so that a restarted
operator finds what it made before instead of making duplicates.  A name can also be taken by
something else: a NetworkPolicy ``default-deny`` that a job named ``default-deny`` would
otherwise adopt and rewrite (opening the namespace), or an unrelated pod ``<job>-g0`` that would
otherwise count as the job's rank and make the job re-plan for ever.  Such an object is never
patched, deleted or counted: the start is refused with :class:`NotOwned`, which names the object,
its owner and the fix, and the reconciler retries it with backoff
(:mod:`hetero_operator.controller.refusals`).

Pure apart from the two calls it is given; no kopf import.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

NOT_OWNED = "ObjectNotOwned"
"""Condition and Event reason of a start refused because an object of the job's name is not its."""


class NotOwned(Exception):
    """An object of a name the job needs exists and is not the job's.

    Attributes:
        kind / namespace / name: the object.
        owner: who controls it, in words (``"ReplicaSet web-5d8"``, ``"nothing"``).
    """

    refusal = True
    """Counts as an admission refusal (:func:`hetero_operator.controller.refusals.not_a_refusal`):
    the start is undone and retried with backoff."""
    reason = NOT_OWNED

    def __init__(self, kind: str, namespace: str, name: str, owner: str, job_name: str) -> None:
        self.kind, self.namespace, self.name, self.owner = kind, namespace, name, owner
        super().__init__(
            f"{kind} {namespace}/{name} exists and is not this job's (its controller: {owner}; a "
            f"job's {kind} carries the job's controller ownerReference), so the operator neither "
            f"changes nor uses it: delete or rename that {kind}, or re-create the job under "
            f"another name than {job_name!r}")


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``ownerReferences`` entry with ``controller: true``, ``None`` when there is none."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return next((r for r in refs if r.get("controller")), None)


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """True when ``obj``'s controller ownerReference is the object of ``owner_uid`` (a job
    without a UID owns nothing)."""
    ref = controller_of(obj)
    return bool(owner_uid) and ref is not None and ref.get("uid") == owner_uid


def owner_words(obj: Mapping[str, Any]) -> str:
    """``"<kind> <name>"`` of ``obj``'s controller, or ``"nothing"``."""
    ref = controller_of(obj)
    return "nothing" if ref is None else f"{ref.get('kind', '?')} {ref.get('name', '?')}"


def check_owned(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
    """Raise :class:`NotOwned` unless ``obj`` is ``owner``'s (a job object).

    Raises:
        NotOwned: naming ``obj``, its controller and the fix.
    """
    meta = owner["metadata"]
    if not owned_by(obj, str(meta.get("uid") or "")):
        om = obj.get("metadata") or {}
        raise NotOwned(str(obj.get("kind") or "object"), str(om.get("namespace") or ""),
                       str(om.get("name") or ""), owner_words(obj), str(meta.get("name")))


Create = Callable[[Mapping[str, Any]], Awaitable[bool]]
"""Creates an object; False when one of its name exists (409)."""
Read = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]
"""Reads the object of the given object's kind, namespace and name; None when absent (404)."""


async def create_owned(create: Create, read: Read, obj: Mapping[str, Any],
                       owner: Mapping[str, Any]) -> bool:
    """Create ``obj`` for ``owner``; a 409 is followed by a read of what exists.

    Args:
        create: the create call.
        read: the read call.
        obj: the object, carrying ``owner``'s controller ownerReference.
        owner: the job object (its ``metadata.uid`` decides).

    Returns:
        True when created now, False when the owner's object of that name exists already (a
        retried start, or a second operator).

    Raises:
        NotOwned: an object of that name exists and is not ``owner``'s (it is left alone).
        RuntimeError: the name was taken and freed twice during the call (the next reconcile
            tries again).
    """
    for _ in range(2):
        if await create(obj):
            return True
        current = await read(obj)
        if current is not None:
            check_owned({"kind": obj.get("kind"), **current}, owner)
            return False
        # gone between the two calls (a pod of the attempt before): create it once more
    meta = obj.get("metadata") or {}
    raise RuntimeError(f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')} was answered "
                       "409 and then 404 twice (created and deleted meanwhile); retried later")


async def create_core_owned(api: Any, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """:func:`create_owned` through the API wrapper's ``create`` and ``read`` (Pod, Service,
    NetworkPolicy: :class:`hetero_operator.controller.k8s.Api`)."""
    return await create_owned(api.create, api.read, obj, owner)
