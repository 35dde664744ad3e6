"""``heterotrain logs [JOB|RUNDIR] [--rank N] [-f] [-n NAMESPACE]``: a rank's log.

For a local run: ``rank-<N>.log`` of its run directory (none given: the latest run); ``-f`` follows
it until the run ends.  For a job on a cluster: the log of the pod hosting rank ``N`` (its
``worker`` container, which holds every local rank of the pod), read through the API server's
``pods/log`` as ``kubectl logs`` does; ``-f`` follows until the container ends.  Exit codes: 0
shown, 1 not found or the API server cannot be reached (one line on stderr), 64 usage error.
"""

from __future__ import annotations

import argparse
import sys

from hetero_operator.jobview import cluster, target
from hetero_operator.local import runview, runstate

EXIT_SHOWN, EXIT_NOT_FOUND = 0, 1
DEFAULT_WAIT_S = 30.0
"""``--wait-s``: how long ``-f`` waits for a rank's log to appear while its run lives."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``logs`` arguments."""
    target.add_arguments(parser)
    parser.add_argument("--rank", type=int, default=0, metavar="N", help="the global rank (default 0)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing what the rank writes until the run (pod) ends")
    parser.add_argument("--wait-s", type=float, default=DEFAULT_WAIT_S, metavar="S",
                        help=f"with -f on a local run: wait this long for the log to appear "
                             f"(default {DEFAULT_WAIT_S:g})")
    parser.add_argument("--previous", action="store_true",
                        help="cluster jobs: the log of the pod's previous container (a restart)")


def run(args: argparse.Namespace) -> int:
    """Print the log; returns the exit code."""
    if args.rank < 0:
        print("heterotrain logs: error: --rank must be 0 or more", file=sys.stderr)
        return EXIT_NOT_FOUND
    try:
        where = target.resolve(args)
        if where.workdir is not None:
            return _local(args, where.workdir)
        return _cluster(args, where)
    except (runview.RunNotFound, cluster.ClusterError, FileNotFoundError) as exc:
        print(f"heterotrain logs: error: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND


def _local(args: argparse.Namespace, workdir) -> int:
    path = runview.rank_log(workdir, args.rank)
    plan = runstate.read_plan(workdir) or {}
    world = int(plan.get("world_size") or 0)
    if world and args.rank >= world:
        raise FileNotFoundError(f"rank {args.rank}: the run in {workdir} has ranks 0..{world - 1}")

    def running() -> bool:
        return args.follow and runstate.read_state(workdir).running
    for chunk in runview.follow(path, running=running, wait_s=args.wait_s):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return EXIT_SHOWN


def _cluster(args: argparse.Namespace, where: target.Target) -> int:
    custom, core = cluster.clients(args.kubeconfig)
    namespace = where.namespace or cluster.context_namespace(args.kubeconfig)
    pod = cluster.rank_pod(core, namespace, where.name, args.rank, custom)
    print(f"==> {cluster.pod_header(pod)}", file=sys.stderr)
    out = sys.stdout.buffer
    for chunk in cluster.pod_log(core, namespace, pod["metadata"]["name"], follow=args.follow,
                                 previous=args.previous):
        out.write(chunk)
        out.flush()
    return EXIT_SHOWN
