"""Resume agreement: rank 0 decides the resume step and every rank confirms it.

Without it a rank that cannot read the checkpoint (no shared volume, a truncated copy, a stale
file) starts at step 0 while rank 0 resumes, and the replicas silently diverge. Here every rank
reports what it found (:class:`Finding`); one all-gather of fixed-size JSON byte records (no
pickling) over the default (Gloo) group gives every rank all findings; when any differs from rank 0's (step and checkpoint id, or none) every rank
raises the same :class:`ResumeDisagreement` naming the ranks that disagree and what each found, so
the whole job fails fast and the operator restarts it (or a person fixes the volume).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

FINDING_BYTES = 1024
"""Size of one rank's finding record in the all-gather (UTF-8 JSON, zero padded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """What one rank found in its checkpoint directory.

    Attributes:
        rank: the rank that looked.
        path: the file it looked at (``""``: no checkpoint directory configured).
        step: the checkpoint's step (None when none was read).
        checkpoint_id: the checkpoint's random id (tells two files of the same step apart).
        missing: True when there was no file.
        error: why the file could not be read (``""`` when it could or was missing).
    """

    rank: int
    path: str
    step: int | None = None
    checkpoint_id: str = ""
    missing: bool = False
    error: str = ""

    def key(self) -> tuple[int | None, str, bool]:
        """What must match rank 0's: ``(step, checkpoint_id, readable)``."""
        return (self.step, self.checkpoint_id, not self.error)

    def describe(self) -> str:
        """One clause, e.g. ``rank 1 found no checkpoint at /ckpt/checkpoint.pt``."""
        if self.error:
            return f"rank {self.rank} could not read {self.path}: {self.error}"
        if self.missing:
            where = f"at {self.path}" if self.path else "(no checkpoint directory set)"
            return f"rank {self.rank} found no checkpoint {where}"
        return (f"rank {self.rank} found step {self.step} (checkpoint {self.checkpoint_id}) "
                f"at {self.path}")


class ResumeDisagreement(RuntimeError):
    """Ranks did not find the same checkpoint as rank 0; no rank resumes.

    Attributes:
        findings: every rank's :class:`Finding`, ordered by rank.
        disagreeing: ranks whose finding differs from rank 0's (or ``[0]`` when rank 0 itself
            could not read its file).
    """

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        self.disagreeing = disagreeing_ranks(self.findings)
        super().__init__(disagreement_message(self.findings))


def disagreeing_ranks(findings: Sequence[Finding]) -> list[int]:
    """Ranks whose finding differs from rank 0's; ``[0]`` when rank 0 could not read its file."""
    decision = findings[0]
    if decision.error:
        return [0]
    return [f.rank for f in findings[1:] if f.key() != decision.key()]


def disagreement_message(findings: Sequence[Finding]) -> str:
    """The error text: rank 0's decision, each disagreeing rank's finding, the fix."""
    decision = findings[0]
    if decision.error:
        return (f"resume not agreed: {decision.describe()}; no rank resumes. Restore a readable "
                "checkpoint.pt or remove it to start from step 0.")
    if decision.step is None:
        head = f"rank 0 starts from step 0 ({decision.describe()})"
    else:
        head = (f"rank 0 resumes from step {decision.step} (checkpoint {decision.checkpoint_id} "
                f"at {decision.path})")
    others = "; ".join(findings[r].describe() for r in disagreeing_ranks(findings))
    return (f"resume not agreed: {head}, but {others}. Every rank must read the same checkpoint: "
            "put HTJ_CHECKPOINT_DIR on a volume shared by all ranks.")


def encode_finding(finding: Finding) -> bytes:
    """``finding`` as UTF-8 JSON of at most :data:`FINDING_BYTES` (path and error shortened)."""
    fields = dataclasses.asdict(finding)
    for key, limit in (("error", 300), ("path", 600)):
        while len(json.dumps(fields).encode()) > FINDING_BYTES and len(fields[key]) > limit:
            fields[key] = fields[key][:limit - 3] + "..."
    encoded = json.dumps(fields).encode()
    if len(encoded) > FINDING_BYTES:
        raise ValueError(f"finding of rank {finding.rank} does not fit {FINDING_BYTES} bytes")
    return encoded


def decode_finding(record: bytes) -> Finding:
    """Inverse of :func:`encode_finding` (trailing zero padding ignored)."""
    return Finding(**json.loads(record.rstrip(b"\0").decode()))


def agree_on_resume(mine: Finding) -> Finding:
    """Confirm rank 0's finding on every rank (collective over the default group).

    Args:
        mine: this rank's finding.

    Returns:
        Rank 0's finding (the decision), identical on every rank.

    Raises:
        ResumeDisagreement: any rank's finding differs from rank 0's, or rank 0 could not read
            its checkpoint (raised on every rank, same message).
    """
    if not dist.is_initialized():
        findings = [mine]
    else:  # fixed-size UTF-8 JSON records over Gloo: no pickling between ranks
        record = torch.zeros(FINDING_BYTES, dtype=torch.uint8)
        encoded = encode_finding(mine)
        record[:len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
        gathered = [torch.empty_like(record) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, record)
        findings = [decode_finding(bytes(g.tolist())) for g in gathered]
    if disagreeing_ranks(findings):
        raise ResumeDisagreement(findings)
    return findings[0]
