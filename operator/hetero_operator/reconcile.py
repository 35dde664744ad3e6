"""The reconciler: observe a job, ask :mod:`lifecycle`, carry out the decision.

Level-based: every kick re-reads the job and its pods from the API, so a restarted operator
continues from ``status`` alone (restarts, attempt, plan) and never creates duplicates
(deterministic names, 409 tolerated).  Kicks come from kopf watch events (jobs, owned pods,
nodes) and from the reconciler's own delayed re-checks (backoff, pending timeout, resync).
No kopf timer or daemon is used: those need a finalizer on the job, which blocks namespace
deletion when the operator is gone (shared/cases/23).  Re-checks act only while this replica
holds the kopf peering lead (same rule as kopf: no live peer with a priority >= ours).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp
import kopf

from hetero_operator import conditions as c
from hetero_operator import lifecycle as lc
from hetero_operator import rendering, status as st
from hetero_operator.config import OperatorConfig
from hetero_operator.k8s import Api
from hetero_operator.model import Plan, Unschedulable
from hetero_operator.opmetrics import OperatorMetrics
from hetero_operator.spec import JobSpec, SpecError, parse_job

log = logging.getLogger("heterotrain.operator")
Key = tuple[str, str]
MetricsUrlFn = Callable[[Mapping[str, Any], int], "str | None"]


def default_metrics_url(pod: Mapping[str, Any], port: int) -> str | None:
    """``http://<podIP>:<port>/metrics`` of a running pod, ``None`` before it has an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{port}/metrics" if ip and port else None


def with_default_images(job: JobSpec, config: OperatorConfig) -> JobSpec:
    """Fill an empty ``spec.images`` with the operator's default catalog."""
    return job if job.images else replace(job, images=config.default_images)


