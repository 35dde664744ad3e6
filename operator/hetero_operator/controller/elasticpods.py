"""The controller's part of an elastic job (``spec.elastic``, issue 31): the keeper pod and the
rank pods it creates again when the job grows back.

The lifecycle decides (:mod:`hetero_operator.lifecycle.elastic`); this part keeps, per job, the
rank pods as rendered at the start of the current attempt (owner reference included), so a pod a
shrink removed is created again exactly as it was planned (its node, image, env contract), with
``HTJ_ELASTIC_JOIN_GENERATION=next`` (:func:`hetero_operator.render.keeper.joining`).

What it holds is in the operator's memory: after an operator restart a removed pod is not
created again (the job goes on with the ranks it has; the status says why) until the next
attempt renders the pods anew (docs/elastic.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api.labels import LABEL_ROLE, ROLE_KEEPER
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import Plan
from hetero_operator.controller.ownership import create_core_owned
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle.elastic import ElasticJob, ElasticStatus
from hetero_operator.render import keeper
from hetero_operator.render import pods as rendering

log = logging.getLogger(__name__)
NOT_REMEMBERED = "ElasticGrowUnavailable"


FreeGpus = Callable[[JobSpec], Mapping[str, Mapping[str, int]]]
"""Free whole GPUs per GFD product and node for a job's pods
(:func:`hetero_operator.controller.planner.free_whole_gpus` over the indexes)."""


class ElasticPods:
    """The rendered rank pods of every elastic job's current attempt, by ``(namespace, name)``.

    Args:
        free: where a lost pod may come back (read only while a job has lost pods).
    """

    def __init__(self, free: FreeGpus | None = None) -> None:
        self._pods: dict[tuple[str, str], tuple[int, dict[str, dict[str, Any]]]] = {}
        self._free = free

    @staticmethod
    def master_addr(spec: JobSpec, plan: Plan, domain: str) -> str:
        """``MASTER_ADDR`` of a start: the keeper's address for an elastic job, else rank 0's."""
        if spec.elastic is not None:
            return keeper.keeper_addr(spec.name, spec.namespace, domain)
        return rendering.master_addr(spec.name, spec.namespace, plan, domain)

    @staticmethod
    def rank_envs(spec: JobSpec, envs: Sequence[Mapping[str, str]], *, master_addr: str,
                  master_port: int) -> list[dict[str, str]]:
        """``envs`` with the keeper's store added for an elastic job (unchanged otherwise)."""
        if spec.elastic is None:
            return [dict(e) for e in envs]
        return keeper.with_store(envs, address=master_addr, port=master_port)

    @staticmethod
    def keeper_pods(spec: JobSpec, plan: Plan, *, master_port: int, attempt: int,
                    run_as_non_root: bool) -> list[dict[str, Any]]:
        """``[the keeper pod]`` for an elastic job, ``[]`` otherwise."""
        if spec.elastic is None:
            return []
        return [keeper.render_keeper(spec, spec.elastic, plan, master_port=master_port,
                                     attempt=attempt, run_as_non_root=run_as_non_root)]

    def remember(self, spec: JobSpec, attempt: int, pods: Sequence[Mapping[str, Any]]) -> None:
        """Keep the rank pods of ``spec``'s attempt ``attempt`` (elastic jobs only)."""
        key = (spec.namespace, spec.name)
        if spec.elastic is None:
            self._pods.pop(key, None)
            return
        self._pods[key] = (attempt, {p["metadata"]["name"]: dict(p) for p in pods
                                     if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) != ROLE_KEEPER})

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is kept of a deleted job."""
        self._pods.pop((namespace, name), None)

    def job(self, spec: JobSpec, status: Mapping[str, Any], attempt: int) -> ElasticJob | None:
        """What the lifecycle needs of an elastic job (with the free GPUs when it has lost pods);
        None when ``spec`` is not elastic."""
        if spec.elastic is None:
            return None
        state = ElasticStatus.from_status(status, attempt)
        spares = self._free(spec) if state.lost and self._free is not None else {}
        return ElasticJob(spec=spec.elastic, state=state, keeper=keeper.keeper_name(spec.name),
                          spares=spares)

    async def grow(self, api: Any, job: Mapping[str, Any], attempt: int,
                   d: lc.Decision) -> lc.Decision:
        """Create the pods of ``d`` (a :data:`~hetero_operator.lifecycle.values.GROW`) again; the
        decision to record: ``d``, or a wait that says why they could not be (the pods of this
        attempt were rendered before an operator restart; a create refused)."""
        meta = job["metadata"]
        kept_attempt, kept = self._pods.get((meta["namespace"], meta["name"]), (0, {}))
        missing = [n for n in d.create_pods if kept_attempt != attempt or n not in kept]
        if missing:
            return _not_grown(d, f"pod(s) {', '.join(missing)} were rendered by an operator process "
                                 "that has since restarted, so this one cannot create them again "
                                 "as planned; the job goes on with the ranks it has (a restart of "
                                 "the job renders every pod anew)")
        claimed = [n for n in d.create_pods if n in d.create_on and kept[n]["spec"].get("resourceClaims")]
        if claimed:  # a DRA claim template is made for its node's devices
            return _not_grown(d, f"pod(s) {', '.join(claimed)} claim their GPUs through DRA and "
                                 "come back only on their own node")
        try:
            for name in d.create_pods:
                pod = keeper.joining(kept[name])
                await create_core_owned(api, keeper.on_node(pod, d.create_on[name])
                                        if name in d.create_on else pod, job)
        except Exception as exc:  # noqa: BLE001 - the next reconcile decides again
            log.warning("%s/%s: cannot create %s again: %s", meta["namespace"], meta["name"],
                        ", ".join(d.create_pods), exc)
            return _not_grown(d, f"creating pod(s) {', '.join(d.create_pods)} again failed: {exc}")
        return d


def _not_grown(d: lc.Decision, why: str) -> lc.Decision:
    return replace(d, action=lc.WAIT, reason=NOT_REMEMBERED, create_pods=(), elastic=None,
                   message=f"The job could grow back but does not: {why}.",
                   requeue_s=lc.POLL_DELETING_S * 5, phase=c.RUNNING)
