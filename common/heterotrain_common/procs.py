"""Supervise a gang of local rank processes: start, forward signals, fail together.

Used by ``heterotrain launch`` (in a pod) and ``heterotrain run`` (the embedded default). A data-
parallel world cannot continue without one of its ranks, so when one process fails every other one
is stopped (SIGTERM, then SIGKILL after a grace period) and the gang's exit code is the failed
process's, like torchrun. Children run in their own session (a terminal's Ctrl-C reaches them once,
through us) and get SIGTERM if the supervising thread dies (Linux ``PR_SET_PDEATHSIG``), so no
orphaned rank is left blocked in a collective.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from heterotrain_common.envnames import PREEMPTED_EXIT_CODE  # the one exit-code table

GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping the gang."""
POLL_S = 0.1
DEADLINE_EXIT_CODE = 124
"""Exit code of a gang stopped at its deadline (as coreutils ``timeout``)."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def exit_code_of(returncode: int) -> int:
    """Popen return code -> shell-style exit code (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


try:
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)  # loaded once: the child must not dlopen
except OSError:
    _LIBC = None


def _die_with_parent() -> None:  # runs in the child between fork and exec: keep it minimal
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """How a gang ended.

    Attributes:
        exit_code: 0 when all succeeded; else the first failure's exit code, or 128 + N when
            stopped by signal N sent to the supervisor.
        failed_index: index of the first failing process, None when none failed.
        signal_received: the signal that stopped the gang, None when none.
        deadline_exceeded: True when stopped at the deadline (exit code
            :data:`DEADLINE_EXIT_CODE`).
    """

    exit_code: int
    failed_index: int | None = None
    signal_received: int | None = None
    deadline_exceeded: bool = False


