"""Wait for the very thing a test asserts (a file, a process state, a server answer), never a sleep.

:func:`wait_until` is the one polling loop the synchronous tests share; its poll interval is the
only ``time.sleep`` it needs (asyncio tests use ``Cluster.wait_for`` in tests/k8s/harness.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout_s: float, what: str,
               poll_s: float = 0.05) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    Args:
        predicate: the condition; an exception from it propagates at once.
        timeout_s: give up after this many seconds.
        what: what is awaited, for the failure message ("rank 0's pid file").
        poll_s: seconds between calls.

    Raises:
        AssertionError: not true within ``timeout_s``; the message names ``what`` and the last
            value.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {value!r})")
        time.sleep(poll_s)  # sync-ok: the poll interval of this wait, not a synchronisation delay
