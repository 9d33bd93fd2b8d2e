"""benchmarks/scale_commands.py's memory figures (issue 46: memory flat as the store grows): the peak over
what a process holds before a command runs, read from the kernel (VmHWM after clear_refs), and each
command run in a fresh process on a real SQLite store of two nights of the synthetic team."""

from __future__ import annotations

import pytest

from benchmarks import scale_commands as sc
from benchmarks import scale_store as ss
from jobs.store import Store

MB = 1 << 20


def test_the_peak_over_a_run_counts_what_it_allocated_and_freed():
    held = sc.peak_over(lambda: bytearray(b"\x01") * (64 * MB))  # written, so resident; freed after
    assert held["reset"] is True
    assert held["mb"] >= 60, held
    idle = sc.peak_over(lambda: None)
    assert idle["mb"] < 16, idle  # the 64 MB of the run before are not counted again


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory) -> str:
    db = str(tmp_path_factory.mktemp("scale") / "farm.db")
    store = Store(db)
    ss.build(store, 2, pools=ss.make_pools(store, draws=1))
    store.close()
    return db


def test_a_command_in_a_fresh_process_gives_its_memory_and_time(two_nights):
    got = sc.memory_all(two_nights, only=["drafts account"], clock="cpu")
    m = got["drafts account"]
    assert m["reset"] is True and m["s"] >= 0
    assert m["peak_mb"] >= m["base_mb"] > 50  # the interpreter with the CLI's modules
    assert m["mb"] == pytest.approx(m["peak_mb"] - m["base_mb"])


def test_an_unknown_command_is_named_with_the_known_ones(two_nights):
    with pytest.raises(ValueError, match=r"no command named \['jobs lsit'\].*jobs list"):
        sc.memory_all(two_nights, only=["jobs lsit"])


def test_every_clock_is_read_over_the_same_runs(two_nights):
    got = sc.time_all_clocks(two_nights, repeat=1, only=["drafts account"])
    assert set(got) == {"wall", "cpu"}  # SQLite: no server's clock
    assert got["wall"]["drafts account"] > 0 and got["cpu"]["drafts account"] > 0


def test_a_postgresql_servers_cpu_is_a_clock_of_its_processes(postgres):
    from sqlalchemy import text

    url = postgres.url(postgres.create_database("clocks"))
    store = Store(url)
    try:
        pool = ss.make_pool(ss.SPECS["gemm-nightly"], ss.environment_id(store), seed=0, draws=1)
        plans = [ss.JobPlan("gemm-nightly", n, ss.START, 0, frozenset()) for n in range(2)]
        ss.write_jobs(store, plans, {"gemm-nightly": pool})
        clock = sc.server_cpu_clock(url)
        assert clock is not None
        before = clock()
        with store.engine.connect() as conn:  # a backend's own work, counted while it runs
            conn.execute(text("SELECT count(*) FROM generate_series(1, 3000000)")).scalar()
            assert clock() > before
        got = sc.time_all_clocks(url, repeat=0, only=["drafts list JOB"])
        assert set(got) == {"wall", "cpu", "server_cpu"}
        assert got["server_cpu"]["drafts list JOB"] >= 0
    finally:
        store.close()


def test_no_server_clock_for_sqlite(two_nights):
    assert sc.server_cpu_clock(two_nights) is None
