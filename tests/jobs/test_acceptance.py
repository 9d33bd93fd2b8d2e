"""Baselines, anomalies and `farm accept` on real gemm sweeps (local Ray, two logical GPUs, CPU timings).

One baseline job, then candidates of the same points: noise alone, a real injected slowdown (the gemm
`_repeat: 4` knob: four matmuls per call), a wrong result (`_perturb`). CPU timings on a loaded machine
are noisy, so the gemm card's CPU thresholds are used (a slowdown must exceed 50% to be called, cv up to
25% counts as stable); the injected slowdown is ~4x, far outside both, and the noise-only rerun must pass
or at worst be ambiguous (accepted as a warning).

Every job runs on one worker, one trial at a time. On two cores, two logical workers contend for the
CPU: a baseline measured alone and a candidate measured beside a 4x-slowed neighbour are not the same
conditions, and the untouched trial then reads as slower than its baseline (CI saw it). On GPUs each
worker owns its device and that contention does not exist. One torch thread, too: a two-thread matmul
whose second core is taken by a neighbour's process waits at every barrier and reads 10-100x slower.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.judge.acceptance import accept, recurring
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store import Store

pytestmark = pytest.mark.slow  # real gemm sweeps, and interleaved A/B rounds

SPEC = """
name: gemm-accept
family: gemm
backends:
  - {{name: torch_fp32, configs: {{include: {configs}}}}}
