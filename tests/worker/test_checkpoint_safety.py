"""The last good checkpoint is never lost (issue 32, item 5: F6, F7, F9, F12), with real Gloo
rank processes (tests/worker/ckptsafety_ranks.py) and the store on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from hetero_worker.ckpt import checkpoint, store
from hetero_worker.ckpt.ownership import Owner, SupersededError
from hetero_worker.ckpt.saving import CheckpointSaveError, PeriodicSaves

RANKS = Path(__file__).with_name("ckptsafety_ranks.py")


def run_scenario(scenario: str, tmp_path: Path, world: int = 2, timeout_s: float = 150,
                 **extra: str) -> list[dict]:
    ckpt = tmp_path / "ckpt"
    envs = mixed_cluster_envs([2] * world, checkpoint_dir=str(ckpt))
    runs = run_ranks([sys.executable, str(RANKS), scenario, str(tmp_path), str(ckpt)], envs,
                     timeout_s=timeout_s, HTJ_CHECKPOINT_TIMEOUT_S="30", **extra)
    assert_ok(runs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(300)
def test_a_corrupt_newer_checkpoint_is_quarantined_and_the_good_one_kept(tmp_path: Path) -> None:
    """F6: fall back from a corrupt step 200 to step 100, save step 150 with keep 2: 150 and 100
    stay, 200 lies aside as .corrupt (today: 200 and 150 stay and 100 is deleted)."""
    ranks = run_scenario("quarantine", tmp_path)
    for r in ranks:
        assert r["resumed"] == 100 and r["resumed_the_good_one"]
    final = ranks[0]
    assert final["steps"] == [150, 100]
    corrupt = [e for e in final["entries"] if e.endswith(store.QUARANTINE_SUFFIX)]
    assert len(corrupt) == 1 and corrupt[0].startswith("step-00000200-")
    note = (tmp_path / "ckpt" / corrupt[0] / store.QUARANTINE_NOTE).read_text()
    assert "does not match its SHA-256 in the manifest (corrupt)" in note
    assert not [e for e in final["entries"] if e.endswith(".tmp")]


@pytest.mark.timeout(300)
def test_a_full_disk_in_torch_save_raises_the_same_error_on_every_rank_at_once(tmp_path: Path) -> None:
    """F12 and F7: torch.save's RuntimeError on rank 0 (a full disk) is raised on every rank with
    the same message within seconds (today: rank 0 alone, the peer waits for the checkpoint
    timeout), and the failed save's temp directory is gone."""
    ranks = run_scenario("save_error", tmp_path)
    errors = [r["error"] for r in ranks]
    assert errors[0]["type"] == errors[1]["type"] == "CheckpointSaveError"
    assert errors[0]["message"] == errors[1]["message"]
    assert errors[0]["is_oserror"] and errors[0]["is_runtimeerror"]
    assert "saving the checkpoint of step 2" in errors[0]["message"]
    assert "RuntimeError: [enforce fail at inline_container.cc:626] . unexpected pos 64" in errors[0]["message"]
    assert max(r["elapsed_s"] for r in ranks) < 10.0  # the checkpoint group's timeout is 30 s
    assert ranks[0]["steps"] == [1]
    assert [e for e in ranks[0]["entries"] if e.startswith(".")] == []  # no temp left behind


@pytest.mark.timeout(300)
def test_periodic_saves_survive_failures_and_fail_after_n_in_a_row(tmp_path: Path) -> None:
    """F7: with HTJ_CHECKPOINT_MAX_FAILURES=2 a failed periodic save is a warning and a metric and
    training goes on; a success resets the count; the second failure in a row fails every rank
    with the same error (today: the first failure fails the job)."""
    ranks = run_scenario("periodic", tmp_path, HTJ_CHECKPOINT_MAX_FAILURES="2")
    for r in ranks:
        assert r["saved"] == {"1": True, "2": False, "3": True, "4": False}
        assert r["error"]["type"] == "CheckpointSaveError" and r["error"]["step"] == 5
        assert r["failures_metric"] == 3.0
    assert ranks[0]["error"]["message"] == ranks[1]["error"]["message"]
    assert ranks[0]["error"]["message"].startswith(
        "2 checkpoint saves in a row failed (at most HTJ_CHECKPOINT_MAX_FAILURES=2); the last, at step 5: ")
    assert ranks[0]["steps"] == [3, 1]
    assert [e for e in ranks[0]["entries"] if e.startswith(".")] == []


