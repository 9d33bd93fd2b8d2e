"""`farm site -o DIR`: a static site of the store that a team can publish from CI, as asv's.

index.html            families and kernels (one row per point: family, backend, shape, config, dtype,
                      environment) with a sparkline of its history and its change points
kernels/<point>.html  one point's history across jobs, with the change points, the environment changes
                      (a performance component: torch, driver, ...) and a table of the jobs
jobs/<id>.html        one job's report (jobs.report.html)
account.html          the token account of the drafts and its four questions (jobs.report.account_page)
plotly.min.js         plotly.js, once for the whole site: every page opens offline

Every page is rendered from its template (jobs/report/templates/); this module prepares their data.

A kernel page shows the point's newest `last` jobs (jobs.history.series.DEFAULT_LAST, as `farm history`
does; --last on `farm site`), its change points found on those, and keeps them beside it as
kernels/<slug>.json (jobs.report.site_series).

A rebuild into the same folder writes only what changed (issue 46): `.site-manifest.json` keeps each
job's stamp (jobs.store.page_reads: status, end, verdict, its family's baselines) and each kernel's index
row; a job whose stamp changed (or a new one) gets its page again, and the kernel pages of the series its
trials are in: only those jobs' trials are read, their points merged into the kept series (change points
found again); the other pages stay as they are and the index is made from the kept rows. `full=True`, a
manifest of another version or of another `last`, none, or a job gone from the store rebuilds everything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from jobs.drafts.account import Account, build_account
from jobs.history.series import DEFAULT_LAST, Selection, Series, collect, paused_gc
from jobs.judge.environment import changed_text
from jobs.report.account_page import render_account
from jobs.report.figures import history_figure
from jobs.report.html import render_job
from jobs.report.plotting import figure_view
from jobs.report.recent import RecentReads
from jobs.report.rows import JobReads
from jobs.report.site_series import dumps, found, loads, merged, window
from jobs.report.templating import plotly_js, render_page
from jobs.report.views import NAV_INDEX, Link, Spark, Table, spark
from jobs.store import Store
from jobs.store.tables.trials import shape_key

MANIFEST = ".site-manifest.json"
MANIFEST_VERSION = 2  # 2: a kernel's row names its stored series; the manifest says the pages' `last`
WINDOWS_AT_ONCE = 250  # kernel pages made together (their change points found in one batch), then let go
PAGES_A_READ = 40  # job pages whose recent histories are read together (a night's 20; a full build's
# thousands, 40 consecutive ones at a time: what is kept in memory stays a few nights' rows)


@dataclass
class SiteResult:
    pages: int  # written by this build
    kernels: int  # in the site
    jobs: int  # in the site


@dataclass
class ChangeLine:
    """A change point as the kernel page lists it."""

    job_id: int
    commit: str
    before: str  # ms
    after: str
    magnitude: str  # +20.0%
    environment: str = ""  # what changed in the environment at the same job (performance components)


@dataclass
class SiteJob:
    """A job in the index's list."""

    id: int
    name: str
    commit: str


def _kernel_page(
    series: Series, last: int = DEFAULT_LAST, jobs: dict[tuple, tuple[Link, str, str]] | None = None
) -> str:
    """One point's history (its newest `last` jobs): its change points, the figure and the table of its
    jobs (each linked); `jobs`: a job's first cells (its link, commit and date), kept across the pages (a
    job is on a thousand of them)."""
    changes = {c.job_id: c for c in series.changes}
    marks = {m.job_id: m.text for m in series.marks}
    jobs = {} if jobs is None else jobs
    rows = []
    for p in series.points:
        c = changes.get(p.job_id)
        job = (p.job_id, p.commit, p.created_at)
        cells = jobs.get(job)
        if cells is None:
            link = Link(f"../jobs/{p.job_id}.html", str(p.job_id))
            cells = jobs[job] = (link, p.commit or "-", p.created_at.strftime("%Y-%m-%d %H:%M"))
        spread = p.spread_pct
        rows.append(
            [
                *cells,
                f"{p.median_ns / 1e6:.4f}",
                f"{spread:.1f}%" if spread is not None else "-",
                f"{c.magnitude:+.1%}" if c else "",
                marks.get(p.job_id, ""),
            ]
        )
    return render_page(
        "kernel.html.j2",
        series.key.label,
        "../plotly.min.js",
        nav=NAV_INDEX,
        series=series,
        last=last,
        changes=[
            ChangeLine(
                c.job_id,
                c.commit or "unknown",
                f"{c.before_ns / 1e6:.4f}",
                f"{c.after_ns / 1e6:.4f}",
                f"{c.magnitude:+.1%}",
                changed_text(c.environment),
            )
            for c in series.changes
        ],  # fmt: skip
        marks=series.marks,
        figure=figure_view(history_figure(series), "plot-history", 460),
        listing=Table(
            ["job", "commit", "created", "median ms", "spread", "change", "environment"], rows, left=3
        ),
    )


