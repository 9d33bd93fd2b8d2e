"""The verdict: a job judged against its metric card and a baseline, assertion by assertion.

`accept(store, job_id, ...)` evaluates every check the card names on every trial (jobs.judge.checks), in the
card's order; with `confirm`, the regression results that are slower or ambiguous are re-decided by an
interleaved re-run (jobs.judge.confirm). It stores the anomalies found
(jobs.judge.anomalies; a new acceptance run
replaces the job's previous ones) and the failed assertions in the failure bank with the job's kernels
commit, a tag and a fingerprint (point + check, stable across jobs). A regression that would fail across a
change of environment that changes performance (jobs.judge.environment: torch, triton, CUDA, driver, GPU,
CPU, governor, clocks policy, threads) is ambiguous, naming the change, unless `--confirm` re-ran both sides
on one worker; what differs is kept in the assertion's numbers (`environment`) and, for the job against its
baseline, in an `environment` anomaly. `write_junit` writes one testcase per assertion; `render` prints
them. The verdict is "fail" when an assertion fails (or is ambiguous under `ambiguous="fail"`), "warn" when
some are ambiguous under `ambiguous="warn"`, else "pass".
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobs.judge import baselines, environment
from jobs.judge.anomalies import Found, contamination, throttling
from jobs.judge.checks import AMBIGUOUS, FAIL, PASS, SKIP, Context, Outcome, card_check, in_scope, run_check
from jobs.spec.cards import Card, load_card
from jobs.spec.sweep import loads_spec
from jobs.store import AnomalyRecord, FailureRecord, Job, Judging, Store, TrialRow
from kernels.base import trial_label as label_of

if TYPE_CHECKING:  # the runner imports Ray: only `farm accept --confirm` needs it (jobs.judge.confirm)
    from jobs.run.runner import RunOptions

EXIT_PASS, EXIT_FAIL = 0, 1
AMBIGUOUS_MODES = ("fail", "warn")


@dataclass
class AssertionResult:
    check: str
    trial: TrialRow
    label: str
    result: Outcome
    baseline_trial_id: int | None = None

    @property
    def outcome(self) -> str:
        return self.result.outcome

    @property
    def fingerprint(self) -> str:
        return baselines.digest([baselines.point_ident(self.trial), "assert", self.check])

    def failure(self, card: str, job: Job, tag: str | None) -> FailureRecord:
        """This failed assertion as the failure bank keeps it."""
        return FailureRecord(
            trial_id=self.trial.id, card=card, assertion=self.check, outcome=self.outcome,
            fingerprint=self.fingerprint, label=self.label, message=self.result.reason,
            evidence=self.result.numbers, git_commit=job.git_commit, tag=tag,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "trial_id": self.trial.id,
            "label": self.label,
            "outcome": self.outcome,
            "reason": self.result.reason,
            "numbers": self.result.numbers,
            "anomaly": self.result.anomaly,
            "fingerprint": self.fingerprint,
        }


@dataclass
class Acceptance:
    job_id: int
    card: Card
    ambiguous: str
    baseline: str | None
    baseline_job: int | None
    results: list[AssertionResult] = field(default_factory=list)
    anomalies: list[Found] = field(default_factory=list)
    confirm_job: int | None = None
    # what differs from the environments of the baseline's trials to the job's (jobs.judge.environment)
    environment: list[environment.Difference] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.outcome for r in self.results))

    def failed(self) -> list[AssertionResult]:
        bad = (FAIL, AMBIGUOUS) if self.ambiguous == "fail" else (FAIL,)
        return [r for r in self.results if r.outcome in bad]

    @property
    def verdict(self) -> str:
        if self.failed():
            return "fail"
        return "warn" if any(r.outcome == AMBIGUOUS for r in self.results) else "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.verdict == "fail" else EXIT_PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "card": self.card.name,
            "baseline": self.baseline,
            "baseline_job": self.baseline_job,
            "ambiguous": self.ambiguous,
            "verdict": self.verdict,
            "counts": self.counts(),
            "confirm_job": self.confirm_job,
            "assertions": [r.to_dict() for r in self.results],
            "anomalies": [asdict(a.record()) for a in self.anomalies],
            "environment": [d.to_list() for d in self.environment],
        }


def trial_label(t: TrialRow) -> str:
    return label_of(t.backend, t.shape, t.config, t.dtype, seq=t.seq)


def card_of(job: Job, name: str | None = None) -> Card:
    """The card named, else the job spec's `card:`, else the family's own card."""
    if name is None:
        name = loads_spec(job.spec, source=f"job {job.id} spec").card or job.family
    card = load_card(name)
    if card.family is not None and card.family != job.family:
        raise ValueError(f"card {card.name} is for family {card.family}, job {job.id} is {job.family}")
    return card


def card_for(store: Store, job_id: int, name: str | None = None) -> Card:
    """card_of the stored job (LookupError when there is none)."""
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    return card_of(job, name)


def judged(store: Store, job_id: int, baseline: str | None = None) -> Judging:
    """Everything the job is judged on, read once (jobs.store.judging): its trials, their environments,
    the baseline (the one named, else the newest of its family matching a point) and the kept samples."""
    found = store.judging(job_id, key=baselines.point_key, baseline=baseline)
    if found is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    return found


def contexts(store: Store, judging: Judging, card: Card) -> dict[int, Context]:
    """What the checks of each trial of the judged job see; samples not read with the job (the re-runs of
    --confirm) are read from the store when a check asks for them."""

    def samples(trial_id: int) -> list[int]:
        if trial_id not in judging.samples:
            judging.samples[trial_id] = store.kept_samples(trial_id)
        return judging.samples[trial_id]

    out = {}
    for t in judging.trials:
        base = judging.matches.get(t.id)
        env = judging.env_of(t)
        out[t.id] = Context(card, t, env, base, samples, judging.env_of(base) if base is not None else None)
    return out


def accept(
    store: Store,
    job_id: int,
    *,
    card: str | None = None,
    baseline: str | None = None,
    ambiguous: str | None = None,
    confirm: bool = False,
    rounds: int = 3,
    tag: str | None = None,
    options: RunOptions | None = None,
) -> Acceptance:
    if ambiguous is not None and ambiguous not in AMBIGUOUS_MODES:
        raise ValueError(f"ambiguous must be one of {AMBIGUOUS_MODES} (got {ambiguous!r})")
    judging = judged(store, job_id, baseline)
    job, base, trials = judging.job, judging.baseline, judging.trials
    the_card = card_of(job, card)
    if baseline is not None and not judging.matches:  # asked for by name: judging nothing is no pass
        raise ValueError(
            f"baseline {baseline!r} matches no trial of job {job_id} (another family, other points, or "
            "another environment class: GPU model or CPU)"
        )
    by_trial = contexts(store, judging, the_card)
    if ambiguous is None:  # not given: "fail", except on CPU timings, where the card decides (warn)
        on_cpu = any(c.on_cpu for c in by_trial.values())
        ambiguous = the_card.cpu.ambiguous if on_cpu else "fail"
    acc = Acceptance(job_id, the_card, ambiguous, base.name if base else None, base.job_id if base else None)
    acc.results = assertions(the_card, trials, by_trial)
    across_environment(acc.results, by_trial)
    if confirm:
        _confirm(store, job, acc, by_trial, rounds, options)
        across_environment(acc.results, by_trial)  # a re-run of B alone still stands on the old baseline
    acc.environment = environment.changes(
        [judging.env_of(b) for b in judging.matches.values()],
        [judging.env_of(t) for t in trials if t.id in judging.matches],
    )
    acc.anomalies = [
        Found(r.result.anomaly, r.trial, r.result.reason, r.result.numbers, r.baseline_trial_id)
        for r in acc.results
        if r.result.anomaly
    ] + throttling(trials)
    flagged = {(a.trial.id, a.kind) for a in acc.anomalies}
    acc.anomalies += [a for a in contamination(trials) if (a.trial.id, a.kind) not in flagged]
    found = [a.record() for a in acc.anomalies] + environment_anomaly(acc, job)
    store.record_verdict(job_id, found, [r.failure(the_card.name, job, tag) for r in acc.failed()])
    return acc


def on_time(r: AssertionResult) -> bool:
    """Whether the assertion judges the trial's time against its baseline's: the regression check, or a
    scoped check on the ratio."""
    return r.check == "regression" or r.result.numbers.get("metric") == "ratio"


def across_environment(results: list[AssertionResult], contexts: dict[int, Context]) -> None:
    """Each assertion on time whose trial and baseline trial ran in different environments keeps what
    differs (its numbers' `environment`); one that fails across a performance change is ambiguous, naming
    it, unless --confirm re-ran the baseline beside it on one worker (`baseline_rerun`)."""
    for r in results:
        c = contexts[r.trial.id]
        if not on_time(r) or c.baseline is None:
            continue
        if _gpu_types_differ(r, c):
            continue
        diffs = environment.changes(c.baseline_env, c.env)
        if not diffs:
            continue
        r.result.numbers["environment"] = [d.to_list() for d in diffs]
        if (
            r.outcome == FAIL
            and environment.performance(diffs)
            and not r.result.numbers.get("baseline_rerun")
        ):
            text = f"ambiguous: {environment.ambiguous_reason(diffs)}; {r.result.reason}"
            r.result = Outcome(AMBIGUOUS, text, r.result.numbers, r.result.anomaly and "ambiguous")


def _gpu_types_differ(r: AssertionResult, c: Context) -> bool:
    """GPU types are never mixed in one comparison (issue 47): a time assertion whose trial and baseline
    trial ran on different GPU types (as their nodes declare them) is ambiguous, naming both, unless
    --confirm re-ran the baseline beside it on one worker."""
    ours, theirs = r.trial.gpu_type, c.baseline.gpu_type if c.baseline is not None else None
    if ours is None or theirs is None or ours == theirs or r.result.numbers.get("baseline_rerun"):
        return False
    text = f"ambiguous: not compared across GPU types (baseline on {theirs}, this trial on {ours})"
    r.result = Outcome(AMBIGUOUS, text, r.result.numbers | {"gpu_types": [theirs, ours]}, "ambiguous")
    return True


def environment_anomaly(acc: Acceptance, job: Job) -> list[AnomalyRecord]:
    """The job's environment against its baseline's, as an anomaly of the job (no trial): a `warning` when
    a component that changes performance differs, `info` when only others (host) do; none when only the
    code (the kernel source) differs, which is what the farm judges."""
    shown = [d for d in acc.environment if d.kind != environment.CODE]
    if not shown:
        return []
    perf = environment.performance(shown)
    words = "changed" if perf else "differs (no effect on the verdict)"
    since = f"since baseline {acc.baseline} (job {acc.baseline_job})"
    message = f"environment {words} {since}: {environment.changed_text(shown)}"
    return [
        AnomalyRecord(
            trial_id=None, kind="environment", severity="warning" if perf else "info",
            fingerprint=baselines.digest(["environment", job.family, [d.to_list() for d in shown]]),
            message=message, evidence={"baseline_job": acc.baseline_job,
                                       "changes": [d.to_list() for d in acc.environment]},
        )
    ]  # fmt: skip


def assertions(card: Card, trials: list[TrialRow], by_trial: dict[int, Context]) -> list[AssertionResult]:
    """Every assertion of the card on every trial, then its scoped checks (promoted from reviewed
    drafts) on the trials in their scope, in the card's order."""
    out = []
    for check in card.assertions:
        for t in trials:
            c = by_trial[t.id]
            out.append(AssertionResult(check, t, trial_label(t), run_check(check, c), _base_id(c)))
    for chk in card.checks:
        for t in trials:
            if in_scope(chk, t):
                c = by_trial[t.id]
                out.append(AssertionResult(chk.name, t, trial_label(t), card_check(chk, c), _base_id(c)))
    return out


def _base_id(c: Context) -> int | None:
    return c.baseline.id if c.baseline else None


def _confirm(
    store: Store,
    job: Any,
    acc: Acceptance,
    contexts: dict[int, Context],
    rounds: int,
    options: RunOptions | None,
) -> None:
    from jobs.judge.confirm import confirm  # imports the runner's Ray side only when asked

    suspicious = [r for r in acc.results if r.check == "regression" and r.outcome in (FAIL, AMBIGUOUS)]
    if not suspicious:
        return
    done = confirm(store, job, [contexts[r.trial.id] for r in suspicious], rounds=rounds, options=options)
    acc.confirm_job = done.job_id
    for r in suspicious:
        if r.trial.id in done.outcomes:
            first = r.result
            r.result = done.outcomes[r.trial.id]
            r.result.numbers["job_verdict"] = {"outcome": first.outcome, "reason": first.reason}
            if "baseline_job" in first.numbers:  # still judged against that baseline
                r.result.numbers.setdefault("baseline_job", first.numbers["baseline_job"])


# ---- output ------------------------------------------------------------------------------------------

_STYLE = {PASS: "green", FAIL: "bold red", AMBIGUOUS: "yellow", SKIP: "dim"}


def _numbers_text(numbers: dict[str, Any], limit: int = 6) -> str:
    keys = ("ratio", "ci_low", "ci_high", "p_value", "cv", "max_cv", "max_abs_err", "bytes_per_token")
    shown = [(k, numbers[k]) for k in keys if numbers.get(k) is not None][:limit]
    dropped = numbers.get("outliers_dropped")
    if isinstance(dropped, int) and dropped and len(shown) < limit:  # stability: the count its reason names
        shown.append(("outliers_dropped", dropped))
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown)