@pytest.mark.timeout(300)
def test_a_stale_generation_neither_publishes_nor_prunes(tmp_path: Path) -> None:
    """F9: manifests carry the job UID and restart generation; a gang of generation 0 saving
    with keep 1 where generation 1 has saved is refused on every rank, naming both, and the
    newer gang's checkpoint stays (today: it publishes and prunes the newer one away)."""
    ranks = run_scenario("generation", tmp_path)
    assert ranks[0]["manifest_owner"] == {"job_uid": "uid-7", "restart_generation": 1}
    for r in ranks:
        assert r["error"]["type"] == "CheckpointSaveError" and r["error"]["superseded"]
        assert "restart generation 1 of job UID uid-7 owns the directory (step-00000010-" in r["error"]["message"]
        assert "and this gang is restart generation 0: it neither publishes nor prunes there" in r["error"]["message"]
    assert ranks[0]["error"]["message"] == ranks[1]["error"]["message"]
    assert ranks[0]["steps"] == [10]
    assert [e for e in ranks[0]["entries"] if e.startswith(".")] == []


# --- single process: the store's rules -------------------------------------------------------

def _save(directory: Path, step: int, keep: int = 2, owner: Owner | None = None) -> None:
    torch.manual_seed(step)
    model = torch.nn.Linear(3, 2)
    checkpoint.save_checkpoint(directory, step=step, model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1), keep=keep,
                               owner=owner or Owner())


def test_a_directory_without_manifest_is_quarantined_not_deleted(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    oldest = store.candidates(tmp_path)[1].path
    (oldest / store.MANIFEST).unlink()
    _save(tmp_path, 6, keep=1)
    assert [c.step for c in store.candidates(tmp_path)] == [6]
    aside = tmp_path / f"{oldest.name}{store.QUARANTINE_SUFFIX}"
    assert (aside / store.CHECKPOINT_FILE).is_file()
    assert "MANIFEST.json" in (aside / store.QUARANTINE_NOTE).read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(store.QUARANTINE_SUFFIX)) == [
        f"{oldest.name}{store.QUARANTINE_SUFFIX}"]


def test_retention_counts_only_checkpoints_that_verify(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    store._VERIFIED.clear()  # a new process: nothing verified yet
    middle = store.candidates(tmp_path)[0]
    data = bytearray(middle.file.read_bytes())
    data[-10] ^= 0x01
    middle.file.write_bytes(bytes(data))
    _save(tmp_path, 6, keep=2)
    assert [c.step for c in store.candidates(tmp_path)] == [6, 2]  # 4 set aside, 2 kept
    assert (tmp_path / f"{middle.path.name}{store.QUARANTINE_SUFFIX}").is_dir()


def test_manifests_of_another_job_do_not_block_a_new_job(tmp_path: Path) -> None:
    _save(tmp_path, 2, owner=Owner(job_uid="old-job", generation=5))
    _save(tmp_path, 4, owner=Owner(job_uid="new-job", generation=0))
    assert [Owner.from_manifest(c.manifest) for c in store.candidates(tmp_path)] == [
        Owner(job_uid="new-job", generation=0), Owner(job_uid="old-job", generation=5)]
    with pytest.raises(CheckpointSaveError, match="restart generation 5 of job UID old-job"):
        _save(tmp_path, 6, owner=Owner(job_uid="old-job", generation=4))


def test_owner_from_env_reads_the_contract_variables() -> None:
    assert Owner.from_env({"HTJ_JOB_UID": "abc", "HTJ_RESTART_GENERATION": "3"}) == Owner(
        job_uid="abc", generation=3)
    assert Owner.from_env({}) == Owner(job_uid="", generation=0)


class _Metrics:
    def __init__(self) -> None:
        self.failures = 0

    def record_checkpoint_save_failure(self) -> None:
        self.failures += 1


def test_periodic_saves_fail_at_once_when_superseded() -> None:
    saves = PeriodicSaves(max_failures=3, metrics=_Metrics())

    def superseded() -> str:
        raise CheckpointSaveError(f"rank 0: {SupersededError('/ckpt', Owner(generation=0), Owner(generation=1), 'step-x')}")

    with pytest.raises(CheckpointSaveError, match="superseded by a newer restart generation"):
        saves.run(superseded, step=7)
    assert saves.failures_in_row == 0


def test_periodic_saves_count_failures_in_a_row() -> None:
    metrics = _Metrics()
    saves = PeriodicSaves(max_failures=2, metrics=metrics)

    def fail() -> str:
        raise CheckpointSaveError("rank 0: RuntimeError: unexpected pos 64")

    assert saves.run(fail, step=1) is None
    assert saves.run(lambda: "/ckpt/step-2", step=2) == "/ckpt/step-2"
    assert saves.run(fail, step=3) is None
    with pytest.raises(CheckpointSaveError, match=r"^2 checkpoint saves in a row failed"):
        saves.run(fail, step=4)
    assert metrics.failures == 3
    with pytest.raises(ValueError, match="HTJ_CHECKPOINT_MAX_FAILURES"):
        PeriodicSaves(max_failures=0)
