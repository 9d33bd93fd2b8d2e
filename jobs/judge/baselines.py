"""Baselines: a named job whose trials later jobs are compared to, point by point.

A point is matched by family, backend, shape, config, dtype and the environment class: the GPU model
("NVIDIA H100 80GB HBM3"), or "cpu:<CPU model>" for CPU timings, which never match a GPU baseline.
Config keys a backend declares as variant keys (kernels.base.Backend.variant_keys: a plugin's injected
fault, a build option) change the code that runs, not the point measured, so matching and anomaly
fingerprints ignore them. That is what lets a test inject a slowdown into "the same point".
Only trials that finished `ok` become baseline points.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from jobs.errors import BadInput, NoSuchJob
from jobs.store import Baseline, BaselineMoved, BaselinePoint, Environment, Store, TrialRow, baseline_points
from kernels import registry


def point_config(t: TrialRow) -> dict[str, Any]:
    """The trial's config without its backend's variant keys (kernels.registry.point_config)."""
    return registry.point_config(t.family, t.backend, t.config)


def point_ident(t: TrialRow) -> list[Any]:
    """What identifies a point across jobs (no job ids, timestamps or variant keys)."""
    return [t.family, t.backend, sorted(t.shape.items()), sorted(point_config(t).items()), t.dtype]


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str, sort_keys=True).encode()).hexdigest()[:32]


def env_class(env: Environment | None) -> str:
    if env is None:
        return "unknown"
    if env.device_kind == "gpu":
        return env.device_name
    return f"cpu:{env.device_name}"


def match_key(t: TrialRow, env: str) -> str:
    return digest([point_ident(t), env])


def point_key(t: TrialRow, env: Environment | None) -> str:
    """The match key of a trial that ran in `env` (what jobs.store.Store.judging matches points by)."""
    return match_key(t, env_class(env))


def trial_envs(store: Store, job_id: int) -> dict[int, Environment]:
    """environment id -> Environment, for the trials of a job."""
    return {e.id: e for e in store.environments(job_id)}


def env_of(t: TrialRow, envs: dict[int, Environment]) -> Environment | None:
    return envs.get(t.environment_id) if t.environment_id is not None else None


@dataclass
class SetResult:
    baseline: Baseline
    previous_job: int | None  # the job the name pointed at before (None: a new name)
    points: int
    skipped: list[str]  # trials not taken, with why

    @property
    def replaced(self) -> bool:
        return self.previous_job is not None


class BaselineRefused(BadInput):
    """A move of a named baseline that would lose the team's reference: without --force, or to a job of
    another family or spec. Exit 2, nothing changed."""


def set_from_job(store: Store, job_id: int, name: str | None = None, *, force: bool = False) -> SetResult:
    """Take the job's ok trials as the points of the baseline `name` (default: the job's spec name).

    A name already on another job moves only with `force`, and never to a job of another family or
    spec (the spec's name): one mistyped job id must not replace the team's baseline. Setting a name to
    the job it is on already refreshes its points. Every setting is kept in the baseline's history."""
    job = store.get_job(job_id)
    if job is None:
        raise NoSuchJob(job_id, store.url)
    name = name or job.name
    current = store.get_baseline(name)
    if current is not None and current.job_id != job_id:
        old = store.get_job(current.job_id)
        old_spec = old.name if old is not None else "?"
        if (current.family, old_spec) != (job.family, job.name):
            raise BaselineRefused(
                f"baseline {name} is on job {current.job_id} (family {current.family}, spec {old_spec}); "
                f"job {job_id} is family {job.family}, spec {job.name}: a baseline moves only to a job of "
                "its own family and spec; name a new one with --name"
            )
        if not force:
            raise BaselineRefused(
                f"baseline {name} is on job {current.job_id}; moving it to job {job_id} needs --force "
                f"(`farm baseline list --history` shows its moves)"
            )
    envs = trial_envs(store, job_id)
    taken, left = baseline_points(store.trials(job_id), lambda t: point_key(t, env_of(t, envs)))
    points = [BaselinePoint(key, env_class(env_of(t, envs)), t.id) for key, t in taken.items()]
    skipped = [f"#{t.seq} {t.backend} {t.shape} {t.config}: {why}" for t, why in left]
    if not points:
        raise BadInput(f"job {job_id} has no ok trial to take as a baseline")
    expect = current.job_id if current is not None else None
    try:
        row, previous = store.set_baseline(name, job, points, expect_job_id=expect, forced=force)
    except BaselineMoved as err:
        raise BaselineRefused(str(err)) from None
    return SetResult(row, previous, len(points), skipped)


def matches(store: Store, baseline: Baseline, job_id: int) -> dict[int, int]:
    """trial id of the job -> the matching baseline trial id, for the points the baseline has."""
    judging = store.judging(job_id, key=point_key, baseline=baseline.name, samples=False)
    return {tid: t.id for tid, t in judging.matches.items()} if judging else {}


def resolve(store: Store, job_id: int, name: str | None = None) -> Baseline | None:
    """The named baseline (LookupError if unknown), else the newest baseline of the job's family that
    is not the job itself and matches at least one of its points (jobs.store.judging); None when there
    is none."""
    judging = store.judging(job_id, key=point_key, baseline=name, samples=False)
    return judging.baseline if judging else None
