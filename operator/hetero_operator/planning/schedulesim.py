"""The step time of a pipeline schedule, by running its operations in simulated time (pure; issue 30).

The closed form ``(m + s - 1) x slowest slot`` (GPipe; PipeDream-Flush) holds when every stage
takes the same time and the activations cost nothing to move. Across GPU types neither holds: the
stages differ, and on a slow link a transfer takes as long as a stage's compute. This module
plays the schedule instead, operation by operation, as ``torch.distributed.pipelining`` runs it
(``Schedule1F1B._step_microbatches`` and ``ScheduleGPipe._step_microbatches`` of PyTorch 2.13):

* **1F1B**: stage ``i`` of ``s`` runs ``min(m, s - i)`` warm-up forwards, each send fired after
  waiting the previous one; then alternates one backward and one forward, waiting each time for
  the pending send together with the next receive (PyTorch fuses them in one batch), then the
  remaining backwards.
* **GPipe**: every forward (receive waited, send fired), every forward send waited, then every
  backward likewise.

**A transfer** (one micro-batch's activation forward, or its gradient backward, over the
boundary between stages ``k`` and ``k + 1``) starts when both its send and its receive are posted
(Gloo's point-to-point rendezvous: the bytes move once the receiver has posted its buffer) and the
link's direction is free (each direction one FIFO: a full-duplex link), and takes
``transfer_s[k]``; a send's wait and the receive's wait end when it ends. Compute does not overlap
compute on one stage; a transfer overlaps compute on both ends.

The simulation advances the stage with the earliest clock first, so operations posted earlier in
simulated time are matched first. Its result is the time the last stage finishes (every stage
starts at 0).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from heterotrain_common.pipelineschedules import SCHEDULES

FORWARD, BACKWARD = "act", "grad"
"""A transfer's direction: an activation forward, or its gradient backward."""


@dataclass(frozen=True, slots=True)
class ScheduleTime:
    """One step of a schedule in simulated time.

    Attributes:
        step_s: the last stage's finish, seconds (the step without the replicas' all-reduce).
        busy_s: per stage, seconds of compute.
        finish_s: per stage, when its last operation ended, seconds.
    """

    step_s: float
    busy_s: tuple[float, ...]
    finish_s: tuple[float, ...]

    @property
    def idle_fraction(self) -> float:
        """Share of the step the stages spend not computing (bubble and transfers), mean over
        stages."""
        if self.step_s <= 0:
            return 0.0
        return sum(1 - b / self.step_s for b in self.busy_s) / len(self.busy_s)


_Transfer = tuple[str, int, int]
"""``(direction, boundary k, micro-batch)``."""


def _ops_1f1b(i: int, s: int, m: int) -> Iterator[tuple]:
    """Stage ``i``'s operations under 1F1B, in PyTorch's order (see the module docstring)."""
    def frecv(j: int) -> list[_Transfer]:
        return [(FORWARD, i - 1, j)] if i > 0 else []

    def fsend(j: int) -> list[_Transfer]:
        return [(FORWARD, i, j)] if i < s - 1 else []

    def brecv(j: int) -> list[_Transfer]:
        return [(BACKWARD, i, j)] if i < s - 1 else []

    def bsend(j: int) -> list[_Transfer]:
        return [(BACKWARD, i - 1, j)] if i > 0 else []

    warmup = min(m, s - i)
    fwd = bwd = 0
    fired: list[_Transfer] = []   # the last send fired and not yet waited
    sends: list[_Transfer] = []   # sends PyTorch keeps to fire with the next receive
    for _ in range(warmup):
        yield ("post", frecv(fwd))
        yield ("wait", frecv(fwd))
        yield ("compute", "F")
        yield ("wait", fired)
        sends, fired = fsend(fwd), []
        if fwd != warmup - 1:
            yield ("post", sends)
            fired, sends = sends, []
        fwd += 1
    while True:
        batch = sends + brecv(bwd)
        yield ("post", batch)
        yield ("wait", batch)
        yield ("compute", "B")
        sends = bsend(bwd)
        bwd += 1
        if fwd == m:
            break
        batch = sends + frecv(fwd)
        yield ("post", batch)
        yield ("wait", batch)
        yield ("compute", "F")
        sends = fsend(fwd)
        fwd += 1
    yield ("post", sends)
    fired = sends
    while bwd < m:
        yield ("post", brecv(bwd))
        yield ("wait", brecv(bwd))
        yield ("compute", "B")
        yield ("wait", fired)
        fired = bsend(bwd)
        yield ("post", fired)
        bwd += 1
    yield ("wait", fired)


