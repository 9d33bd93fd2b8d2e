"""`farm site` into a folder it built before writes only what changed (issue 46): nothing but the index
and the account when nothing did; after one more job, that job's page and the kernel pages of its
points; after a new verdict on an old job, that job's page. What it leaves is what a full build makes:
the index and every page equal a full rebuild's, byte for byte."""

from __future__ import annotations

import filecmp

import numpy as np
import pytest

from benchmarks import history_store as hs
from jobs.report.site import MANIFEST, build_site
from jobs.store import FailureRecord, Store


def _mtimes(out) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*.html")}


def _same_as_a_full_build(store: Store, out, tmp_path) -> None:
    full = tmp_path / "full"
    build_site(store, full, full=True)
    pages = sorted(str(p.relative_to(out)) for p in out.rglob("*.html"))
    assert pages == sorted(str(p.relative_to(full)) for p in full.rglob("*.html"))
    _match, mismatch, errors = filecmp.cmpfiles(out, full, pages, shallow=False)
    assert mismatch == [] and errors == []


@pytest.fixture
def history(tmp_path):
    store = Store(str(tmp_path / "farm.db"))
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

    level = lambda _point: hs.MS * 1e6 * 1.2  # noqa: E731 - one more night, at the slowed level
    new = hs._written_job(store, hs.spec_yaml(), 9, level, hs.CPU_ENV, np.random.default_rng(9))
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
