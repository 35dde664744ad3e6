"""Honest memory on CPU: a simulated device's memory cap, enforced (issue 12).

A simulated rank (``heterotrain run`` on a CPU machine) counts what a GPU would have to hold:

* **state**: the bytes of the parameters, gradients and optimizer state tensors the rank really
  holds (a shard's local tensor under sharding), each storage counted once;
* **activations**: the bytes autograd really saves for backward, counted as they are saved with
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage once; parameters and views of them,
  FSDP2's gathered ones included, are state, not activations); they are freed when backward has run, so the count restarts per micro-batch.
  Inside a checkpointed block (``torch.utils.checkpoint``, non-reentrant) the checkpoint's own hooks
  take over and only the block's inputs stay saved, which is what such a block keeps.

The cap is ``HTJ_MEMORY_CAP_BYTES`` (the device's memory minus the planner's reserve).  When state
plus saved activations would exceed it, the rank fails with :class:`torch.OutOfMemoryError` and a
message shaped like CUDA's ("CUDA out of memory. Tried to allocate ... "), marked simulated.
The peak (state + activations) is the rank's ``htj_memory_peak_bytes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["MemoryMeter", "measure_activation_bytes", "simulated_oom_message",
           "tensor_storage_bytes"]

MIB = 2**20
GIB = 2**30


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def tensor_storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view is not counted twice).

    Args:
        tensors: tensors (None entries skipped).

    Returns:
        Sum of ``untyped_storage().nbytes()`` over distinct storages.
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = _local(t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def simulated_oom_message(*, need_bytes: int, held_bytes: int, cap_bytes: int, device: str) -> str:
    """CUDA's out-of-memory wording with the simulated figures, e.g. ``"CUDA out of memory
    (simulated Tesla-T4). Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 13.25 GiB of
    which 11.56 MiB is free. ..."``."""
    free = max(0, cap_bytes - held_bytes)
    return (f"CUDA out of memory (simulated {device}, memory cap HTJ_MEMORY_CAP_BYTES). Tried to "
            f"allocate {_size(need_bytes)}. GPU 0 has a total capacity of {_size(cap_bytes)} of "
            f"which {_size(free)} is free. Of the allocated memory {_size(held_bytes)} is model "
            "state and saved activations. Lower the micro-batch (HTJ_MICRO_BATCH_SIZE) or shard "
            "the model (spec.training.sharding)")


def _size(n_bytes: int) -> str:
    """CUDA's style (two decimals) in GiB from 1 GiB up, else MiB."""
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB else f"{n_bytes / MIB:.2f} MiB"


class MemoryMeter:
    """Counts a rank's state and saved activations and enforces the cap.

    Args:
        cap_bytes: the cap; 0 = count only, never fail.
        device: the simulated device's name (for the message).

    Attributes:
        peak_bytes: the largest state + saved activations seen.
        peak_activation_bytes: the largest saved activations of one micro-batch.
        state_bytes: the state at the last :meth:`set_state`.
    """

    def __init__(self, cap_bytes: int, device: str) -> None:
        self.cap_bytes = cap_bytes
        self.device = device
        self.state_bytes = 0
        self.peak_bytes = 0
        self.peak_activation_bytes = 0
        self._saved: dict[int, int] = {}
        self._exclude: set[int] = set()

    def set_state(self, params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None) -> int:
        """Recount the state: parameters, their ``.grad`` and the optimizer's state tensors.

        Raises:
            torch.OutOfMemoryError: the state alone exceeds the cap.

        Returns:
            The state bytes.
        """
        params = list(params)
        tensors: list[torch.Tensor | None] = [*params, *(p.grad for p in params)]
        if optimizer is not None:
            for st in optimizer.state.values():
                tensors.extend(v for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        self._exclude = {_local(p).untyped_storage().data_ptr() for p in params}
        self.state_bytes = tensor_storage_bytes(tensors)
        self._check(0)
        return self.state_bytes

    def _check(self, need: int) -> None:
        held = self.state_bytes + sum(self._saved.values())
        self.peak_bytes = max(self.peak_bytes, held)
        if self.cap_bytes and held > self.cap_bytes:
            raise torch.OutOfMemoryError(simulated_oom_message(
                need_bytes=need, held_bytes=held - need, cap_bytes=self.cap_bytes, device=self.device))

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if isinstance(base, torch.nn.Parameter):  # a parameter or a view of one (a transposed
            return t  # weight; FSDP2's gathered ones too) is state, not an activation
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._exclude and ptr not in self._saved and storage.nbytes():
            self._saved[ptr] = storage.nbytes()
            self.peak_activation_bytes = max(self.peak_activation_bytes, sum(self._saved.values()))
            self._check(storage.nbytes())
        return t

    @contextlib.contextmanager
    def micro_batch(self) -> Iterator[None]:
        """Count activations saved during the block (forward and backward of one micro-batch);
        they are released at its end (backward has consumed them)."""
        self._saved = {}
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            self._saved = {}


def measure_activation_bytes(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                             batch: Sequence[torch.Tensor], *,
                             autocast: Callable[[], Any] | None = None) -> tuple[int, int]:
    """Probe the activation bytes one sample keeps for backward (for
    ``spec.training.model.activationBytesPerSample``).

    Runs forward and backward twice, on the first sample and on the whole ``batch`` (``n`` >= 2
    samples), counting the bytes saved for backward as :class:`MemoryMeter` does; the difference
    separates the per-sample part from what a batch keeps regardless of its size (masks, position
    tables). Gradients are left on ``model``; zero them afterwards.

    Args:
        model: the model (checkpointed blocks already wrapped when the figure with activation
            checkpointing is wanted, :func:`hetero_worker.memory.microbatch.checkpoint_blocks`).
        loss_fn: ``loss_fn(model, *batch)`` returns a scalar loss.
        batch: tensors with samples along dim 0 (``n`` >= 2), on the model's device.
        autocast: the precision's autocast context factory (default: none), so the figure is at
            the job's precision.

    Returns:
        ``(per_sample_bytes, fixed_bytes)``: ``ceil((saved(n) - saved(1)) / (n - 1))`` and
        ``saved(1) - per_sample_bytes`` (>= 0).

    Raises:
        ValueError: fewer than two samples.
    """
    n = len(batch[0])
    if n < 2:
        raise ValueError("measure_activation_bytes needs a batch of at least 2 samples")
    saved = []
    for size in (1, n):
        meter = MemoryMeter(0, "probe")
        meter.set_state(model.parameters(), None)
        with meter.micro_batch():
            with autocast() if autocast is not None else contextlib.nullcontext():
                loss = loss_fn(model, *(t[:size].clone() for t in batch))
            loss.backward()
        saved.append(meter.peak_activation_bytes)
    per_sample = -(-(saved[1] - saved[0]) // (n - 1))
    return per_sample, max(0, saved[0] - per_sample)