def _ops_gpipe(i: int, s: int, m: int) -> Iterator[tuple]:
    """Stage ``i``'s operations under GPipe, in PyTorch's order."""
    sent: list[_Transfer] = []
    for j in range(m):
        recv = [(FORWARD, i - 1, j)] if i > 0 else []
        yield ("post", recv)
        yield ("wait", recv)
        yield ("compute", "F")
        send = [(FORWARD, i, j)] if i < s - 1 else []
        yield ("post", send)
        sent += send
    yield ("wait", sent)
    sent = []
    for j in range(m):
        recv = [(BACKWARD, i, j)] if i < s - 1 else []
        yield ("post", recv)
        yield ("wait", recv)
        yield ("compute", "B")
        send = [(BACKWARD, i - 1, j)] if i > 0 else []
        yield ("post", send)
        sent += send
    yield ("wait", sent)


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], transfer_s: Sequence[float],
             micro_batches: int, schedule: str = SCHEDULES[0]) -> ScheduleTime:
    """One step of ``schedule`` on ``s`` stages (see the module docstring).

    Args:
        forward_s / backward_s: per stage, seconds of one micro-batch's forward / backward, >= 0.
        transfer_s: per boundary (``s - 1`` of them, stage ``k`` to ``k + 1``), seconds to move
            one micro-batch's activation (or its gradient: the same bytes) one way, >= 0.
        micro_batches: ``m`` >= 1.
        schedule: ``1F1B`` or ``GPipe``.

    Returns:
        The step's finish and each stage's busy and finish times.

    Raises:
        ValueError: lengths that do not match, a negative time, ``m < 1`` or an unknown schedule.
        RuntimeError: the operations deadlock (a defect of this module, not of the input).
    """
    s, m = len(forward_s), micro_batches
    if len(backward_s) != s or len(transfer_s) != max(0, s - 1) or s < 1:
        raise ValueError(f"{s} stages need {s} backward times and {s - 1} transfer times")
    if m < 1 or min((*forward_s, *backward_s, *transfer_s)) < 0:
        raise ValueError("micro_batches must be >= 1 and every time >= 0")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    make = _ops_1f1b if schedule == "1F1B" else _ops_gpipe
    programs = [make(i, s, m) for i in range(s)]
    clock = [0.0] * s
    busy = [0.0] * s
    posted: dict[_Transfer, list[float]] = {}   # transfer -> post times of its two sides
    done: dict[_Transfer, float] = {}           # transfer -> when it ends
    link_free: dict[tuple[str, int], float] = {}
    waiting: dict[int, list[_Transfer]] = {}    # stage -> the transfers its wait needs
    heap: list[tuple[float, int, int]] = []     # (time, sequence, stage); one live entry a stage
    live: list[int | None] = [None] * s
    finished = [False] * s
    sequence = 0

    def run_at(i: int, at_s: float) -> None:
        nonlocal sequence
        sequence += 1
        live[i] = sequence
        heapq.heappush(heap, (at_s, sequence, i))

    def wake() -> None:  # stages whose wait ended, not yet queued
        for k, need in waiting.items():
            if live[k] is None and all(op in done for op in need):
                run_at(k, max([clock[k], *(done[op] for op in need)]))

    for i in range(s):
        run_at(i, 0.0)
    while heap:
        _, seq, i = heapq.heappop(heap)
        if live[i] != seq:
            continue  # superseded
        live[i] = None
        while True:
            need = waiting.get(i)
            if need is not None:
                if any(op not in done for op in need):
                    break  # blocked: wake() queues it when its transfers end
                del waiting[i]
                ends = max(done[op] for op in need)
                if ends > clock[i]:
                    clock[i] = ends
                    run_at(i, ends)
                    break
            command = next(programs[i], None)
            if command is None:
                finished[i] = True
                break
            kind, arg = command
            if kind == "compute":
                seconds = forward_s[i] if arg == "F" else backward_s[i]
                clock[i] += seconds
                busy[i] += seconds
                run_at(i, clock[i])
                break  # a stage with an earlier clock goes first
            if kind == "post":
                for op in arg:
                    sides = posted.setdefault(op, [])
                    sides.append(clock[i])
                    if len(sides) == 2:  # matched: it moves once its direction is free
                        lane = (op[0], op[1])
                        start = max(max(sides), link_free.get(lane, 0.0))
                        done[op] = link_free[lane] = start + transfer_s[op[1]]
                wake()
            elif arg:
                waiting[i] = list(arg)
    if not all(finished):
        raise RuntimeError(f"pipeline schedule simulation deadlocked: stages "
                           f"{[k for k, f in enumerate(finished) if not f]} never finished")
    return ScheduleTime(step_s=max(clock), busy_s=tuple(busy), finish_s=tuple(clock))
