"""The reconciler: observe a job, ask :mod:`lifecycle`, carry out the decision.

Level-based: every kick re-reads the job and its pods from the API, so a restarted operator
continues from ``status`` alone (restarts, attempt, plan) and never creates duplicates
(deterministic names, 409 tolerated).  A decision's status is written before any pod is deleted,
so a restart is counted exactly once even when the operator dies in between.

The concerns around it each live in one module: planning over the operator's indexes
(:mod:`~hetero_operator.controller.planner`), GPUs held by starts in flight
(:mod:`~hetero_operator.controller.reservations`), when a job is looked at next
(:mod:`~hetero_operator.controller.requeue`), which replica acts
(:mod:`~hetero_operator.controller.leadership`), rank 0's progress
(:mod:`~hetero_operator.controller.progress`), Events (:mod:`~hetero_operator.controller.events`),
node health (:mod:`~hetero_operator.cluster.nodehealth`), pods and status
(:mod:`~hetero_operator.lifecycle.status`), bounded API calls (:mod:`~hetero_operator.controller.k8s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import kopf

from hetero_operator.api import conditions as c
from hetero_operator.api import labels, limits
from hetero_operator.api.errors import SpecError
from hetero_operator.api.settings import OperatorConfig
from hetero_operator.api.spec import JobSpec, parse_job, profile_key
from hetero_operator.api.types import Plan, Unschedulable
from hetero_operator.cluster.dra import DraInventory
from hetero_operator.cluster.nodehealth import FirstSeen, NodeHealth, node_health
from hetero_operator.controller.egress import restricts_egress
from hetero_operator.controller.elasticpods import ElasticPods
from hetero_operator.controller.events import EventRecorder
from hetero_operator.controller.k8s import Api
from hetero_operator.controller.leadership import Leadership
from hetero_operator.controller.learning import SpeedLearner
from hetero_operator.controller.learning import record as record_speeds
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.objects import (Gate, KueueGate, replace_claim_templates,
                                                dra_objects, WARNED_GATE_REASONS)
from hetero_operator.controller.ownership import NotOwned, create_core_owned
from hetero_operator.controller.planner import (free_whole_gpus, plan_inputs, plan_on_indexes,
                                                with_default_images)
from hetero_operator.controller.progress import (METRICS_UNREADABLE, MetricsUrlFn, ProgressReader,
                                                 default_metrics_url)
from hetero_operator.controller.rankevents import RankCheckpointEvents
from hetero_operator.controller.refusals import REFUSED, not_a_refusal, plan_too_large, refusal_words
from hetero_operator.controller.requeue import Requeue, next_look_s
from hetero_operator.controller.reservations import Reservations, planned_gpu_pods
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import status as st
from hetero_operator.lifecycle import ckptplace, rwoclaims, stuck
from hetero_operator.planning.marginal import PlanInputs
from hetero_operator.render import pods as rendering
from hetero_operator.render import workload as kueue
from hetero_operator.render.claims import add_claims, stale_template_names
from hetero_operator.render.env import render_rank_envs

log = logging.getLogger("heterotrain.operator")
Key = tuple[str, str]
WARNING_WAITS = frozenset({"NodeNotReady", *WARNED_GATE_REASONS, *stuck.JOB_REASONS})
"""Wait reasons that are Warnings (re-posted while the job keeps waiting)."""

__all__ = ["MetricsUrlFn", "Reconciler", "default_metrics_url", "with_default_images"]


class Reconciler:
    """Runs reconciles per job, one at a time per job.

    Args:
        config: operator settings.
        api: API wrapper.
        metrics: operator metrics.
        nodes: returns the Node objects (the Node informer's trimmed values:
            :mod:`hetero_operator.controller.clustercache`).
        gpu_pods: returns pods bound to nodes that hold GPUs (the Pod informer's).
        identity / peering_namespace: this replica's kopf peering identity; ``identity=None``
            means standalone (always acts).
        namespaced_peering: read the ``KopfPeering`` of each job's namespace (kopf's namespaced
            mode) instead of ``peering_namespace``'s.
        metrics_url: where rank 0's metrics are read (a test kubelet maps ports).
        clock: epoch seconds.
    """

    def __init__(self, *, config: OperatorConfig, api: Api, metrics: OperatorMetrics,
                 nodes: Callable[[], list[dict[str, Any]]],
                 gpu_pods: Callable[[], list[dict[str, Any]]],
                 identity: str | None = None, peering_namespace: str | None = None,
                 namespaced_peering: bool = False,
                 metrics_url: MetricsUrlFn = default_metrics_url,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.api, self.metrics = config, api, metrics
        self.nodes, self.gpu_pods, self.clock = nodes, gpu_pods, clock
        self.timing = config.restart
        self.requeue = Requeue(self._work, retry_s=config.intervals.resync_s,
                               max_retry_s=config.restart.backoff_max_s)
        self.leadership = Leadership(get_peering=api.get_peering, identity=identity,
                                     peering=config.peering.name, namespace=peering_namespace,
                                     priority=config.peering.priority, clock=clock,
                                     per_job_namespace=namespaced_peering)
        self.events = EventRecorder(api, repeat_s=config.intervals.waiting_event_s)
        self.progress = ProgressReader(metrics_url, config.intervals.progress_s)
        self.learner = SpeedLearner(metrics_url, config.intervals.progress_s)
        self._phases: dict[Key, str] = {}
        self._job_nodes: dict[Key, frozenset[str]] = {}
        self.kueue = KueueGate(api)  # queued jobs: Workload per job, admission gates the pods
        self.reservations = Reservations()  # planned pods the pod index has not seen yet
        self.ckpt_events = RankCheckpointEvents(self.events)  # CheckpointFallback / NotResumed
        self.node_first_seen = FirstSeen()  # time-less NotReady marks, dated at first sight
        self.elastic = ElasticPods(free=lambda spec: free_whole_gpus(  # where a lost pod may come back
            spec, self.nodes(), [*self.gpu_pods(), *self.reservations.held_by_others(
                (spec.namespace, spec.name), self.gpu_pods(), now_s=self.clock())]))

    # --- kicks -----------------------------------------------------------------------------

    def kick(self, namespace: str, name: str, delay_s: float = 0.0) -> None:
        """Reconcile ``namespace/name`` after ``delay_s`` (an earlier pending kick wins)."""
        self.requeue.kick(namespace, name, delay_s)

    def kick_pending(self, delay_s: float = 0.2) -> None:
        """Kick every job that waits for capacity (a node was added or changed)."""
        for key, phase in list(self._phases.items()):
            if phase == c.PENDING:
                self.kick(*key, delay_s=delay_s)

    def node_changed(self, node: str, delay_s: float = 0.2) -> None:
        """A Node changed or went: kick the jobs waiting for capacity and those with pods on it."""
        self.kick_pending(delay_s)
        for key, nodes in list(self._job_nodes.items()):
            if node in nodes:
                self.kick(*key, delay_s=delay_s)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's timers and memory."""
        key = (namespace, name)
        self.requeue.forget(namespace, name)
        self.events.forget(namespace, name)
        self.kueue.forget(namespace, name)
        self.ckpt_events.forget(namespace, name)
        self.progress.forget(namespace, name)
        self.learner.forget(namespace, name)
        self.elastic.forget(namespace, name)
        self._phases.pop(key, None)
        self._job_nodes.pop(key, None)
        self.reservations.release(key)
        self.metrics.set_phases(self._phases.values())

    async def stop(self) -> None:
        """Cancel pending kicks and running reconciles."""
        await self.requeue.stop()

    async def is_leader(self, namespace: str | None = None) -> bool:
        """True when this replica may act on jobs of ``namespace`` (see
        :mod:`hetero_operator.controller.leadership`)."""
        return await self.leadership.is_leader(namespace)

    async def _work(self, namespace: str, name: str) -> float | None:
        started = time.perf_counter()
        try:
            if not await self.leadership.is_leader(namespace):
                return self.config.intervals.resync_s
            return await self.reconcile(namespace, name)
        finally:
            self.metrics.reconcile_duration.observe(time.perf_counter() - started)

    # --- one reconcile ---------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> float | None:
        """Observe, decide, act once; returns seconds until the next look (``None`` = done)."""
        job = await self.api.get_job(namespace, name)
        if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(namespace, name)
            return None
        now = self.clock()
        status = dict(job.get("status") or {})
        try:
            spec = with_default_images(parse_job(job), self.config)
        except SpecError as exc:
            await self._invalid(job, status, exc, now)
            return None
        pods = await self.api.list_pods(namespace, labels.selector(name))
        if pods:  # the API has them: from here on the pod index counts them, not a hold
            self.reservations.release((namespace, name))
        planned_nodes = st.planned_nodes(status)
        attach = await self._attach_events(namespace, pods, now)  # Multi-Attach (lifecycle.stuck)
        states = [st.pod_state(p, planned_nodes.get(p["metadata"]["name"], ""),
                               attach.get(p["metadata"]["name"], ())) for p in pods]
        state, gate = st.job_state(status), None
        elastic = self.elastic.job(spec, status, state.attempt)  # its lost pods' nodes: to grow back
        used = frozenset(p.node for p in states if p.node) | (elastic.nodes if elastic else frozenset())
        self._job_nodes[(namespace, name)] = used
        if state.phase not in c.FINISHED_PHASES:  # one queue source (objects.KueueGate.gate)
            gate = await self.kueue.gate(job, spec, lambda: self._plan(spec, capacity=True)[0],
                                         has_pods=bool(pods), require_queue=self.config.kueue.require_queue)
        decision = lc.decide(state, gate.policy(spec) if gate else spec.run_policy,
                             states, nodes=self._node_health(used, now), now_s=now, timing=self.timing,
                             checkpointing=bool(spec.training.checkpoint_path),
                             restart_from=ckptplace.restart_source(spec),
                             elastic=elastic)
        decision = gate.explain(decision) if gate else decision
        refused = st.refusals(status)
        if refused.retry_s is not None:  # a refused start (_refused): back off, keep the server's word
            if decision.action == lc.START and now < refused.retry_s:
                return refused.retry_s - now
            if decision.action == lc.WAIT and decision.phase == c.PENDING:
                decision = replace(decision, reason=REFUSED, message=refused.message)
        log.debug("%s/%s: %s %s (%s) pods=%s", namespace, name, decision.action, decision.phase,
                  decision.reason, [(p.name, p.phase, p.deleting) for p in states])
        if decision.action == lc.START:
            return await self._start(job, spec, status, now, gate=gate)
        if decision.action == lc.DELETE_JOB:
            await self.events.post(job, "Normal", decision.reason, decision.message, now)
            await self.api.delete_job(namespace, name)
            self.forget(namespace, name)
            return None
        extra: dict[str, Any] = {}
        if decision.action == lc.GROW:  # created before the status says so; or a wait saying why
            decision = await self.elastic.grow(self.api, job, state.attempt, decision)
        if decision.action == lc.RUNNING:
            extra = await self.progress.read(namespace, name, pods, metrics_port=spec.worker.metrics_port,
                                             global_batch=spec.training.global_batch_size, now_s=now)
            await self.ckpt_events.observe(job, spec, status, self.progress.last.get((namespace, name)), now)
            await self.learner.observe(namespace, name, pods, status.get("plan"),
                                       metrics_port=spec.worker.metrics_port, now_s=now)
            await self._metrics_warnings(job, now)
        await self._record(job, status, decision, states, now, extra=extra)
        if decision.phase == c.SUCCEEDED and state.phase != c.SUCCEEDED:
            await self._learn(spec, now)
        await self._delete_pods(namespace, decision)  # after the status: a restart counts once
        if gate is not None:
            await self.kueue.after(gate, job, decision, states, c.now_iso(now))
            if gate.not_owned:  # a Workload of the job's name that is not the job's: back off
                return self.requeue.backoff(namespace, name)
        return next_look_s(decision, self.config.intervals.resync_s)

    async def _attach_events(self, namespace: str, pods: list[dict[str, Any]],
                             now: float) -> dict[str, list[Mapping[str, Any]]]:
        """The namespace's FailedAttachVolume Events by pod, read only while a bound pod of the job
        is still creating its containers (:func:`hetero_operator.lifecycle.stuck.wants_events`);
        an API without the call, or a failed read, is no Events (the pending timeout still ends
        the wait)."""
        lister = getattr(self.api, "list_pod_events", None)
        if lister is None or not stuck.wants_events(pods, now):
            return {}
        try:
            return stuck.events_by_pod(await lister(namespace, reason=stuck.MULTI_ATTACH_EVENT[0]))
        except Exception as exc:  # noqa: BLE001 - advice only: the wait still ends by its timeout
            log.warning("%s: cannot list pod Events: %s", namespace, exc)
            return {}

    async def _metrics_warnings(self, job: Mapping[str, Any], now: float) -> None:
        """A Warning Event for a rank endpoint that answered but not as a worker's metrics
        (:mod:`hetero_operator.controller.progress`); the reconcile goes on either way."""
        meta = job["metadata"]
        problems = (self.progress.take_warnings(meta["namespace"], meta["name"])
                    + self.learner.take_warnings(meta["namespace"], meta["name"]))
        if problems:
            message = f"Rank metrics unreadable: {problems[0]}"
            if self.events.due(job, "Warning", METRICS_UNREADABLE, message, now):
                await self.events.post(job, "Warning", METRICS_UNREADABLE, message, now)

    def _node_health(self, used: Iterable[str], now: float) -> dict[str, NodeHealth] | None:
        """Health of the job's nodes that exist; ``None`` before the node index has any node.

        A node of ``used`` missing from the result is gone.  The name -> node map is a temporary
        of this call (one per in-flight reconcile would add up at 2,000 nodes).
        """
        nodes = self.nodes()
        if not nodes:
            return None
        used = set(used)
        if not used:  # a job without pods (every start): no map of all nodes
            return {}
        by_name = {n["metadata"]["name"]: n for n in nodes}
        self.node_first_seen.keep_nodes(set(by_name))
        return {name: node_health(by_name[name], now, self.node_first_seen)
                for name in used if name in by_name}

    async def _delete_pods(self, namespace: str, d: lc.Decision) -> None:
        if d.force_delete_pods:
            log.warning("%s: force-deleting pod(s) %s (grace 0: %s)", namespace,
                        ", ".join(d.force_delete_pods), d.reason)
        await asyncio.gather(*(self.api.delete_pod(namespace, p) for p in d.delete_pods),
                             *(self.api.delete_pod(namespace, p, grace_s=0) for p in d.force_delete_pods))

    async def _start(self, job: Mapping[str, Any], spec: JobSpec, status: dict[str, Any],
                     now: float, gate: Gate | None = None) -> float | None:

        gen = job["metadata"].get("generation")
        how = dict(allowed=gate.allowed if gate else None, dra_source=await dra_objects(self.kueue.objects),
                   inputs=await plan_inputs(self.api, spec, self.config, now_s=now))
        result, drainv = self._plan(spec, **how)
        if isinstance(result, Plan):  # a ReadWriteOnce claim keeps the ranks on one node
            result, drainv = await self._one_node_claims(job, spec, result, drainv, how, now)
        if isinstance(result, Unschedulable):
            self.metrics.record_plan("unschedulable")
            message = f"Unschedulable: {result.message}"
            decision = lc.Decision(action=lc.WAIT, phase=c.PENDING, reason=result.reason,
                                   message=message)
            await self._record(job, status, decision, [], now, event_type="Warning")
            return self.config.restart.unschedulable_retry_s
        self.metrics.record_plan("planned")
        if len(result.groups) > limits.PLAN_GROUPS_MAX:  # its status.plan would be refused (422)
            await self._record(job, status, plan_too_large(spec, result), [], now, event_type="Warning")
            return None
        attempt = st.job_state(status).attempt + 1
        maddr = self.elastic.master_addr(spec, result, self.config.pods.service_domain)
        envs = self.elastic.rank_envs(spec, render_rank_envs(
            result, spec, master_addr=maddr, master_port=self.config.ports.master,
            simulated=self.config.pods.simulate_devices, restart_generation=attempt - 1,
            job_uid=str(job["metadata"].get("uid", ""))), master_addr=maddr, master_port=self.config.ports.master)
        # The pods' inputs first (Kueue's admitted flavors, DRA's claims), then the pods, once.
        inputs = rendering.PodInputs()
        if gate is not None and gate.allowed:  # the admitted flavors' nodeSelector/tolerations
            inputs = kueue.add_placements(inputs, result, gate.allowed)
        inputs, claim_templates = add_claims(inputs, spec.name, spec.namespace, result, drainv,
                                             labels=labels.selector(spec.name), attempt=attempt)
        pods = rendering.render_pods(spec, result, envs, launcher=self.config.pods.launcher, attempt=attempt,
                                     run_as_non_root=self.config.pods.run_as_non_root, inputs=inputs)
        pods += self.elastic.keeper_pods(spec, result, master_port=self.config.ports.master, attempt=attempt,
                                         run_as_non_root=self.config.pods.run_as_non_root)

        # Held before the first await: a start planned meanwhile counts these GPUs as used.
        self.reservations.hold((spec.namespace, spec.name), planned_gpu_pods(
            spec.namespace, spec.name, result, dra_nodes=drainv.dra_nodes), now_s=self.clock())
        children = [rendering.render_service(spec, master_port=self.config.ports.master)]
        if self.config.network.policy:  # before any pod exists: no window with open ports
            children.append(rendering.render_network_policy(
                spec, result, metrics_namespaces=self.config.network.metrics_namespaces,
                egress=await restricts_egress(self.api, self.config.network.egress, spec, pods),
                dns_namespace=self.config.network.dns_namespace, dns_labels=self.config.network.dns_labels))
        kopf.append_owner_reference([*children, *claim_templates, *pods], owner=job)
        self.elastic.remember(spec, attempt, pods)  # a pod a shrink removes is created again as it was
        plan = st.plan_status(spec.name, result, master_addr=maddr, master_port=self.config.ports.master)
        started = st.started_status(status, spec, result, plan, attempt=attempt, generation=gen,
                                    now_s=now)
        await self._patch(job, status, started.before)  # the plan is recorded before any pod exists
        refused, conditions = st.refusals(status).count, status.get("conditions") or []
        try:  # every object is the job's or the start is refused (ownership: never adopt, patch)
            for child in children:
                if not await create_core_owned(self.api, child, job) and child["kind"] == "NetworkPolicy":
                    await self.api.patch_network_policy(child)  # the job's own: brought up to date
            before = st.planned_nodes(status).values()  # DRA nodes: the pods' claims come from these
            if claim_templates or any(node in drainv.dra_nodes for node in before):
                await replace_claim_templates(self.kueue.objects, spec.namespace, stale_template_names(
                    spec.name, status.get("plan") or {}, attempt - 1), claim_templates, owner=job)
        except NotOwned as exc:
            return await self._refused(job, started.before, [], [(exc.name, exc)], refused, now,
                                       conditions=conditions)
        created = await asyncio.gather(*(create_core_owned(self.api, p, job) for p in pods),
                                       return_exceptions=True)
        self.metrics.pods_created.inc(sum(1 for r in created if r is True))
        failed = [(p["metadata"]["name"], r) for p, r in zip(pods, created, strict=True)
                  if isinstance(r, BaseException)]
        if failed:  # undo this start, never touching a pod that is not the job's
            undo = [p["metadata"]["name"] for p, r in zip(pods, created, strict=True)
                    if not isinstance(r, NotOwned)]
            return await self._refused(job, started.before, undo, failed, refused, now,
                                       conditions=conditions)
        if refused:  # every pod was admitted this time
            await self._patch(job, started.before, started.created)
        self._set_phase(job, c.CREATED)
        self._job_nodes[(spec.namespace, spec.name)] = frozenset(result.nodes)
        await self.events.post(job, "Normal", "Planned", started.created["message"], now)
        lost_checkpoints = ckptplace.checkpoint_warning(spec)  # a path on no volume (issue 32, F8)
        if lost_checkpoints:
            await self.events.post(job, "Warning", ckptplace.WARNING_REASON, lost_checkpoints, now)
        for warning in result.warnings:  # label inconsistencies of the nodes this job runs on
            if warning.node in result.nodes:
                await self.events.post(job, "Warning", warning.reason, warning.message, now)
        return self.config.intervals.resync_s

    async def _refused(self, job: Mapping[str, Any], started: dict[str, Any], undo: list[str],
                       failed: list[tuple[str, BaseException]], refusals: int, now: float, *,
                       conditions: list[Any]) -> float:
        """The API server refused pods of this start, or an object of the job's name is not the
        job's (:mod:`hetero_operator.controller.ownership`): delete the pods ``undo`` (what was
        created of this start), wait ``Pending`` with the reason, retry after an exponential
        backoff (:mod:`hetero_operator.controller.refusals`)."""
        other = not_a_refusal(r for _, r in failed)
        if other is not None:  # the next reconcile retries the creates (deterministic names: 409s)
            raise other
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        self.reservations.release(key)
        await asyncio.gather(*(self.api.delete_pod(meta["namespace"], p) for p in undo))
        pod, exc = min(failed, key=lambda f: not isinstance(f[1], NotOwned))  # a taken name first
        n = refusals + 1
        delay = lc.backoff_s(n, self.timing)
        said, message = refusal_words(pod, exc, refusals=n, delay_s=delay)
        reason = exc.reason if isinstance(exc, NotOwned) else REFUSED
        new = st.refused_status(started, reason=reason, message=message, refusals_count=n,
                                retry_s=now + delay, conditions=conditions,
                                generation=meta.get("generation"), now_s=now)
        await self.api.patch_job_status(meta["namespace"], meta["name"],
                                        {k: v for k, v in new.items() if started.get(k) != v})
        self._set_phase(job, c.PENDING)
        await self.events.post(job, "Warning", reason, said + ".", now)
        log.warning("%s/%s: %s", *key, message)
        return delay

    def _plan(self, spec: JobSpec, *, allowed: Mapping[str, Any] | None = None, capacity: bool = False,
              dra_source: tuple[list[Any], list[Any]] = ([], []),
              inputs: PlanInputs | None = None, only: str = "") -> tuple[Plan | Unschedulable, DraInventory]:
        """:func:`hetero_operator.controller.planner.plan_on_indexes` over the node and pod
        indexes (each read once per plan: a read copies the informer's values) and the
        GPUs other starts hold; ``only``: onto that node alone."""
        nodes, indexed = self.nodes(), self.gpu_pods()
        if only:
            nodes = [n for n in nodes if n["metadata"]["name"] == only]
        held = self.reservations.held_by_others((spec.namespace, spec.name), indexed,
                                                now_s=self.clock())
        return plan_on_indexes(spec, nodes, indexed, held, allowed=allowed, capacity=capacity,
                               dra_source=dra_source, inputs=inputs)

    async def _one_node_claims(self, job: Mapping[str, Any], spec: JobSpec, plan: Plan, drainv: DraInventory,
                               how: Mapping[str, Any], now: float) -> tuple[Plan | Unschedulable, DraInventory]:
        """The plan a ReadWriteOnce claim of the pods allows (:mod:`hetero_operator.lifecycle.rwoclaims`,
        shared/cases/51), with a Warning when it was narrowed to one node; claims are read only
        when the pods mount any (an unreadable one is left to the kubelet)."""
        uses, getter = rwoclaims.claim_uses(spec), getattr(self.api, "get_pvc", None)
        if not uses or getter is None:
            return plan, drainv
        pvcs: dict[str, Any] = {}
        for use in uses:
            try:
                pvcs[use.name] = await getter(spec.namespace, use.name)
            except Exception as exc:  # noqa: BLE001 - advice only: the pods report a missing claim
                log.warning("%s/%s: cannot read PersistentVolumeClaim %s: %s", spec.namespace, spec.name,
                            use.name, exc)
        views: dict[str, DraInventory] = {}

        def plan_on(node: str) -> Plan | Unschedulable:
            single, views[node] = self._plan(spec, **how, only=node)
            return single

        confined = rwoclaims.confine(spec.name, plan, rwoclaims.one_node_claims(uses, pvcs),
                                     min_ranks=spec.gpus.min_ranks, plan_on=plan_on)
        if confined.warning:
            await self.events.post(job, "Warning", rwoclaims.REASON, confined.warning, now)
        if isinstance(confined.plan, Plan) and confined.plan is not plan:
            return confined.plan, views[confined.plan.nodes[0]]
        return confined.plan, drainv

    async def _learn(self, spec: JobSpec, now: float) -> None:
        """Record the succeeded job's per-type speeds in ``heterotrain-profiles``
        (:mod:`hetero_operator.controller.learning`); a failure is logged, never fails the job."""

        key = profile_key(spec)
        observations = self.learner.observations(spec.namespace, spec.name, unix_s=now)
        try:
            entries = await record_speeds(self.api, spec.namespace, key, observations, now_s=now)
        except Exception as exc:  # noqa: BLE001 - advice only: the job has succeeded regardless
            log.warning("%s/%s: cannot record learned speeds: %s", spec.namespace, spec.name, exc)
            return
        if entries is not None:
            log.info("%s/%s: learned speeds of %s: %s", spec.namespace, spec.name, key,
                     {k: (round(e.samples_per_s, 1), e.observations) for k, e in entries.items()})

    async def _record(self, job: Mapping[str, Any], status: dict[str, Any], d: lc.Decision,
                      states: Iterable[lc.PodState], now: float, event_type: str = "",
                      extra: Mapping[str, Any] | None = None) -> None:
        new = st.decided_status(status, d, states, generation=job["metadata"].get("generation"),
                                now_s=now, extra=extra)
        if d.count_restart:
            self.metrics.restarts.inc()
        await self._patch(job, status, new)
        self._set_phase(job, d.phase)
        if not d.message:
            return
        kind = event_type or ("Warning" if d.action in (lc.FAIL, lc.RESTART, lc.REPLAN, lc.SHRINK)
                              or d.reason in WARNING_WAITS else "Normal")
        waiting = kind == "Warning" and d.action == lc.WAIT
        if d.message != status.get("message") or (
                waiting and self.events.due(job, kind, d.reason, d.message, now)):
            await self.events.post(job, kind, d.reason, d.message, now)

    async def _invalid(self, job: Mapping[str, Any], status: dict[str, Any], exc: SpecError,
                       now: float) -> None:
        message = f"Invalid spec: {exc}"
        d = lc.Decision(action=lc.FAIL, phase=c.FAILED, reason="InvalidSpec", message=message)
        await self._record(job, status, d, [], now, event_type="Warning")

    async def _patch(self, job: Mapping[str, Any], old: Mapping[str, Any], new: dict[str, Any]) -> None:
        patch = st.merge_patch(old, new)
        if patch:
            meta = job["metadata"]
            await self.api.patch_job_status(meta["namespace"], meta["name"], patch)

    def _set_phase(self, job: Mapping[str, Any], phase: str) -> None:
        meta = job["metadata"]
        self._phases[(meta["namespace"], meta["name"])] = phase
        self.metrics.set_phases(self._phases.values())

