"""Torch-free checks a rank runs before anything heavy, and the exit codes for setup errors.

``python -m hetero_worker.examples.digits`` with a malformed contract must fail in well under a
second with a message naming the variable, not after importing torch or waiting on a rendezvous.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from hetero_worker.runtime import rendezvous
from heterotrain_common.contract import Contract, parse_contract
from heterotrain_common.envread import ContractError

EXIT_BAD_CONTRACT = 2
EXIT_RENDEZVOUS_TIMEOUT = 3


def preflight(environ: Mapping[str, str]) -> Contract:
    """Parse the contract, the worker's own ``HTJ_*`` knobs included (``run.sim_delay_per_sample_s``,
    ``comm.rendezvous_timeout_s``).

    Raises:
        ContractError: naming the first malformed or inconsistent variable.
    """
    return parse_contract(environ)


def exit_on_setup_error(main: Callable[[], int | None]) -> int:
    """Run ``main``; turn a bad contract or a rendezvous timeout into a message and exit code.

    Returns:
        ``main``'s code; :data:`EXIT_BAD_CONTRACT` (2) for a :class:`ContractError` (a contract
        variable or an ``HTJ_*`` knob; the message names it), :data:`EXIT_RENDEZVOUS_TIMEOUT` (3)
        for :class:`~hetero_worker.runtime.rendezvous.RendezvousTimeout`.
    """
    try:
        return int(main() or 0)
    except ContractError as exc:
        print(f"heterotrain worker: invalid contract: {exc}", file=sys.stderr)
        return EXIT_BAD_CONTRACT
    except rendezvous.RendezvousTimeout as exc:
        print(f"heterotrain worker: {exc}", file=sys.stderr)
        return EXIT_RENDEZVOUS_TIMEOUT
