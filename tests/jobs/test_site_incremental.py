"""`farm site` into a folder it built before writes only what changed (issue 46): nothing but the index
and the account when nothing did; after one more job, that job's page and the kernel pages of its
points; after a new verdict on an old job, that job's page. What it leaves is what a full build makes:
the index, every page and every kernel's kept series equal a full rebuild's, byte for byte. A kernel page
shows its point's newest `last` jobs: a night slides the kept windows with only the night's trials read,
and a window that lost a point it cannot replace is read from the store again."""

from __future__ import annotations

import filecmp
import json
import shutil

import numpy as np
import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from benchmarks import history_store as hs
from jobs.history.series import DEFAULT_LAST
from jobs.report.site import MANIFEST, build_site
from jobs.store import FailureRecord, Job, Store, TrialRow


def _mtimes(out) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*.html")}


def _same_as_a_full_build(store: Store, out, tmp_path, last: int = DEFAULT_LAST, but: tuple = ()) -> None:
    """The pages and kept series in `out` are a full build's, byte for byte (`but` these pages)."""
    full = tmp_path / "full"
    shutil.rmtree(full, ignore_errors=True)
    build_site(store, full, full=True, last=last)

    def files(root) -> list[str]:
        found = [*root.rglob("*.html"), *root.glob("kernels/*.json")]
        return sorted(name for p in found if (name := str(p.relative_to(root))) not in but)

    assert files(out) == files(full)
    _match, mismatch, errors = filecmp.cmpfiles(out, full, files(out), shallow=False)
    assert mismatch == [] and errors == []


def _kept(out) -> dict[str, list[list]]:
    """Each kernel's kept series (kernels/<slug>.json): its jobs' rows."""
    return {p.stem: json.loads(p.read_text())["jobs"] for p in (out / "kernels").glob("*.json")}


def _night(store: Store, number: int) -> int:
    level = lambda _point: hs.MS * 1e6 * 1.2  # noqa: E731 - one more night, at the slowed level
    return hs._written_job(store, hs.spec_yaml(), number, level, hs.CPU_ENV, np.random.default_rng(number))


def _edit(store: Store, *statements) -> None:
    with Session(store.engine) as s, s.begin():
        for statement in statements:
            s.execute(statement)


@pytest.fixture
def history(store_url):
    """8 jobs of the history spec, on SQLite and on PostgreSQL (the night's read, the kept series' merge
    and the baselines as they stood are statements of both)."""
    store = Store(store_url)
    hs.build_history_store(store, jobs=8, slow_from=5)
    yield store
    store.close()


def test_a_rebuild_writes_only_what_changed_and_ends_as_a_full_build(history, tmp_path):
    store, out = history, tmp_path / "site"
    first = build_site(store, out)
    assert first.jobs == 8 and first.kernels == 2 and first.pages == 2 + 2 + 8
    assert (out / MANIFEST).exists()
    built = _mtimes(out)

    again = build_site(store, out)  # nothing changed
    assert again.pages == 2
    now = _mtimes(out)
    assert {p: t for p, t in now.items() if p not in ("index.html", "account.html")} == {
        p: t for p, t in built.items() if p not in ("index.html", "account.html")
    }

    new = _night(store, 9)
    night = build_site(store, out)
    assert night.pages == 2 + 2 + 1 and night.jobs == 9  # index, account, 2 kernels, the new job
    after = _mtimes(out)
    assert f"jobs/{new}.html" in after
    rewritten = {p for p in after if after[p] != now.get(p)}
    assert rewritten == {"index.html", "account.html", f"jobs/{new}.html"} | {
        p for p in after if p.startswith("kernels/")
    }
    _same_as_a_full_build(store, out, tmp_path)

    old = sorted(int(p[5:-5]) for p in after if p.startswith("jobs/"))[0]
    store.replace_failures(old, [FailureRecord(None, "probe", "correct", "fail", "f" * 32, "x", "boom", {})])
    verdict = build_site(store, out)
    assert verdict.pages == 2 + 1
    latest = _mtimes(out)
    assert {p for p in latest if latest[p] != after[p]} == {"index.html", "account.html", f"jobs/{old}.html"}
    assert "boom" in (out / "jobs" / f"{old}.html").read_text()
    _same_as_a_full_build(store, out, tmp_path)


def test_a_manifest_of_another_version_or_none_means_a_full_build(history, tmp_path):
    out = tmp_path / "site"
    build_site(history, out)
    (out / MANIFEST).write_text('{"version": 0}')
    assert build_site(history, out).pages == 2 + 2 + 8
    (out / MANIFEST).unlink()
    assert build_site(history, out).pages == 2 + 2 + 8


def test_plotly_js_is_written_once_and_again_only_when_it_differs(history, tmp_path):
    out = tmp_path / "site"
    build_site(history, out)
    js = out / "plotly.min.js"
    written = js.stat().st_mtime_ns
    build_site(history, out)
    assert js.stat().st_mtime_ns == written
    js.write_text("stale")
    build_site(history, out)
    assert js.stat().st_size > 1_000_000