def _index_row(s: Series) -> dict:
    """A kernel's row of the index, as the manifest keeps it (JSON)."""
    change = s.changes[-1] if s.changes else None
    line = spark([p.median_ns for p in s.points], marks=tuple(c.index for c in s.changes))
    return {
        "family": s.key.family,
        "series": [s.key.family, s.key.backend, shape_key(dict(s.key.shape))],  # its trials' indexed key
        "slug": s.key.slug,
        "label": s.key.label,
        "env": s.key.env,
        "jobs": len(s.points),
        "last": f"{s.points[-1].median_ns / 1e6:.4f}",
        "change": f"job {change.job_id}: {change.magnitude:+.1%}" if change else "-",
        "spark": asdict(line) if isinstance(line, Spark) else line,
    }


def _family_table(rows: list[dict], family: str) -> Table:
    """The index's table of a family: a row per point, linked to its page, with its sparkline."""
    body = []
    for r in (r for r in rows if r["family"] == family):
        line = r["spark"]
        line = (
            Spark(line["width"], line["height"], line["points"], tuple(map(tuple, line["dots"])))
            if line
            else ""
        )
        body.append(
            [Link(f"kernels/{r['slug']}.html", r["label"]), r["env"], r["jobs"], r["last"], r["change"], line]
        )
    head = ["kernel", "environment", "jobs", "last median ms", "last change", "history"]
    return Table(head, body, left=2)


def _index(rows: list[dict], jobs: list[SiteJob], account: Account) -> str:
    families = sorted({r["family"] for r in rows})
    total = account.totals()
    return render_page(
        "index.html.j2",
        "KernelFarm",
        "plotly.min.js",
        total=total,
        tokens=f"{total.total_tokens:,}",
        families=[(family, _family_table(rows, family)) for family in families],
        jobs=jobs,
    )


def _write_changed(path: Path, text: str) -> None:
    """`text` into `path` unless it holds it already (plotly.js: 3.5 MB a build, the same each time)."""
    try:
        if path.read_text() == text:
            return
    except (OSError, ValueError):
        pass
    path.write_text(text)


def _manifest(out: Path, last: int) -> dict | None:
    try:
        found = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("version") != MANIFEST_VERSION or found.get("last") != last:
        return None
    return found


def build_site(
    store: Store,
    out: Path,
    account: Account | None = None,
    *,
    full: bool = False,
    last: int = DEFAULT_LAST,
) -> SiteResult:
    """The site of ``store`` in ``out``, rewriting only what changed since the last build there (unless
    ``full``). ``account``: the token account to show (`farm site` reads the gateway's ledger for it);
    None: the farm's own, without asking any gateway. ``last``: the newest jobs a kernel page shows."""
    if last < 1:
        raise ValueError(f"last={last}: a kernel page shows at least 1 job")
    # the collector paused: a night's build keeps ~a million objects alive until it ends (the series'
    # points, the pages' rows); its full passes over them were 1.2-1.6 s of 10-12 s of CPU at 1/64
    with paused_gc():
        return _build(store, Path(out), account, full, last)


