"""Rendezvous that tolerates rank 0 starting last (case 17).

In a heterogeneous job rank 0 often has the biggest image and is the last pod up; until then its
Service name does not resolve and ``init_process_group`` fails at once ("Name or service not
known"; kubeflow/pytorch-operator#125). Here every other rank first waits, with exponential
backoff, for ``MASTER_ADDR`` to resolve and ``MASTER_PORT`` to accept a TCP connection, then joins
the ``TCPStore``. If that does not happen within the rendezvous timeout it raises
:class:`RendezvousTimeout` (the process then exits non-zero with that reason, rather than
crash-looping).

Timeout: argument, else ``HTJ_RENDEZVOUS_TIMEOUT_S``, else :data:`heterotrain_common.defaults.RENDEZVOUS_TIMEOUT_S`.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from hetero_worker.runtime import netfamily
from heterotrain_common import contract, defaults, envnames, listen


_STATE: dict[str, Any] = {}
"""The training collectives' timeout this process initialised with, and the checkpoint group."""


class RendezvousTimeout(TimeoutError):
    """Rank 0 (MASTER_ADDR:MASTER_PORT) did not become reachable within the timeout."""


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``HTJ_RENDEZVOUS_TIMEOUT_S`` in seconds, or the default.

    Raises:
        ContractError: set but not a number > 0.
    """
    return contract.read_var(os.environ if environ is None else environ,
                             envnames.RENDEZVOUS_TIMEOUT_S)


def _tcp_probe(host: str, port: int, timeout_s: float) -> None:
    with socket.create_connection((host, port), timeout=timeout_s):
        pass


def wait_for_master(host: str, port: int, *, timeout_s: float,
                    resolve: Callable[..., Any] = socket.getaddrinfo,
                    probe: Callable[[str, int, float], None] = _tcp_probe,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep,
                    first_backoff_s: float = 0.1, max_backoff_s: float = 5.0) -> float:
    """Wait until ``host`` resolves and ``host:port`` accepts TCP connections.

    Args:
        host: MASTER_ADDR (a DNS name or an IP).
        port: MASTER_PORT.
        timeout_s: give up after this many seconds.
        resolve, probe, clock, sleep: injectable for tests (defaults: DNS, TCP connect, monotonic
            clock, ``time.sleep``).
        first_backoff_s, max_backoff_s: backoff starts here and doubles up to the maximum.

    Returns:
        Seconds left of ``timeout_s``.

    Raises:
        RendezvousTimeout: not reachable in time; the message names the last error.
    """
    deadline = clock() + timeout_s
    backoff_s = first_backoff_s
    while True:
        try:
            resolve(host, port)
            probe(host, port, max(0.1, min(5.0, deadline - clock())))
            return max(0.0, deadline - clock())
        except OSError as exc:
            if backoff_s == first_backoff_s:  # once: say why this rank waits
                print(f"heterotrain: waiting for rank 0 at {host}:{port} ({type(exc).__name__}: "
                      f"{exc}); retrying for up to {timeout_s:g} s", file=sys.stderr, flush=True)
            last_error = f"{type(exc).__name__}: {exc}"
        left_s = deadline - clock()
        if left_s <= 0:
            raise RendezvousTimeout(
                f"RendezvousTimeout: rank 0 at {host}:{port} not reachable after {timeout_s:g} s "
                f"(last error: {last_error}); set {envnames.RENDEZVOUS_TIMEOUT_S} to wait longer")
        sleep(min(backoff_s, left_s))
        backoff_s = min(backoff_s * 2, max_backoff_s)


def collective_timeout() -> timedelta | None:
    """The training collectives' timeout :func:`init_distributed` set (every process group the
    worker creates uses it: ``new_group`` would otherwise default to torch's 30 minutes for Gloo);
    None when this process did not initialise through it."""
    return _STATE.get("collective_timeout")


def checkpoint_group(timeout_s: float) -> Any:
    """The checkpoint process group: every rank, Gloo, its own timeout (collective on first use).

    Checkpoint saves, their agreement and the per-step stop agreement run on it, so a save to slow
    storage (rank 0 writing for minutes while the others wait) never trips the training
    collectives' timeout, and the training collectives never wait on a checkpoint's.  One per
    default group: every rank creates it at the same point (:class:`hetero_worker.trainer.Trainer`).
    """
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    found = _STATE.get("checkpoint_group")
    if found is not None and found[0] is default:
        return found[1]
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    _STATE["checkpoint_group"] = (default, group)
    return group


def init_distributed(*, rank: int, world_size: int, master_addr: str, master_port: int,
                     backend: str, timeout_s: float | None = None,
                     collective_timeout_s: float = defaults.COLLECTIVE_TIMEOUT_S) -> None:
    """Join the job: wait for rank 0 (ranks > 0), build the TCPStore, init the default group.

    Args:
        rank, world_size, master_addr, master_port: from the contract.
        backend: default group backend, ``"gloo"`` on CPU or ``"nccl"`` on CUDA.
        timeout_s: rendezvous timeout; None reads :func:`timeout_from_env`.
        collective_timeout_s: timeout of every training collective (``HTJ_COLLECTIVE_TIMEOUT_S``).

    Raises:
        RendezvousTimeout: rank 0 unreachable (ranks > 0), or not all ranks joined rank 0's store
            in time (rank 0).
    """
    import torch.distributed as dist

    timeout_s = timeout_from_env() if timeout_s is None else timeout_s
    left_s = timeout_s
    if rank != 0:
        left_s = wait_for_master(master_addr, master_port, timeout_s=timeout_s)
    netfamily.pin_transports(master_addr, master_port)  # Gloo/NCCL in the master's family
    try:
        # rank 0 of a one-host job: the store on the loopback address only (TCPStore itself
        # would listen on every interface); torch owns the socket once it is handed over
        listen_fd = listen.loopback_listener(master_addr, master_port) if rank == 0 else None
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=max(1.0, left_s)),
                              wait_for_workers=True, master_listen_fd=listen_fd)
    except (RuntimeError, OSError) as exc:  # torch raises DistStoreError (a RuntimeError)
        raise RendezvousTimeout(
            f"RendezvousTimeout: rank {rank} could not complete the store rendezvous at "
            f"{master_addr}:{master_port} within {timeout_s:g} s ({exc})") from exc
    _STATE["collective_timeout"] = timedelta(seconds=collective_timeout_s)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=_STATE["collective_timeout"])