class Reconciler:
    """Runs reconciles per job, one at a time per job.

    Args:
        config: operator settings.
        api: API wrapper.
        metrics: operator metrics.
        nodes: returns the Node objects (the kopf index).
        gpu_pods: returns pods bound to nodes that hold GPUs (the kopf index).
        identity / peering_namespace: this replica's kopf peering identity; ``identity=None``
            means standalone (always acts).
        metrics_url: where rank 0's metrics are read (a test kubelet maps ports).
        clock: epoch seconds.
    """

    def __init__(self, *, config: OperatorConfig, api: Api, metrics: OperatorMetrics,
                 nodes: Callable[[], list[dict[str, Any]]],
                 gpu_pods: Callable[[], list[dict[str, Any]]],
                 identity: str | None = None, peering_namespace: str | None = None,
                 metrics_url: MetricsUrlFn = default_metrics_url,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.api, self.metrics = config, api, metrics
        self.nodes, self.gpu_pods = nodes, gpu_pods
        self.identity, self.peering_namespace = identity, peering_namespace
        self.metrics_url, self.clock = metrics_url, clock
        self.timing = lc.Timing(pending_timeout_s=config.pending_timeout_s,
                                backoff_base_s=config.backoff_base_s,
                                backoff_max_s=config.backoff_max_s)
        self._due: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._phases: dict[Key, str] = {}
        self._progress_at: dict[Key, float] = {}
        self._leader_cache: tuple[float, bool] = (-1e9, True)

    # --- scheduling ----------------------------------------------------------------------

    def kick(self, namespace: str, name: str, delay_s: float = 0.0) -> None:
        """Reconcile ``namespace/name`` after ``delay_s`` (an earlier pending kick wins)."""
        loop = asyncio.get_running_loop()
        key, when = (namespace, name), loop.time() + max(delay_s, 0.0)
        current = self._due.get(key)
        if current is not None:
            if current[0] <= when:
                return
            current[1].cancel()
        self._due[key] = (when, loop.call_at(when, self._fire, key))

    def kick_pending(self, delay_s: float = 0.2) -> None:
        """Kick every job that waits for capacity (a node was added or changed)."""
        for key, phase in list(self._phases.items()):
            if phase == c.PENDING:
                self.kick(*key, delay_s=delay_s)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's timers and memory."""
        key = (namespace, name)
        due = self._due.pop(key, None)
        if due is not None:
            due[1].cancel()
        self._phases.pop(key, None)
        self._progress_at.pop(key, None)
        self._locks.pop(key, None)
        self.metrics.set_phases(self._phases.values())

    async def stop(self) -> None:
        """Cancel pending kicks and running reconciles."""
        for _, handle in self._due.values():
            handle.cancel()
        self._due.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _fire(self, key: Key) -> None:
        self._due.pop(key, None)
        task = asyncio.get_running_loop().create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: Key) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            started = time.perf_counter()
            try:
                if not await self.is_leader():
                    self.kick(*key, delay_s=self.config.resync_s)
                    return
                requeue = await self.reconcile(*key)
            except Exception:  # noqa: BLE001 - API hiccups: log, retry after a resync period
                log.exception("reconcile of %s/%s failed; retrying", *key)
                requeue = self.config.resync_s
            finally:
                self.metrics.reconcile_duration.observe(time.perf_counter() - started)
        if requeue is not None:
            self.kick(*key, delay_s=requeue)

    async def is_leader(self) -> bool:
        """True when standalone, or when no live peer has a priority >= ours (kopf's rule)."""
        if self.identity is None:
            return True
        now = self.clock()
        if now - self._leader_cache[0] < 2.0:
            return self._leader_cache[1]
        body = await self.api.get_peering(self.config.peering, self.peering_namespace)
        leader = peering_leader(body, self.identity, self.config.peering_priority, now)
        self._leader_cache = (now, leader)
        return leader

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
        pods = await self.api.list_pods(namespace, rendering.selector(name))
        planned_nodes = {g["pod"]: g["node"] for g in (status.get("plan") or {}).get("groups") or ()}
        states = [st.pod_state(p, planned_nodes.get(p["metadata"]["name"], "")) for p in pods]
        # the node-name set is a temporary of this call: a reconcile suspended at an await below
        # must not keep a set of every node name alive (one per in-flight job adds up)
        decision = lc.decide(st.job_state(status), spec.run_policy, states,
                             nodes={n["metadata"]["name"] for n in self.nodes()} or None,
                             now_s=now, timing=self.timing)
        log.debug("%s/%s: %s %s (%s) pods=%s", namespace, name, decision.action, decision.phase,
                  decision.reason, [(p.name, p.phase) for p in states])
        if decision.delete_pods:
            await asyncio.gather(*(self.api.delete_pod(namespace, p) for p in decision.delete_pods))
        if decision.action == lc.START:
            return await self._start(job, spec, status, now)
        if decision.action == lc.DELETE_JOB:
            await self._event(job, "Normal", decision.reason, decision.message, now)
            await self.api.delete_job(namespace, name)
            self.forget(namespace, name)
            return None
        extra = await self._progress(spec, pods, now) if decision.action == lc.RUNNING else {}
        await self._record(job, status, decision, states, now, extra=extra)
        if decision.action in (lc.NOTHING, lc.CLEANUP) and decision.requeue_s is None:
            return None
        if decision.requeue_s is None:
            return self.config.resync_s
        return min(decision.requeue_s, self.config.resync_s)

    async def _start(self, job: Mapping[str, Any], spec: JobSpec, status: dict[str, Any],
                     now: float) -> float:
        from hetero_operator.envrender import render_rank_envs

        gen = job["metadata"].get("generation")
        result = self._plan(spec)
        if isinstance(result, Unschedulable):
            self.metrics.record_plan("unschedulable")
            message = f"Unschedulable: {result.message}"
            decision = lc.Decision(action=lc.WAIT, phase=c.PENDING, reason=result.reason,
                                   message=message)
            await self._record(job, status, decision, [], now, event_type="Warning")
            return self.config.unschedulable_retry_s
        self.metrics.record_plan("planned")
        attempt = int(status.get("attempt") or 0) + 1
        maddr = rendering.master_addr(spec.name, spec.namespace, result, self.config.service_domain)
        envs = render_rank_envs(result, spec, master_addr=maddr, master_port=self.config.master_port,
                                simulated=self.config.simulate_devices)
        pods = rendering.render_pods(spec, result, envs, launcher=self.config.launcher, attempt=attempt)
        service = rendering.render_service(spec, master_port=self.config.master_port)
        kopf.append_owner_reference([service, *pods], owner=job)
        plan = st.plan_status(spec.name, result, master_addr=maddr, master_port=self.config.master_port)
        message = (f"Placed {result.world_size} ranks on {len(result.nodes)} node(s) "
                   f"({st.gpu_types_text(plan['groups'])}); expected speedup over an equal split "
                   f"{plan['expectedSpeedupOverEqual']}x.")
        new = dict(status, plan=plan, attempt=attempt, ranksWanted=result.world_size,
                   ranksRunning=0, ranksSummary=f"0/{result.world_size}",
                   gpuTypes=st.gpu_types_text(plan["groups"]), lastStartTime=c.now_iso(now),
                   phase=c.CREATED, message=message, observedGeneration=gen)
        new.setdefault("startTime", c.now_iso(now))
        new.pop("restartNotBefore", None)
        new["conditions"] = c.apply_phase(status.get("conditions") or [], phase=c.CREATED,
                                          reason="PodsCreated", message=message, now_s=now,
                                          generation=gen)
        await self._patch(job, status, new)  # the plan is recorded before any pod exists
        await self.api.create(service)
        created = await asyncio.gather(*(self.api.create(p) for p in pods))
        self.metrics.pods_created.inc(sum(created))
        self._set_phase(job, c.CREATED)
        await self._event(job, "Normal", "Planned", message, now)
        return self.config.resync_s

    def _plan(self, spec: JobSpec) -> Plan | Unschedulable:
        """Plan ``spec`` over the indexed nodes and the GPU pods not its own.

        The inventory (about 0.4 KiB per node: ~0.8 MiB at 2,000 nodes) lives only inside this
        call: ``_start`` awaits API calls after planning, and an inventory kept in its frame would
        be held once per job being started at the same time (the operator's peak RSS grew by
        ~1 MiB per job that way).
        """
        from hetero_operator.nodeindex import build_indexed_inventory
        from hetero_operator.planning import plan_job

        # Index values remember their parse: only nodes changed since the last start are re-read.
        inventory = build_indexed_inventory(self.nodes(), [p for p in self.gpu_pods()
                                                           if not _owned_by(p, spec.name, spec.namespace)])
        result = plan_job(spec, inventory)
        log.info("%s/%s: planned over %d usable node(s), %d GPU pod(s) bound: %s", spec.namespace,
                 spec.name, len(inventory.nodes), len(self.gpu_pods()),
                 getattr(result, "message", None) or [(g.node, g.gpu_type, len(g.ranks)) for g in result.groups])
        return result

    async def _record(self, job: Mapping[str, Any], status: dict[str, Any], d: lc.Decision,
                      states: Iterable[lc.PodState], now: float, event_type: str = "",
                      extra: Mapping[str, Any] | None = None) -> None:
        gen = job["metadata"].get("generation")
        new = dict(status, phase=d.phase, observedGeneration=gen, **(extra or {}))
        if d.message:
            new["message"] = d.message
            new["conditions"] = c.apply_phase(status.get("conditions") or [], phase=d.phase,
                                              reason=d.reason, message=d.message, now_s=now,
                                              generation=gen)
        if d.count_restart:
            new["restarts"] = int(status.get("restarts") or 0) + 1
            new["lastFailure"] = d.message.split(";")[0]
            self.metrics.restarts.inc()
        if d.restart_not_before_s is not None:
            new["restartNotBefore"] = c.now_iso(d.restart_not_before_s)
        if d.action == lc.REPLAN:
            new["replans"] = int(status.get("replans") or 0) + 1
        if d.action == lc.FAIL and d.reason == "BackoffLimitExceeded":
            new["lastFailure"] = d.message.split(";")[0]
        if d.phase in c.FINISHED_PHASES and not status.get("completionTime"):
            new["completionTime"] = c.now_iso(now)
        plan = status.get("plan") or {}
        units = _ranks_per_pod(plan)
        wanted = int(plan.get("worldSize") or status.get("ranksWanted") or 0)
        running = sum(units.get(p.name, 0) for p in states if p.phase == "Running" and not p.deleting)
        new.update(ranksRunning=running, ranksSummary=f"{running}/{wanted}")
        if wanted:
            new["ranksWanted"] = wanted
        await self._patch(job, status, new)
        self._set_phase(job, d.phase)
        if d.message and d.message != status.get("message"):
            kind = event_type or ("Warning" if d.action in (lc.FAIL, lc.RESTART, lc.REPLAN) else "Normal")
            await self._event(job, kind, d.reason, d.message, now)

    async def _invalid(self, job: Mapping[str, Any], status: dict[str, Any], exc: SpecError,
                       now: float) -> None:
        message = f"Invalid spec: {exc}"
        d = lc.Decision(action=lc.FAIL, phase=c.FAILED, reason="InvalidSpec", message=message)
        await self._record(job, status, d, [], now, event_type="Warning")

    async def _progress(self, spec: JobSpec, pods: list[dict[str, Any]], now: float) -> dict[str, Any]:
        """``{"progress": ...}`` from rank 0's metrics when due and readable, else ``{}``."""
        key = (spec.namespace, spec.name)
        if now - self._progress_at.get(key, -1e9) < self.config.progress_interval_s:
            return {}
        rank0 = next((p for p in pods if p["metadata"].get("labels", {}).get(rendering.LABEL_RANK) == "0"), None)
        url = self.metrics_url(rank0, spec.worker.metrics_port) if rank0 else None
        if url is None:
            return {}
        self._progress_at[key] = now
        try:
            timeout = aiohttp.ClientTimeout(total=2.0)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url) as resp:
                    text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return {}
        progress = st.parse_progress(text, spec.training.global_batch_size)
        return {} if progress is None else {"progress": st.progress_status(progress, now)}

    async def _patch(self, job: Mapping[str, Any], old: Mapping[str, Any], new: dict[str, Any]) -> None:
        changed = {k: v for k, v in new.items() if old.get(k) != v}
        removed = {k: None for k in old if k not in new}
        if changed or removed:
            meta = job["metadata"]
            await self.api.patch_job_status(meta["namespace"], meta["name"], {**changed, **removed})

    async def _event(self, job: Mapping[str, Any], type_: str, reason: str, message: str,
                     now: float) -> None:
        try:
            await self.api.post_event(job, type_=type_, reason=reason, message=message,
                                      now_iso=c.now_iso(now))
        except Exception:  # noqa: BLE001 - events are best effort
            log.warning("could not post event %s for %s", reason, job["metadata"]["name"])

    def _set_phase(self, job: Mapping[str, Any], phase: str) -> None:
        meta = job["metadata"]
        self._phases[(meta["namespace"], meta["name"])] = phase
        self.metrics.set_phases(self._phases.values())


