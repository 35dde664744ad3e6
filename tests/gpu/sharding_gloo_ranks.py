"""Run inside each rank process by tests/gpu/test_gpu_sharding_gloo.py; writes ``<out>/rank<R>.json``.

Two ranks on the machine's one CUDA device in ONE topology group (one node, one time-sliced GPU
type): the communicator rule gives the group Gloo (both report the same physical GPU), so Group
sharding would be FSDP2 over Gloo on CUDA.  The rank records whether ``wrap`` refused it (and
the message) or, under Full sharding, trains a few steps and records the losses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hetero_worker import trainer as ht


def main(out: str) -> int:
    t = ht.init()
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    facts: dict = {"device": str(t.device), "intra_backend": t.groups.intra_backend}
    try:
        wrapped = t.wrap(model)
    except RuntimeError as exc:
        facts["refused"] = str(exc)
    else:
        g = torch.Generator().manual_seed(11)
        data = torch.utils.data.TensorDataset(torch.randn(96, 16, generator=g),
                                              torch.randint(0, 4, (96,), generator=g))
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.2)
        losses = []
        for x, y in t.loader(data, shuffle=False):
            res = t.step(opt, lambda m: torch.nn.functional.cross_entropy(m(t.to_device(x)), t.to_device(y)))
            losses.append(res.loss)
        facts["losses"] = losses
        facts["param_device"] = str(next(wrapped.parameters()).device)
    Path(out, f"rank{t.rank}.json").write_text(json.dumps(facts))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
