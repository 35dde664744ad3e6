"""Which job ``heterotrain status`` / ``logs`` mean: a local run directory or a job on a cluster.

* a directory: that run directory;
* no argument: the latest run under ``runs/``;
* a name with ``--namespace`` or ``--kubeconfig``: the job of that name on the cluster;
* a name without them: its latest run under ``runs/`` when there is one, else the cluster's job
  in the kubeconfig context's namespace (as kubectl takes it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from hetero_operator.local import runview
from hetero_operator.local.rundirs import RUNS_DIR


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """A local run (``workdir``) or a cluster job (``name`` in ``namespace``; ``""``: the
    kubeconfig context's namespace)."""

    workdir: Path | None = None
    namespace: str = ""
    name: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``[JOB|RUNDIR] [-n NAMESPACE] [--kubeconfig FILE] [--runs DIR]``."""
    parser.add_argument("target", nargs="?", metavar="JOB|RUNDIR", default=None,
                        help="a run directory of heterotrain run, or a job's name (default: the "
                             "latest run under runs/)")
    parser.add_argument("-n", "--namespace", default=None,
                        help="the job's namespace on the cluster (a name then means a cluster job)")
    parser.add_argument("--kubeconfig", default=None,
                        help="the cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--runs", default=RUNS_DIR, metavar="DIR",
                        help=f"where local runs are (default: {RUNS_DIR})")


def resolve(args: argparse.Namespace) -> Target:
    """The :class:`Target` of ``args`` (see the module docstring).

    Raises:
        runview.RunNotFound: a local run was meant and none matches.
    """
    cluster = args.namespace is not None or args.kubeconfig is not None
    if args.target is None or Path(args.target).is_dir():
        if cluster and args.target is None:
            raise runview.RunNotFound("name the job: heterotrain status JOB -n NAMESPACE")
        return Target(workdir=runview.find_run_dir(args.target, Path(args.runs)))
    if not cluster:
        try:
            return Target(workdir=runview.find_run_dir(args.target, Path(args.runs)))
        except runview.RunNotFound:
            pass
    return Target(namespace=args.namespace or "", name=args.target)
