"""The one read a verdict makes: a job with everything it is judged on, in one session.

`farm accept` (jobs.judge.acceptance) asks for the job, its trials and their environments, the baseline
it is compared to with the baseline trial matching each of its trials (and their environments), and the
kept samples of all of those trials, once; the judging itself then runs on what it got, without coming
back to the store.

The baseline is the one named, else the newest baseline of the job's family, other than the job itself,
that has a point of the job. Points are matched by the caller's `key` (jobs.judge.baselines.match_key of
the trial and its environment's class): the store keeps the keys, the judge says what a point is. A job's
report asks for the baselines as they stood when the job ended (`baseline_matches(as_of=...)`): a baseline
moved since is matched on the job it was on then, its points taken from that job's trials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from jobs.store.sample_codec import unpack
from jobs.store.tables import Baseline, BaselineMove, BaselineTrial, Environment, Job, Sample, TrialRow
from jobs.store.trial_store import kept
from kernels.base import TrialStatus

PointKey = Callable[[TrialRow, Environment | None], str]  # a trial and its environment -> its match key


@dataclass
class Judging:
    """A job as its verdict sees it."""

    job: Job
    trials: list[TrialRow]  # in grid order
    environments: dict[
        int, Environment
    ]  # environment id -> row, for the job's and its matched baseline trials
    baseline: Baseline | None = None
    matches: dict[int, TrialRow] = field(default_factory=dict)  # the job's trial id -> its baseline trial
    samples: dict[int, list[int]] = field(default_factory=dict)  # trial id -> kept samples (ns)

    def env_of(self, t: TrialRow) -> Environment | None:
        return self.environments.get(t.environment_id) if t.environment_id is not None else None

    def kept_samples(self, trial_id: int) -> list[int]:
        """The kept samples of a trial of the job or of a matched baseline trial."""
        return self.samples.get(trial_id, [])


class JudgingStore:
    """The read of jobs.store.Store that a verdict makes."""

    engine: Engine

    def judging(
        self, job_id: int, *, key: PointKey, baseline: str | None = None, samples: bool = True
    ) -> Judging | None:
        """The job (None when there is none) with its baseline (LookupError for an unknown name) and,
        unless `samples` is False, the kept samples of its trials and of the matched baseline trials."""
        with Session(self.engine, expire_on_commit=False) as s:
            named = _named(s, baseline) if baseline is not None else None
            job = s.get(Job, job_id)
            if job is None:
                return None
            trials = list(s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.seq)))
            used = select(TrialRow.environment_id).where(TrialRow.job_id == job_id)
            envs = {e.id: e for e in s.scalars(select(Environment).where(Environment.id.in_(used)))}
            out = Judging(job, trials, envs)
            # the job's trial id -> the baseline trial id of its point
            out.baseline, matched = _matched(s, job, trials, out.env_of, key, named)
            rows = {r.id: r for r in _trials(s, set(matched.values()))}
            out.matches = {tid: rows[bid] for tid, bid in matched.items() if bid in rows}
            theirs = {r.environment_id for r in rows.values() if r.environment_id is not None} - set(envs)
            if theirs:  # the baseline trials' environments: what a verdict compares the job's with
                envs.update(
                    (e.id, e) for e in s.scalars(select(Environment).where(Environment.id.in_(theirs)))
                )
            if samples:
                out.samples = _kept_samples(s, job_id, list(rows.values()), trials)
            return out

    def baseline_matches(
        self,
        job: Job,
        trials: list[TrialRow],
        environments: Iterable[Environment],
        *,
        key: PointKey,
        baseline: str | None = None,
        as_of: datetime | None = None,
    ) -> tuple[Baseline | None, dict[int, int]]:
        """The baseline `judging` finds for the job and the job's trial id -> its matched baseline
        trial's id (those still stored), from the job's trials and their environments as read already
        (a job's report): the baseline's points and its matched trials' ids are read, not its trials.
        `as_of`: the family's baselines where they stood then (a finished job's report: what its verdict
        was judged against when it ended, whatever moved since), not where they stand now."""
        envs = {e.id: e for e in environments}

        def env_of(t: TrialRow) -> Environment | None:
            return envs.get(t.environment_id) if t.environment_id is not None else None

        with Session(self.engine) as s:
            named = _named(s, baseline) if baseline is not None else None
            found, matched = _matched(s, job, trials, env_of, key, named, as_of)
            if matched:
                ids = set(matched.values())
                stored = set(s.scalars(select(TrialRow.id).where(TrialRow.id.in_(ids))))
                matched = {t: b for t, b in matched.items() if b in stored}
            return found, matched


def _matched(
    s: Session,
    job: Job,
    trials: list[TrialRow],
    env_of: Callable[[TrialRow], Environment | None],
    key: PointKey,
    named: Baseline | None,
    as_of: datetime | None = None,
) -> tuple[Baseline | None, dict[int, int]]:
    """The baseline the job is judged against (the named one, else the newest of its family with a point
    of the job; `as_of`: of the family's baselines where they stood then) and the job's trial id -> the
    baseline trial id of its point."""
    keys = {t.id: key(t, env_of(t)) for t in trials}
    if named is not None:
        candidates = [named]
    else:
        candidates = _family_baselines(s, job) if as_of is None else _baselines_then(s, job, as_of)
    for candidate in candidates:
        points = _points(s, candidate) if candidate.id is not None else _points_of_job(s, candidate, key)
        found = {t.id: points[keys[t.id]] for t in trials if points.get(keys[t.id], t.id) != t.id}
        if found or named is not None:
            return candidate, found
    return None, {}


def _named(s: Session, name: str) -> Baseline:
    found = s.scalar(select(Baseline).where(Baseline.name == name))
    if found is None:
        newest_first = select(Baseline.name).order_by(Baseline.created_at.desc(), Baseline.id.desc())
        raise LookupError(
            f"no baseline named {name!r} (known: {', '.join(s.scalars(newest_first)) or 'none'})"
        )
    return found


def _family_baselines(s: Session, job: Job) -> list[Baseline]:
    """The baselines of the job's family on other jobs, newest first."""
    q = (
        select(Baseline)
        .where(Baseline.family == job.family, Baseline.job_id != job.id)
        .order_by(Baseline.created_at.desc(), Baseline.id.desc())
    )
    return list(s.scalars(q))


def _baselines_then(s: Session, job: Job, as_of: datetime) -> list[Baseline]:
    """The baselines of the job's family on other jobs where they stood at `as_of`, newest first: each
    name's last move by then (baseline_history). A name still on that job is its row (its stored
    points); one that moved since is a Baseline not stored (id None) on the job it was on."""
    moves = s.execute(
        select(BaselineMove.name, BaselineMove.job_id, BaselineMove.git_commit, BaselineMove.set_at)
        .where(BaselineMove.family == job.family, BaselineMove.set_at <= as_of)
        .order_by(BaselineMove.set_at, BaselineMove.id)
    ).all()
    stood = {name: (job_id, commit, at) for name, job_id, commit, at in moves}  # the last move wins
    now = {b.name: b for b in s.scalars(select(Baseline).where(Baseline.family == job.family))}
    out = []
    for name, (job_id, commit, at) in sorted(stood.items(), key=lambda kv: kv[1][2], reverse=True):
        if job_id == job.id:
            continue
        row = now.get(name)
        if row is not None and row.job_id == job_id:
            out.append(row)
        else:
            then = Baseline(name=name, job_id=job_id, family=job.family, git_commit=commit, created_at=at)
            out.append(then)
    return out


def baseline_points(
    trials: Iterable[TrialRow], key_of: Callable[[TrialRow], str]
) -> tuple[dict[str, TrialRow], list[tuple[TrialRow, str]]]:
    """The points a baseline on a job takes from its trials in grid order (`farm baseline set`, and a
    baseline as it stood on a job it has left since): each ok trial, the first of its match key
    (`key_of`); and the trials left out, each with why."""
    points: dict[str, TrialRow] = {}
    left: list[tuple[TrialRow, str]] = []
    for t in trials:
        if t.status != TrialStatus.OK:
            left.append((t, f"status {t.status}"))
        elif (k := key_of(t)) in points:
            left.append((t, "same point as an earlier trial (differs only in variant keys)"))
        else:
            points[k] = t
    return points, left


def _points_of_job(s: Session, baseline: Baseline, key: PointKey) -> dict[str, int]:
    """The points of a baseline on its job (`baseline_points`), from the job's trials: one whose name
    moved on since, its stored points gone with the move."""
    trials = list(
        s.scalars(
            select(TrialRow)
            .where(TrialRow.job_id == baseline.job_id, TrialRow.status == TrialStatus.OK)
            .order_by(TrialRow.seq)
        )
    )
    used = {t.environment_id for t in trials if t.environment_id is not None}
    envs = {e.id: e for e in s.scalars(select(Environment).where(Environment.id.in_(used)))} if used else {}
    points, _left = baseline_points(
        trials, lambda t: key(t, envs.get(t.environment_id) if t.environment_id is not None else None)
    )
    return {k: t.id for k, t in points.items()}


def _points(s: Session, baseline: Baseline) -> dict[str, int]:
    q = select(BaselineTrial.match_key, BaselineTrial.trial_id).where(
        BaselineTrial.baseline_id == baseline.id
    )
    return {k: t for k, t in s.execute(q)}


def _trials(s: Session, ids: set[int]) -> list[TrialRow]:
    return list(s.scalars(select(TrialRow).where(TrialRow.id.in_(ids)))) if ids else []


def _kept_samples(
    s: Session, job_id: int, baseline_trials: list[TrialRow], trials: list[TrialRow]
) -> dict[int, list[int]]:
    raw: dict[int, list[int]] = {}
    ours = select(TrialRow.id).where(TrialRow.job_id == job_id)
    theirs = [t.id for t in baseline_trials]
    q = select(Sample.trial_id, Sample.codec, Sample.data)
    for where in [Sample.trial_id.in_(ours)] + ([Sample.trial_id.in_(theirs)] if theirs else []):
        for trial_id, codec, data in s.execute(q.where(where)):
            raw[trial_id] = unpack(codec, data)
    return {t.id: kept(raw.get(t.id, []), t.summary) for t in [*trials, *baseline_trials]}
