"""When a job is looked at next: coalesced, delayed kicks and one reconcile at a time per job.

Kicks come from kopf watch events (jobs, owned pods, nodes) and from the reconciler's own
delayed re-checks (backoff, pending timeout, node-loss grace, resync).  An earlier pending kick
wins over a later one; a job's reconciles never overlap (a per-job lock).  A reconcile that fails
(an exception) or that asks for it (:meth:`Requeue.backoff`) is looked at again after a per-job
exponential backoff, ``retry_s`` doubling up to ``max_retry_s``, reset by the next reconcile
that neither fails nor asks (like client-go's per-item exponential rate limiter): one job that
keeps failing costs a handful of API calls a minute, not six.  No kopf timer or
daemon is used: those need a finalizer on the job, which blocks namespace deletion when the
operator is gone (shared/cases/23).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from hetero_operator.lifecycle import decisions as lc

log = logging.getLogger("heterotrain.operator")
Key = tuple[str, str]


def next_look_s(decision: lc.Decision, resync_s: float) -> float | None:
    """Seconds until a job is looked at again after ``decision``; ``None`` = only on events.

    A finished job with nothing left to do waits for events (or its TTL); everything else is
    looked at again when its decision asks, and at least every ``resync_s`` (level-based: a
    missed watch event is repaired within one resync period).
    """
    if decision.action in (lc.NOTHING, lc.CLEANUP) and decision.requeue_s is None:
        return None
    if decision.requeue_s is None:
        return resync_s
    return min(decision.requeue_s, resync_s)


def retry_delay_s(failures: int, base_s: float, max_s: float) -> float:
    """Seconds before the next look after ``failures`` (>= 1) failed reconciles in a row:
    ``base_s * 2**(failures-1)``, at most ``max_s``."""
    return min(base_s * 2.0 ** min(max(failures - 1, 0), 62), max_s)


class Requeue:
    """Schedules ``work(namespace, name)`` per job.

    Args:
        work: one reconcile; returns seconds until the next look (``None`` = only on events).
            An exception is logged and the job looked at again after its backoff
            (:func:`retry_delay_s`).
        retry_s: delay after the first failed reconcile of a job, seconds.
        max_retry_s: the longest delay after failures in a row, seconds (``retry_s`` when
            smaller).
    """

    def __init__(self, work: Callable[[str, str], Awaitable[float | None]], *, retry_s: float,
                 max_retry_s: float | None = None) -> None:
        self.work, self.retry_s = work, retry_s
        self.max_retry_s = max(retry_s, max_retry_s if max_retry_s is not None else retry_s)
        self._due: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: dict[Key, int] = {}
        self._asked: set[Key] = set()

    def failures(self, namespace: str, name: str) -> int:
        """Failed (or backed-off) reconciles of the job in a row."""
        return self._failures.get((namespace, name), 0)

    def backoff(self, namespace: str, name: str) -> float:
        """Count one more failure of the job without an exception (the reconcile recorded why
        it waits) and return the delay the reconcile should ask for, seconds."""
        key = (namespace, name)
        n = self._failures[key] = self._failures.get(key, 0) + 1
        self._asked.add(key)
        return retry_delay_s(n, self.retry_s, self.max_retry_s)

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

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's pending kick, lock and failure count."""
        key = (namespace, name)
        due = self._due.pop(key, None)
        if due is not None:
            due[1].cancel()
        self._locks.pop(key, None)
        self._failures.pop(key, None)
        self._asked.discard(key)

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
            self._asked.discard(key)
            try:
                requeue = await self.work(*key)
            except Exception:  # noqa: BLE001 - API hiccups: log, look again later
                n = self._failures[key] = self._failures.get(key, 0) + 1
                requeue = retry_delay_s(n, self.retry_s, self.max_retry_s)
                log.exception("reconcile of %s/%s failed (%d in a row); retrying in %.0f s",
                              *key, n, requeue)
            else:
                if key not in self._asked:
                    self._failures.pop(key, None)
            self._asked.discard(key)
        if requeue is not None:
            self.kick(*key, delay_s=requeue)
