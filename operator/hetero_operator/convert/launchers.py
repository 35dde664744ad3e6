"""A PyTorchJob container's command with its launcher taken off (pure).

Kubeflow users often start ``torchrun --nproc-per-node=4 train.py --lr 0.1`` (or ``python -m
torch.distributed.run`` / ``.launch``) in the container.  HeteroTrain is the launcher itself
(``heterotrain launch`` starts one process per GPU of the pod's plan and sets the env contract), so
the converted ``spec.worker.command`` is the script alone: ``python train.py``, with ``--lr 0.1`` as
its args, and the launcher's ``--nproc-per-node`` becomes the ranks per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
"""``python -m`` modules that are torchrun."""
LAUNCHER_PROGRAMS = ("torchrun",)
"""Programs that are torchrun."""
TORCHRUN_VALUE_FLAGS = frozenset({
    "--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port", "--rdzv-backend",
    "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id",
    "--rdzv-conf", "--rdzv_conf", "--max-restarts", "--max_restarts", "--monitor-interval",
    "--monitor_interval", "--start-method", "--start_method", "--role", "--log-dir", "--log_dir",
    "--redirects", "-r", "--tee", "-t", "--local-ranks-filter", "--local_ranks_filter",
    "--local-addr", "--local_addr", "--logs-specs", "--logs_specs",
})
"""torchrun's options that take a value (``torch/distributed/run.py``); any other option is
taken as a switch (``--standalone``, ``--no-python``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """A container's argv split into the program each rank runs and what the launcher said.

    Attributes:
        command: the program and script (``("python", "train.py")``).
        args: the script's own arguments.
        launcher: ``"torchrun"`` when one was taken off, else ``""``.
        nproc_per_node: the launcher's ``--nproc-per-node`` when a whole number, else None.
        dropped: the launcher's options that were taken off, as written.
    """

    command: tuple[str, ...]
    args: tuple[str, ...]
    launcher: str = ""
    nproc_per_node: int | None = None
    dropped: tuple[str, ...] = ()


def split_launcher(command: Sequence[str], args: Sequence[str]) -> Launch:
    """Take torchrun off ``command + args``; without one, ``command`` and ``args`` as they are.

    ``torchrun [opts] train.py a b`` -> ``python train.py`` + ``a b``; ``torchrun -m pkg.mod a``
    -> ``python -m pkg.mod`` + ``a``; ``python -m torch.distributed.run [opts] train.py`` the same.
    """
    argv = [*command, *args]
    rest = _after_launcher(argv)
    if rest is None:
        return Launch(command=tuple(command), args=tuple(args))
    dropped: list[str] = []
    nproc: int | None = None
    module = False
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        flag, _, inline = rest[i].partition("=")
        if flag in ("-m", "--module"):
            module = True
            dropped.append(rest[i])
            i += 1
            continue
        if flag in TORCHRUN_VALUE_FLAGS:
            value = inline if inline else (rest[i + 1] if i + 1 < len(rest) else "")
            dropped.append(rest[i] if inline else f"{rest[i]} {value}")
            if flag in ("--nproc-per-node", "--nproc_per_node") and value.isdigit():
                nproc = int(value)
            i += 1 if inline else 2
            continue
        dropped.append(rest[i])
        i += 1
    if i >= len(rest):
        return Launch(command=tuple(command), args=tuple(args))
    program = ("python", "-m", rest[i]) if module else ("python", rest[i])
    return Launch(command=program, args=tuple(rest[i + 1:]), launcher="torchrun",
                  nproc_per_node=nproc, dropped=tuple(dropped))


def _after_launcher(argv: Sequence[str]) -> list[str] | None:
    """What follows ``torchrun`` or ``python -m torch.distributed.run``, None without it."""
    if not argv:
        return None
    if argv[0].rsplit("/", 1)[-1] in LAUNCHER_PROGRAMS:
        return list(argv[1:])
    if argv[0].rsplit("/", 1)[-1].startswith("python") and len(argv) > 2 and argv[1] == "-m" \
            and argv[2] in LAUNCHER_MODULES:
        return list(argv[3:])
    return None
