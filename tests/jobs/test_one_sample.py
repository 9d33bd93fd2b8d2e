"""Jobs of one sample per trial (`min_samples: 1, max_samples: 1`, or a trial stopped after its first
sample): no ratio to a baseline can be computed, and every command says so instead of failing.

What was seen (issue 30): the run-level ratio was NaN, written into the anomaly's JSON evidence, which
PostgreSQL refuses ("invalid input syntax for type json": `farm accept` exited 4; SQLite took it);
`farm compare --html` crashed with a TypeError on a shape without a ratio; the drafted checklists said
"measured None". Now an undefined ratio is null with its reason, the store refuses a non-finite number in
any JSON column on both databases alike, and pages and drafts say "undefined" with the reason."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner
from sqlalchemy import text

from jobs.cli import main
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: one-sample
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1]}}
measure: {min_samples: 1, max_samples: 1}
card: probe
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU", "torch": "x"}


def one_sample_job(store: Store, ns: int) -> int:
    job = spec_job(store, SPEC)
    store.record_results(
        [result_of(t.id, [ns + t.seq], worker="w0", node="n", environment=ENV) for t in store.trials(job)]
    )
    store.set_job_status(job, "completed")
    return job


def _non_finite_json(store_url: str) -> list[str]:
    """Every JSON value in the store that holds a NaN or an infinity (as each database spells it)."""
    store = Store(store_url)
    found = []
    try:
        with store.engine.connect() as conn:
            for table, column in (("anomalies", "evidence"), ("trials", "summary"), ("trials", "metrics")):
                for (value,) in conn.execute(text(f"SELECT {column} FROM {table}")):
                    raw = value if isinstance(value, str) else json.dumps(value)
                    if any(w in str(raw) for w in ("NaN", "Infinity")):
                        found.append(f"{table}.{column}: {raw[:200]}")
    finally:
        store.close()
    return found


def test_one_sample_jobs_are_judged_compared_and_reported(store_url, tmp_path, caplog):
    store = Store(store_url)
    base, cand = one_sample_job(store, 1000), one_sample_job(store, 1500)
    store.close()
    run = CliRunner().invoke
    assert run(main, ["baseline", "set", str(base), "--name", "main", "--db", store_url]).exit_code == 0

    accepted = run(main, ["accept", str(cand), "--baseline", "main", "--ambiguous", "warn", "--db", store_url,
                          "--drafts", "--verbose"])  # fmt: skip
    assert accepted.exit_code == 0, accepted.output  # ambiguous, warned: not a database error (4)
    assert "ratio undefined" in accepted.output and "too few" in accepted.output
    assert "nan" not in accepted.output.lower().replace("non-finite", "")
    assert "measured None" not in accepted.output and "undefined" in accepted.output
    assert _non_finite_json(store_url) == []
    assert not [r for r in caplog.records if r.name == "farm.store"]  # nothing computed a NaN

    page = tmp_path / "ab.html"
    compared = run(main, ["compare", str(base), str(cand), "--db", store_url, "--html", str(page)])
    assert compared.exit_code == 0, compared.output
    assert "undefined" in compared.output and "undefined" in page.read_text()
    as_json = run(main, ["compare", str(base), str(cand), "--db", store_url, "--json"])
    assert as_json.exit_code == 0 and "NaN" not in as_json.output, as_json.output

    report_page = tmp_path / "report.html"
    reported = run(main, ["report", str(cand), "--db", store_url, "--html", str(report_page)])
    assert reported.exit_code == 0, reported.output
    assert "nan" not in reported.output.replace("non-finite", "").lower()
    exported = run(main, ["report", str(cand), "--db", store_url, "--format", "json"])
    assert exported.exit_code == 0 and "NaN" not in exported.output and "Infinity" not in exported.output
    json.loads(exported.output)  # standard JSON (the page's own script, plotly.js, spells NaN itself)


def test_a_non_finite_number_is_stored_as_null_on_any_database_and_named(store_url, caplog):
    """A NaN reaching a JSON column is a defect of whoever computed it: both databases store it as null
    (PostgreSQL's json type refuses NaN, SQLite would keep it), a warning names where it sat, and the rest
    of the result is stored."""
    store = Store(store_url)
    try:
        spec = loads_spec(SPEC)
        job = store.create_job(name=spec.name, family=spec.family, spec_yaml=SPEC, git_commit="abc",
                               spec_hash=spec.spec_hash(), trials=spec.trials())  # fmt: skip
        (first, *_rest) = store.trials(job)
        # a summary is typed (no NaN in it: kernels.base.Summary); the other JSON columns are free-form
        odd = {"gbps": math.inf, "series": {"hit rate": [0.5, math.nan]}}
        store.record_results([result_of(first.id, [1000], metrics=odd, memory={"peak_bytes": -math.inf},
                                        worker="w0", node="n", environment=ENV)])  # fmt: skip
        got = next(t for t in store.trials(job) if t.id == first.id)
        assert got.metrics == {"gbps": None, "series": {"hit rate": [0.5, None]}}
        assert got.memory == {"peak_bytes": None} and got.summary["cv"] is None
        assert got.median_ns == 1000 and got.status == "ok"
        warned = " ".join(r.getMessage() for r in caplog.records if r.name == "farm.store")
        assert "at gbps" in warned and "series.hit rate[1]" in warned  # the path inside the column's value
        assert "peak_bytes" in warned
    finally:
        store.close()


def test_the_encoding_names_each_non_finite_number_by_its_path():
    from jobs.store.finite_json import finite_json, non_finite_paths

    value = {"a": [1.0, math.nan], "b": {"c": -math.inf}, "d": "NaN"}
    assert non_finite_paths(value) == ["a[1]", "b.c"]
    assert json.loads(finite_json(value)) == {"a": [1.0, None], "b": {"c": None}, "d": "NaN"}
    assert finite_json({"x": 1.5}) == '{"x": 1.5}'


def test_a_stored_summary_reads_back_typed_whatever_the_row_holds():
    """Issue 30: readers took `(t.summary or {}).get("p10")` in about twenty places. TrialRow.stats is the
    one typed read (kernels.base.Summary.from_stored): no result, an old row missing keys, a string or a
    NaN where a number belongs all read as absent, never as a crash or a NaN downstream."""

    empty = Summary.from_stored(None)
    assert (empty.n, empty.median, empty.flags, empty.clocks, empty.discarded) == (0, None, (), {}, ())
    row = {"n": 3, "median": "12", "p10": math.nan, "cv": 0.5, "flags": ["noisy", 7], "discarded": [1, "x"],
           "clocks": {"cpu_time_ratio": 0.4}, "n_kept": True}  # fmt: skip
    odd = Summary.from_stored(row)
    assert (odd.n, odd.median, odd.p10, odd.cv) == (3, None, None, 0.5)
    assert odd.flags == ("noisy",) and odd.discarded == (1,) and odd.n_kept == 0
    assert odd.clocks["cpu_time_ratio"] == 0.4
    # a list's place holding a string or a mapping: no flags, no discarded samples (not its characters or
    # keys; what the history's own read of the flags gives, jobs.history.summary_stats)
    for wrong in ("drift", {"drift": True}, 5):
        bare = Summary.from_stored({"flags": wrong, "discarded": wrong})
        assert (bare.flags, bare.discarded) == ((), ()), wrong
    stored = Summary(n=2, median=1.0, mean=1.0, min=1.0, max=1.0, p10=1.0, p90=1.0, iqr=0.0, mad=0.0,
                     stdev=0.0, cv=0.0, flags=("few_samples",), discarded=(0,))  # fmt: skip
    assert Summary.from_stored(stored.to_dict()) == stored  # what the store keeps reads back the same


def test_no_reader_takes_the_summary_as_a_dict():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # TrialRow.summary["key"] is a JSON path in SQL (kept_samples_of's discarded list, which kept() reads
    # back through Summary.from_stored), not a dict
    as_dict = re.compile(r"summary\s+or\s+\{\}|\.summary\.get\(|(?<!TrialRow)\.summary\[")
    found = [f"{p.relative_to(root)}:{n}" for d in ("jobs", "cluster") for p in (root / d).rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if as_dict.search(line)]  # fmt: skip
    assert not found, found


def test_a_comparison_that_cannot_be_computed_is_none_with_its_reason_never_nan():
    """Issue 30: a side of fewer than 3 samples, or a zero median, gave NaN ratios and an inf cv that the
    report, the page and the drafts each had to guard against; now the figure is None and `reason` names
    why, in the comparison and in what the store keeps."""
    from kernels.measure.stats import compare_samples

    one = compare_samples([5.0], [5.0, 6.0, 7.0])
    assert (one.verdict, one.ratio, one.ci_low, one.p_value, one.cv_baseline) == (
        "ambiguous",
        None,
        None,
        None,
        None,
    )
    assert "no ratio" in one.reason and "n=1" in one.reason
    zero = compare_samples([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert zero.ratio is None and "median of zero" in zero.reason
    stored = json.loads(json.dumps(one.to_dict(), allow_nan=False))  # strict JSON: no NaN to refuse
    assert stored["ratio"] is None


def test_a_stored_comparison_reads_back_typed_whatever_the_evidence_holds():
    """The comparison and the run-level comparison are models from the judge to the drafts and pages:
    what `to_dict` stored reads back equal, and odd values (strings, NaN, missing keys, evidence written
    before the run-level verdict) read as None or the within-run figures, never as a crash."""
    from jobs.judge.runs import RunComparison, compare_runs
    from kernels.measure.stats import Comparison, compare_samples

    c = compare_samples([10.0, 10.1, 9.9, 10.0], [12.0, 12.1, 11.9, 12.0], min_effect=0.05, alpha=0.05)
    assert Comparison.from_stored(c.to_dict()) == c
    r = compare_runs([[10.0, 10.1, 9.9]] * 2, [[12.0, 12.1, 11.9]] * 2, min_effect=0.05, alpha=0.05,
                     max_cv=0.05, prior=0.02)  # fmt: skip
    back = RunComparison.from_stored(json.loads(json.dumps(r.to_dict())))
    assert back == r
    odd = RunComparison.from_stored(
        {"verdict": "slower?", "ratio": "1.2", "p_value": math.nan, "run_ratio": None}
    )
    assert (odd.verdict, odd.within.ratio, odd.within.p_value, odd.run_ratio) == (
        "ambiguous",
        None,
        None,
        None,
    )
    old = RunComparison.from_stored({"verdict": "slower", "ratio": 1.3, "ci_low": 1.2, "ci_high": 1.4})
    assert (old.verdict, old.run_ratio, old.run_low, old.run_high) == ("slower", 1.3, 1.2, 1.4)


def test_no_reader_takes_a_comparison_as_a_dict():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    keys = "ratio|run_ratio|ci_low|ci_high|run_ci_low|run_ci_high|p_value|within_verdict|cv_baseline"
    keys += "|cv_candidate"
    as_dict = re.compile(rf"""(\.get\(|\[)\s*["']({keys})["']\s*(?!\]\s*=[^=])""")
    model = root / "jobs" / "judge" / "runs.py"  # RunComparison.from_stored: the one place that reads them
    found = [f"{p.relative_to(root)}:{n}" for d in ("jobs", "cluster") for p in (root / d).rglob("*.py")
             if p != model
             for n, line in enumerate(p.read_text().splitlines(), 1) if as_dict.search(line)]  # fmt: skip
    assert not found, found
