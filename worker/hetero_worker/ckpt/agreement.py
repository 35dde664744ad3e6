"""Resume agreement: every rank resumes from the same checkpoint, the newest all of them can read.

Without it a rank that cannot read the checkpoint (no shared volume, a truncated copy, a stale
file) starts at step 0 while rank 0 resumes, and the replicas silently diverge. Here every rank
reports what it found (:class:`Finding`); one all-gather of fixed-size JSON byte records (no
pickling, :func:`hetero_worker.comm.agree.gather_records`) over the default (Gloo) group gives every rank all findings; when any differs from rank 0's (step and checkpoint id, or none) every rank
raises the same :class:`ResumeDisagreement` naming the ranks that disagree and what each found, so
the whole job fails fast and the operator restarts it (or a person fixes the volume).

With several checkpoints kept (:mod:`hetero_worker.ckpt.store`), :func:`agree_on_newest` first
lets every rank verify its candidates against their manifests, newest first, and agrees in rounds
on the newest checkpoint every rank verified: when the newest is unreadable anywhere (truncated,
corrupt, half-copied), every rank falls back to the same older one and says so.  Only when some
rank has no usable checkpoint at all while others have one is there no agreement (the error
above): that is a volume that is not shared, not a broken file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hetero_worker.comm.agree import gather_records

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
    saved_ns: int = 0
    newest: str = ""
    """The newest checkpoint this rank saw when it could not use it: ``"step 120 (checkpoint
    ab12): <why>"`` (a fallback names it); ``""`` when the finding is the newest."""

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
    for key, limit in (("error", 300), ("newest", 300), ("path", 600)):
        while len(json.dumps(fields).encode()) > FINDING_BYTES and len(fields[key]) > limit:
            fields[key] = fields[key][:limit - 3] + "..."
    encoded = json.dumps(fields).encode()
    if len(encoded) > FINDING_BYTES:
        raise ValueError(f"finding of rank {finding.rank} does not fit {FINDING_BYTES} bytes")
    return encoded


def decode_finding(record: bytes) -> Finding:
    """Inverse of :func:`encode_finding` (trailing zero padding ignored)."""
    return Finding(**json.loads(record.rstrip(b"\0").decode()))


def gather_findings(mine: Finding, group: Any = None) -> list[Finding]:
    """Every rank's finding on every rank, ordered by rank (fixed-size JSON records over Gloo: no
    pickling between ranks); ``group`` None is the default group."""
    if not dist.is_initialized():
        return [mine]
    return [decode_finding(r) for r in gather_records(encode_finding(mine), FINDING_BYTES, group)]


def agree_on_newest(directory: str | Path | None, group: Any = None,
                    accept: Any = None) -> tuple[Any, list[Finding], str]:
    """Agree on the newest checkpoint every rank can read (collective over ``group``).

    Every rank verifies its candidates newest first (sizes of every file, its share of the
    checksums) and proposes the newest that passed; while the proposals differ, every rank
    proposes again its newest at or below the oldest proposal.  A rank that verified a candidate
    keeps the verdict, so each file is read at most once per rank.

    ``accept`` (a predicate on a :class:`hetero_worker.ckpt.store.Candidate`, None: all) leaves
    out the checkpoints this job may not resume (another job's:
    :class:`hetero_worker.ckpt.ownership.ResumeFilter`).

    Returns:
        ``(candidate or None, findings, note)``: the chosen :class:`hetero_worker.ckpt.store.Candidate`
        (None: no rank has any checkpoint, start from step 0), every rank's final finding, and a
        fallback note (``""`` unless a newer checkpoint than the chosen one was unreadable).

    Raises:
        ResumeDisagreement: some rank can read no checkpoint while another can, or no rank can
            read any of the checkpoints there are (raised on every rank, same message).
    """
    from hetero_worker.ckpt import store  # noqa: PLC0415 (store imports files, which imports torch)

    rank = dist.get_rank(group) if dist.is_initialized() else 0
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    cands = [c for c in store.candidates(directory) if accept is None or accept(c)]
    verdicts: dict[tuple[int, int, str], str] = {}

    def verdict(c: Any) -> str:
        if c.key not in verdicts:
            verdicts[c.key] = store.verify(c, share=(rank, world))
        return verdicts[c.key]

    def newest_note(chosen: Any) -> str:
        if not cands or cands[0] is chosen:
            return ""
        c = cands[0]
        what = "the legacy checkpoint.pt" if c.legacy else f"step {c.step} (checkpoint {c.checkpoint_id})"
        return f"{what}: {verdict(c) or 'not on every rank'}"

    bound: tuple[int, int, str] | None = None
    for _ in range(len(cands) + 2):
        mine = next((c for c in cands if (bound is None or c.key <= bound) and not verdict(c)), None)
        if mine is None:
            first = cands[0] if cands else None
            finding = Finding(rank=rank, path=str(first.file) if first else str(
                Path(directory) / "checkpoint.pt") if directory else "", missing=first is None,
                error="" if first is None else verdict(first))
        else:
            finding = Finding(rank=rank, path=str(mine.file), step=mine.step,
                              checkpoint_id=mine.checkpoint_id, saved_ns=mine.saved_ns,
                              newest=newest_note(mine))
        findings = gather_findings(finding, group)
        usable = [f for f in findings if f.step is not None or (f.error == "" and not f.missing)]
        if all(f.missing for f in findings):
            return None, findings, ""
        if len(usable) < len(findings):
            raise ResumeDisagreement(findings)
        keys = [(f.step if f.step is not None else -1, f.saved_ns, f.checkpoint_id) for f in findings]
        low = min(keys)
        if all(k == low for k in keys):
            chosen = next(c for c in cands if c.key == low)
            by_note: dict[str, list[int]] = {}
            for f in findings:
                if f.newest:
                    by_note.setdefault(f.newest, []).append(f.rank)
            notes = [f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {n}"
                     for n, r in by_note.items()]
            return chosen, findings, "; ".join(notes)
        bound = low
    raise ResumeDisagreement(findings)


def agree_on_resume(mine: Finding, group: Any = None) -> Finding:
    """Confirm rank 0's finding on every rank (collective over ``group``, None: the default).

    Args:
        mine: this rank's finding.
        group: the process group (the checkpoint group of a trainer).

    Returns:
        Rank 0's finding (the decision), identical on every rank.

    Raises:
        ResumeDisagreement: any rank's finding differs from rank 0's, or rank 0 could not read
            its checkpoint (raised on every rank, same message).
    """
    findings = gather_findings(mine, group)
    if disagreeing_ranks(findings):
        raise ResumeDisagreement(findings)
    return findings[0]
