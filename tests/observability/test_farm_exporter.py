"""The farm's exporter without Ray: off by default, port 0, the listener tee, bounded labels, Pushgateway."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from promkit import http_get

from cluster.dispatch import DispatchSnapshot, SlotState, WorkerResult, WorkItem
from jobs.run.farm_metrics import ANOMALY_KINDS, TRIAL_STATUSES, FarmMetrics
from kernels.base import Summary, TrialOutcome, TrialRequest
from kernels.measure.policy import MeasurePolicy

ALLOWED_LABELS = {"family", "backend", "status", "node", "gpu", "kind", "le"}


class Inner:
    """A listener that records what reached it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self.calls.append(name)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert set(s.labels) <= ALLOWED_LABELS, s
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def item(backend: str, n: int = 0) -> WorkItem:
    return WorkItem(trial_id=n, request=TrialRequest("probe", backend, {"n": n}, {}, "fp32", MeasurePolicy()))


def outcome(status: str, median_ns: float = 2e6, cv: float = 0.01, passed: bool = True) -> WorkerResult:
    stats = dict.fromkeys(("mean", "min", "max", "p10", "p90", "iqr", "mad", "stdev"), median_ns)
    summary = Summary(n=5, median=median_ns, cv=cv, **stats)
    return WorkerResult(TrialOutcome(status, summary=summary, correctness={"passed": passed}), 100.0, 100.25)


class Dispatcher:
    """A dispatcher as the gauges see it: its read-only snapshot."""

    def __init__(self, queued: int, slots: list[SlotState]) -> None:
        self.queued, self.slots = queued, slots

    def snapshot(self) -> DispatchSnapshot:
        return DispatchSnapshot(self.queued, tuple(self.slots))


def slot(name: str, node: str | None, gpu: str | None, in_flight: int = 0) -> SlotState:
    return SlotState(name, node is not None, False, in_flight, 1, node, gpu)


def test_off_unless_configured():
    assert FarmMetrics.from_env({}) is None
    assert FarmMetrics.from_env({"FARM_GPUS": "2"}) is None


def test_port_zero_picks_a_free_port_and_says_where():
    said: list[str] = []
    m = FarmMetrics.from_env({"FARM_METRICS_PORT": "0"}, echo=said.append)
    assert m is not None and m.close_after_job
    try:
        assert m.port and m.url == f"http://127.0.0.1:{m.port}/metrics"
        assert said == [f"farm metrics: {m.url}"]
        assert "farm_trials_total" in http_get(m.url)
    finally:
        m.close()


def test_a_bad_port_names_the_variable():
    with pytest.raises(ValueError, match="FARM_METRICS_PORT"):
        FarmMetrics.from_env({"FARM_METRICS_PORT": "nine"})


