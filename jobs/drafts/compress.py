"""Compression: a job's anomalies as the fixed input format the gateway's summaries endpoint takes.

Nothing raw leaves the farm. Per anomaly: the interface signature (family, backend, shape and dtype), the
config fields that differ from the baseline point, a log excerpt (warnings and errors only, in a time
window around the failure, repeated lines folded, capped in bytes), the card's thresholds next to the
measured values (and, when the trial and its baseline ran in environments that differ in a component that
changes performance, that change in one line of at most ENV_CAP characters), and the prohibitions.
Anomalies with the same fingerprint are sent once. The sizes before (the raw log, evidence and config) and
after (the JSON sent) are measured for the record.

`facts_from_job` adapts the stored anomaly rows (jobs.store.Anomaly) into
`AnomalyFacts`; `compress`
works on plain facts, so any other source plugs in the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobs.judge.environment import changed_text, performance, stored
from jobs.judge.runs import RunComparison
from jobs.spec.cards import Card
from kernels.measure.stats import Comparison, finite_or_none

PROHIBITIONS = (
    "no full kernel implementations: describe the change, do not write the kernel",
    "no production SQL",
    "no commands to run against shared systems (clusters, databases, CI, production hosts)",
)
LOG_CAP_BYTES = 2048
MAX_LINE = 300
WINDOW_BEFORE_S = 60.0
WINDOW_AFTER_S = 10.0
ENV_CAP = 160  # characters of an anomaly's environment change sent ("torch 2.12.0 -> 2.13.0, ...")

_TS = re.compile(r"^\[?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[.,]\d+)?")
_WARN = re.compile(r"\b(WARN|WARNING)\b|\bwarnings?\.warn|UserWarning")
_ERROR = re.compile(
    r"\b(ERROR|CRITICAL|FATAL)\b|^Traceback \(most recent call last\)|^\s*File \"|"
    r"^\s*\w+(\.\w+)*(Error|Exception|Interrupt)\b|\bAssertionError\b|\bKilled\b|\bOOM\b|out of memory"
)


@dataclass
class AnomalyFacts:
    """What the farm knows about one anomaly, before compression (plain data, no ORM)."""

    id: str
    fingerprint: str
    kind: str
    severity: str
    message: str
    family: str
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    dtype: str
    evidence: dict[str, Any] = field(default_factory=dict)
    baseline_backend: str | None = None
    baseline_config: dict[str, Any] | None = None
    thresholds: list[dict[str, Any]] = field(default_factory=list)  # {metric, expected, measured}
    log_text: str = ""
    failed_at: datetime | None = None
    device: str = ""  # "cpu" or "gpu": what timed the trial ("" unknown)


@dataclass
class Compressed:
    items: list[dict[str, Any]]  # the AnomalyIn-shaped dicts to send
    duplicates: dict[str, list[str]]  # fingerprint -> ids of the anomalies folded into the one sent
    raw_bytes: int  # the raw log text, evidence and config of every anomaly
    compressed_bytes: int  # the JSON of the items

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.compressed_bytes if self.compressed_bytes else 0.0


# ---- the parts ---------------------------------------------------------------------------------------
def signature(family: str, backend: str, shape: dict[str, Any], dtype: str) -> str:
    args = ", ".join(f"{k}={v}" for k, v in shape.items())
    return f"{family}.{backend}({args}{', ' if args else ''}dtype={dtype})"


def config_diff(config: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, list[Any]]:
    """Only the fields that differ: name -> [baseline value, value] (None where a side lacks it)."""
    base = baseline or {}
    return {
        k: [base.get(k), config.get(k)]
        for k in sorted(set(config) | set(base))
        if config.get(k) != base.get(k)
    }


def _timestamp(line: str) -> datetime | None:
    m = _TS.match(line)
    if not m:
        return None
    try:
        return datetime.fromisoformat(m.group(1).replace(" ", "T"))
    except ValueError:
        return None


def _fold_key(line: str) -> str:
    return re.sub(r"\d+", "#", _TS.sub("", line)).strip()


def compress_log(
    text: str,
    *,
    at: datetime | None = None,
    before_s: float = WINDOW_BEFORE_S,
    after_s: float = WINDOW_AFTER_S,
    cap_bytes: int = LOG_CAP_BYTES,
) -> str:
    """Warnings and errors (tracebacks whole) within [at - before_s, at + after_s], repeated lines
    folded into one with a count, at most `cap_bytes` (UTF-8). Errors are kept before warnings and the
    latest before the earliest; cuts are marked. `at` defaults to the time of the last error line."""
    lines = text.splitlines()
    stamps: list[datetime | None] = []
    current: datetime | None = None
    for line in lines:
        current = _timestamp(line) or current
        stamps.append(current)
    levels: list[int] = []  # 2 error, 1 warning, 0 other
    in_trace = False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_trace = True
        elif in_trace and not (line.startswith((" ", "\t")) or _ERROR.search(line)):
            in_trace = False
        levels.append(2 if in_trace or _ERROR.search(line) else 1 if _WARN.search(line) else 0)
    if at is None:
        errs = [s for s, lv in zip(stamps, levels, strict=True) if lv == 2 and s is not None]
        at = errs[-1] if errs else None
    lo = at - timedelta(seconds=before_s) if at else None
    hi = at + timedelta(seconds=after_s) if at else None

    kept: list[tuple[int, int, str]] = []  # (index, level, text)
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, (line, lv, ts) in enumerate(zip(lines, levels, stamps, strict=True)):
        if lv == 0 or (lo is not None and ts is not None and not lo <= ts <= hi):
            continue
        key = _fold_key(line)
        counts[key] = counts.get(key, 0) + 1
        if key in first:
            continue
        first[key] = len(kept)
        kept.append((i, lv, line if len(line) <= MAX_LINE else line[:MAX_LINE] + " [...]"))
    shown = [(i, lv, t + (f" [x{counts[_fold_key(lines[i])]}]" if counts[_fold_key(lines[i])] > 1 else ""))
             for i, lv, t in kept]  # fmt: skip

    budget = cap_bytes - 40  # room for the cut markers
    chosen: set[int] = set()
    for level in (2, 1):
        for i, lv, t in reversed(shown):
            size = len(t.encode()) + 1
            if lv == level and size <= budget:
                chosen.add(i)
                budget -= size
    out: list[str] = []
    skipped = 0
    for i, _lv, t in shown:
        if i in chosen:
            if skipped:
                out.append(f"[... {skipped} lines cut ...]")
                skipped = 0
            out.append(t)
        else:
            skipped += 1
    if skipped:
        out.append(f"[... {skipped} lines cut ...]")
    result = "\n".join(out)
    while len(result.encode()) > cap_bytes and out:  # markers pushed it over: drop from the start
        out.pop(0)
        result = "\n".join(out)
    return result


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    return value


# the card's limits an anomaly of each kind is checked against: the card's section, and per limit its field,
# the metric's name, its key in the evidence and the limit's format
_LIMITS: dict[str, tuple[str, list[tuple[str, str, str, str]]]] = {
    "memory": (
        "memory",
        [
            ("max_bytes_per_token", "bytes per token", "bytes_per_token", "g"),
            ("max_peak_bytes", "peak bytes", "peak_bytes", "g"),
            ("max_peak_growth", "peak growth over baseline", "peak_growth", "g"),
        ],
    ),
    "resource": (
        "resources",
        [
            ("max_spills", "register spills", "n_spills", ""),
            ("max_occupancy_drop", "occupancy drop vs baseline", "occupancy_drop", "g"),
        ],
    ),
}


def expected_metrics(kind: str, evidence: dict[str, Any], card: Card | None, on_cpu: bool) -> list[dict]:
    """The card's thresholds that bear on this kind, next to the measured values in the evidence."""
    ev = evidence
    out: list[dict[str, Any]] = []

    def add(metric: str, expected: str, measured: Any, why: str | None = None) -> None:
        """``why``: the reason a value that is None could not be computed ("undefined: ...")."""
        if measured is None:
            measured = f"undefined: {why}" if why else "not measured"
        out.append({"metric": metric, "expected": expected, "measured": _fmt(measured)})

    if kind in ("slower", "faster", "ambiguous") and card and card.performance:
        cmp = RunComparison.from_stored(ev)  # the run-level ratio is the one the verdict is made on
        add("median ratio to baseline", f"<= {1 + card.max_slowdown(on_cpu):.3g}", cmp.run_ratio, cmp.reason)
        if cmp.within.p_value is not None:
            add("Mann-Whitney p", f"< {card.performance.alpha:g}", cmp.within.p_value)
    if kind in ("noisy", "ambiguous") and card:
        limit = card.max_cv(on_cpu)
        if limit is not None:
            n = ev.get("n_candidate", ev.get("n"))
            few = f"{n} sample(s), a cv needs 2" if isinstance(n, int) and n < 2 else None
            cv = finite_or_none(ev["cv"]) if "cv" in ev else Comparison.from_stored(ev).cv_candidate
            add("cv of samples", f"<= {limit:.3g}", cv, few)
    if kind == "correctness":
        add("reference check", "pass on every seed", ev.get("max_abs_err", "fail"))
        if card and card.correctness:
            for name, limit in card.correctness.max_metrics.items():
                add(name, f"<= {limit:g}", ev.get(name))
    if kind in _LIMITS and card:
        section_name, limits = _LIMITS[kind]
        section = getattr(card, section_name)
        for name, metric, key, spec in limits if section else ():
            limit = getattr(section, name)
            if limit is not None:
                add(metric, f"<= {format(limit, spec)}", ev.get(key))
    if kind == "hw_fraction":
        fractions = ev.get("fractions") or {}
        add(
            "fraction of hardware limit",
            f">= {ev.get('min')}",
            max(fractions.values()) if fractions else None,
        )
    if kind in ("timeout", "crashed", "error", "invalid"):
        add("trial completes", "ok", ev.get("status", kind))
    if kind == "throttled":
        add("throttled samples", "0", ev.get("throttled"))
    moved = performance(stored(ev.get("environment")))
    if moved:  # the trial and its baseline ran in other environments (jobs.judge.acceptance): one short line
        add("environment vs baseline", "unchanged", changed_text(moved, ENV_CAP))
    return out


