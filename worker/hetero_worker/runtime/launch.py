"""``heterotrain launch [--] CMD…``: in a pod, start one process per local rank, like torchrun.

The operator gives a pod the *pod form* of the contract (see :mod:`heterotrain_common.contract`):
``HTJ_FIRST_RANK`` plus ``LOCAL_WORLD_SIZE`` and the shared variables. For each local rank ``i``
this starts ``CMD`` with :func:`contract.expand_pod_env` (``RANK``, ``LOCAL_RANK``,
``HTJ_GROUP_RANK``; the rank's batch is its ``HTJ_TOPOLOGY`` entry), ``HTJ_METRICS_PORT`` = pod port + ``i`` (the
operator's port convention, ``spec.worker.metricsPort``), and on whole real GPUs
``CUDA_VISIBLE_DEVICES`` = the ``i``-th visible GPU (the rank then sees one device, ``cuda:0``).
A preset ``CUDA_VISIBLE_DEVICES`` is kept as given: rank ``i`` gets its ``i``-th entry verbatim and
``CUDA_DEVICE_ORDER`` stays whatever the pod had (the entries may be indices in CUDA's own
order). Without one, the GPUs come from NVML as UUIDs, which mean the same device under any
``CUDA_DEVICE_ORDER``, so the launcher never sets that variable. A MIG slice is never remapped: one process
can use only one MIG device, and the device plugin already exposes exactly that one
(pytorch/pytorch#130181). Signals are forwarded; when one rank fails, the others are stopped and
the launcher exits with that rank's code. With more than one local rank, each rank's
stdout and stderr reach the pod's log a whole line at a time (:class:`procs.LineMerger`). After a SIGTERM (preemption, drain, eviction) the ranks
get the pod's ``terminationGracePeriodSeconds`` to stop at an agreed step and write one checkpoint
(:mod:`hetero_worker.runtime.preemption`) before anything is killed.

Torch-free (the launcher process itself never touches a GPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

from heterotrain_common import contract as c
from heterotrain_common import defaults, envnames, envread, nvml, procs

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class LaunchError(ValueError):
    """The pod cannot host its ranks (e.g. fewer GPUs visible than ``LOCAL_WORLD_SIZE``)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``launch`` arguments."""
    parser.add_argument("--grace-s", type=float, default=procs.GRACE_S, metavar="SECONDS",
                        help="after a failure or signal, seconds between SIGTERM and SIGKILL "
                             f"to the other ranks (default {procs.GRACE_S:g})")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the program each local rank runs, e.g. -- python train.py")


def _uses_whole_gpus(device: c.DeviceProfile) -> bool:
    """True when the ranks run on real, whole GPUs (not simulated, not MIG, not CPU)."""
    return not (device.simulated or device.mig_profile or "-MIG-" in device.product
                or device.product.lower() == "cpu")


def _visible_gpus(pod: Mapping[str, str]) -> list[str] | None:
    """GPU ids this pod may use: ``CUDA_VISIBLE_DEVICES`` entries as given, else NVML UUIDs
    (order-independent), else None."""
    preset = pod.get(CUDA_VISIBLE_DEVICES)
    if preset is not None:
        return [e.strip() for e in preset.split(",") if e.strip()]
    gpus = nvml.list_gpus()
    return [g.uuid for g in gpus if not g.mig_enabled] if gpus else None


def _local_world_size(pod: Mapping[str, str]) -> int:
    raw = pod.get(envnames.LOCAL_WORLD_SIZE, "")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise envread.ContractError(envnames.LOCAL_WORLD_SIZE, f"must be an integer >= 1, got {raw!r}")
    return int(raw)


def child_envs(pod: Mapping[str, str], *, visible_gpus: list[str] | None) -> list[dict[str, str]]:
    """The complete environment of every local rank.

    Args:
        pod: the pod's environment (pod form of the contract plus anything else, e.g. PATH).
        visible_gpus: GPU ids visible to the pod (``CUDA_VISIBLE_DEVICES`` entries or NVML
            indices); None when unknown (no NVML, no variable).

    Returns:
        ``LOCAL_WORLD_SIZE`` dicts, local rank order, each passing :func:`contract.parse_contract`.

    Raises:
        ContractError: a malformed or inconsistent contract variable (named).
        LaunchError: whole GPUs are expected but fewer are visible than ``LOCAL_WORLD_SIZE``.
    """
    local_world = _local_world_size(pod)
    envs = [c.expand_pod_env(pod, i) for i in range(local_world)]
    first = c.parse_contract(envs[0])  # every rank is checked below; this one also gives the device
    gpus = _uses_whole_gpus(first.device) and visible_gpus is not None
    if gpus and len(visible_gpus or []) < local_world:
        raise LaunchError(f"{envnames.LOCAL_WORLD_SIZE}={local_world} but {len(visible_gpus or [])} GPU(s) "
                          f"visible ({CUDA_VISIBLE_DEVICES}={pod.get(CUDA_VISIBLE_DEVICES, '<unset>')}); "
                          "request one GPU per local rank")
    for i, env in enumerate(envs):
        contract = c.parse_contract(env)
        if contract.run.metrics_port:
            port = contract.run.metrics_port + i
            if port > 65535:
                raise envread.ContractError(envnames.METRICS_PORT, f"{contract.run.metrics_port} + local rank {i} "
                                      "exceeds 65535")
            env[envnames.METRICS_PORT] = str(port)
        if gpus:  # an entry as given (index in the pod's CUDA order, or a UUID); order untouched
            env[CUDA_VISIBLE_DEVICES] = (visible_gpus or [])[i]
        if local_world > 1 and "OMP_NUM_THREADS" not in pod:
            env["OMP_NUM_THREADS"] = str(procs.threads_per_rank(local_world))
    return envs


def termination_grace_s(pod: Mapping[str, str]) -> float:
    """How long the ranks may take to stop after SIGTERM: the pod's
    ``terminationGracePeriodSeconds`` (``HTJ_TERMINATION_GRACE_S``; the kubelet kills the pod
    then anyway).  Meanwhile they reach the next agreed step and write one checkpoint."""
    try:
        return c.read_var(pod, envnames.TERMINATION_GRACE_S)
    except envread.ContractError:
        return float(defaults.TERMINATION_GRACE_S)


def resolve_command(cmd: list[str]) -> list[str]:
    """Drop a leading ``--``; raises LaunchError when nothing is left or the program is not found."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise LaunchError("no command given; usage: heterotrain launch -- python train.py ...")
    if os.sep not in cmd[0] and shutil.which(cmd[0]) is None:
        raise LaunchError(f"command not found: {cmd[0]!r}")
    return cmd


