"""The drafts of the summary batcher's model calls (gateway.summaries.batcher): what the model is asked
(the system prompt and one prompt per task), its answer read back as drafts (``_validate``: JSON that
validates as ``DraftList`` and names only the anomaly ids it was sent), and drafts restricted to some ids
(content hashes, or a batch's local ids) or mapped from a batch's local ids to content hashes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.summaries.schema import CHECK_METRICS, CHECK_OPS, Draft, DraftList

_SYSTEM_PROMPT = """\
You draft acceptance items for GPU kernel engineers. A benchmark farm found anomalies and sends each one
compressed: an id, its kind and severity, the interface (family, backend, signature), the config fields
that differ from the baseline, a short log excerpt (warnings and errors only), the card's expected metrics
next to the measured values, and prohibitions.
Answer with ONE JSON object and nothing else, in exactly this shape:
{"drafts": [{"assertion": str, "verify_how": str, "failure_signature": str,
             "needs_local_profiler": bool, "anomaly_ids": [str, ...], "check": {...} or null}]}
- assertion: one checkable statement with the numbers it must meet.
- verify_how: how an engineer verifies it on the farm (farm commands, local profilers), briefly.
- failure_signature: the pattern that identifies this failure when it recurs (a log line, a metric).
- needs_local_profiler: true only when deciding it needs a profiler run on a GPU host.
- anomaly_ids: the ids of the anomalies the draft explains; every anomaly id appears in some draft.
- check: the assertion as a check the farm runs, in its metric card's grammar, or null when no metric
  states it: {"metric": one of METRICS, "op": one of OPS, "threshold": number,
  "scope": {"family": str, "backend": str, "shapes": [{shape key: value, ...}], "dtype": str}}; scope
  fields come from the anomaly's interface (leave out the ones the check does not depend on).
  METRICS: {metrics} (cv is stdev/mean of the samples, ratio the median over the baseline's, correct
  and completes are 1 or 0). OPS: {ops}.
- device "cpu": CPU timings (no SM clock, no GPU profiler): say what can be done on a CPU.
Obey every prohibition: never write a full kernel implementation, never production SQL, never a command
to run against shared systems. Only drafts: you run nothing.
"""
# the card grammar's metrics and comparisons, named once (gateway.summaries.schema)
SYSTEM_PROMPT = _SYSTEM_PROMPT.replace("{metrics}", ", ".join(CHECK_METRICS)).replace(
    "{ops}", ", ".join(f'"{op}"' for op in CHECK_OPS)
)

TASK_PROMPTS = {
    "checklist": "Task: checklist. Write at least one assertion per anomaly; merge anomalies only when one "
    "assertion covers them.",
    "log_summary": "Task: log_summary. Group the anomalies by the failure their log excerpts show; one draft "
    "per distinct failure, its failure_signature the distinctive log line.",
}


def _restrict(drafts: list[dict[str, Any]], allowed: set[str]) -> list[dict[str, Any]]:
    """The drafts naming ``allowed`` ids, each with only those ids (content hashes)."""
    out = []
    for d in drafts:
        ids = [h for h in d["anomaly_ids"] if h in allowed]
        if ids:
            out.append({**d, "anomaly_ids": ids})
    return out


def _restrict_drafts(drafts: list[Draft], allowed: set[str]) -> list[Draft]:
    """The drafts naming ``allowed`` ids, each with only those ids, once (batch-local ids)."""
    out = []
    for d in drafts:
        ids = [i for i in dict.fromkeys(d.anomaly_ids) if i in allowed]
        if ids:
            out.append(d.model_copy(update={"anomaly_ids": ids}))
    return out


def _to_hashes(drafts: list[Draft], by_local: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for d in drafts:
        ids = [by_local[i] for i in dict.fromkeys(d.anomaly_ids) if i in by_local]
        out.append({**d.model_dump(mode="json"), "anomaly_ids": ids})
    return out


def _validate(text: str, known_ids: set[str]) -> tuple[list[Draft] | None, str]:
    """The drafts of a model answer, or None and what is wrong with it (for the repair prompt)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None, "no JSON object found in the answer"
    try:
        obj = json.loads(text[start : end + 1])
    except ValueError as e:
        return None, f"not valid JSON ({e})"
    if isinstance(obj, list):
        obj = {"drafts": obj}
    try:
        drafts = DraftList.model_validate(obj).drafts
    except ValidationError as e:
        err = e.errors()[0]
        return None, f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    for i, d in enumerate(drafts):
        unknown = [x for x in d.anomaly_ids if x not in known_ids]
        if unknown:
            return None, f"drafts.{i}.anomaly_ids: unknown ids {unknown} (known: {sorted(known_ids)})"
    if not drafts:
        return None, "drafts: empty list"
    return drafts, ""
