"""What the membership part sees of the Trainer it re-forms: the parts it re-points, by type.

:class:`ElasticHost` is a structural type (:class:`typing.Protocol`) that
:class:`hetero_worker.trainer.Trainer` satisfies; the membership modules take it instead of the
Trainer itself, which imports them (the worker's floors allow no circle).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hetero_worker.ckpt.trainer_state import Checkpointing
from hetero_worker.comm.commplan import CommRank
from hetero_worker.comm.groups import ProcessGroups
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.efficiency import EfficiencyWindow
from hetero_worker.loading import TrainData
from hetero_worker.memory.wrap import ModelPart
from hetero_worker.stepping import Stepper
from hetero_worker.stop import GracefulStop
from heterotrain_common.contract import Contract


class ElasticHost(Protocol):
    """The Trainer as an elastic rank's membership part uses it (attributes of the same names)."""

    contract: Contract
    rank: int
    device: torch.device
    comm_ranks: list[CommRank]
    global_step: int
    data: TrainData
    sync: WeightedGradSync
    parts_model: ModelPart
    stepper: Stepper
    checkpoints: Checkpointing
    stop: GracefulStop
    window: EfficiencyWindow
    scaler: Any  # torch.amp.GradScaler or None
    metrics: Any  # hetero_worker.metrics.WorkerMetrics or its null stand-in
    ckpt_group: Any  # the checkpoint group (a ProcessGroup) or None
    membership: Any

    def build_groups(self, mode: str) -> ProcessGroups:
        """The process groups of hierarchy ``mode`` (collective)."""
        ...
