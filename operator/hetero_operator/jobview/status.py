"""``heterotrain status [JOB|RUNDIR] [-n NAMESPACE]``: a job's plan, state, progress and result.

For a local run (a run directory of ``heterotrain run``; none given: the latest) it reads what the
run left there (:mod:`hetero_operator.local.runview`); for a job on a cluster it reads the job's
status through the API server (:mod:`.cluster`).  Exit codes: 0 shown, 1 not found or the API
server cannot be reached (one line on stderr), 64 usage error.
"""

from __future__ import annotations

import argparse
import sys

from hetero_operator.jobview import cluster, target
from hetero_operator.local import runview

EXIT_SHOWN, EXIT_NOT_FOUND = 0, 1


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``status`` arguments."""
    target.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Print the status; returns the exit code."""
    try:
        where = target.resolve(args)
        if where.workdir is not None:
            lines = runview.view(where.workdir).lines()
        else:
            custom, _ = cluster.clients(args.kubeconfig)
            namespace = where.namespace or cluster.context_namespace(args.kubeconfig)
            lines = cluster.status_lines(cluster.read_job(custom, namespace, where.name))
    except (runview.RunNotFound, cluster.ClusterError) as exc:
        print(f"heterotrain status: error: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    print("\n".join(lines))
    return EXIT_SHOWN
