"""The review of drafts: list them, accept, reject or send them to a profiler, run a draft's check on its
job's data, and promote an accepted draft's check into a metric card (`farm drafts ...`).

A draft's check is in the metric card's grammar (jobs.spec.cards.CardCheck): `validate_check` checks what
a model (or the offline drafter) wrote against the card schema; a draft whose check does not validate
keeps its prose, and its `check_error` says why. `promote` writes the check into the card's `checks:` list
with ruamel.yaml's round trip, so the card keeps its comments and layout, with the draft's id and the date
beside it; from then on `farm accept` runs it. An anomaly whose latest draft was rejected is not sent to
the model again with the same content (`rejected_fingerprints`, used by jobs.drafts.client).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs.spec.cards import Card, CardCheck, CardError, parse_card, parse_check
from jobs.store import DRAFT_NEW, DraftRow, Store, now

NEW, ACCEPTED, REJECTED, NEEDS_PROFILER = DRAFT_NEW, "accepted", "rejected", "needs_profiler"
STATES = (NEW, ACCEPTED, REJECTED, NEEDS_PROFILER)


class ReviewError(ValueError):
    """A review step that cannot be done as asked (bad input: exit 2); the message says why and what to do."""


def validate_check(check: Any, card: Card | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the check as the card would hold it, None) or (None, why it does not validate); (None, None)
    when the draft has no check."""
    if check is None:
        return None, None
    if isinstance(check, dict) and set(check) == {"_invalid"}:  # the summaries schema's mark of a non-mapping
        check = check["_invalid"]
    try:
        chk = parse_check(check, card, source="check")
    except CardError as err:
        return None, "; ".join(err.problems)[:2000]
    return chk.model_dump(mode="json", exclude_none=True, exclude={"draft"}), None


def list_drafts(store: Store, job_id: int | None = None) -> list[DraftRow]:
    with Session(store.engine, expire_on_commit=False) as s:
        q = select(DraftRow).order_by(DraftRow.id)
        if job_id is not None:
            q = q.where(DraftRow.job_id == job_id)
        return list(s.scalars(q))


def get_draft(store: Store, draft_id: int) -> DraftRow:
    with Session(store.engine, expire_on_commit=False) as s:
        row = s.get(DraftRow, draft_id)
    if row is None:
        raise ReviewError(f"no draft {draft_id} in {store.url}; `farm drafts list` shows the drafts")
    return row


def review(store: Store, draft_id: int, state: str, reason: str | None = None) -> DraftRow:
    if state not in STATES[1:]:
        raise ReviewError(f"state must be one of {STATES[1:]} (got {state!r})")
    get_draft(store, draft_id)
    with Session(store.engine) as s, s.begin():
        s.execute(
            update(DraftRow)
            .where(DraftRow.id == draft_id)
            .values(state=state, reason=reason, reviewed_at=now())
        )
    return get_draft(store, draft_id)


def rejected_fingerprints(store: Store, contents: Mapping[str, str]) -> set[str]:
    """Those of `contents` (fingerprint -> content digest of the item about to be sent) whose latest draft
    (in any job) was rejected for the same content: an anomaly at the same point that now says something
    else is sent again. A draft stored before digests were kept stands for any content of its anomalies."""
    latest: dict[str, tuple[str, str | None]] = {}
    with Session(store.engine) as s:
        rows = s.execute(
            select(DraftRow.fingerprints, DraftRow.contents, DraftRow.state).order_by(DraftRow.id)
        )
        for fps, digests, state in rows:
            for fp in fps or ():
                if fp in contents:
                    latest[fp] = (state, (digests or {}).get(fp))
    return {
        fp
        for fp, (state, digest) in latest.items()
        if state == REJECTED and (digest is None or digest == contents[fp])
    }


def draft_check(row: DraftRow, card: Card | None = None) -> CardCheck:
    """The draft's check as a card check, or ReviewError saying why it has none."""
    if row.check_spec is None:
        why = f"its check does not validate: {row.check_error}" if row.check_error else "it carries no check"
        raise ReviewError(f"draft {row.id} has no check to run: {why}")
    try:
        return parse_check({**row.check_spec, "draft": row.id}, card, source=f"draft {row.id}")
    except CardError as err:
        raise ReviewError(str(err)) from None


@dataclass
class CheckRun:
    check: CardCheck
    results: list[Any]  # jobs.judge.acceptance.AssertionResult, one per trial in scope

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    @property
    def holds(self) -> bool:
        """At least one trial judged and none failed."""
        return not self.counts.get("fail") and bool(self.counts.get("pass"))


def check_on_job(store: Store, draft_id: int, job_id: int | None = None) -> CheckRun:
    """Run the draft's check on the trials of its job (or `job_id`) in its scope; stores nothing."""
    from jobs.judge.acceptance import AssertionResult, card_of, contexts, judged, trial_label
    from jobs.judge.checks import card_check, in_scope

    row = get_draft(store, draft_id)
    judging = judged(store, row.job_id if job_id is None else job_id)
    card = card_of(judging.job)
    chk = draft_check(row, card)
    by_trial = contexts(store, judging, card)
    results = [
        AssertionResult(chk.name, t, trial_label(t), card_check(chk, by_trial[t.id]))
        for t in judging.trials
        if in_scope(chk, t)
    ]
    return CheckRun(chk, results)


def _yaml():
    from ruamel.yaml import YAML

    y = YAML()  # round trip: comments, key order and flow style are kept
    y.preserve_quotes = True
    y.width = 110
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def promote(store: Store, draft_id: int, card_path: Path, *, today: date | None = None) -> CardCheck:
    """Write the accepted draft's check into the card at `card_path`, keeping its comments and layout, with
    the draft's id and the date beside it; mark the draft promoted there. The card is validated before it
    is written: a card that would not load is never written."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    row = get_draft(store, draft_id)
    if row.state != ACCEPTED:
        raise ReviewError(
            f"draft {draft_id} is {row.state}: only an accepted draft is promoted "
            f"(farm drafts review {draft_id} --accept)"
        )
    try:
        text = card_path.read_text()
    except OSError as err:
        raise ReviewError(f"cannot read the card {card_path}: {err.strerror or err}") from None
    y = _yaml()
    data = y.load(text)
    card = parse_card(_plain(data), str(card_path))
    chk = draft_check(row, card)
    if any(c.model_dump(exclude={"draft"}) == chk.model_dump(exclude={"draft"}) for c in card.checks):
        raise ReviewError(f"{card_path} already has this check ({chk.text()})")
    entry = CommentedMap()
    entry["metric"] = chk.metric
    entry["op"] = chk.op
    entry["threshold"] = chk.threshold
    scope = CommentedMap((k, v) for k, v in chk.scope.model_dump(exclude_none=True).items())
    if scope:
        scope.fa.set_flow_style()
        entry["scope"] = scope
    entry["draft"] = row.id
    entry.yaml_add_eol_comment(f"draft {row.id}, promoted {(today or date.today()).isoformat()}", "draft")
    checks = data.get("checks")
    if checks is None:
        checks = CommentedSeq()
        data["checks"] = checks
    checks.append(entry)
    out = io.StringIO()
    y.dump(data, out)
    new_text = out.getvalue()
    parse_card(_plain(_yaml().load(new_text)), str(card_path))  # the card as `farm accept` will load it
    card_path.write_text(new_text)
    with Session(store.engine) as s, s.begin():
        s.execute(update(DraftRow).where(DraftRow.id == row.id).values(promoted_to=str(card_path)))
    return chk


def _plain(node: Any) -> Any:
    """ruamel's commented containers as plain dicts and lists (what the card schema validates)."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node
