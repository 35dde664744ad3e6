"""Issue 32: every row of docs/bad-inputs.md fed to the operator's validation gets the documented
error naming the field (a manifest field, an ``HTJ_*`` setting, a node list entry): none is
accepted silently, none is a traceback.  The table is the test's data: a row added there is
tested here."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero_operator.api.errors import ConfigError, SpecError
from hetero_operator.api.settings import OperatorConfig
from hetero_operator.api.spec import parse_job
from hetero_operator.local.plan import InputError, load_objects

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "bad-inputs.md"
ROW = re.compile(r"^\| (\d+) \| (manifest|setting|nodes) \| `([^`]*)` \| `([^`]*)` \| `([^`]*)` \|$")


def table_rows() -> list[tuple[str, str, str, str, str]]:
    """``(number, kind, field, value, expected)`` of every row between the table's markers."""
    text = TABLE.read_text()
    body = text.split("<!-- bad-inputs:begin -->", 1)[1].split("<!-- bad-inputs:end -->", 1)[0]
    lines = [line for line in body.splitlines() if re.match(r"^\| \d+ \|", line)]
    rows = []
    for line in lines:
        m = ROW.match(line)
        assert m, f"docs/bad-inputs.md: row not in the form | n | kind | `field` | `value` | `expected` |: {line}"
        rows.append(m.groups())
    return rows


ROWS = table_rows()


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b[0].c`` in ``obj`` (mappings created on the way)."""
    keys = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    for key in keys[:-1]:
        obj = obj[int(key[1:-1])] if key.startswith("[") else obj.setdefault(key, {})
    last = keys[-1]
    if last.startswith("["):
        obj[int(last[1:-1])] = value
    else:
        obj[last] = value


def test_the_table_has_at_least_40_rows_numbered_in_order_and_no_row_twice() -> None:
    assert len(ROWS) >= 40
    assert [int(r[0]) for r in ROWS] == list(range(1, len(ROWS) + 1))
    assert len({r[1:4] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("number,kind,field,value,expected", ROWS, ids=[f"{r[0]}-{r[2]}" for r in ROWS])
def test_each_bad_input_gets_the_documented_error(number: str, kind: str, field: str, value: str,
                                                  expected: str, tmp_path: Path) -> None:
    if kind == "manifest":
        body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
        set_path(body, field, yaml.safe_load(value))
        with pytest.raises(SpecError) as err:
            parse_job(copy.deepcopy(body))
        assert str(err.value).startswith(expected), str(err.value)
    elif kind == "setting":
        with pytest.raises(ConfigError) as cerr:
            OperatorConfig.from_env({field: value})
        assert str(cerr.value).startswith(expected), str(cerr.value)
    else:
        nodes = tmp_path / "nodes.yaml"
        nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "NodeList",
                                         field: yaml.safe_load(value)}))
        with pytest.raises(InputError) as ierr:
            load_objects(nodes, "Node")
        assert str(ierr.value).startswith(f"{nodes}: ") and expected in str(ierr.value), str(ierr.value)


def test_heterotrain_run_names_a_bad_grace_period_instead_of_a_traceback(tmp_path: Path) -> None:
    """F15: ``terminationGracePeriodSeconds: "abc"`` was a traceback in ``heterotrain run``."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["spec"]["worker"]["template"] = {"spec": {"terminationGracePeriodSeconds": "abc"}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(body))
    proc = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(job)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert ("spec.worker.template.spec.terminationGracePeriodSeconds: must be a whole number of seconds"
            in proc.stderr), proc.stderr


def test_duplicate_node_names_are_refused_by_heterotrain_plan(tmp_path: Path) -> None:
    """F15: a node listed twice had its GPUs counted twice (over-committed)."""
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())
    nodes["items"].append(copy.deepcopy(nodes["items"][0]))
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(nodes))
    proc = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", str(REPO / "examples" / "digits.yaml"),
                           "--nodes", str(path)], capture_output=True, text=True, check=False, timeout=120)
    name = nodes["items"][0]["metadata"]["name"]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"items[3].metadata.name: node '{name}' is listed twice (items[0] and items[3])" in proc.stderr, proc.stderr


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999"])
def test_the_worker_contract_refuses_non_finite_seconds_naming_the_variable(text: str) -> None:
    """F15 on the worker's side: a timeout variable of the env contract is finite."""
    from heterotrain_common.envread import ContractError, parse_seconds
    with pytest.raises(ContractError, match="HTJ_CHECKPOINT_TIMEOUT_S"):
        parse_seconds(text, "HTJ_CHECKPOINT_TIMEOUT_S", allow_zero=False)
