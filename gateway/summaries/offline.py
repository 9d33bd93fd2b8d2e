"""The offline drafter (provider kind ``local``): deterministic, rule-based drafts from the anomaly fields.

No network and no model: the same anomalies always give the same drafts, each marked ``[offline]`` so
nobody mistakes them for a model's. It lets ``make run`` show the whole acceptance workflow on a laptop.
``checklist`` writes one draft per anomaly; ``log_summary`` one per distinct failure signature. Either way
every anomaly id is named by exactly one draft (the batcher requires every id to be covered), and every
draft stays within the ``Draft`` field limits whatever the anomalies say.
"""

from __future__ import annotations

import re

from gateway.summaries.schema import AnomalyIn, Draft

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
_DEFAULT_VERIFY = ("re-run the trial on the farm and compare with the baseline point", False)
_ERROR_LINE = re.compile(r"(?i)\b(error|exception|fatal|assert|failed|nan)\b")


def _metrics_text(a: AnomalyIn) -> str:
    parts = []
    for m in a.expected_metrics:
        measured = f"{m.measured:.4g}" if isinstance(m.measured, float) else m.measured
        parts.append(f"{m.metric} {m.expected} (measured {measured})")
    return "; ".join(parts)


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
        how, profiler = _VERIFY.get(a.kind, _DEFAULT_VERIFY)
        out.append(
            Draft(
                assertion=_assertion(a),
                verify_how=f"{OFFLINE_MARK} {how}",
                failure_signature=failure_signature(a),
                needs_local_profiler=profiler,
                anomaly_ids=[a.id],
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
        profiler = any(_VERIFY.get(k, _DEFAULT_VERIFY)[1] for k in kinds)
        out.append(
            Draft(
                assertion=(
                    f"{OFFLINE_MARK} {len(members)} anomal{'y' if len(members) == 1 else 'ies'} "
                    f"({', '.join(kinds)}) share one failure on {', '.join(subjects)}"
                )[:2000],
                # each way to verify once (unknown kinds share the default), within the Draft's limit
                verify_how=(
                    f"{OFFLINE_MARK} "
                    + "; ".join(dict.fromkeys(_VERIFY.get(k, _DEFAULT_VERIFY)[0] for k in kinds))
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