def run(args: argparse.Namespace) -> int:
    """Start the local ranks and supervise them; returns the exit code (1 on a bad contract)."""
    try:
        cmd = resolve_command(list(args.cmd))
        envs = child_envs(os.environ, visible_gpus=_visible_gpus(os.environ))
    except (envread.ContractError, LaunchError) as exc:
        print(f"heterotrain launch: {exc}", file=sys.stderr)
        return 1
    piped = len(envs) > 1  # ranks sharing the pod's log: whole lines only (procs.LineMerger)
    pipes = [subprocess.PIPE] * len(envs) if piped else None
    gang = procs.Gang(cmd, envs, stdouts=pipes, stderrs=pipes)
    merged = ([procs.LineMerger([p.stdout for p in gang.procs], sys.stdout.buffer),
               procs.LineMerger([p.stderr for p in gang.procs], sys.stderr.buffer)] if piped else [])
    with procs.forwarding_signals(gang):
        outcome = gang.wait(grace_s=args.grace_s, signal_grace_s=termination_grace_s(os.environ))
    for merger in merged:
        merger.join()
    if outcome.failed_index is not None and outcome.signal_received is None:
        print(f"heterotrain launch: local rank {outcome.failed_index} "
              f"(rank {envs[outcome.failed_index][envnames.RANK]}) exited with code {outcome.exit_code}; "
              "stopped the other ranks", file=sys.stderr)
    return outcome.exit_code
