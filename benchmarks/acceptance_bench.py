"""The agent acceptance layer's figure: input tokens per anomaly, compressed against the raw logs.

A realistic gemm job (a baseline trial and five faulty ones, six anomalies of which two share a
fingerprint) with a ~200 KB worker log: INFO progress, repeated clock warnings, tracebacks at the
failures and an older unrelated error. "Raw" sends that log once with every anomaly's evidence, config
and message; "compressed" sends what jobs.drafts.compress makes of it, the gateway's prompt included. Tokens
are estimated as bytes / 4 on both sides (the gateway's own estimate). No network, no GPU, ~1 s.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobs.store import AnomalyRecord, Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.kernels import faults

faults.enable()  # the injected faults its specs use: a FARM_PLUGINS module, for Ray and subprocesses too

T0 = datetime(2025, 6, 1, 12, 0, 0)
BYTES_PER_TOKEN = 4
SPEC = """\
name: gemm-accept
family: gemm
backends:
  - {name: torch_fp32, configs: {include: [{}, {_repeat: 4}, {_repeat: 8}, {_perturb: 1.0}]}}
shapes: {grid: {m: [128, 256], n: [128], k: [128]}}
card: gemm
"""
# (seq, backend, shape m, config, status, anomaly kind, seconds after T0 it failed)
TRIALS = [
    (0, True, 128, {}, "ok", None, 30),
    (1, False, 128, {"_repeat": 4}, "ok", "slower", 120),
    (2, False, 128, {"_repeat": 8}, "ok", "slower", 180),  # same point and kind as #1: one fingerprint
    (3, False, 128, {"_perturb": 1.0}, "incorrect", "correctness", 260),
    (4, False, 256, {"_repeat": 4}, "error", "error", 400),
    (5, False, 256, {}, "timeout", "timeout", 520),
    (6, True, 256, {}, "ok", "noisy", 590),
]
EVIDENCE: dict[str, dict[str, Any]] = {
    "slower": {"ratio": 3.92, "ci_low": 3.8, "ci_high": 4.1, "p_value": 1e-9, "median_ns": 412000},
    "correctness": {"method": "allclose", "max_abs_err": 1.7, "max_rel_err": 0.9, "mismatches": 16384},
    "error": {"status": "error", "attempt": 1},
    "timeout": {"status": "timeout", "attempt": 2},
    "noisy": {"cv": 0.31, "max_cv": 0.25, "n": 60, "outliers_dropped": 2},
}


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{t.microsecond // 1000:03d}"


def _traceback(t: datetime, seq: int, exc: str) -> list[str]:
    return [
        f"{_stamp(t)} ERROR worker-1 trial #{seq} failed",
        "Traceback (most recent call last):",
        '  File "/farm/cluster/worker.py", line 212, in run_trial',
        "    outcome = family.run(request)",
        '  File "/farm/kernels/gemm/case.py", line 88, in run',
        "    out = backend(a, b, **config)",
        exc,
    ]


def realistic_log(target_bytes: int = 200_000, seed: int = 0) -> str:
    """A worker log of the job: mostly INFO, repeated warnings, the failures' tracebacks."""
    rng = random.Random(seed)
    failures = {s: (seq, kind) for seq, _b, _m, _c, _st, kind, s in TRIALS if kind}
    lines: list[str] = []
    t = T0
    size = 0
    second = 0
    while size < target_bytes or second <= 600:
        t = T0 + timedelta(seconds=second, milliseconds=rng.randrange(1000))
        for _ in range(3):
            seq = rng.randrange(7)
            line = (
                f"{_stamp(t)} INFO worker-{rng.randrange(2)} trial #{seq} sample {rng.randrange(60)} "
                f"{rng.uniform(90, 420):.3f} us sm_clock={rng.choice([1980, 1755, 1410])}MHz "
                f"mem_used={rng.randrange(1, 9)}.{rng.randrange(10)}GiB queue={rng.randrange(4)}"
            )
            lines.append(line)
            size += len(line) + 1
        if second % 7 == 0:
            lines.append(
                f"{_stamp(t)} WARNING worker-0 SM clock 1410 MHz below 75% of default: sample dropped"
            )
        if second % 53 == 0:
            lines.append(f"{_stamp(t)} WARNING ray: worker heartbeat late by {rng.randrange(100, 900)} ms")
        if second == 45:
            lines += _traceback(
                t, 9, "ConnectionResetError: [Errno 104] Connection reset by peer (old, recovered)"
            )
        if second in failures:
            seq, kind = failures[second]
            if kind == "error":
                lines += _traceback(
                    t, seq, "RuntimeError: CUDA error: an illegal memory access was encountered"
                )
            elif kind == "timeout":
                lines.append(f"{_stamp(t)} ERROR dispatcher trial #{seq} timed out after 60 s; worker killed")
            elif kind == "correctness":
                lines.append(
                    f"{_stamp(t)} ERROR worker-0 trial #{seq} check failed: max_abs_err 1.7 > atol 0.02"
                )
            else:
                lines.append(f"{_stamp(t)} WARNING worker-1 trial #{seq} {kind}: see analysis")
        second += 1
    return "\n".join(lines) + "\n"


