"""The realistic torchrun script and its port (examples/torchrun/train_*_full.py): the port runs
with the plan's batches and reports its result, and docs/torchrun.md states the lines it really
changes."""

from __future__ import annotations

import ast
import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "torchrun"


def code_lines(path: Path) -> list[str]:
    """Source lines without the module docstring, comments and blank lines."""
    tree = ast.parse(path.read_text())
    doc_end = tree.body[0].end_lineno if isinstance(tree.body[0], ast.Expr) else 0
    lines = path.read_text().splitlines()[doc_end:]
    return [line.split("  #")[0].rstrip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_the_guide_states_the_count_the_port_really_takes() -> None:
    plain, ported = code_lines(EXAMPLES / "train_ddp_full.py"), code_lines(EXAMPLES / "train_hetero_full.py")
    diff = list(difflib.ndiff(plain, ported))
    removed = sum(1 for line in diff if line.startswith("- "))
    added = [line[2:] for line in diff if line.startswith("+ ")]
    marked = [line.split("  #")[0].rstrip() for line in (EXAMPLES / "train_hetero_full.py").read_text().splitlines()
              if "  # HT" in line]
    assert added == marked  # every added line is marked, every marked line is new
    doc = " ".join((ROOT / "docs" / "torchrun.md").read_text().split())
    assert (f"{len(plain)} lines of code, {removed} removed and {len(added)} added "
            f"({len(ported)} lines after the port)") in doc
    for name in ("t.device", "t.rank", "result.loss", "t.module", "t.global_step"):
        assert re.search(rf"`[^`]*{re.escape(name)}[^`]*`", doc), name


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_realistic_port_trains_with_the_plans_batches_and_reports_its_accuracy(tmp_path: Path) -> None:
    doc = yaml.safe_load((EXAMPLES / "ported-full.yaml").read_text())
    doc["spec"]["gpus"] = {"ranks": 2}
    doc["spec"]["worker"]["args"] = ["--epochs", "1"]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(job), "--workdir",
                           str(tmp_path / "work"), "--metrics-port-base", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stats = [json.loads((tmp_path / "work" / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [s["local_batch"] for s in stats] == [91, 37]  # A100 + V100 split 128 as planned
    assert [s["steps"] for s in stats] == [32, 32]  # one epoch of 4096 samples
    result = json.loads((tmp_path / "work" / "result.json").read_text())
    assert result["accuracy"] > 0.8
    log = (tmp_path / "work" / "rank-0.log").read_text()
    assert re.findall(r"epoch 0 step (\d+) loss", log) == ["20"]
    # t.maybe_checkpoint saved at step 20 (intervalSteps); heterotrain run keeps checkpoints in the run dir
    assert [p.name.split("-")[1] for p in (tmp_path / "work" / "checkpoints").iterdir()] == ["00000020"]