def render(acc: Acceptance, console: Console, verbose: bool = False) -> None:
    """The assertions that did not pass (every one with `verbose`), the counts and the verdict."""
    base = f"baseline {acc.baseline} (job {acc.baseline_job})" if acc.baseline else "no baseline"
    console.print(f"[bold]job {acc.job_id}[/bold] against card {acc.card.name}, {base}")
    for line in environment.summary_lines(acc.environment):
        console.print(escape(line))
    shown = acc.results if verbose else [r for r in acc.results if r.outcome in (FAIL, AMBIGUOUS)]
    hidden = len(acc.results) - len(shown)
    table = Table()
    for col in ("assertion", "trial", "result", "reason", "numbers"):
        table.add_column(col, overflow="fold")
    for r in shown:
        style = _STYLE[r.outcome]
        table.add_row(
            r.check,
            escape(r.label),
            f"[{style}]{r.outcome}[/{style}]",
            escape(r.result.reason),
            escape(_numbers_text(r.result.numbers)),
        )
    if shown:
        console.print(table)
    if hidden:
        console.print(f"{hidden} assertions passed or skipped (--verbose lists every assertion)")
    counts = " ".join(f"{k} {v}" for k, v in sorted(acc.counts().items()))
    kinds = Counter(a.kind for a in acc.anomalies)
    console.print(f"assertions: {counts}; anomalies: {dict(kinds) or 'none'}")
    if acc.confirm_job is not None:
        console.print(f"confirmation runs: job {acc.confirm_job}")
    else:
        suspects = [r for r in acc.results if r.check == "regression" and r.outcome in (FAIL, AMBIGUOUS)]
        if suspects:
            console.print(
                f"{len(suspects)} regression suspect(s): `farm accept {acc.job_id} --confirm` re-runs "
                "each interleaved with its baseline (A/B rounds on one worker) before calling it"
            )
    console.print(
        f"verdict: [{_STYLE.get(acc.verdict, 'yellow')}]{acc.verdict}[/] (ambiguous -> {acc.ambiguous})"
    )