def seed_job(store: Store) -> int:
    """The job above, stored with its trials and anomalies (as jobs.judge.acceptance would store them)."""
    from jobs.judge.anomalies import SEVERITY, fingerprint

    trials = [
        SimpleNamespace(
            key=f"k{seq}",
            family="gemm",
            backend="torch_fp32",
            baseline=base,
            shape={"m": m, "n": 128, "k": 128},
            config=config,
            dtype="float32",
        )  # fmt: skip
        for seq, base, m, config, _st, _kind, _s in TRIALS
    ]
    job_id = store.create_job(
        name="gemm-accept",
        family="gemm",
        spec_yaml=SPEC,
        spec_hash="bench",
        trials=trials,
        git_commit="abc123",
    )
    rows = {t.seq: t for t in store.trials(job_id)}
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    store.record_results(
        result_of(
            rows[seq].id,
            status=status,
            finished_at=T0 + timedelta(seconds=s),
            error=crash if status == "error" else None,
            summary=Summary.from_stored({"median": 100_000.0 * (1 + seq), "n": 60}),
        )
        for seq, _b, _m, _c, status, _kind, s in TRIALS
    )
    rows = {t.seq: t for t in store.trials(job_id)}
    anomalies = []
    for seq, _b, _m, _c, _st, kind, _s in TRIALS:
        if kind:
            t = rows[seq]
            anomalies.append(
                AnomalyRecord(
                    trial_id=t.id,
                    baseline_trial_id=rows[0].id if t.shape["m"] == 128 else rows[6].id,
                    kind=kind,
                    severity=SEVERITY[kind],
                    fingerprint=fingerprint(t, kind),
                    message=f"{kind} on #{seq}",
                    evidence=EVIDENCE[kind],
                )
            )
    store.replace_anomalies(job_id, anomalies)
    return job_id


def figure(log_bytes: int = 200_000) -> dict[str, Any]:
    from gateway.summaries.drafts import SYSTEM_PROMPT, TASK_PROMPTS
    from jobs.drafts.compress import compress, facts_from_job

    log = realistic_log(log_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "farm.db"))
        try:
            job_id = seed_job(store)
            t0 = time.perf_counter()
            facts = facts_from_job(store, job_id, logs=lambda _t: log)
            packed = compress(facts)
            compress_s = time.perf_counter() - t0
        finally:
            store.close()
    n = len(facts)
    prompt = len(SYSTEM_PROMPT.encode()) + len(TASK_PROMPTS["checklist"].encode())
    records = sum(
        len(json.dumps({"evidence": f.evidence, "config": f.config, "message": f.message}).encode())
        for f in facts
    )
    raw_tokens = (prompt + len(log.encode()) + records) / BYTES_PER_TOKEN
    sent_tokens = (prompt + packed.compressed_bytes) / BYTES_PER_TOKEN
    excerpts = [len(i["log_excerpt"].encode()) for i in packed.items]
    return {
        "log_bytes": len(log.encode()),
        "anomalies": n,
        "sent": len(packed.items),
        "duplicates_folded": sum(len(v) - 1 for v in packed.duplicates.values()),
        "max_excerpt_bytes": max(excerpts),
        "raw_tokens_per_anomaly": round(raw_tokens / n),
        "compressed_tokens_per_anomaly": round(sent_tokens / n),
        "reduction": round(raw_tokens / sent_tokens, 1),
        "compress_ms": round(compress_s * 1000, 1),
    }


def main() -> dict[str, Any]:
    f = figure()
    print(
        f"job with {f['anomalies']} anomalies ({f['sent']} sent, {f['duplicates_folded']} duplicate folded), "
        f"{f['log_bytes']:,} B of raw log"
    )
    print(
        f"input tokens per anomaly: raw logs {f['raw_tokens_per_anomaly']:,}  compressed "
        f"{f['compressed_tokens_per_anomaly']:,}  -> {f['reduction']}x fewer (target >= 10x)"
    )
    print(f"largest log excerpt {f['max_excerpt_bytes']} B; compression took {f['compress_ms']} ms")
    return f


if __name__ == "__main__":
    main()
