"""A trial's raw samples are one stored array (issue 46, jobs.store.sample_codec): every value back exactly,
in its order; migration 0010 turns a store's one-row-per-sample table into arrays without losing a value
(and its downgrade back), with the same report; `farm db prune --samples-older-than` says what it would
free, frees it only with --apply, and keeps summaries and the samples of baselines and confirmations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import text, update

from jobs.cli import main
from jobs.report import render
from jobs.report.rows import speedup_ci
from jobs.store import Base, Job, Store, make_engine, now
from jobs.store.results import result_of
from jobs.store.retention import Pruned
from jobs.store.sample_codec import RAW, ZLIB, pack, unpack
from jobs.store.schema import head_revision, schema_state, upgrade_schema
from jobs.store.trial_store import TrialStore
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: arrays
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1, 2]}}
"""


def _values(seq: int) -> list[int]:
    """A trial's samples: timing-like values, one above 2^32, one far out."""
    return [10_000 * (seq + 1) + (i * 37) % 101 for i in range(40)] + [2**33 + seq, 7]


@pytest.mark.parametrize("values", [[], [5], [1, 2, 3], _values(0), [2**62, -1, 0]])
def test_an_array_gives_back_every_value_in_order(values):
    codec, data = pack(values)
    assert unpack(codec, data) == values
    assert len(data) <= 8 * len(values)  # never bigger than the raw int64s


def test_zlib_is_used_where_it_pays_and_only_there():
    codec, data = pack(_values(0))
    assert codec == ZLIB and len(data) < 0.6 * 8 * len(_values(0))
    assert pack([123456789])[0] == RAW  # 8 bytes do not compress
    with pytest.raises(ValueError, match="unknown samples codec 'x'"):
        unpack("x", b"")


class _At0009(TrialStore):
    """The trial writes of a store still at revision 0009 (no schema check): jobs and trials as today."""

    def __init__(self, engine):
        self.engine = engine
        self._env_ids = {}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres")
        return server.url(server.create_database("arrays"))
    return str(tmp_path / "farm.db")


def _alembic_downgrade(engine, target: str) -> None:
    from alembic import command
    from alembic.config import Config

    from jobs.store.schema import MIGRATIONS_DIR, VERSION_TABLE

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, target)


def _rows(engine) -> dict[int, list[int]]:
    with engine.connect() as conn:
        got = conn.execute(text("SELECT trial_id, value_ns FROM samples ORDER BY trial_id, seq")).all()
    out: dict[int, list[int]] = {}
    for trial_id, v in got:
        out.setdefault(trial_id, []).append(v)
    return out


def _report(store: Store, job: int) -> tuple:
    trials = store.trials(job)
    base = {t.shape["n"]: t.id for t in trials if t.baseline}
    cis = [speedup_ci(store, base[t.shape["n"]], t.id) for t in trials if not t.baseline]
    return render.to_json(store, job), cis


def test_a_store_at_0009_with_sample_rows_is_upgraded_to_arrays_with_every_value_and_the_same_report(url):
    engine = make_engine(url, check_schema=False)
    upgrade_schema(engine, Base.metadata, target="0009")
    old = _At0009(engine)
    job = spec_job(old, SPEC)  # type: ignore[arg-type]  # the trial writes are all it uses
    trials = old.trials(job)
    written = {t.id: _values(t.seq) for t in trials}
    # results as 0009 stored them: the summary on the trial, the samples one row each
    old.record_results([result_of(t.id, summary=Summary.from_samples(written[t.id])) for t in trials])
    rows = [{"t": tid, "s": i, "v": v} for tid, vs in written.items() for i, v in enumerate(vs)]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO samples (trial_id, seq, value_ns) VALUES (:t, :s, :v)"), rows)

    upgrade_schema(engine, Base.metadata)
    assert schema_state(engine, Base.metadata).current == head_revision()
    store = Store(url)
    try:
        assert {tid: store.samples(tid) for tid in written} == written
        upgraded = _report(store, job)
        reference = Store(url)  # the same job written today, in the same store: the same report
        again = spec_job(reference, SPEC)
        redone = reference.trials(again)
        reference.record_results(
            [result_of(t.id, written[o.id]) for t, o in zip(redone, trials, strict=True)]
        )
        assert _report(reference, again) == upgraded
        assert upgraded[1] and all(ci is not None for ci in upgraded[1])  # the report read the samples
        reference.close()
    finally:
        store.close()

    _alembic_downgrade(engine, "0009")  # and back: one row per sample again, every value
    assert {tid: vs for tid, vs in _rows(engine).items() if tid in written} == written
    engine.dispose()


