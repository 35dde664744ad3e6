"""The operator in process, as its pod runs it: kopf's ``operator()`` with the registrations of
``hetero_operator.controller.main`` in a thread with its own event loop.

As in production it talks to the API only over HTTP; kopf also cancels every task started in its
loop when it stops, which must not hit the server or the kubelet of the test.  Used by the fake
cluster (tests/k8s/harness.py), the real control plane (tests/cluster/realcluster.py) and the
peering test's replicas.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from hetero_operator.api.settings import OperatorConfig


class OperatorThread:
    """One operator started at construction.

    Args:
        config: its settings.
        metrics_url: where it reads the ranks' metrics (a test kubelet maps ports); None for the
            default (``http://<pod IP>:<port>``).
        name: the thread's name.

    Attributes:
        config / memo: the settings and kopf's memo (metrics, identity, the reconciler once
            started).
    """

    def __init__(self, config: OperatorConfig, *, metrics_url: Any = None, name: str = "operator") -> None:
        import kopf

        import hetero_operator.controller.main  # noqa: F401 - registers the handlers
        from hetero_operator.controller import runner

        self.config = config
        self.memo = runner.make_memo(config, metrics_url=metrics_url or runner.default_metrics_url)
        self._stop, self._ready = threading.Event(), threading.Event()
        kwargs = runner.operator_kwargs(config, self.memo)

        def main() -> None:
            asyncio.run(kopf.operator(registry=kopf.get_default_registry(), stop_flag=self._stop,
                                      ready_flag=self._ready, **kwargs))

        self._thread = threading.Thread(target=main, name=name, daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float = 30) -> bool:
        """Block until kopf is up (``ready_flag``), at most ``timeout_s``; True when it is."""
        return self._ready.wait(timeout_s)

    def stop(self, timeout_s: float = 30) -> None:
        """Stop kopf (like the operator pod going away) and wait for its thread, at most
        ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout_s)