# ---- the whole set -----------------------------------------------------------------------------------
def compress_one(f: AnomalyFacts, cap_bytes: int = LOG_CAP_BYTES) -> dict[str, Any]:
    base = dict(f.baseline_config or {})
    if f.baseline_backend is not None:
        base["backend"] = f.baseline_backend
    return {
        "id": f.id,
        "fingerprint": f.fingerprint,
        "kind": f.kind,
        "severity": f.severity,
        "message": f.message[:500],
        "interface": {
            "family": f.family,
            "backend": f.backend,
            "signature": signature(f.family, f.backend, f.shape, f.dtype),
            "shape": {
                k: v for k, v in f.shape.items() if v is None or isinstance(v, str | int | float | bool)
            },
            "dtype": f.dtype,
        },
        "config_diff": config_diff({**f.config, "backend": f.backend}, base) if base else {},
        "log_excerpt": compress_log(f.log_text, at=f.failed_at, cap_bytes=cap_bytes) if f.log_text else "",
        "expected_metrics": f.thresholds,
        "prohibitions": list(PROHIBITIONS),
        **({"device": f.device} if f.device in ("cpu", "gpu") else {}),
    }


def raw_size(f: AnomalyFacts) -> int:
    """What sending this anomaly raw would cost: its log, evidence, config and message, as JSON."""
    raw = {
        "log": f.log_text,
        "evidence": f.evidence,
        "config": f.config,
        "shape": f.shape,
        "message": f.message,
    }
    return len(json.dumps(raw, default=str).encode())