def _ranks_per_pod(plan: Mapping[str, Any]) -> dict[str, int]:
    groups = {g["index"]: g for g in plan.get("groups") or ()}
    out: dict[str, int] = {}
    for name in plan.get("pods") or ():
        group = groups.get(_group_of(name))
        if group is not None:
            out[name] = 1 if "-m" in name.rsplit("-g", 1)[-1] else int(group["ranks"])
    return out


def _group_of(pod_name: str) -> int:
    tail = pod_name.rsplit("-g", 1)[-1]
    return int(tail.split("-m")[0])


def _owned_by(pod: Mapping[str, Any], job: str, namespace: str) -> bool:
    meta = pod.get("metadata") or {}
    return meta.get("namespace") == namespace and (meta.get("labels") or {}).get(rendering.LABEL_JOB) == job


def peering_leader(body: Mapping[str, Any] | None, identity: str, priority: int, now_s: float) -> bool:
    """kopf's peering rule: act unless another live peer has a priority >= ``priority``.

    A peer is live while ``lastseen + lifetime`` is in the future (kopf's ``Peer.is_dead``).
    A missing peering object means kopf runs standalone: act.
    """
    if body is None:
        return True
    for peer_id, info in (body.get("status") or {}).items():
        if peer_id == identity or not isinstance(info, Mapping):
            continue
        seen = c.parse_iso(str(info.get("lastseen", "")).replace(" ", "T")) if info.get("lastseen") else None
        alive = seen is not None and seen + float(info.get("lifetime", 60)) > now_s
        if alive and int(info.get("priority", 0)) >= priority:
            return False
    return True
