"""What changed around a measurement: two environments compared component by component.

A worker records the environment it runs in (cluster.environment.collect), stored once per content in the
store's `environments` and pointed at by each trial. A job's fingerprint is the components of all its
trials' environments (a component with several values, e.g. two hosts, reads "a | b"). `changes` is THE
comparison every verdict uses (`farm accept` and `farm compare`, per trial pair and per job; `farm history`
between consecutive jobs of a series; `farm failures list --by environment`): the components that differ,
each a `Difference` (component, before, after) of one of three kinds:

  performance  gpu, gpu_count, driver, cuda, torch, triton, cpu, governor, clocks (the clocks policy) and
               threads (torch's on a CPU): with the code unchanged a change in one changes timings, so a
               slowdown across one is not the code's; `farm accept` calls it ambiguous
               (jobs.judge.acceptance) unless `--confirm` measured both sides on one worker;
  code         kernels (the digest of the kernels/ a worker ran, cluster.shipping.source_digest): the code
               changing is what the farm judges, so it is recorded, never an environment change;
  other        host, python, ray: reported, no effect on a verdict (the same hardware under another name).

A component that one side did not record (an environment stored before it was collected, a CPU worker's
driver) is not compared: an older store's jobs are judged as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PERFORMANCE, CODE, OTHER = "performance", "code", "other"
SEP = " | "  # between a job's values of one component, when its workers differed
MAX_TEXT = 240  # the longest line of changes a summary (a draft's, a page's cell) carries


def _gpu(env: Mapping[str, Any]) -> Any:
    return env.get("device_name") if env.get("device_kind") == "gpu" else None


# the components by kind, in the order they are listed; each read from its key in an environment's data
# (its name, else the key named in KEYS), the GPU from the device of a GPU worker
KINDS = {
    PERFORMANCE: "gpu gpu_count driver cuda torch triton cpu governor clocks threads".split(),
    CODE: ["kernels"],
    OTHER: ["host", "python", "ray"],
}
KEYS = {"cpu": "cpu_model", "governor": "cpu_governor", "clocks": "clocks_policy", "threads": "torch_threads",
        "kernels": "kernels_source"}  # fmt: skip
KIND = {name: kind for kind, names in KINDS.items() for name in names}
COMPONENTS = tuple(KIND)


def _read(name: str, env: Mapping[str, Any]) -> Any:
    return _gpu(env) if name == "gpu" else env.get(KEYS.get(name, name))


@dataclass(frozen=True)
class Difference:
    """One component that differs between two environments."""

    component: str
    before: str
    after: str

    @property
    def kind(self) -> str:
        return KIND.get(self.component, OTHER)

    @property
    def performance(self) -> bool:
        return self.kind == PERFORMANCE

    def text(self) -> str:
        """`torch 2.12.0 -> 2.13.0` (a kernel source digest cut to 12 characters)."""
        cut = 12 if self.kind == CODE else 60
        return f"{self.component} {_cut(self.before, cut)} -> {_cut(self.after, cut)}"

    def to_list(self) -> list[str]:
        """As the store keeps it in an assertion's numbers: [component, before, after, kind]."""
        return [self.component, self.before, self.after, self.kind]

    @classmethod
    def from_stored(cls, value: Any) -> Difference | None:
        """From `to_list`'s form; None for anything else."""
        if isinstance(value, list | tuple) and len(value) >= 3:
            return cls(str(value[0]), str(value[1]), str(value[2]))
        return None


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n]


Env = Mapping[str, Any] | Any  # an environment's data, or a stored row (jobs.store.Environment) holding it


def _data(env: Env) -> Mapping[str, Any] | None:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return env
    data = getattr(env, "data", None)
    return data if isinstance(data, Mapping) else None


def fingerprint(envs: Env | Iterable[Env] | None) -> dict[str, str]:
    """Component -> value (as text) of one environment, or of several (a job's): the values a component
    takes, sorted and joined by " | ". Components none of them recorded are left out."""
    one = _data(envs)
    many = [one] if one is not None else [] if envs is None else [d for e in envs if (d := _data(e))]
    out: dict[str, str] = {}
    for name in COMPONENTS:
        values = sorted({str(v) for d in many if (v := _read(name, d)) is not None})
        if values:
            out[name] = SEP.join(values)
    return out


def changes(before: Env | Iterable[Env] | None, after: Env | Iterable[Env] | None) -> list[Difference]:
    """The components that differ from `before` to `after` (each one environment, a stored row or its
    data, or an iterable of them: a job's), in COMPONENTS' order; a component either side lacks is not
    compared."""
    a, b = fingerprint(before), fingerprint(after)
    return [Difference(n, a[n], b[n]) for n in COMPONENTS if n in a and n in b and a[n] != b[n]]


def performance(diffs: Iterable[Difference]) -> list[Difference]:
    return [d for d in diffs if d.performance]


def stored(value: Any) -> list[Difference]:
    """Differences as an assertion's numbers keep them (`environment`: a list of to_list forms)."""
    found = [Difference.from_stored(v) for v in value] if isinstance(value, list) else []
    return [d for d in found if d is not None]


def changed_text(diffs: Iterable[Difference], limit: int = MAX_TEXT) -> str:
    """`torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1`, at most `limit` characters."""
    text = ", ".join(d.text() for d in diffs)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def ambiguous_reason(diffs: Iterable[Difference]) -> str:
    """Why a slowdown across these changes is not the code's: `environment changed (torch 2.12.0 ->
    2.13.0)`."""
    return f"environment changed ({changed_text(performance(diffs))})"


def summary_lines(diffs: list[Difference]) -> list[str]:
    """What `farm accept` and `farm compare` print: the performance changes, then the code's and the
    others' (empty when nothing differs)."""
    perf = performance(diffs)
    rest = [d for d in diffs if not d.performance]
    if not perf:
        return (
            [f"environment unchanged (differs, no effect on the verdict: {changed_text(rest)})"]
            if rest
            else []
        )
    out = [f"environment changed: {changed_text(perf)}"]
    if rest:
        out.append(f"also differs (no effect on the verdict): {changed_text(rest)}")
    return out


def label(fp: Mapping[str, str], shown: Iterable[str]) -> str:
    """An environment as a short label of the components `shown`: `torch 2.13.0, triton 3.7.1`."""
    return ", ".join(f"{name} {_cut(fp[name], 60)}" for name in shown if name in fp) or "unknown"


def varying(fps: Iterable[Mapping[str, str]]) -> list[str]:
    """The performance components whose value is not the same in all these fingerprints (a component
    missing from one counts as a value)."""
    fps = list(fps)
    return [n for n in KINDS[PERFORMANCE] if len({fp.get(n) for fp in fps}) > 1]