def _build(store: Store, out: Path, account: Account | None, full: bool, last: int) -> SiteResult:
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    _write_changed(out / "plotly.min.js", plotly_js())
    before = None if full else _manifest(out, last)
    stamps = store.job_stamps()
    gone = set(before["jobs"]) - {str(j) for j in stamps} if before is not None else set()
    for job_id in gone:
        (out / "jobs" / f"{job_id}.html").unlink(missing_ok=True)
    if gone:
        before = None  # a job left the store: which kept series showed it is not known without them all
    emptied: set[str] = set()  # kept series left with no point in the store
    if before is None:
        changed, kernels = sorted(stamps), {}
        windows: Iterator[Series] = (window(s, last) for s in collect(store, detect=False))
    else:
        kept = before["jobs"]
        changed = sorted(j for j, stamp in stamps.items() if kept.get(str(j)) != stamp)
        kernels = before["kernels"]
        # a kernel page shows trials' results: only a new job, or one whose status or end moved, has new
        # ones (a new verdict or baseline changes the job's page only)
        ran = [j for j in changed if (kept.get(str(j)) or [None, None])[:2] != stamps[j][:2]]
        windows = _touched(store, out, kernels, ran, [j for j in ran if str(j) in kept], last, emptied)
    jobs: dict[tuple, tuple[Link, str, str]] = {}
    kernel_pages = 0
    while chunk := list(islice(windows, WINDOWS_AT_ONCE)):
        found(chunk)
        for s in chunk:
            (out / "kernels" / f"{s.key.slug}.html").write_text(_kernel_page(s, last, jobs))
            (out / "kernels" / f"{s.key.slug}.json").write_text(dumps(s))
            kernels[s.key.slug] = _index_row(s)
        kernel_pages += len(chunk)
    for slug in emptied:
        del kernels[slug]
        for suffix in (".html", ".json"):
            (out / "kernels" / f"{slug}{suffix}").unlink(missing_ok=True)
    recent, samples = RecentReads(store), {}
    for at, job_id in enumerate(changed):
        if at % PAGES_A_READ == 0:  # the next pages' recent histories: each job's rows read once for them
            recent = RecentReads(store, changed[at : at + PAGES_A_READ])
            samples = {}  # and the kept samples they read (a stored baseline's: once, not once a page)
        reads = JobReads(store, job_id, samples=samples, recent=recent)
        (out / "jobs" / f"{job_id}.html").write_text(
            render_job(store, job_id, "../plotly.min.js", NAV_INDEX, reads)
        )
    if account is None:
        account = build_account(store, use_env=False)
    (out / "account.html").write_text(render_account(account, (Link("index.html", "index"),)))
    listed = [SiteJob(j, name, (commit or "unknown commit")[:12]) for j, name, commit in store.jobs_brief()]
    (out / "index.html").write_text(_index(list(kernels.values()), listed, account))
    manifest = {
        "version": MANIFEST_VERSION,
        "last": last,
        "jobs": {str(j): st for j, st in stamps.items()},
        "kernels": kernels,
    }
    (out / MANIFEST).write_text(json.dumps(manifest))
    return SiteResult(pages=2 + kernel_pages + len(changed), kernels=len(kernels), jobs=len(stamps))


def _touched(
    store: Store,
    out: Path,
    kernels: dict[str, dict],
    ran: list[int],
    shown: list[int],
    last: int,
    emptied: set[str],
) -> Iterator[Series]:
    """The series that the jobs `ran` (new, or whose results moved; `shown`: those of them the site showed
    before) touch, with their points now, one at a time (a night's are 2,000); the kept ones left with no
    point go into `emptied`. Only those jobs' trials are read, and in whole a series whose kept window
    cannot tell its new one (site_series.merged)."""
    if not ran:
        return
    fresh = {s.key.slug: s for s in collect(store, Selection(jobs=frozenset(ran)), detect=False)}
    slugs = set(fresh)
    if shown:  # their old points may be in series they have no point in now
        series = {tuple(k) for k in store.series_keys_of(shown)}
        slugs |= {slug for slug, row in kernels.items() if tuple(row["series"]) in series}
    again = set()
    for slug in sorted(slugs):
        kept = loads(_read(out / "kernels" / f"{slug}.json")) if slug in kernels else None
        w = None if slug in kernels and kept is None else merged(kept, fresh.pop(slug, None), set(ran), last)
        if w is None:
            again.add(slug)
        elif w.points:
            yield w
        else:
            emptied.add(slug)
    if again:  # read whole: the few series whose window lost a point that nothing kept replaces
        series = frozenset(tuple(kernels[slug]["series"]) for slug in again)
        read = [window(s, last) for s in collect(store, Selection(series=series), detect=False)]
        yield from (s for s in read if s.key.slug in again)
        emptied |= again - {s.key.slug for s in read}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
