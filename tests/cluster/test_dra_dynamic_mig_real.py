"""The held-out DynamicMIG case against the REAL API server: the ResourceClaimTemplates whose CEL
selectors pin a partitionable class to its GPUs (``uuid in [...]``, ``parentUUID in [...]``)
compile and are admitted.  (The dev control plane runs without the DRAPartitionableDevices gate,
so it drops sharedCounters/consumesCounters from slices: the inventory side is tested offline,
tests/operator/test_dra_dynamic_mig.py.)"""

from __future__ import annotations

import json
import sys

import pytest
from realcluster import REPO, RealCluster

sys.path.insert(0, str(REPO / "tests" / "operator"))
sys.path.insert(0, str(REPO / "tests"))
from test_dra_dynamic_mig import IMAGES, fixture, inventory  # noqa: E402
from builders import make_job  # noqa: E402

from hetero_operator.api import labels  # noqa: E402
from hetero_operator.api import types as model  # noqa: E402
from hetero_operator.planning.plan import plan_job  # noqa: E402
from hetero_operator.render import pods as rendering  # noqa: E402
from hetero_operator.render.claims import add_claims  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_pinned_claim_templates_are_admitted(real: RealCluster) -> None:
    ns = real.namespace("dynamic-mig")
    slices, claims, _ = fixture()
    inv = inventory(slices, claims)
    spec = make_job(name="mix", ranks=3, global_batch=48, images=IMAGES, gpus={"selection": "All"})
    plan = plan_job(spec, inv.inventory)
    assert isinstance(plan, model.Plan)
    _inputs, templates = add_claims(rendering.PodInputs(), spec.name, ns, plan, inv,
                                    labels=labels.selector(spec.name))
    assert len(templates) == 3 and all("in [" in json.dumps(t) for t in templates)
    for t in templates:
        proc = real.kubectl("create", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-",
                            input_text=json.dumps(t), check=False)
        assert proc.returncode == 0, proc.stderr
    bad = json.loads(json.dumps(templates[0]))
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] += " &&"
    proc = real.kubectl("create", "--dry-run=server", "-n", ns, "-f", "-", input_text=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "compilation failed" in proc.stderr.lower(), proc.stderr  # CEL is checked