def write_junit(acc: Acceptance, path: Path) -> None:
    """One <testcase> per assertion: failures as <failure>, skips as <skipped>, ambiguous as <failure
    type="ambiguous"> under --ambiguous fail and as a passing case with its reason in <system-out> under
    warn. Every case carries its outcome and fingerprint as properties."""
    failed = {id(r) for r in acc.failed()}
    suite = ET.Element(
        "testsuite",
        name=f"farm.accept.job{acc.job_id}",
        tests=str(len(acc.results)),
        failures=str(len(failed)),
        errors="0",
        skipped=str(sum(1 for r in acc.results if r.outcome == SKIP)),
    )
    for r in acc.results:
        case = ET.SubElement(
            suite, "testcase", classname=f"card.{acc.card.name}.{r.check}", name=r.label, time="0"
        )
        props = ET.SubElement(case, "properties")
        for name, value in (("outcome", r.outcome), ("fingerprint", r.fingerprint), ("trial_id", r.trial.id)):
            ET.SubElement(props, "property", name=name, value=str(value))
        detail = f"{r.result.reason}\n{_numbers_text(r.result.numbers, limit=12)}"
        if id(r) in failed:
            ET.SubElement(case, "failure", message=r.result.reason[:500], type=r.outcome).text = detail
        elif r.outcome == SKIP:
            ET.SubElement(case, "skipped", message=r.result.reason[:500])
        elif r.outcome == AMBIGUOUS:
            ET.SubElement(case, "system-out").text = f"AMBIGUOUS (warn): {detail}"
    root = ET.Element("testsuites", name="farm accept")
    root.append(suite)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# ---- the failure bank --------------------------------------------------------------------------------


