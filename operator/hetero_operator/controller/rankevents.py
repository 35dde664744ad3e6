"""Events the operator posts from what rank 0's metrics say about its checkpoints, once per attempt.

Two readings of :class:`~hetero_operator.controller.progress.Progress` become Warnings on the job:
a resume past an unreadable newer checkpoint (``htj_checkpoint_fallbacks_total``: CheckpointFallback)
and a start beside another job's checkpoints that were not resumed (``htj_checkpoints_not_resumed``,
issue 33: CheckpointNotResumed). This part owns the memory of what it already told, per (namespace,
name, attempt), and forgets a deleted job's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.api.spec import JobSpec
from hetero_operator.controller.events import EventRecorder
from hetero_operator.controller.progress import Progress
from hetero_operator.lifecycle import ckptplace
from hetero_operator.lifecycle import status as st
from hetero_operator.lifecycle.ckptplace import CHECKPOINT_NOT_RESUMED

Told = tuple[str, str, int]


class RankCheckpointEvents:
    """Posts CheckpointFallback and CheckpointNotResumed through ``events``, each once per attempt."""

    def __init__(self, events: EventRecorder) -> None:
        self.events = events
        self._fallbacks_told: set[Told] = set()
        self._not_resumed_told: set[Told] = set()

    async def observe(self, job: Mapping[str, Any], spec: JobSpec, status: Mapping[str, Any],
                      read: Progress | None, now: float) -> None:
        """Post what ``read`` (rank 0's last reading, None when none) says that was not told yet."""
        if read is None:
            return
        meta = job["metadata"]
        attempt = st.job_state(status).attempt
        key = (meta["namespace"], meta["name"], attempt)
        if read.checkpoint_fallbacks and key not in self._fallbacks_told:
            self._fallbacks_told.add(key)
            await self.events.post(job, "Warning", "CheckpointFallback",
                                   f"Attempt {attempt} resumed from the checkpoint of step "
                                   f"{read.resumed_step}: a newer one was unreadable on some rank "
                                   "(truncated or corrupt; rank 0's log names it and why).", now)
        if read.checkpoints_not_resumed and key not in self._not_resumed_told:
            self._not_resumed_told.add(key)
            await self.events.post(job, "Warning", CHECKPOINT_NOT_RESUMED, ckptplace.not_resumed_message(
                spec, read.checkpoints_not_resumed), now)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's memory."""
        self._fallbacks_told = {k for k in self._fallbacks_told if k[:2] != (namespace, name)}
        self._not_resumed_told = {k for k in self._not_resumed_told if k[:2] != (namespace, name)}
