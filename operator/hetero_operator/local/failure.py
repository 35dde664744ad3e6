"""Why an attempt of ``heterotrain run`` failed: the rank that started it, its exit code and the
first line of its error.

When one rank raises, the others fail a moment later in a collective ("Connection closed by
peer"): their errors are collateral. The gang supervisor sees exits only at its polling period, so
the first exit it sees may be a collateral one; the cause is the failed rank whose own error is not
collateral, the one seen first among those. Torch-free.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

COLLATERAL_PATTERNS = (
    re.compile(r"Connection closed by peer", re.I),
    re.compile(r"Connection reset by peer", re.I),
    re.compile(r"Broken pipe", re.I),
    re.compile(r"remote process exited", re.I),
    re.compile(r"NCCL communicator was aborted", re.I),
    re.compile(r"ProcessGroupNCCL.*(?:abort|terminat)", re.I),
    re.compile(r"Gloo connectFullMesh failed", re.I),
)
"""Errors a rank gets because a peer left the collective (Gloo and NCCL wordings)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankFailure:
    """The failure of one rank in one attempt.

    Attributes:
        rank: global rank.
        exit_code: the rank's exit code (128 + N when killed by signal N).
        error: the first line of its error (an exception line, ``...: error: ...``, or the last
            line it printed); ``""`` when it printed nothing.
        collateral: True when the error says a peer left (not the cause).
    """

    rank: int
    exit_code: int
    error: str
    collateral: bool

    def sentence(self) -> str:
        """``rank 1 exited with code 5: ValueError: boom`` (signals named)."""
        how = f"exited with code {self.exit_code}"
        if self.exit_code > 128:
            try:
                how = (f"was killed by {signal.Signals(self.exit_code - 128).name} "
                       f"(exit code {self.exit_code})")
            except ValueError:
                pass
        return f"rank {self.rank} {how}" + (f": {self.error}" if self.error else " (no output)")


_TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")
"""torch.distributed's prefix on a rank's traceback lines (``[rank0]: ImportError: ...``)."""


def error_line(text: str) -> str:
    """The first line of the error in one attempt's output of a rank.

    The exception line of the first traceback (the root of a chained one: Python prints the
    original first; torch's ``[rank0]:`` line prefix dropped), else the first line holding ``error:`` (argparse, ``heterotrain: error:``),
    else the last non-empty line; ``""`` for no output.
    """
    lines = [_RANK_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    if _TRACEBACK in lines:
        start = lines.index(_TRACEBACK) + 1
        for line in lines[start:]:
            if line and not line.startswith((" ", "\t")) and not line.startswith("During handling"):
                return line.strip()
    for line in lines:
        if re.search(r"\berror:", line, re.I):
            return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def is_collateral(error: str) -> bool:
    """True when ``error`` says a peer left the collective (see :data:`COLLATERAL_PATTERNS`)."""
    return any(p.search(error) for p in COLLATERAL_PATTERNS)


def rank_failure(rank: int, exit_code: int, output: str) -> RankFailure:
    """A :class:`RankFailure` from a rank's exit code and its output of this attempt."""
    error = error_line(output)
    return RankFailure(rank=rank, exit_code=exit_code, error=error, collateral=is_collateral(error))


def cause(failures: Sequence[RankFailure], first_seen: int | None) -> RankFailure | None:
    """The failure that started it: the first non-collateral one, the one seen first
    (``first_seen``, a rank) preferred; a collateral one only when all are.

    Args:
        failures: the ranks that exited non-zero by themselves (not stopped by us), in the
            order their exits were seen.
        first_seen: the rank the supervisor saw failing first.
    """
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: f.rank != first_seen)  # stable: keeps seen order
    return next((f for f in ordered if not f.collateral), ordered[0])