@dataclass
class Recurring:
    fingerprint: str
    assertion: str
    label: str
    jobs: list[int]
    commits: list[str]
    tags: list[str]
    last_message: str
    environment: str = ""  # with by_environment: the environment's label (the components that vary)


def recurring(store: Store, min_jobs: int = 1, *, by_environment: bool = False) -> list[Recurring]:
    """Failed assertions grouped by fingerprint, the ones seen in the most jobs first. `by_environment`:
    by fingerprint and the environment the trial ran in, labelled by the performance components whose
    value is not the same across the bank (a failure seen on one torch version only reads `torch 2.13.0`),
    or by torch and triton when none varies."""
    fps = {i: environment.fingerprint(env) for i, env in store.bank_environments().items()}
    shown = environment.varying(fps.values()) or ["gpu", "torch", "triton"]
    groups: dict[tuple[str, str], Recurring] = {}
    # a group's jobs, commits and tags as dicts (insertion-ordered sets): a membership test a bank entry,
    # not a scan of the group's list (a fingerprint seen in a year's 1,500 jobs made the listing quadratic)
    seen: dict[tuple[str, str], tuple[dict, dict, dict]] = {}
    for f in store.bank_rows():
        where = environment.label(fps[f.environment_id], shown) if by_environment else ""
        key = (f.fingerprint, where)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Recurring(f.fingerprint, f.assertion, f.label, [], [], [], "", where)
            seen[key] = ({}, {}, {})
        jobs, commits, tags = seen[key]
        jobs[f.job_id] = None
        if f.git_commit:
            commits[f.git_commit] = None
        if f.tag:
            tags[f.tag] = None
        g.label, g.last_message = f.label, f.message
    for key, g in groups.items():
        g.jobs, g.commits, g.tags = (list(d) for d in seen[key])
    out = [g for g in groups.values() if len(g.jobs) >= min_jobs]
    return sorted(out, key=lambda g: (-len(g.jobs), -max(g.jobs)))