def test_a_night_slides_each_kernels_window_reading_only_the_nights_trials(history, tmp_path):
    store, out = history, tmp_path / "site"
    jobs = sorted(int(j) for j in store.job_stamps())
    build_site(store, out, last=3)
    assert {slug: [r[0] for r in rows] for slug, rows in _kept(out).items()} == {
        slug: jobs[-3:] for slug in _kept(out)
    }
    assert "its newest 3 jobs" in next((out / "kernels").glob("*.html")).read_text()
    # an old trial altered behind the stamps: a rebuild that read the old jobs again would show it
    altered = jobs[-2]
    with Session(store.engine) as s:
        medians = dict(
            s.execute(select(TrialRow.id, TrialRow.median_ns).where(TrialRow.job_id == altered)).all()
        )
    _edit(store, update(TrialRow).where(TrialRow.job_id == altered).values(median_ns=1.0))
    new = _night(store, 9)
    night = build_site(store, out, last=3)
    assert night.pages == 2 + 2 + 1
    for rows in _kept(out).values():
        assert [r[0] for r in rows] == [jobs[-2], jobs[-1], new]  # the window slid by one
        assert rows[0][5] == medians[rows[0][4]]  # the kept median, not the altered one
    for trial, median in medians.items():
        _edit(store, update(TrialRow).where(TrialRow.id == trial).values(median_ns=median))
    # the night's job page showed the altered trial in its recent history: it read the store, as it should
    _same_as_a_full_build(store, out, tmp_path, last=3, but=(f"jobs/{new}.html",))


def test_a_shown_job_that_lost_its_point_has_the_series_read_again(history, tmp_path):
    """The newest job's trial of one kernel fails after the site showed it (its status and end moved): the
    kernel's full window is one short, and the job before the window takes its place from the store."""
    store, out = history, tmp_path / "site"
    jobs = sorted(int(j) for j in store.job_stamps())
    build_site(store, out, last=3)
    with Session(store.engine) as s:
        trial = s.scalars(
            select(TrialRow.id).where(TrialRow.job_id == jobs[-1]).order_by(TrialRow.seq)
        ).first()
    _edit(store, update(TrialRow).where(TrialRow.id == trial).values(status="error"))
    store.set_job_status(jobs[-1], "failed")
    rebuilt = build_site(store, out, last=3)
    assert rebuilt.pages == 2 + 2 + 1  # both kernels of the job, and its page
    windows = sorted([r[0] for r in rows] for rows in _kept(out).values())
    assert windows == [[jobs[-4], jobs[-3], jobs[-2]], [jobs[-3], jobs[-2], jobs[-1]]]
    _same_as_a_full_build(store, out, tmp_path, last=3)


def test_a_damaged_kept_series_is_read_again_and_a_job_gone_rebuilds_everything(history, tmp_path):
    store, out = history, tmp_path / "site"
    build_site(store, out, last=3)
    damaged = next((out / "kernels").glob("*.json"))
    damaged.write_text('{"format": 1, "jobs": [[1, 2]]}')
    _night(store, 9)
    assert build_site(store, out, last=3).pages == 2 + 2 + 1
    _same_as_a_full_build(store, out, tmp_path, last=3)

    first = min(int(j) for j in store.job_stamps())
    _edit(store, delete(TrialRow).where(TrialRow.job_id == first), delete(Job).where(Job.id == first))
    assert build_site(store, out, last=3).pages == 2 + 2 + 8  # every page: the job left the store
    assert not (out / "jobs" / f"{first}.html").exists()
    _same_as_a_full_build(store, out, tmp_path, last=3)


def test_a_site_built_for_another_window_is_built_again(history, tmp_path):
    out = tmp_path / "site"
    build_site(history, out, last=3)
    assert build_site(history, out, last=5).pages == 2 + 2 + 8
    assert build_site(history, out, last=5).pages == 2
    with pytest.raises(ValueError, match="last=0"):
        build_site(history, out, last=0)


def test_a_baseline_moved_after_the_jobs_ended_rewrites_none_of_their_pages(history, tmp_path):
    """A job page compares with the stored baseline as it stood when the job ended (the one its verdict
    was judged against): a weekly move rewrites the index and the account, not every job of the family."""
    from jobs.judge import baselines

    store, out = history, tmp_path / "site"
    jobs = sorted(int(j) for j in store.job_stamps())
    baselines.set_from_job(store, jobs[2], "probe-nightly")
    night = _night(store, 9)
    build_site(store, out)
    before = (out / "jobs" / f"{night}.html").read_text()
    baselines.set_from_job(store, jobs[-1], "probe-nightly", force=True)
    assert build_site(store, out).pages == 2
    assert (out / "jobs" / f"{night}.html").read_text() == before
    _same_as_a_full_build(store, out, tmp_path)