def compress(facts: list[AnomalyFacts], cap_bytes: int = LOG_CAP_BYTES) -> Compressed:
    items: list[dict[str, Any]] = []
    duplicates: dict[str, list[str]] = {}
    for f in facts:
        if f.fingerprint in duplicates:
            duplicates[f.fingerprint].append(f.id)
            continue
        duplicates[f.fingerprint] = [f.id]
        items.append(compress_one(f, cap_bytes))
    sent = len(json.dumps(items, separators=(",", ":"), default=str).encode())
    return Compressed(
        items=items,
        duplicates={fp: ids for fp, ids in duplicates.items() if len(ids) > 1},
        raw_bytes=sum(raw_size(f) for f in facts),
        compressed_bytes=sent,
    )


def content_digest(item: dict[str, Any]) -> str:
    """What the model reads of a compressed item, as a digest: all of it but the ids, which name the
    anomaly and its point, not what was measured there."""
    content = {k: v for k, v in item.items() if k not in ("id", "fingerprint")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:32]


def without(packed: Compressed, fingerprints: set[str]) -> Compressed:
    """The compressed set less the items of `fingerprints` (sizes of what is still sent)."""
    if not fingerprints:
        return packed
    items = [i for i in packed.items if i["fingerprint"] not in fingerprints]
    return Compressed(
        items=items,
        duplicates={fp: ids for fp, ids in packed.duplicates.items() if fp not in fingerprints},
        raw_bytes=packed.raw_bytes,
        compressed_bytes=len(json.dumps(items, separators=(",", ":"), default=str).encode()),
    )