def _farm(*args: str):
    return CliRunner().invoke(main, list(args))


def test_prune_is_a_dry_run_until_apply_and_keeps_summaries_baselines_and_confirmations(store, tmp_path):
    db = str(tmp_path / "farm.db")
    jobs = {}
    for name in ("old", "old-base", "old-confirm", "new"):
        jobs[name] = spec_job(store, SPEC.replace("name: arrays", f"name: {name}"))
        store.record_results([result_of(t.id, _values(t.seq)) for t in store.trials(jobs[name])])
    assert _farm("baseline", "set", str(jobs["old-base"]), "--name", "main", "--db", db).exit_code == 0
    with store.engine.begin() as conn:
        for name in ("old", "old-base", "old-confirm"):
            conn.execute(
                update(Job).where(Job.id == jobs[name]).values(created_at=now() - timedelta(days=100))
            )
    before = {t.id: (store.samples(t.id), t.summary) for j in jobs.values() for t in store.trials(j)}
    old_trials = store.trials(jobs["old"])
    size = sum(len(pack(_values(t.seq))[1]) for t in old_trials)

    dry = _farm("db", "prune", "--samples-older-than", "90d", "--db", db)
    assert dry.exit_code == 0, dry.output
    assert f"would free the samples of 6 trials (252 values, {size:,} bytes of arrays)" in dry.output
    assert "--apply" in dry.output
    assert {t.id: (store.samples(t.id), t.summary) for j in jobs.values() for t in store.trials(j)} == before
    assert "of 0 trials" in _farm("db", "prune", "--samples-older-than", "101d", "--db", db).output

    done = _farm("db", "prune", "--samples-older-than", "12w", "--apply", "--db", db)
    assert done.exit_code == 0 and "freed the samples of 6 trials" in done.output, done.output
    for name, job in jobs.items():
        for t in store.trials(job):
            samples, summary = before[t.id]
            assert t.summary == summary  # every summary kept
            assert store.samples(t.id) == ([] if name == "old" else samples)
    assert "of 0 trials" in _farm("db", "prune", "--samples-older-than", "90d", "--apply", "--db", db).output
    report = _farm("report", str(jobs["old"]), "--db", db)  # a pruned job still reports its medians
    assert report.exit_code == 0, report.output


@pytest.mark.parametrize("age", ["90", "0d", "3m", "-5d", "d"])
def test_a_bad_age_is_one_line_and_exit_2(store, tmp_path, age):
    res = _farm("db", "prune", "--samples-older-than", age, "--db", str(tmp_path / "farm.db"))
    assert res.exit_code == 2 and "--samples-older-than" in res.output and "Traceback" not in res.output


def test_prune_counts_and_deletes_the_same_on_both_databases(url):
    store = Store(url)
    try:
        old, new = (spec_job(store, SPEC.replace("name: arrays", f"name: {n}")) for n in ("old", "new"))
        for job in (old, new):
            store.record_results([result_of(t.id, _values(t.seq)) for t in store.trials(job)])
        with store.engine.begin() as conn:
            conn.execute(update(Job).where(Job.id == old).values(created_at=now() - timedelta(days=30)))
        size = sum(len(pack(_values(t.seq))[1]) for t in store.trials(old))
        cutoff = now() - timedelta(days=7)
        assert store.prune_samples(cutoff) == store.prune_samples(cutoff) == Pruned(6, 6 * 42, size)
        assert store.prune_samples(cutoff, apply=True).trials == 6
        assert store.prune_samples(cutoff).trials == 0
        assert [store.samples(t.id) for t in store.trials(old)] == [[]] * 6
        assert all(store.samples(t.id) for t in store.trials(new))
    finally:
        store.close()
