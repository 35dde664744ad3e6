"""``heterotrain operator``: parse the flags, load the kopf registrations, run kopf until interrupted.

The top of the controller floor: it imports :mod:`hetero_operator.controller.main` (whose import
registers the handlers) and :mod:`hetero_operator.controller.runner` (startup, login, the memo),
so neither of those imports the other's caller.
"""

from __future__ import annotations

import argparse
import logging

import kopf

from hetero_operator.api.settings import OperatorConfig
from hetero_operator.controller import \
    main as _registrations  # noqa: F401 - importing registers the handlers
from hetero_operator.controller.runner import make_memo, operator_kwargs


FLAG_SETTINGS = {"metrics_port": "ports.metrics", "health_port": "ports.health",
                 "peering": "peering.name", "peering_priority": "peering.priority",
                 "pending_timeout_s": "restart.pending_timeout_s"}
"""Flag (argparse dest) -> the setting it overrides (``-n`` gives ``watch.namespaces``)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``heterotrain operator`` (each overrides its ``HTJ_*`` variable)."""
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces",
                        help="namespace (pattern) to watch; repeat; default: cluster-wide (HTJ_NAMESPACES)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (HTJ_METRICS_PORT, 8080)")
    parser.add_argument("--health-port", type=int, help="liveness port, 0 = off (HTJ_HEALTH_PORT, 8081)")
    parser.add_argument("--peering", help="kopf peering name; '' = standalone (HTJ_PEERING, heterotrain)")
    parser.add_argument("--priority", type=int, dest="peering_priority",
                        help="peering priority of this replica (HTJ_PEERING_PRIORITY, random)")
    parser.add_argument("--pending-timeout-s", type=float, help="re-plan after pods Pending this long (300)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    """Run the operator until interrupted; returns the exit code."""
    overrides = {path: getattr(args, flag, None) for flag, path in FLAG_SETTINGS.items()}
    if getattr(args, "namespaces", None):
        overrides["watch.namespaces"] = tuple(args.namespaces)
    config = OperatorConfig.from_env(overrides=overrides)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "verbose", False):
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per watch event
    memo = make_memo(config)
    kopf.run(**operator_kwargs(config, memo))
    return 0
