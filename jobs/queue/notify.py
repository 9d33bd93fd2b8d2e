"""The webhook a queued job tells its verdict to (`farm submit --notify URL`, or the spec's `notify:`):
Slack-compatible JSON (`text`, with the fields a script reads beside it), posted from a thread of its own so
a slow or dead hook never holds the pool; a failure is one line in the job's log."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

from jobs.run.verdict import exit_code_of
from jobs.store import Store
from jobs.store.schema import display_url
from kernels.base import TrialStatus, trial_label

TIMEOUT_S = 10.0
VERDICTS = {0: "passed", 1: "failed"}


def payload(store: Store, job_id: int) -> dict[str, Any]:
    """What the hook is told: the verdict, the counts, the fastest correct trials and where the report is."""
    job = store.get_job(job_id)
    assert job is not None
    counts = store.status_counts(job_id)
    verdict = "cancelled" if job.status == "cancelled" else VERDICTS[exit_code_of(counts)]
    trials = [t for t in store.trials(job_id) if t.status == TrialStatus.OK and t.correct and t.median_ns]
    base = {tuple(sorted(t.shape.items())): t.median_ns for t in trials if t.baseline}
    fastest = []
    for t in sorted(trials, key=lambda t: t.median_ns)[:3]:
        ref = base.get(tuple(sorted(t.shape.items())))
        fastest.append({
            "trial": trial_label(t.backend, t.shape, t.config, t.dtype, seq=t.seq),
            "median_us": t.median_ns / 1e3,
            "speedup": ref / t.median_ns if ref else None,
        })  # fmt: skip
    shown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    best = "; ".join(
        f"{f['trial']} {f['median_us']:.1f} us" + (f" ({f['speedup']:.2f}x baseline)" if f["speedup"] else "")
        for f in fastest
    )
    report = f"farm report {job_id} --db {display_url(store.url)}"  # never the password
    text = f"farm job {job_id} ({job.name}, {job.family}): {verdict} ({shown})"
    text += (f". Fastest: {best}" if best else "") + f". Report: {report}"
    return {"text": text, "job": job_id, "name": job.name, "verdict": verdict, "counts": counts,
            "fastest": fastest, "report": report}  # fmt: skip


def post(url: str, body: dict[str, Any], on_error: Callable[[str], None]) -> threading.Thread:
    """POST `body` as JSON to `url` in a thread; `on_error` gets one line if it fails."""

    def send() -> None:
        data = json.dumps(body, default=str).encode()
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310 - http(s) only
                answer.read()
        except (OSError, ValueError) as err:
            on_error(f"webhook {url} failed: {err}")

    thread = threading.Thread(target=send, name=f"notify-{body.get('job')}", daemon=True)
    thread.start()
    return thread