shapes: {{grid: {{m: [128], n: [128], k: [128]}}}}
measure: {{warmup_ms: 300, min_samples: 30, max_samples: 60, max_time_s: 0.3, min_time_s: 0, seeds: 1}}
timeout_s: 60
card: gemm
"""
PLAIN = SPEC.format(configs="[{}]")
# one job, three trials of the same point: untouched, a real ~4x slowdown, a wrong result
FAULTY = SPEC.format(configs="[{}, {_repeat: 4}, {_perturb: 1.0}]")


@pytest.fixture(scope="module")
def farm(tmp_path_factory, ray_local):
    """A store with a baseline job named `main`, a noise-only rerun and two faulty jobs."""
    db = str(tmp_path_factory.mktemp("accept") / "farm.db")
    store = Store(db)
    quiet = RunOptions(gpus=1, threads_per_worker=1, show_progress=False, echo=lambda _msg: None)

    def run(text: str) -> int:
        result = run_sweep(loads_spec(text), store, quiet)
        assert result.status == "completed", result
        return result.job_id

    base = run(PLAIN)
    out = CliRunner().invoke(main, ["baseline", "set", str(base), "--name", "main", "--db", db])
    assert out.exit_code == 0 and "1 points" in out.output, out.output
    jobs = {"noise": run(PLAIN), "faulty": run(FAULTY), "faulty_again": run(FAULTY)}
    yield store, db, jobs
    store.close()


def _cli(db: str, *args: str):
    return CliRunner().invoke(main, [*args, "--db", db])


def _by(acc, check: str, knob: str | None):
    """The result of `check` on the trial with that test knob (None: the untouched trial)."""
    (r,) = [r for r in acc.results if r.check == check and next(iter(r.trial.config), None) == knob]
    return r


def test_noise_alone_passes(farm):
    """A rerun of the same point passes. On a shared CPU the baseline and the candidate were measured under
    different loads, so a one-off reading may still look slower; `--confirm` (what a user on a noisy machine
    runs) re-measures a suspicious trial and judges the pooled samples, and that must clear it."""
    store, db, jobs = farm
    acc = accept(store, jobs["noise"], baseline="main", ambiguous="warn", confirm=True, rounds=2)
    assert acc.verdict in ("pass", "warn") and acc.exit_code == 0, acc.to_dict()
    assert not [r for r in acc.results if r.outcome == "fail"]
    reg = _by(acc, "regression", None)
    assert reg.outcome in ("pass", "ambiguous"), reg.result
    assert reg.result.numbers["baseline_job"] == acc.baseline_job
    out = _cli(db, "accept", str(jobs["noise"]), "--baseline", "main", "--ambiguous", "warn", "--confirm")
    assert out.exit_code == 0, out.output


def test_injected_slowdown_and_wrong_result_fail_and_junit_has_one_case_per_assertion(farm, tmp_path):
    store, db, jobs = farm
    junit = tmp_path / "accept.xml"
    out = _cli(
        db, "accept", str(jobs["faulty"]), "--baseline", "main", "--junit", str(junit), "--tag", "ci-1"
    )
    assert out.exit_code == 1, out.output
    assert "slower" in out.output and "check failed" in out.output
    acc = accept(store, jobs["faulty"], baseline="main", ambiguous="warn", tag="ci-1")
    assert acc.exit_code == 1
    slow = _by(acc, "regression", "_repeat")
    # four matmuls per call read 2-4x slower on a CPU (call overhead does not grow); the card calls >= 1.5x
    assert slow.outcome == "fail" and slow.result.numbers["ratio"] > 1.8, slow.result
    assert _by(acc, "correctness", "_repeat").outcome == "pass"  # slower, still correct
    wrong = _by(acc, "correctness", "_perturb")
    assert wrong.outcome == "fail" and wrong.trial.status == "incorrect"
    assert wrong.result.numbers["max_abs_err"] >= 0.99
    assert _by(acc, "regression", "_perturb").outcome == "skip"  # a wrong kernel's speed is not judged
    anomalies = {(a.kind, a.trial_id): a for a in store.anomalies(jobs["faulty"])}
    assert ("correctness", wrong.trial.id) in anomalies
    stored = anomalies[("slower", slow.trial.id)]
    assert (
        stored.severity == "error" and stored.evidence["ratio"] > 1.8 and stored.evidence["p_value"] < 0.002
    )

    root = ET.parse(junit).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(acc.results) == len(acc.card.assertions) * 3
    failing = sorted(c.get("classname") for c in cases if c.find("failure") is not None)
    assert "card.gemm.regression" in failing and "card.gemm.correctness" in failing
    assert root.find("testsuite").get("failures") == str(len(failing))
    skipped = {c.get("classname") for c in cases if c.find("skipped") is not None}
    assert "card.gemm.hw_fraction" in skipped  # CPU timings: no hardware floor


def test_confirm_reruns_interleaved_on_one_worker_and_keeps_the_regression(farm):
    store, _db, jobs = farm
    said: list[str] = []
    options = RunOptions(show_progress=False, echo=said.append)
    acc = accept(
        store, jobs["faulty"], baseline="main", ambiguous="warn", confirm=True, rounds=2, options=options
    )
    assert acc.confirm_job is not None and acc.exit_code == 1
    slow = _by(acc, "regression", "_repeat")
    assert slow.outcome == "fail" and "interleaved" in slow.result.reason, slow.result
    # what ran is recorded: A (the baseline's request) then B, round by round, run-level and paired
    ran = slow.result.numbers["ran"]
    assert [(x["round"], x["role"]) for x in ran] == [(0, "A"), (0, "B"), (1, "A"), (1, "B")]
    assert [x["config"] for x in ran] == [{}, {"_repeat": 4}] * 2
    assert slow.result.numbers["paired_rounds"] and slow.result.numbers["baseline_rerun"]
    # the header names the torch threads the confirmation workers ran with, as their environment does
    [header] = [line for line in said if line.startswith("ray:")]
    [env] = store.environments(acc.confirm_job)
    assert f"{env.data['torch_threads']} torch thread(s) each" in header, (header, env.data)
    # the untouched trial of the same job is not blamed once re-measured (noise alone may flag it first)
    assert _by(acc, "regression", None).outcome in ("pass", "ambiguous"), _by(acc, "regression", None).result
    assert (
        slow.result.numbers["rounds_slower"] == 2 and slow.result.numbers["job_verdict"]["outcome"] == "fail"
    )
    reruns = store.trials(acc.confirm_job)
    # A (the baseline configuration) then B (the slowed one), round by round, on one worker; the other
    # suspicious trial (if noise made the untouched one ambiguous) is the same request as its baseline,
    # taken at this commit: its A and B are both re-run too
    slowed = [t for t in reruns if "_repeat" in t.config]
    assert len(slowed) == 2 and all(t.status == "ok" for t in reruns)
    before = [reruns[reruns.index(t) - 1].config for t in slowed]
    assert before == [{}, {}]
    assert len({t.worker for t in reruns}) == 1


def test_the_same_anomaly_has_the_same_fingerprint_in_two_jobs(farm):
    store, db, jobs = farm
    accept(store, jobs["faulty"], baseline="main", ambiguous="warn", tag="ci-1")
    accept(store, jobs["faulty_again"], baseline="main", ambiguous="warn", tag="ci-2")
    for kind in ("slower", "correctness"):
        first = {a.fingerprint for a in store.anomalies(jobs["faulty"]) if a.kind == kind}
        again = {a.fingerprint for a in store.anomalies(jobs["faulty_again"]) if a.kind == kind}
        assert len(first) == 1 and first == again, kind
    # no two anomalies of different points or kinds share a fingerprint. (The untouched trial is the same
    # point as the slowed one, test knobs aside: if noise flags it slower too, it shares that fingerprint.)
    knobbed = {t.id for t in store.trials(jobs["faulty"]) if t.config}
    found = [  # the slowed and the wrong trial's own anomalies (not a `noisy` flag the load may add)
        a
        for a in store.anomalies(jobs["faulty"])
        if a.trial_id in knobbed and a.kind in ("slower", "correctness")
    ]
    prints = [a.fingerprint for a in found]
    assert len(prints) == 2 and len(set(prints)) == 2, [(a.kind, a.trial_id, a.evidence) for a in found]
    rec = {g.assertion: g for g in recurring(store, min_jobs=2)}
    assert {"regression", "correctness"} <= set(rec)
    for g in rec.values():
        assert sorted(g.jobs) == sorted([jobs["faulty"], jobs["faulty_again"]]) and g.tags == ["ci-1", "ci-2"]
    out = _cli(db, "failures", "list", "--min-jobs", "2")
    assert out.exit_code == 0 and "regression" in out.output and "correctness" in out.output, out.output


def test_ambiguous_fails_or_warns_as_asked(farm, tmp_path):
    store, db, jobs = farm
    strict = tmp_path / "strict.yaml"  # no CPU measurement is this quiet: stability is ambiguous
    strict.write_text(
        "name: strict\nfamily: gemm\nassertions: [completes, stability]\nstability: {max_cv: 0.000001}\n"
    )
    warn = accept(store, jobs["noise"], card=str(strict), ambiguous="warn")
    assert warn.verdict == "warn" and warn.exit_code == 0
    assert {r.outcome for r in warn.results if r.check == "stability"} == {"ambiguous"}
    assert store.failures() == [] or all(f.job_id != jobs["noise"] for f in store.failures())
    fail = accept(store, jobs["noise"], card=str(strict), ambiguous="fail", tag="strict")
    assert fail.verdict == "fail" and fail.exit_code == 1
    banked = [f for f in store.failures() if f.job_id == jobs["noise"]]
    assert [(f.assertion, f.outcome, f.tag) for f in banked] == [("stability", "ambiguous", "strict")]
    for mode, code in (("warn", 0), ("fail", 1)):
        junit = tmp_path / f"{mode}.xml"
        out = _cli(
            db,
            "accept",
            str(jobs["noise"]),
            "--card",
            str(strict),
            "--ambiguous",
            mode,
            "--junit",
            str(junit),
        )
        assert out.exit_code == code, out.output
        cases = ET.parse(junit).getroot().findall("./testsuite/testcase")
        assert [c.get("classname") for c in cases] == ["card.strict.completes", "card.strict.stability"]
        failure = cases[1].find("failure")
        assert (failure is not None) == (mode == "fail")
        if mode == "warn":
            assert cases[1].find("system-out").text.startswith("AMBIGUOUS (warn)")


def test_baseline_list_and_an_unknown_baseline(farm):
    _store, db, jobs = farm
    out = _cli(db, "baseline", "list")
    assert out.exit_code == 0 and "main" in out.output
    out = _cli(db, "accept", str(jobs["noise"]), "--baseline", "nope")
    assert out.exit_code == 2 and "no baseline named 'nope'" in out.output
