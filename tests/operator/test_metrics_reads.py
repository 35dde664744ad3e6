"""The operator's reads of rank metrics (issue 21): no redirects followed, a bounded body, and an
answer that is not a worker's metrics a warning on the job, never an aborted reconcile.

A real HTTP server (aiohttp) plays the rank endpoints: a worker's metrics, a redirect to
another host, a 5 MiB body, an HTML page, and an error status.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from hetero_operator.controller import learning, progress

METRICS = ("# TYPE htj_steps_total counter\nhtj_steps_total 42\n"
           "# TYPE htj_samples_total counter\nhtj_samples_total 630\n"
           "# TYPE htj_compute_seconds_total counter\nhtj_compute_seconds_total 6.3\n"
           "# TYPE htj_throughput_samples_per_second gauge\nhtj_throughput_samples_per_second 100\n"
           "# TYPE htj_local_batch_size gauge\nhtj_local_batch_size 15\n")


@pytest.fixture
async def endpoints():  # type: ignore[no-untyped-def]
    hits: list[str] = []

    def answer(make):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.StreamResponse:
            hits.append(request.path)
            return make()
        return handler

    def redirect() -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    app = web.Application()
    app.router.add_get("/ok/metrics", answer(lambda: web.Response(text=METRICS)))
    app.router.add_get("/redirect/metrics", answer(redirect))
    app.router.add_get("/elsewhere", answer(lambda: web.Response(text=METRICS)))
    app.router.add_get("/huge/metrics", answer(lambda: web.Response(body=b"#" * (5 * 2**20))))
    app.router.add_get("/html/metrics", answer(lambda: web.Response(
        text="<html><body>login</body></html>", content_type="text/html")))
    app.router.add_get("/error/metrics", answer(lambda: web.Response(status=503, text="busy")))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", hits
    await runner.cleanup()


async def test_a_workers_metrics_are_read(endpoints) -> None:
    base, _ = endpoints
    read = await progress.read_metrics(f"{base}/ok/metrics")
    assert read.text == METRICS and read.problem == ""


@pytest.mark.parametrize(("mode", "checkpointing", "expected"), [
    ("Full", False, 630 / 6.3 * 4 / 3), ("None", True, 630 / 6.3 * 4 / 3),
    ("None", False, 630 / 6.3)], ids=["Full", "activation checkpointing", "neither"])
async def test_a_rank_that_recomputes_is_learned_without_the_recomputation(
        endpoints, mode: str, checkpointing: bool, expected: float) -> None:
    # 630 samples in 6.3 compute seconds; under Full or activation checkpointing those seconds
    # hold every block's forward twice, and the step-time model adds the 4/3 back
    base, _ = endpoints
    learner = learning.SpeedLearner(url_of, interval_s=0.0)
    plan = {"groups": [{"gpuType": "Tesla-T4", "precision": "fp16", "pod": "j-g0"}],
            "memory": {"mode": mode, "gpuTypes": [{"gpuType": "Tesla-T4",
                                                    "activationCheckpointing": checkpointing}]}}
    assert await learner.observe("ns", "j", [pod(base, "ok")], plan, metrics_port=9480,
                                 now_s=1.0) == 1
    (obs,) = learner.observations("ns", "j", unix_s=2.0)
    assert (obs.gpu_type, obs.precision) == ("Tesla-T4", "fp16")
    assert obs.samples_per_s == pytest.approx(expected)


@pytest.mark.parametrize(("path", "fragment"), [
    ("redirect", "answered HTTP 302 redirecting to /elsewhere; redirects are not followed"),
    ("huge", "sent more than 4 MiB; not read"),
    ("error", "answered HTTP 503"),
], ids=["a redirect is not followed", "a body over 4 MiB is not read", "an error status says so"])
async def test_what_is_not_a_workers_answer_is_not_read_and_says_why(endpoints, path, fragment) -> None:
    base, hits = endpoints
    read = await progress.read_metrics(f"{base}/{path}/metrics")
    assert read.text is None and fragment in read.problem
    assert "/elsewhere" not in hits  # the redirect's target was never asked


async def test_an_unreachable_endpoint_is_no_warning() -> None:
    read = await progress.read_metrics("http://127.0.0.1:9/metrics")  # discard port: refused
    assert read == progress.MetricsRead(text=None)


def pod(base: str, path: str) -> dict[str, Any]:
    return {"metadata": {"name": "j-g0", "labels": {"heterotrain.io/rank": "0"}, "annotations": {}},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}, "_url": f"{base}/{path}/metrics"}


def url_of(p: dict[str, Any], _port: int) -> str:
    return p["_url"]


@pytest.mark.parametrize(("path", "fragment"), [
    ("html", "is not Prometheus text (ValueError"), ("redirect", "redirects are not followed")],
    ids=["an HTML page", "a redirect"])
async def test_progress_and_learning_reads_warn_and_never_raise(endpoints, path, fragment) -> None:
    base, _ = endpoints
    reader = progress.ProgressReader(url_of, interval_s=0.0)
    assert await reader.read("ns", "j", [pod(base, path)], metrics_port=9480, global_batch=128,
                             now_s=1.0) == {}
    (warning,) = reader.take_warnings("ns", "j")
    assert fragment in warning and reader.take_warnings("ns", "j") == []
    learner = learning.SpeedLearner(url_of, interval_s=0.0)
    plan = {"groups": [{"gpuType": "Tesla-T4", "precision": "fp16", "pod": "j-g0"}]}
    assert await learner.observe("ns", "j", [pod(base, path)], plan, metrics_port=9480, now_s=1.0) == 0
    assert fragment in learner.take_warnings("ns", "j")[0]


async def test_a_good_read_gives_progress_and_no_warning(endpoints) -> None:
    base, _ = endpoints
    reader = progress.ProgressReader(url_of, interval_s=0.0)
    got = await reader.read("ns", "j", [pod(base, "ok")], metrics_port=9480, global_batch=128, now_s=1.0)
    assert got["progress"]["step"] == 42 and reader.take_warnings("ns", "j") == []


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def due(self, *_: Any) -> bool:
        return True

    async def post(self, job: Any, type_: str, reason: str, message: str, now_s: float) -> None:
        self.posted.append((type_, reason, message))


async def test_the_reconciler_turns_them_into_one_warning_event_on_the_job() -> None:
    from hetero_operator.controller.reconcile import Reconciler
    rec = Reconciler.__new__(Reconciler)  # only what _metrics_warnings touches
    rec.progress = progress.ProgressReader(url_of, 0.0)
    rec.learner = learning.SpeedLearner(url_of, 0.0)
    rec.events = Events()
    rec.progress.warn("ns", "j", "http://x/metrics answered HTTP 503")
    await rec._metrics_warnings({"metadata": {"namespace": "ns", "name": "j"}}, 1.0)
    assert rec.events.posted == [("Warning", "MetricsUnreadable",
                                  "Rank metrics unreadable: http://x/metrics answered HTTP 503")]
