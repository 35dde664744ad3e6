"""The rank's log line: ``heterotrain: rank N: <message>`` on stderr, flushed at once (the
launcher and ``heterotrain run`` prefix and collect stderr; tests read these lines)."""

from __future__ import annotations

import sys


def log(message: str, *, rank: int | None = None) -> None:
    """Write one line for this rank (``rank`` None: the process group's rank, 0 without one;
    torch is imported only then, so a torch-free module may log with its own rank)."""
    if rank is None:
        import torch.distributed as dist  # noqa: PLC0415

        rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"heterotrain: rank {rank}: {message}", file=sys.stderr, flush=True)
