"""A malformed contract variable gives a clear error naming it and a non-zero exit, no hang.

Runs the real entry point (``python -m hetero_worker.examples.digits``) as a subprocess; all the
broken environments start at once and are awaited together.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest

from rankproc import mixed_cluster_envs, start_rank, wait_all

BROKEN = {
    "RANK outside WORLD_SIZE": ("RANK", "7", "RANK"),
    "RANK missing": ("RANK", "", "RANK"),
    "WORLD_SIZE not an integer": ("WORLD_SIZE", "two", "WORLD_SIZE"),
    "MASTER_PORT out of range": ("MASTER_PORT", "70000", "MASTER_PORT"),
    "a rank's batch below 1 in the topology": (
        "HTJ_TOPOLOGY", lambda text: text.replace('"local_batch":8', '"local_batch":0', 1), "HTJ_TOPOLOGY"),
    "a rank's batch missing from the topology": (
        "HTJ_TOPOLOGY", lambda text: json.dumps([{k: v for k, v in e.items() if k != "local_batch"}
                                                 for e in json.loads(text)]), "HTJ_TOPOLOGY"),
    "unknown precision": ("HTJ_PRECISION", "fp8", "HTJ_PRECISION"),
    "unknown hierarchy": ("HTJ_HIERARCHY", "ring", "HTJ_HIERARCHY"),
    "device profile not JSON": ("HTJ_DEVICE_PROFILE", "{product: T4", "HTJ_DEVICE_PROFILE"),
    "topology misses a rank": ("HTJ_TOPOLOGY", None, "HTJ_TOPOLOGY"),
    "negative simulated delay": ("HTJ_SIM_DELAY_PER_SAMPLE_S", "-1", "HTJ_SIM_DELAY_PER_SAMPLE_S"),
    "rendezvous timeout not a number": ("HTJ_RENDEZVOUS_TIMEOUT_S", "soon",
                                        "HTJ_RENDEZVOUS_TIMEOUT_S"),
}


def broken_env(variable: str, value: str | Callable[[str], str] | None) -> dict[str, str]:
    env = mixed_cluster_envs([8, 8])[0]
    if value is None:  # drop rank 1 from the topology
        env[variable] = json.dumps(json.loads(env[variable])[:1])
    elif callable(value):  # a change of the rendered text
        env[variable] = value(env[variable])
    else:
        env[variable] = value
    return env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_each_malformed_variable_fails_fast_and_names_it() -> None:
    cases = list(BROKEN.items())
    procs = [start_rank([sys.executable, "-m", "hetero_worker.examples.digits"],
                        broken_env(var, value)) for _, (var, value, _) in cases]
    runs = wait_all(procs, timeout_s=90)
    for (name, (_, _, named)), run in zip(cases, runs, strict=True):
        assert run.returncode == 2, f"{name}: exit {run.returncode}\n{run.stderr[-2000:]}"
        assert f"invalid contract: {named}:" in run.stderr, f"{name}: {run.stderr[-2000:]}"
        assert "Traceback" not in run.stderr, name