# ---- the adapter from stored anomaly rows ------------------------------------------------------------
LogSource = Callable[[Any], str | None]  # TrialRow -> its log text (None: none kept)


def facts_from_job(
    store: Any, job_id: int, *, card: Card | None = None, logs: LogSource | None = None
) -> list[AnomalyFacts]:
    """The job's stored anomalies as facts. The log of a trial is `logs(trial)` when given, else the
    trial's stored error text (the farm keeps no other log); the card defaults to the job's."""
    from jobs.judge import baselines
    from jobs.judge.acceptance import card_for

    if card is None:
        try:
            card = card_for(store, job_id)
        except (LookupError, ValueError):
            card = None
    trials = {t.id: t for t in store.trials(job_id)}
    envs = baselines.trial_envs(store, job_id)
    out = []
    for a in store.anomalies(job_id):
        t = trials.get(a.trial_id) if a.trial_id is not None else None
        if t is None:
            continue
        base = store.get_trial(a.baseline_trial_id) if a.baseline_trial_id else None
        if base is None:  # the job's own baseline backend on the same point, when it has one
            base = next(
                (
                    b
                    for b in trials.values()
                    if b.baseline and b.shape == t.shape and b.dtype == t.dtype and b is not t
                ),
                None,
            )
        env = baselines.env_of(t, envs)
        on_cpu = env is None or env.device_kind != "gpu"
        text = logs(t) if logs is not None else None
        out.append(
            AnomalyFacts(
                id=a.fingerprint,
                fingerprint=a.fingerprint,
                kind=a.kind,
                severity=a.severity,
                message=a.message,
                family=t.family,
                backend=t.backend,
                shape=t.shape,
                config=t.config,
                dtype=t.dtype,
                evidence=a.evidence or {},
                baseline_backend=base.backend if base is not None else None,
                baseline_config=base.config if base is not None else None,
                thresholds=expected_metrics(a.kind, a.evidence or {}, card, on_cpu),
                log_text=text if text is not None else (t.error or ""),
                failed_at=t.finished_at,
                device="cpu" if on_cpu else "gpu",
            )
        )
    return out
