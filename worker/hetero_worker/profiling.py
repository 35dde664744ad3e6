"""On-demand PyTorch Profiler traces of chosen steps (``HTJ_PROFILE_STEPS``).

``heterotrain run --profile-steps 20-25`` (or, in a cluster, the job annotation
``heterotrain.io/profile-steps: "20-25"``) sets ``HTJ_PROFILE_STEPS`` on every rank; the trainer
then asks a :class:`StepProfiler` to start ``torch.profiler.profile`` before step 20 and to export
a Chrome trace (JSON, opens in https://ui.perfetto.dev or ``chrome://tracing``) after step 25.
Each step is a ``record_function`` range named ``heterotrain step N``, so the trace shows where
each profiled step's time went (forward, backward, the gradient collectives, the optimizer).

Where the trace goes: ``<HTJ_RUN_DIR>/profiles/`` under ``heterotrain run``, else
``<HTJ_CHECKPOINT_DIR>/profiles/`` (the job's checkpoint volume in a cluster), else
``./profiles/``; the file is ``rank-<R>-steps-<first>-<last>.trace.json``.

Zero cost when off: :func:`from_contract` returns None and the trainer's hook is one ``is None``
test per step. Sources: PyTorch Profiler recipe, "Using tracing functionality"
(https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from heterotrain_common.contract import Contract

PROFILES_DIR = "profiles"
STEP_RANGE_PREFIX = "heterotrain step "
"""Name of each profiled step's ``record_function`` range (``heterotrain step 20``)."""


def trace_dir(contract: Contract) -> Path:
    """``<run dir>/profiles``, else ``<checkpoint dir>/profiles``, else ``./profiles``."""
    base = contract.run.dir or contract.checkpoint.dir or "."
    return Path(base) / PROFILES_DIR


def trace_path(contract: Contract) -> Path | None:
    """This rank's trace file, None when profiling is off."""
    if contract.run.profile_steps is None:
        return None
    first, last = contract.run.profile_steps
    return trace_dir(contract) / f"rank-{contract.dist.rank}-steps-{first}-{last}.trace.json"


class StepProfiler:
    """Profiles steps ``first..last`` (1-based, inclusive) of one rank and writes one trace.

    Args:
        first / last: the steps to trace (step n is the n-th optimizer step of the run; a resumed
            run counts from the checkpoint's step).
        path: the Chrome trace file to write.
        cuda: also record CUDA kernels (True when the rank trains on a GPU).

    Call :meth:`before_step` and :meth:`after_step` around every step with the step's number.
    """

    def __init__(self, first: int, last: int, path: Path, *, cuda: bool = False) -> None:
        self.first, self.last, self.path, self.cuda = first, last, path, cuda
        self.written: Path | None = None
        self._profile: Any = None
        self._range: contextlib.AbstractContextManager[Any] | None = None

    def before_step(self, step: int) -> None:
        """Start the profiler at ``first`` and open this step's named range while tracing."""
        if self.written is not None or not self.first <= step <= self.last:
            return
        import torch.profiler as tp

        if self._profile is None:
            activities = [tp.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(tp.ProfilerActivity.CUDA)
            self._profile = tp.profile(activities=activities)
            self._profile.__enter__()
        self._range = tp.record_function(f"{STEP_RANGE_PREFIX}{step}")
        self._range.__enter__()

    def after_step(self, step: int) -> None:
        """Close this step's range; after ``last`` stop and export the trace."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self._profile is not None and step >= self.last:
            self.close()

    def close(self) -> None:
        """Stop and export now (also when the run ends inside the range)."""
        if self._profile is None:
            return
        profile, self._profile = self._profile, None
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        profile.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(self.path))
        self.written = self.path


def from_contract(contract: Contract, *, cuda: bool = False) -> StepProfiler | None:
    """The rank's profiler when ``HTJ_PROFILE_STEPS`` is set, else None (profiling off)."""
    path = trace_path(contract)
    if path is None or contract.run.profile_steps is None:
        return None
    first, last = contract.run.profile_steps
    return StepProfiler(first, last, path, cuda=cuda)
