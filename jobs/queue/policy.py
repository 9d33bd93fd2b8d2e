"""What a pool shares its workers by (`farm pool serve --config pool.yaml`): owners' weights, projects
above owners (each with its weight and owners), quotas per owner and per project, how fast past usage is
forgotten, when a waiting job is served first, preemption, and the memory of each GPU type.

```yaml
half_life: 1d            # past usage counts half after a day (s, m, h, d suffixes; a number is seconds)
max_wait: 30m            # a job waiting this long for a worker is served before any other
owners:
  ana: {weight: 2, quota: {workers: 4, queued: 2000}}
  ci: {weight: 1}
projects:
  kernels: {weight: 3, owners: [ana, bo], quota: {workers: 6}}
default_quota: {workers: null, queued: null}   # every owner not named above
preempt: {enabled: false, min_run: 2m, again_after: 10m, patience: 15s}
best_fit: 0.05           # a worker goes to a job that needs its GPU type before one that runs anywhere,
                         # while that job's owner stays within 5 points of its share (0: off)
gpu_memory_gb: {H100: 80, H200: 141}           # added to the built-in table
```

Unknown keys and bad values are errors naming the file, the field and the value (jobs.spec.validation).
A pool without a config shares equally among owners, forgets with a half-life of a day, serves a job that
has waited an hour first, never preempts, places best fit within 5 points. The policy travels as a plain
dict (`to_dict`/`from_dict`): the pool writes it to its row in the store (farm_pools.policy), where
`farm jobs list`, `farm pool status` and `farm submit` read what the live pool serves by.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobs.spec.validation import InvalidFile, problems_from

DAY_S = 86_400.0
# what Ray's accelerator_type:<name> resources call the GPUs, and their memory (GB); a config adds more
GPU_MEMORY_GB: dict[str, float] = {
    "A10G": 24, "L4": 24, "L40S": 48, "A100": 80, "A100-40G": 40, "A100-80G": 80,
    "H100": 80, "H200": 141, "B200": 192, "GB200": 186, "MI300X": 192,
}  # fmt: skip
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY_S, None: 1.0}


class InvalidPolicy(InvalidFile):
    WHAT = "pool config"


def seconds(value: Any) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d` -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        found = _DURATION.match(str(value))
    else:
        found = _DURATION.match(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError("expected a duration: a number of seconds or one with s, m, h or d (e.g. 30m)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quota(_Strict):
    workers: int | None = Field(None, ge=0, description="workers held at once")
    queued: int | None = Field(None, ge=1, description="trials waiting (not running) at once")


class OwnerConfig(_Strict):
    weight: float = Field(1.0, gt=0)
    quota: Quota = Field(default_factory=Quota)


class ProjectConfig(_Strict):
    weight: float = Field(1.0, gt=0)
    owners: tuple[str, ...] = ()
    quota: Quota = Field(default_factory=Quota)


class Preemption(_Strict):
    enabled: bool = False
    min_run: float = Field(120.0, ge=0, description="a trial runs this long before it may be stopped")
    again_after: float = Field(600.0, ge=0, description="a stopped trial is not stopped again this soon")
    patience: float = Field(
        15.0, ge=0, description="a job waits this long for a worker to free before it stops a trial"
    )

    @field_validator("min_run", "again_after", "patience", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return seconds(v)


class Policy(_Strict):
    half_life: float = Field(DAY_S, gt=0)
    max_wait: float = Field(3600.0, gt=0)
    owners: dict[str, OwnerConfig] = Field(default_factory=dict)
    projects: dict[str, ProjectConfig] = Field(default_factory=dict)
    default_quota: Quota = Field(default_factory=Quota)
    preempt: Preemption = Field(default_factory=Preemption)
    best_fit: float = Field(
        0.05, ge=0, le=1, description="share of all workers a GPU-bound job's owner may go over its target"
    )
    gpu_memory_gb: dict[str, float] = Field(default_factory=dict)

    @field_validator("half_life", "max_wait", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return seconds(v)

    @field_validator("projects")
    @classmethod
    def _one_project_per_owner(cls, projects: dict[str, ProjectConfig]) -> dict[str, ProjectConfig]:
        seen: dict[str, str] = {}
        for name, project in projects.items():
            for owner in project.owners:
                if owner in seen:
                    raise ValueError(f"owner {owner!r} is in two projects ({seen[owner]!r} and {name!r})")
                seen[owner] = name
        return projects

    # ---- what the ordering asks -----------------------------------------------------------------
    def weight(self, owner: str) -> float:
        found = self.owners.get(owner)
        return found.weight if found else 1.0

    def project_of(self, owner: str) -> str | None:
        """The configured project the owner belongs to, or None (the owner is a project of its own)."""
        return next((name for name, p in self.projects.items() if owner in p.owners), None)

    def project_weight(self, project: str, owner: str) -> float:
        """A configured project's weight; an owner that is its own project weighs its own weight."""
        found = self.projects.get(project)
        return found.weight if found else self.weight(owner)

    def owner_quota(self, owner: str) -> Quota:
        found = self.owners.get(owner)
        return found.quota if found else self.default_quota

    def project_quota(self, project: str) -> Quota:
        found = self.projects.get(project)
        return found.quota if found else Quota()

    def memory_gb(self, gpu_type: str | None) -> float | None:
        if gpu_type is None:
            return None
        return self.gpu_memory_gb.get(gpu_type, GPU_MEMORY_GB.get(gpu_type))

    # ---- as stored --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Policy:
        return cls.model_validate(dict(data or {}))


def load_policy(path: Path) -> Policy:
    """A pool config file; InvalidPolicy (one line per problem, naming the file and field) when bad."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise InvalidPolicy(source, [f"cannot be read: {err.strerror or err}"]) from None
    except yaml.YAMLError as err:
        raise InvalidPolicy(source, [f"not YAML: {str(err).splitlines()[0]}"]) from None
    if not isinstance(data, dict):
        raise InvalidPolicy(source, ["(top level): expected a mapping of settings"])
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        raise InvalidPolicy(source, problems_from(err, data)) from None