def test_the_listener_tee_counts_outcomes_and_the_gauges_read_the_dispatcher():
    m = FarmMetrics()
    inner = Inner()
    tee = m.listen(inner)
    slots = [
        slot("w0", "10.0.0.1/abc", "0"),
        slot("w1", "10.0.0.1/abc", "1"),
        slot("w2", None, None),  # still starting
    ]
    dispatcher = Dispatcher(3, slots)
    with m.job("probe", ["spin", "crash"], dispatcher):
        tee.worker_ready("w0", {"node": "10.0.0.1/abc", "gpu_id": "0"})
        slots[0] = slot("w0", "10.0.0.1/abc", "0", in_flight=2)
        tee.trial_started(item("spin", 1), "w0")
        s = samples(generate_latest(m.registry).decode())
        assert s[("farm_queue_length", (("family", "probe"),))] == 3
        assert s[("farm_trials_running", (("family", "probe"),))] == 2
        busy = {k[1]: v for k, v in s.items() if k[0] == "farm_workers_busy"}
        assert busy == {
            (("gpu", "0"), ("node", "10.0.0.1/abc")): 1,
            (("gpu", "1"), ("node", "10.0.0.1/abc")): 0,
        }
        # zero series for every outcome, anomaly kind and (zero-bucket) histogram of the job
        for status in TRIAL_STATUSES:
            assert (
                s[("farm_trials_total", (("backend", "crash"), ("family", "probe"), ("status", status)))] == 0
            )
        for kind in ANOMALY_KINDS:
            assert s[("farm_anomalies_total", (("family", "probe"), ("kind", kind)))] == 0
        assert s[("farm_kernel_median_seconds_count", (("backend", "crash"), ("family", "probe")))] == 0
        assert s[("farm_workers_lost_total", (("node", "10.0.0.1/abc"),))] == 0

        tee.trial_finished(item("spin", 1), "w0", outcome("ok"))
        tee.trial_finished(item("spin", 2), "w0", outcome("ok", cv=0.5))  # noisy
        tee.trial_finished(item("spin", 3), "w0", outcome("incorrect", passed=False))
        tee.trial_timed_out(item("spin", 4), "w0", 3.0)
        tee.trial_crashed(item("crash", 5), "w0", "died", False)
        tee.trial_crashed(item("crash", 5), "w0", "died", True)
        tee.worker_lost("w0", "actor died", False)
        m.anomaly("probe", "slower")
        m.anomaly("probe", "something-new")
        s = samples(generate_latest(m.registry).decode())
    fb = (("backend", "spin"), ("family", "probe"))
    assert s[("farm_trials_total", (*fb, ("status", "ok")))] == 2
    assert s[("farm_trials_total", (*fb, ("status", "incorrect")))] == 1
    assert s[("farm_trials_total", (*fb, ("status", "timeout")))] == 1
    assert s[("farm_trials_total", (("backend", "crash"), ("family", "probe"), ("status", "crashed")))] == 1
    assert s[("farm_trial_retries_total", (("backend", "crash"), ("family", "probe")))] == 1
    assert s[("farm_trial_duration_seconds_count", fb)] == 4  # 3 finished + 1 timeout
    assert s[("farm_trial_duration_seconds_sum", fb)] == pytest.approx(3.75)
    assert s[("farm_kernel_median_seconds_count", fb)] == 2  # only ok trials have a kernel median
    assert s[("farm_kernel_median_seconds_sum", fb)] == pytest.approx(0.004)
    anomalies = {k[1][1][1]: v for k, v in s.items() if k[0] == "farm_anomalies_total" and v}
    assert anomalies == {"noisy": 1, "correctness": 1, "slower": 1, "other": 1}
    assert s[("farm_workers_lost_total", (("node", "10.0.0.1/abc"),))] == 1
    # every callback reached the store listener behind the tee
    assert inner.calls.count("trial_finished") == 3 and "worker_lost" in inner.calls
    # the job is over: the live gauges have no series left
    after = samples(generate_latest(m.registry).decode())
    assert not [k for k in after if k[0] in ("farm_queue_length", "farm_workers", "farm_workers_busy")]


class _Receiver(BaseHTTPRequestHandler):
    pushes: list[tuple[str, str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.pushes.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


def test_short_jobs_push_to_a_pushgateway_at_the_end():
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        m = FarmMetrics.from_env({"FARM_METRICS_PUSHGATEWAY": url, "FARM_METRICS_PUSH_S": "60"})
        assert m is not None and m.port is None  # no HTTP server, pushes only
        with m.job("probe", ["noop"], Dispatcher(0, [])):
            m.listen(Inner()).trial_finished(item("noop"), "w0", outcome("ok"))
        method, path, body = _Receiver.pushes[-1]
        assert method == "PUT" and path == "/metrics/job/kernelfarm"
        assert b'farm_trials_total{backend="noop",family="probe",status="ok"} 1.0' in body
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_pushgateway_never_fails_the_job(caplog):
    url = f"http://127.0.0.1:{_closed_port()}"
    m = FarmMetrics(pushgateway=url)
    with caplog.at_level("WARNING", logger="jobs.run.farm_metrics"):
        with m.job("probe", ["noop"], Dispatcher(0, [])):
            pass  # the final push fails with a warning only
    # the job ended normally, and the one failed push is a warning naming the Pushgateway and why
    [record] = [r for r in caplog.records if r.name == "jobs.run.farm_metrics"]
    assert record.levelname == "WARNING"
    assert f"push to {url} failed" in record.getMessage()
    assert "refused" in record.getMessage().lower(), record.getMessage()


def _closed_port() -> int:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    port = server.server_port
    server.server_close()
    return port
