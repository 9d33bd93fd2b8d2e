"""Baselines: a named job whose trials later jobs are compared to, point by point.

A point is matched by family, backend, shape, config, dtype and the environment class: the GPU model
("NVIDIA H100 80GB HBM3"), or "cpu:<CPU model>" for CPU timings, which never match a GPU baseline.
Config keys that start with `_` are injected test knobs (gemm `_repeat` / `_perturb`, paged_mla
`_overread`): they change the code that runs, not the point measured, so matching and anomaly
fingerprints ignore them. That is what lets a test inject a slowdown into "the same point".
Only trials that finished `ok` become baseline points.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from jobs.store.repository import Baseline, Environment, Store, TrialRow
from kernels.base import TrialStatus


def is_knob(key: str) -> bool:
    return key.startswith("_")


def point_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if not is_knob(k)}


def point_ident(t: TrialRow) -> list[Any]:
    """What identifies a point across jobs (no job ids, timestamps or test knobs)."""
    return [t.family, t.backend, sorted(t.shape.items()), sorted(point_config(t.config).items()), t.dtype]


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


def trial_envs(store: Store, job_id: int) -> dict[int, Environment]:
    """environment id -> Environment, for the trials of a job."""
    return {e.id: e for e in store.environments(job_id)}


def env_of(t: TrialRow, envs: dict[int, Environment]) -> Environment | None:
    return envs.get(t.environment_id) if t.environment_id is not None else None


@dataclass
class SetResult:
    baseline: Baseline
    replaced: bool
    points: int
    skipped: list[str]  # trials not taken, with why


def set_from_job(store: Store, job_id: int, name: str | None = None) -> SetResult:
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    envs = trial_envs(store, job_id)
    points: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    skipped: list[str] = []
    for t in store.trials(job_id):
        label = f"#{t.seq} {t.backend} {t.shape} {t.config}"
        if t.status != TrialStatus.OK:
            skipped.append(f"{label}: status {t.status}")
            continue
        cls = env_class(env_of(t, envs))
        key = match_key(t, cls)
        if key in seen:
            skipped.append(f"{label}: same point as an earlier trial (differs only in `_` test knobs)")
            continue
        seen.add(key)
        points.append((key, cls, t.id))
    if not points:
        raise ValueError(f"job {job_id} has no ok trial to take as a baseline")
    row, replaced = store.set_baseline(name or job.name, job, points)
    return SetResult(row, replaced, len(points), skipped)


def matches(store: Store, baseline: Baseline, job_id: int) -> dict[int, int]:
    """trial id of the job -> the matching baseline trial id, for the points the baseline has."""
    points = store.baseline_points(baseline.id)
    envs = trial_envs(store, job_id)
    out: dict[int, int] = {}
    for t in store.trials(job_id):
        found = points.get(match_key(t, env_class(env_of(t, envs))))
        if found is not None and found != t.id:
            out[t.id] = found
    return out


def resolve(store: Store, job_id: int, name: str | None = None) -> Baseline | None:
    """The named baseline (LookupError if unknown), else the newest baseline of the job's family that
    is not the job itself and matches at least one of its points; None when there is none."""
    if name is not None:
        found = store.get_baseline(name)
        if found is None:
            known = ", ".join(b.name for b, _ in store.list_baselines()) or "none"
            raise LookupError(f"no baseline named {name!r} (known: {known})")
        return found
    job = store.get_job(job_id)
    for b, _ in store.list_baselines():
        if job is not None and b.family == job.family and b.job_id != job_id and matches(store, b, job_id):
            return b
    return None
