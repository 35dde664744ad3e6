"""The common ``main`` of the rank scripts the worker tests start (``python tests/worker/X.py``):
join the job from the contract, run one scenario, write its facts to ``<out>/rank<r>.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_worker import trainer as ht


def run_and_write(facts_of: Callable[[ht.Trainer], dict[str, Any]], out_dir: str) -> int:
    """``ht.init()``, ``facts_of(trainer)`` as JSON into ``out_dir/rank<r>.json``, ``close()``.

    Returns:
        The process exit code (a contract or rendezvous error exits non-zero with its message).
    """
    def run() -> int:
        t = ht.init()
        facts = facts_of(t)
        Path(out_dir, f"rank{t.rank}.json").write_text(json.dumps(facts))
        t.close()
        return 0

    return ht.exit_on_setup_error(run)
