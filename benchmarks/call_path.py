"""The path a job id takes through the farm's modules in `farm accept` (issue 44): how many modules it
enters and how often it comes back to one it already left.

A small store is written through the Store API (a probe spec of two shapes: a baseline job named `main`
and a candidate, three samples a trial, no Ray), then `farm accept CANDIDATE --baseline main` runs in a
fresh Python process under `sys.setprofile`, as a user's command would (its imports included). Every
call into a function of a `jobs.` module is seen; it is a *stop* when that module is not the one of the
nearest `jobs.` frame below it (the caller, however many library frames lie between; the first `jobs.`
frame is a stop too). A *return* is a stop into a module the path already visited. Module bodies run by
an import are left out.

The job id's path is the stops whose call carries the job id as an argument (the candidate's id, 97, is
no other number of the store); the limits (MAX_MODULES, MAX_RETURNS) hold for it. Every stop, the job
id's or not, is counted too, as `every_call`. `python -m benchmarks call-path` prints the path, then
both figures; `measure()` returns them (tests/jobs/test_call_path.py holds the path under the limits).

Measured on the code before issue 44: the job id's path 15 stops in 5 modules with 10 returns (the
repository entered 9 times, jobs.judge.baselines 3 times); every call 80 stops in 13 modules, 67 returns.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MAX_MODULES, MAX_RETURNS = 8, 6  # the limits issue 44 sets for the accept path

SPEC = """\
name: call-path
family: probe
backends:
  - {name: spin, baseline: true, configs: {grid: {ms: [1]}}}
shapes: {grid: {n: [0, 1]}}
measure: {warmup_ms: 0, min_samples: 3, max_samples: 3, max_time_s: 1, min_time_s: 0}
timeout_s: 30
"""
# the candidate's id: no trial, sample or other number of the store has this value, so a call is on the
# job id's path when an argument equals it
CANDIDATE = 97
ENV = {"host": "call-path-host", "device_kind": "cpu", "device_name": "Synthetic CPU", "torch": "-"}


def write_store(db: str) -> int:
    """A baseline job named `main` and a candidate of the same points; the candidate's id."""
    from click.testing import CliRunner

    from jobs.cli import main
    from jobs.spec.sweep import loads_spec
    from jobs.store import Store
    from jobs.store.results import result_of

    store = Store(db)
    spec = loads_spec(SPEC)
    ids = []
    for level in (1_000_000, 1_010_000):
        while level > 1_000_000 and ids[-1] < CANDIDATE - 1:  # empty jobs up to the candidate's id
            ids.append(store.create_job(name="filler", family=spec.family, spec_yaml=SPEC,
                                        spec_hash=spec.spec_hash(), trials=[], git_commit=None))  # fmt: skip
        job_id = store.create_job(
            name=spec.name, family=spec.family, spec_yaml=SPEC, spec_hash=spec.spec_hash(),
            trials=spec.trials(), git_commit=None,
        )  # fmt: skip
        samples = [level, level + 2_000, level - 1_000]
        store.record_results(
            result_of(
                t.id, samples, worker="w0", correctness={"passed": True, "method": "none"}, environment=ENV
            )
            for t in store.trials(job_id)
        )
        store.set_job_status(job_id, "completed")
        ids.append(job_id)
    store.close()
    assert job_id == CANDIDATE, job_id
    out = CliRunner().invoke(main, ["baseline", "set", str(ids[0]), "--name", "main", "--db", db])
    if out.exit_code != 0:
        raise RuntimeError(f"farm baseline set failed: {out.output}")
    return job_id


def trace_accept(db: str, job_id: int) -> list[tuple[str, bool]]:
    """The stops of `farm accept JOB --baseline main --db DB` in this process (call it in a fresh one),
    each with whether its call carries the job id."""
    from click.testing import CliRunner

    from jobs.cli import main

    stops: list[tuple[str, bool]] = []

    def jobs_module(frame: Any) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name == "jobs" or name.startswith("jobs.") else None

    def in_import(frame: Any) -> bool:
        while frame is not None:
            if frame.f_code.co_filename.startswith("<frozen importlib"):
                return True
            frame = frame.f_back
        return False

    def carries_job(frame: Any) -> bool:
        code = frame.f_code
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
        values = [frame.f_locals.get(name) for name in code.co_varnames[:n]]
        for v in list(values):
            if isinstance(v, tuple):
                values += v
            elif isinstance(v, dict):
                values += v.values()
        return any(type(v) is int and v == job_id for v in values)

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        module = jobs_module(frame)
        if module is None:
            return
        caller = frame.f_back
        while caller is not None and jobs_module(caller) is None:
            caller = caller.f_back
        if (caller is None or jobs_module(caller) != module) and not in_import(frame):
            stops.append((module, carries_job(frame)))

    args = ["accept", str(job_id), "--baseline", "main", "--ambiguous", "warn", "--db", db]
    sys.setprofile(profile)
    try:
        out = CliRunner().invoke(main, args)
    finally:
        sys.setprofile(None)
    if out.exit_code not in (0, 1):
        raise RuntimeError(f"farm accept ended {out.exit_code}: {out.output}")
    return stops


def figures(stops: list[str]) -> dict[str, Any]:
    modules = list(dict.fromkeys(stops))
    return {
        "stops": len(stops),
        "modules": len(modules),
        "returns": len(stops) - len(modules),
        "path": stops,
        "entered": {m: stops.count(m) for m in modules},
    }


def measure() -> dict[str, Any]:
    """The accept path's figures, traced in a fresh interpreter (so the command's imports are its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "farm.db")
        job_id = write_store(db)
        code = (
            "import json, sys; from benchmarks.call_path import trace_accept; "
            f"print(json.dumps(trace_accept({db!r}, {job_id})))"
        )
        root = Path(__file__).resolve().parent.parent
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"tracing farm accept failed:\n{done.stderr[-4000:]}")
        stops = json.loads(done.stdout.strip().splitlines()[-1])
        return figures([m for m, carries in stops if carries]) | {
            "every_call": figures([m for m, _ in stops])
        }


def main() -> dict[str, Any]:
    result = measure()
    for i, module in enumerate(result["path"], 1):
        print(f"{i:3d}  {module}")
    print(
        f"farm accept: {result['stops']} stops in {result['modules']} modules, {result['returns']} returns "
        f"to a module already visited (limits: {MAX_MODULES} modules, {MAX_RETURNS} returns)"
    )
    print("entered: " + ", ".join(f"{m} x{n}" for m, n in result["entered"].items()))
    every = result["every_call"]
    print(
        f"every call between jobs modules (the job id's or not): {every['stops']} stops in "
        f"{every['modules']} modules, {every['returns']} returns"
    )
    keep = ("stops", "modules", "returns", "entered")
    return {k: result[k] for k in keep} | {"every_call": {k: every[k] for k in keep}}


if __name__ == "__main__":
    main()