class Gang:
    """Processes that live and die together.

    Args:
        argv: the program each process runs.
        envs: one complete environment per process (not merged with ``os.environ``).
        stdouts / stderrs: per process, a file object, ``subprocess.PIPE`` or None (inherit).
        cwd: working directory.

    Children get SIGTERM when the thread that created the gang ends (``PR_SET_PDEATHSIG``):
    create it in the thread that supervises it.
    """

    def __init__(self, argv: Sequence[str], envs: Sequence[Mapping[str, str]], *,
                 stdouts: Sequence[Any] | None = None, stderrs: Sequence[Any] | None = None,
                 cwd: str | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exit_order: list[int] = []
        self.absorbed: set[int] = set()
        """Processes whose failure the gang went on without (an elastic job's lost ranks,
        :meth:`wait`'s ``on_failure``)."""
        self.signal_received: int | None = None
        self.forwarded: int | None = None
        """The signal the processes got from :func:`forwarding_signals` (the one received, or
        SIGTERM when forwarded ``as_sigterm``); None before any."""
        try:
            for i, env in enumerate(envs):
                self.procs.append(subprocess.Popen(
                    list(argv), env=dict(env), cwd=cwd,
                    stdout=stdouts[i] if stdouts else None, stderr=stderrs[i] if stderrs else None,
                    start_new_session=True, preexec_fn=_die_with_parent))
        except BaseException:
            self.stop(grace_s=0)
            raise

    def restart(self, i: int, argv: Sequence[str], env: Mapping[str, str], *, stdout: Any = None,
                stderr: Any = None, cwd: str | None = None) -> subprocess.Popen[bytes]:
        """Start process ``i`` again (it exited and was absorbed: an elastic job's lost rank
        started again to join the running job); it is watched like the others from now on.

        Raises:
            ValueError: process ``i`` is still running.
            OSError: the program cannot be started.
        """
        if self.procs[i].poll() is None:
            raise ValueError(f"process {i} is still running")
        self.procs[i] = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=stdout,
                                         stderr=stderr, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        self.absorbed.discard(i)
        if i in self.exit_order:
            self.exit_order.remove(i)
        return self.procs[i]

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to every live process."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

    def _reap(self) -> None:
        for i, p in enumerate(self.procs):
            if i not in self.exit_order and p.poll() is not None:
                self.exit_order.append(i)

    def first_failure(self) -> int | None:
        """Index of the first process seen exiting with a non-zero code (and not absorbed),
        else None."""
        self._reap()
        return next((i for i in self.exit_order
                     if self.procs[i].returncode != 0 and i not in self.absorbed), None)

    def running(self) -> bool:
        """True while any process is alive."""
        return any(p.poll() is None for p in self.procs)

    def stop(self, grace_s: float = GRACE_S, *, resend: bool = True) -> None:
        """SIGTERM every live process, SIGKILL what is left after ``grace_s`` seconds, reap all.

        ``resend=False``: they had their SIGTERM already (forwarded from ours): only wait, then
        SIGKILL (a second SIGTERM would cut a rank's stop checkpoint short)."""
        if resend:
            self.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
        self.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def wait(self, *, on_tick: Callable[[], None] | None = None, grace_s: float = GRACE_S,
             poll_s: float = POLL_S, deadline_s: float | None = None,
             signal_grace_s: float | None = None,
             on_failure: Callable[[int], bool] | None = None) -> Outcome:
        """Wait until all exit or one fails (then stop the rest).

        Args:
            on_tick: called every ``poll_s`` seconds while waiting (progress display).
            grace_s: SIGTERM-to-SIGKILL grace when stopping the rest, seconds.
            signal_grace_s: after a signal to the supervisor (forwarded to every process) or a
                process that exited with :data:`PREEMPTED_EXIT_CODE`, how long the others may take
                to finish on their own before SIGKILL (a rank's stop at an agreed step writes a
                checkpoint); None: ``grace_s``.
            poll_s: polling period, seconds.
            deadline_s: ``time.monotonic()`` value at which to stop everything; None for none.
            on_failure: called with the index of a process that failed; True: the gang goes on
                without it (an elastic job's survivors re-form, ``spec.elastic``), False or None:
                every other process is stopped, as without it.

        Returns:
            The :class:`Outcome`.
        """
        while True:
            failed = self.first_failure()
            if self.signal_received is not None:  # forwarded: a SIGTERM'd rank stops on its own
                sigterm = (self.forwarded or self.signal_received) == signal.SIGTERM
                graceful = sigterm and signal_grace_s is not None
                self.stop(signal_grace_s if graceful else grace_s, resend=not sigterm)
                break
            if failed is not None and on_failure is not None and on_failure(failed):
                self.absorbed.add(failed)
                continue
            if failed is not None:
                preempted = exit_code_of(self.procs[failed].returncode) == PREEMPTED_EXIT_CODE
                self.stop(signal_grace_s if preempted and signal_grace_s is not None else grace_s)
                break
            if deadline_s is not None and time.monotonic() >= deadline_s and self.running():
                self.stop(grace_s)
                return Outcome(exit_code=DEADLINE_EXIT_CODE, deadline_exceeded=True)
            if not self.running():
                break
            if on_tick is not None:
                on_tick()
            time.sleep(poll_s)
        if on_tick is not None:
            on_tick()
        if self.signal_received is not None:
            return Outcome(exit_code=128 + self.signal_received, failed_index=failed,
                           signal_received=self.signal_received)
        if failed is not None:
            return Outcome(exit_code=exit_code_of(self.procs[failed].returncode),
                           failed_index=failed)
        return Outcome(exit_code=0)


@contextlib.contextmanager
def forwarding_signals(gang: Gang, *, as_sigterm: bool = False) -> Iterator[None]:
    """While inside, SIGINT/SIGTERM/SIGHUP to us go to every child and end :meth:`Gang.wait`.

    ``as_sigterm``: every child gets SIGTERM whichever of them we got (``heterotrain run``: a
    Ctrl-C then stops the ranks as a preemption does, at an agreed step with one checkpoint,
    instead of raising ``KeyboardInterrupt`` in each; a second signal is a second SIGTERM, which
    ends a rank at once). Only installs handlers in the main thread (elsewhere signals cannot be
    caught); restores the previous handlers on exit.
    """
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        if gang.signal_received is None:
            gang.signal_received = signum
        gang.forwarded = signal.SIGTERM if as_sigterm else signum
        gang.send_signal(gang.forwarded)

    previous = {s: signal.signal(s, handler) for s in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class LineMerger:
    """Copy several processes' pipes into one stream a whole line at a time.

    Processes that share one stdout (a container's log pipe) cut each other's lines: an
    unbuffered ``print`` writes the text and the ``\\n`` in two ``write`` calls, so two ranks
    of one pod left ``rank 3 of 4 says hellorank 2 of 4 says hello`` in ``kubectl logs``.
    Here each pipe is read by its own thread with ``readline`` and every line is written to
    ``out`` (a binary stream) under one lock, then flushed.

    Args:
        pipes: the processes' readable binary pipes (None entries are skipped).
        out: where the lines go, e.g. ``sys.stdout.buffer``.
    """

    def __init__(self, pipes: Sequence[IO[bytes] | None], out: IO[bytes]) -> None:
        self._out, self._lock = out, threading.Lock()
        self._threads = [threading.Thread(target=self._copy, args=(p,), daemon=True)
                         for p in pipes if p is not None]
        for t in self._threads:
            t.start()

    def _copy(self, pipe: IO[bytes]) -> None:
        for line in iter(pipe.readline, b""):
            with self._lock:
                self._out.write(line)
                self._out.flush()
        pipe.close()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` per pipe for its last line (a pipe a grandchild still holds
        open would otherwise keep us waiting for ever)."""
        for t in self._threads:
            t.join(timeout=timeout_s)


def open_log(path: os.PathLike[str] | str) -> IO[bytes]:
    """Open a rank's log file for appending (binary, unbuffered enough for tailing)."""
    return open(path, "ab", buffering=0)


def tail(path: os.PathLike[str] | str, lines: int = 20) -> str:
    """Last ``lines`` lines of a text file ('' when missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is no zombie (a process of another user counts as
    alive); False for ``pid <= 0``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cpu_count() -> int:
    """CPUs this process may run on (its affinity set, e.g. a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_rank(ranks: int) -> int:
    """``OMP_NUM_THREADS`` for ``ranks`` processes sharing this machine: CPUs / ranks, at least 1."""
    return max(1, cpu_count() // max(1, ranks))
