"""Start-up helpers of :func:`hetero_worker.trainer.init`: seeding, the rank's CUDA device, whether
the job asks for speed features."""

from __future__ import annotations

import random

import torch

from heterotrain_common.contract import Contract


def seed_everything(seed: int) -> None:
    """Seed torch, Python and NumPy identically on every rank (same initial model)."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass


def wants_speed_features(contract: Contract) -> bool:
    """True when the job asks for rebalancing, compression or the automatic hierarchy."""
    return (contract.comm.rebalance_interval_steps > 0 or contract.comm.compression != "none"
            or contract.comm.hierarchy == "auto")


def cuda_index(contract: Contract) -> int:
    """CUDA device index of this rank: 0 when the launcher pinned one GPU per rank
    (``CUDA_VISIBLE_DEVICES`` shows one device), else ``LOCAL_RANK``."""
    return 0 if torch.cuda.device_count() == 1 else contract.dist.local_rank
