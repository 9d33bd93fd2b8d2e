"""Environment-aware verdicts (issue 45): `farm accept`, `farm compare`, `farm history` and `farm failures`
see what changed around a measurement, not only the code.

Jobs are written through the store's own write path (`record_results` with each trial's environment, as
the runner writes a worker's), into a real SQLite store: a baseline on torch 2.12.0 and a slower candidate
on torch 2.13.0 is ambiguous, naming torch; the same slowdown in one environment fails as before; a history
with a torch change at one job and a code regression at another names both."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.judge import baselines
from jobs.judge.acceptance import accept, recurring
from jobs.judge.environment import Difference, changes, fingerprint
from jobs.store import Store
from jobs.store.results import result_of
from testkit.jobs import spec_job

SPEC = """
name: env-verdicts
family: probe
backends: [{name: spin, baseline: true, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0]}}
card: probe
"""
# an environment as cluster.environment.collect records a CPU worker's
ENV = {
    "host": "h1", "device_kind": "cpu", "device_name": "Some CPU", "cpu_model": "Some CPU", "gpu_count": 0,
    "cpu_governor": "performance", "torch": "2.12.0", "triton": "3.6.0", "torch_threads": 1,
    "python": "3.11.9", "kernels_source": "a" * 64, "cuda_visible_devices": None,
}  # fmt: skip
TORCH_213 = {**ENV, "torch": "2.13.0", "triton": "3.7.1"}


def _job(store: Store, level: float, env: dict, commit: str, seed: int = 0) -> int:
    """A finished job of SPEC whose one trial ran in `env`, its 30 samples about `level` ns."""
    job = spec_job(store, SPEC, git_commit=commit)
    rng = np.random.default_rng(seed)
    samples = [int(level * (1 + rng.normal(0, 0.01))) for _ in range(30)]
    store.record_results(
        [result_of(t.id, samples, environment=env, correct=True, worker="w0") for t in store.trials(job)]
    )
    store.set_job_status(job, "completed")
    return job


def _regression(acc):
    (r,) = [r for r in acc.results if r.check == "regression"]
    return r


# ---- the comparison ------------------------------------------------------------------------------------


def test_the_components_that_differ_each_with_its_kind():
    moved = {**TORCH_213, "host": "h2", "kernels_source": "b" * 64, "cpu_governor": "powersave"}
    diffs = changes(ENV, moved)
    assert [(d.component, d.before, d.after) for d in diffs] == [
        ("torch", "2.12.0", "2.13.0"), ("triton", "3.6.0", "3.7.1"), ("governor", "performance", "powersave"),
        ("kernels", "a" * 64, "b" * 64), ("host", "h1", "h2"),
    ]  # fmt: skip
    assert [d.kind for d in diffs] == ["performance"] * 3 + ["code", "other"]
    assert diffs[3].text() == f"kernels {'a' * 12} -> {'b' * 12}"
    assert changes(ENV, dict(ENV)) == [] and changes(ENV, None) == []
    # a component one side did not record (a store older than it) is not compared
    older = {k: v for k, v in ENV.items() if k not in ("cpu_governor", "kernels_source")}
    assert changes(older, {**ENV, "kernels_source": "c" * 64}) == []
    # a job's environments: a component with several values reads "a | b"
    assert fingerprint([ENV, {**ENV, "host": "h2"}])["host"] == "h1 | h2"
    assert Difference.from_stored(diffs[0].to_list()) == diffs[0]


# ---- farm accept ---------------------------------------------------------------------------------------


def test_a_slower_candidate_on_another_torch_is_ambiguous_naming_torch(store):
    base = _job(store, 1_000_000, ENV, "c1")
    baselines.set_from_job(store, base, "main")
    cand = _job(store, 2_000_000, TORCH_213, "c2", seed=1)
    acc = accept(store, cand, baseline="main", ambiguous="warn")
    reg = _regression(acc)
    assert reg.outcome == "ambiguous", reg.result
    assert reg.result.reason.startswith(
        "ambiguous: environment changed (torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1); slower"
    )
    assert ["torch", "2.12.0", "2.13.0", "performance"] in reg.result.numbers["environment"]
    assert acc.verdict == "warn" and acc.exit_code == 0
    assert [d.component for d in acc.environment] == ["torch", "triton"]
    # stored where pages and drafts read it: the trial's ambiguous anomaly and the job's environment one
    found = {a.kind: a for a in store.anomalies(cand)}
    assert "torch 2.12.0 -> 2.13.0" in found["ambiguous"].message
    assert found["ambiguous"].evidence["environment"][0][:3] == ["torch", "2.12.0", "2.13.0"]
    job_level = found["environment"]
    assert job_level.trial_id is None and job_level.severity == "warning"
    assert job_level.message == (
        "environment changed since baseline main (job 1): torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1"
    )
    # under --ambiguous fail it is in the failure bank, as ambiguous, with the change in its message
    strict = accept(store, cand, baseline="main", ambiguous="fail")
    assert strict.verdict == "fail" and _regression(strict).outcome == "ambiguous"
    (banked,) = store.failures()
    assert banked.outcome == "ambiguous" and "torch 2.12.0 -> 2.13.0" in banked.message

    out = CliRunner().invoke(main, ["accept", str(cand), "--baseline", "main", "--db", store.url])
    assert out.exit_code == 0, out.output  # CPU timings: ambiguous warns (the probe card)
    assert "environment changed: torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1" in out.output
    as_json = CliRunner().invoke(
        main, ["accept", str(cand), "--baseline", "main", "--json", "--db", store.url]
    )
    assert json.loads(as_json.output)["environment"][0] == ["torch", "2.12.0", "2.13.0", "performance"]


def test_the_same_slowdown_in_one_environment_fails_as_before(store):
    base = _job(store, 1_000_000, ENV, "c1")
    baselines.set_from_job(store, base, "main")
    cand = _job(store, 2_000_000, dict(ENV), "c2", seed=1)
    acc = accept(store, cand, baseline="main", ambiguous="warn")
    reg = _regression(acc)
    assert reg.outcome == "fail" and reg.result.reason.startswith("slower"), reg.result
    assert "environment" not in reg.result.numbers and acc.environment == []
    assert acc.verdict == "fail" and {a.kind for a in store.anomalies(cand)} == {"slower"}


def test_a_host_or_code_change_is_reported_but_does_not_make_a_regression_ambiguous(store):
    base = _job(store, 1_000_000, ENV, "c1")
    baselines.set_from_job(store, base, "main")
    cand = _job(store, 2_000_000, {**ENV, "host": "h2", "kernels_source": "b" * 64}, "c2", seed=1)
    acc = accept(store, cand, baseline="main", ambiguous="warn")
    reg = _regression(acc)
    assert reg.outcome == "fail", reg.result
    assert [d[0] for d in reg.result.numbers["environment"]] == ["kernels", "host"]
    (job_level,) = [a for a in store.anomalies(cand) if a.kind == "environment"]
    assert job_level.severity == "info" and job_level.message.endswith(": host h1 -> h2")


def test_confirm_settles_it_only_when_it_re_ran_the_baseline_on_the_same_worker(store):
    """What `--confirm` returns (jobs.judge.confirm): a slower that re-ran A and B interleaved on one worker
    (`baseline_rerun`) stands; one that re-ran B alone against the stored baseline of another commit still
    stands on the old environment, so it stays ambiguous."""
    from jobs.judge.acceptance import across_environment, assertions, card_of, contexts, judged
    from jobs.judge.checks import FAIL, Outcome

    base = _job(store, 1_000_000, ENV, "c1")
    baselines.set_from_job(store, base, "main")
    cand = _job(store, 2_000_000, TORCH_213, "c2", seed=1)
    judging = judged(store, cand, "main")
    card = card_of(judging.job)
    by_trial = contexts(store, judging, card)
    for rerun, expected in ((True, "fail"), (False, "ambiguous")):
        results = assertions(card, judging.trials, by_trial)
        reg = next(r for r in results if r.check == "regression")
        reg.result = Outcome(FAIL, "confirmed over 3 rounds: slower", {"baseline_rerun": rerun}, "slower")
        across_environment(results, by_trial)
        assert reg.outcome == expected, reg.result
        assert reg.result.numbers["environment"][0][:3] == ["torch", "2.12.0", "2.13.0"]


# ---- farm compare --------------------------------------------------------------------------------------


def test_compare_prints_what_changed_and_a_slower_b_across_it_is_ambiguous(store, tmp_path):
    base = _job(store, 1_000_000, ENV, "c1")
    moved = _job(store, 2_000_000, TORCH_213, "c2", seed=1)
    same = _job(store, 2_000_000, dict(ENV), "c3", seed=2)
    spin = ["--config-a", "backend=spin", "--config-b", "backend=spin", "--db", store.url]
    page = tmp_path / "ab.html"
    out = CliRunner().invoke(
        main, ["compare", str(base), str(moved), *spin, "--fail-on-slower", "--html", str(page)]
    )
    assert out.exit_code == 0, out.output  # not called slower: the environment changed
    assert "environment changed: torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1" in out.output
    assert "ambiguous: environment changed (torch 2.12.0 -> 2.13.0" in out.output
    assert "environment changed: torch 2.12.0 -&gt; 2.13.0" in page.read_text()
    as_json = json.loads(CliRunner().invoke(main, ["compare", str(base), str(moved), *spin, "--json"]).output)
    assert as_json["verdicts"] == {"ambiguous": 1} and as_json["environment"][0][:3] == [
        "torch",
        "2.12.0",
        "2.13.0",
    ]
    (row,) = as_json["rows"]
    assert row["comparison"]["verdict"] == "slower" and row["ambiguous"].startswith(
        "environment changed (torch"
    )

    plain = CliRunner().invoke(main, ["compare", str(base), str(same), *spin, "--fail-on-slower"])
    assert plain.exit_code == 1 and "environment" not in plain.output, plain.output

    # each comparison is kept with what differed, and `farm jobs show` of either job lists it
    kept = store.comparisons(moved)
    assert [c.id for c in kept] == [as_json["comparison_id"] - 1, as_json["comparison_id"]]
    assert kept[0].environment[0][:3] == ["torch", "2.12.0", "2.13.0"] and kept[0].ambiguous == 1
    assert kept[0].verdicts == {"ambiguous": 1} and kept[0].selector_a == "backend=spin"
    (last,) = store.comparisons(same)
    assert last.environment == [] and last.verdicts == {"slower": 1} and last.job_a == base
    shown = CliRunner().invoke(main, ["jobs", "show", str(moved), "--db", store.url]).output
    assert (
        f"comparison {kept[0].id} (" in shown
        and f"job {base} vs job {moved}: ambiguous 1; torch 2.12.0 -> 2.13.0" in shown
    )


# ---- farm history --------------------------------------------------------------------------------------


def _history(store: Store) -> list[int]:
    """24 jobs of one point: torch 2.12.0 for jobs 1-8, 2.13.0 from job 9 on, where the time steps up 30%
    (the new torch is slower), and a code regression of +60% at job 17 in the same environment."""
    jobs = []
    for i in range(1, 25):
        level = 1_000_000 * (1.3 if i >= 9 else 1.0) * (1.6 if i >= 17 else 1.0)
        jobs.append(_job(store, level, ENV if i < 9 else TORCH_213, f"c{i}", seed=i))
    return jobs


def test_history_names_the_torch_change_and_the_code_regression_apart(store):
    from jobs.history.series import Selection, collect

    jobs = _history(store)
    (series,) = collect(store, Selection(family="probe"))
    assert [(m.job_id, m.text) for m in series.marks] == [
        (jobs[8], "torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1")
    ]
    by_job = {c.job_id: c for c in series.changes}
    assert set(by_job) == {jobs[8], jobs[16]}, [(c.job_id, c.magnitude) for c in series.changes]
    # the change at job 9 falls on the torch change: it says so; the one at job 17 is the code's
    assert [d.component for d in by_job[jobs[8]].environment] == ["torch", "triton"]
    assert by_job[jobs[16]].environment == [] and by_job[jobs[16]].commit == "c17"
    assert by_job[jobs[16]].magnitude == pytest.approx(0.6, abs=0.05)

    out = CliRunner().invoke(main, ["history", "--db", store.url, "--family", "probe"])
    assert out.exit_code == 0, out.output
    assert f"change point at job {jobs[16]} (commit c17): " in out.output
    line17 = next(ln for ln in out.output.splitlines() if f"change point at job {jobs[16]} " in ln)
    assert "environment" not in line17 and line17.endswith(f"{by_job[jobs[16]].magnitude:+.1%}"), line17
    line9 = next(ln for ln in out.output.splitlines() if f"change point at job {jobs[8]} " in ln)
    assert line9.endswith("environment changed there: torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1"), line9
    assert f"environment changed at job {jobs[8]} (commit c9): torch 2.12.0 -> 2.13.0" in out.output
    (as_json,) = json.loads(CliRunner().invoke(main, ["history", "--db", store.url, "--family", "probe",
                                                       "--json"]).output)  # fmt: skip
    assert [m["job"] for m in as_json["environment_changes"]] == [jobs[8]]
    assert {c["job"]: [d[0] for d in c["environment"]] for c in as_json["changes"]} == {
        jobs[8]: ["torch", "triton"],
        jobs[16]: [],
    }


def test_the_history_page_marks_the_environment_change(store):
    from jobs.history.series import Selection, collect
    from jobs.report.figures import history_figure
    from jobs.report.site import _kernel_page

    jobs = _history(store)
    (series,) = collect(store, Selection(family="probe"))
    page = _kernel_page(series)
    assert "Environment changes" in page and f"job {jobs[8]} (commit c9): torch 2.12.0 -&gt; 2.13.0" in page
    assert "environment changed there: torch 2.12.0 -&gt; 2.13.0" in page
    notes = [a["text"] for a in history_figure(series).layout.get("annotations", [])]
    assert "env: torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1" in notes


def test_an_unchanged_environment_marks_nothing(store):
    from jobs.history.series import Selection, collect

    for i in range(1, 13):
        _job(store, 1_000_000 * (1.6 if i >= 7 else 1.0), {**ENV, "host": f"h{i % 2}"}, f"c{i}", seed=i)
    (series,) = collect(store, Selection(family="probe"))
    assert series.marks == [] and [c.environment for c in series.changes] == [[]]


# ---- farm failures list --------------------------------------------------------------------------------


def test_failures_group_by_environment_so_one_torch_version_shows(store):
    b12, b13 = _job(store, 1_000_000, ENV, "c1"), _job(store, 1_000_000, TORCH_213, "c2", seed=1)
    baselines.set_from_job(store, b12, "on-2.12")
    baselines.set_from_job(store, b13, "on-2.13")
    for commit, env, name in (
        ("c3", ENV, "on-2.12"),
        ("c4", TORCH_213, "on-2.13"),
        ("c5", TORCH_213, "on-2.13"),
    ):
        cand = _job(store, 2_000_000, env, commit, seed=int(commit[1:]))
        assert accept(store, cand, baseline=name, ambiguous="warn").verdict == "fail"
    (one,) = recurring(store)
    assert len(one.jobs) == 3 and one.environment == ""
    by_env = {g.environment: g for g in recurring(store, by_environment=True)}
    assert {k: len(g.jobs) for k, g in by_env.items()} == {
        "torch 2.13.0, triton 3.7.1": 2,
        "torch 2.12.0, triton 3.6.0": 1,
    }
    out = CliRunner().invoke(main, ["failures", "list", "--by", "environment", "--db", store.url])
    assert out.exit_code == 0 and "torch 2.13.0, triton 3.7.1" in out.output, out.output


# ---- drafts ------------------------------------------------------------------------------------------


def test_the_drafted_summary_carries_the_environment_change_in_one_short_line(store):
    from gateway.summaries.schema import AnomalyIn
    from jobs.drafts.compress import ENV_CAP, compress, facts_from_job

    base = _job(store, 1_000_000, ENV, "c1")
    baselines.set_from_job(store, base, "main")
    cand = _job(store, 2_000_000, TORCH_213, "c2", seed=1)
    accept(store, cand, baseline="main", ambiguous="warn")
    (item,) = compress(facts_from_job(store, cand)).items  # the job's environment anomaly has no trial
    AnomalyIn.model_validate(item)
    env = [m for m in item["expected_metrics"] if m["metric"] == "environment vs baseline"]
    assert env == [{"metric": "environment vs baseline", "expected": "unchanged",
                    "measured": "torch 2.12.0 -> 2.13.0, triton 3.6.0 -> 3.7.1"}]  # fmt: skip
    assert item["kind"] == "ambiguous" and "torch 2.12.0 -> 2.13.0" in item["message"]
    assert len(env[0]["measured"]) <= ENV_CAP

    same = _job(store, 2_000_000, dict(ENV), "c3", seed=2)
    accept(store, same, baseline="main", ambiguous="warn")
    (plain,) = compress(facts_from_job(store, same)).items
    assert not [m for m in plain["expected_metrics"] if m["metric"] == "environment vs baseline"]
