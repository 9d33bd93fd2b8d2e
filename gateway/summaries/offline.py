"""The offline drafter (provider kind ``local``): deterministic, rule-based drafts from the anomaly fields.

No network and no model: the same anomalies always give the same drafts, each marked ``[offline]`` so
nobody mistakes them for a model's. It lets ``make run`` show the whole acceptance workflow on a laptop.
``checklist`` writes one draft per anomaly; ``log_summary`` one per distinct failure signature. Either way
every anomaly id is named by exactly one draft (the batcher requires every id to be covered), and every
draft stays within the ``Draft`` field limits whatever the anomalies say. A checklist draft carries its
assertion as a check in the metric card's grammar (``DraftCheck``) when a card threshold states it, scoped
to the anomaly's point; on CPU timings (``device: cpu``) the ways to verify are ones a CPU allows.
"""

from __future__ import annotations

import re

from gateway.summaries.schema import AnomalyIn, CheckScope, Draft, DraftCheck

OFFLINE_MARK = "[offline]"

# kind -> (how to verify, needs a local profiler)
_VERIFY: dict[str, tuple[str, bool]] = {
    "correctness": (
        "re-run the trial on every seed against the fp32 torch reference (farm sweep resume)",
        False,
    ),
    "slower": ("farm accept JOB --confirm: interleaved re-runs against the baseline point", False),
    "faster": ("check the output against the reference and the work done (FLOPs, bytes) per call", False),
    "ambiguous": ("farm accept JOB --confirm with more rounds; pin the GPU clock", False),
    "noisy": ("re-run with the SM clock recorded; compare the kept samples' cv to the card", False),
    "timeout": ("re-run the single trial with a longer timeout and read where it stalls", True),
    "crashed": ("re-run the single trial alone on one worker and keep its stderr", False),
    "error": ("re-run the single trial and read the exception in its log excerpt", False),
    "memory": ("sample peak memory and bytes per token of the trial against the baseline point", False),
    "hw_fraction": ("profile the kernel locally (ncu: dram throughput, SM busy) on the same shape", True),
    "resource": ("compile the config locally and read spills and occupancy (ncu / triton asm)", True),
    "throttled": (
        "re-run with clocks locked and discard samples taken under 75% of the default clock",
        False,
    ),
}
# on CPU timings: no SM clock to record or pin, no GPU profiler; what an engineer can do on a CPU instead
_VERIFY_CPU: dict[str, tuple[str, bool]] = {
    "slower": (
        "farm accept JOB --confirm --rounds 5: baseline and candidate interleaved on one worker, so a shared "
        "CPU's load hits both alike",
        False,
    ),
    "ambiguous": (
        "farm accept JOB --confirm --rounds 5 against a named baseline (farm baseline set); CPU timings "
        "of one run cannot tell a 1.9x swing from a regression",
        False,
    ),
    "noisy": (
        "re-run the trial with fewer workers than CPU cores (farm sweep run SPEC --gpus 1) and nothing "
        "else busy; if the cv stays above the limit on a quiet machine, the card's cpu.max_cv is too tight",
        False,
    ),
    "timeout": (
        "re-run the single trial alone with a longer timeout_s and keep its stderr; a GPU-sized shape run "
        "in the Triton interpreter on a CPU can take minutes: shrink the shape, or time the point on a GPU",
        False,
    ),
    "throttled": (
        "on a CPU the slow samples met other load on the machine, not a clock to lock: re-run with fewer "
        "workers than CPU cores (farm sweep run SPEC --gpus 1) and nothing else busy",
        False,
    ),
    "hw_fraction": (
        "CPU timings against a GPU's peak say nothing of the kernel: time the point on a GPU host and "
        "profile it there (ncu: dram throughput, SM busy) before judging the fraction",
        True,
    ),
    "resource": (
        "the Triton interpreter on a CPU reports no spills or occupancy: compile the config on a GPU host "
        "and read them from its metadata (n_spills, n_regs) or ncu",
        True,
    ),
}
_DEFAULT_VERIFY = ("re-run the trial on the farm and compare with the baseline point", False)
_ERROR_LINE = re.compile(r"(?i)\b(error|exception|fatal|assert|failed|nan)\b")


def _metrics_text(a: AnomalyIn) -> str:
    parts = []
    for m in a.expected_metrics:
        if m.measured is None:
            parts.append(f"{m.metric} {m.expected} (not measured on this trial)")
            continue
        measured = f"{m.measured:.4g}" if isinstance(m.measured, float) else m.measured
        parts.append(f"{m.metric} {m.expected} (measured {measured})")
    return "; ".join(parts)


def _verify(a: AnomalyIn) -> tuple[str, bool]:
    if a.device == "cpu" and a.kind in _VERIFY_CPU:
        return _VERIFY_CPU[a.kind]
    return _VERIFY.get(a.kind, _DEFAULT_VERIFY)


# an expected metric's name (jobs.drafts.compress.expected_metrics) -> the card's check metric
_CHECK_METRIC = {
    "median ratio to baseline": "ratio",
    "cv of samples": "cv",
    "bytes per token": "bytes_per_token",
    "peak bytes": "peak_bytes",
    "register spills": "n_spills",
}
_THRESHOLD = re.compile(r"^\s*(<=|<|>=|>|==)\s*([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\s*$")


def draft_check(a: AnomalyIn) -> DraftCheck | None:
    """The anomaly's card threshold as a check scoped to its point, or None when no threshold states it."""
    scope = CheckScope(
        family=a.interface.family,
        backend=a.interface.backend,
        shapes=[dict(a.interface.shape)] if a.interface.shape else None,
        dtype=a.interface.dtype or None,
    )
    if a.kind == "correctness":
        return DraftCheck(metric="correct", op="==", threshold=1, scope=scope)
    if a.kind in ("timeout", "crashed", "error"):
        return DraftCheck(metric="completes", op="==", threshold=1, scope=scope)
    for m in a.expected_metrics:
        metric = _CHECK_METRIC.get(m.metric)
        found = _THRESHOLD.match(m.expected)
        if metric and found:
            try:
                threshold = float(found.group(2))
            except ValueError:
                continue
            return DraftCheck(metric=metric, op=found.group(1), threshold=threshold, scope=scope)
    return None


def _subject(a: AnomalyIn) -> str:
    return a.interface.signature or f"{a.interface.family}.{a.interface.backend}"


def failure_signature(a: AnomalyIn) -> str:
    """The last error-looking line of the excerpt, else the kind and the fingerprint."""
    lines = [ln.strip() for ln in a.log_excerpt.splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
    if errors:
        return errors[-1][:300]
    return f"{a.kind}:{a.interface.family}.{a.interface.backend}:{a.fingerprint[:12]}"


def _assertion(a: AnomalyIn) -> str:
    metrics = _metrics_text(a)
    diff = ", ".join(f"{k}={v}" for k, v in sorted(a.config_diff.items()))
    text = f"{OFFLINE_MARK} {a.kind} on {_subject(a)}"
    if diff:
        text += f" with {diff}"
    text += f": {metrics}" if metrics else f": {a.message or 'must not recur'}"
    return text[:2000]


def draft_checklist(anomalies: list[AnomalyIn]) -> list[Draft]:
    out = []
    for a in anomalies:
        how, profiler = _verify(a)
        check = draft_check(a)
        out.append(
            Draft(
                assertion=_assertion(a),
                verify_how=f"{OFFLINE_MARK} {how}",
                failure_signature=failure_signature(a),
                needs_local_profiler=profiler,
                anomaly_ids=[a.id],
                check=check.model_dump(mode="json", exclude_none=True) if check else None,
            )
        )
    return out


def draft_log_summary(anomalies: list[AnomalyIn]) -> list[Draft]:
    groups: dict[str, list[AnomalyIn]] = {}
    for a in anomalies:
        groups.setdefault(failure_signature(a), []).append(a)
    out = []
    for signature, members in groups.items():
        kinds = sorted({a.kind for a in members})
        subjects = sorted({_subject(a) for a in members})
        profiler = any(_verify(a)[1] for a in members)
        out.append(
            Draft(
                assertion=(
                    f"{OFFLINE_MARK} {len(members)} anomal{'y' if len(members) == 1 else 'ies'} "
                    f"({', '.join(kinds)}) share one failure on {', '.join(subjects)}"
                )[:2000],
                # each way to verify once (unknown kinds share the default), within the Draft's limit
                verify_how=(
                    f"{OFFLINE_MARK} "
                    + "; ".join(dict.fromkeys(_verify(a)[0] for a in sorted(members, key=lambda m: m.kind)))
                )[:2000],
                failure_signature=signature,
                needs_local_profiler=profiler,
                anomaly_ids=[a.id for a in members],
            )
        )
    return out


def offline_drafts(anomalies: list[AnomalyIn], task: str) -> list[Draft]:
    """Deterministic drafts for ``task`` (checklist | log_summary)."""
    return draft_log_summary(anomalies) if task == "log_summary" else draft_checklist(anomalies)
