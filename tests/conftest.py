"""Process-wide test setup. Runs before any test module imports triton or ray.

Tiers (README, "Tests"): ``make test-fast`` runs every test not marked ``slow``; ``make test`` runs them
all. A test that needs a browser (``service("chromium")``) or a multi-node cluster (``multinode``) is in
the full tier whatever its own marks say. Services (PostgreSQL, Redis, Prometheus, Chromium) are required
in CI and optional elsewhere: tests/services.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Triton kernels run in the interpreter on CPU; this must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# The injected faults the tests use (gemm `_repeat`, probe `_slowdown`, ...) are a kernels.registry plugin;
# named here, before any Ray or subprocess starts, so every process of the session loads it.
os.environ.setdefault("FARM_PLUGINS", "testkit.kernels.faults")
# Ray: no telemetry, no auth tokens on the local test cluster, temp files in a folder we remove.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The CLI's tables are 200 columns wide when piped and COLUMNS is unset (jobs.cli.common.console); tests
# read them that way whatever the developer's terminal says or pytest-xdist's workers set (80).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# RAY_TMPDIR moves all of Ray's files (sessions, sockets, the current-cluster file) under one folder.
_RAY_TMP = tempfile.mkdtemp(prefix="kfray-", dir="/tmp")
os.makedirs(os.path.join(_RAY_TMP, "ray"), exist_ok=True)
os.environ["RAY_TMPDIR"] = _RAY_TMP
# Removed at session end (below) and, for a run that stops before its session starts (a bad
# FARM_TEST_SERVICES, a usage error), when the process exits.
atexit.register(shutil.rmtree, _RAY_TMP, ignore_errors=True)

import services  # noqa: E402  (tests/services.py; after the environment above)

FULL_TIER_SERVICES = ("chromium",)  # a test that needs one of these is slow by nature


def pytest_configure(config):
    services.required()  # a bad FARM_TEST_SERVICES stops the run before any test, naming it


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    for item in items:
        needs = {m.args[0] for m in item.iter_markers("service")}
        if item.get_closest_marker("multinode") or needs & set(FULL_TIER_SERVICES):
            item.add_marker(pytest.mark.slow)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("service"):
        services.require(mark.args[0])


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons.append(str(longrepr[2]))
    for line in services.summary(reasons):
        terminalreporter.write_line(line, yellow=True, bold=True)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    import sys

    if "ray" in sys.modules:  # the session's shared Ray (tests/raykit.py), if a test started it
        import raykit

        raykit.leave_local_ray()
    shutil.rmtree(_RAY_TMP, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local():
    """The session's one local Ray (tests/raykit.py: 4 logical GPUs, started on first use); the plan of
    all its workers. Ask for another layout with ``session.connect(gpus=N)``."""
    import raykit

    return raykit.local_ray()


@pytest.fixture(scope="session")
def farm_store_template(tmp_path_factory):
    """An SQLite results store migrated to the newest schema once; ``store`` copies it (a file copy costs
    a fraction of running the migrations in every test)."""
    from jobs.store import Store

    path = tmp_path_factory.mktemp("farm-template") / "farm.db"
    Store(str(path)).close()
    assert not Path(f"{path}-wal").exists(), "the template's WAL was not folded back into the file"
    return path


@pytest.fixture
def store(tmp_path, farm_store_template):
    """A fresh SQLite store in the test's folder (``tmp_path / "farm.db"``, a copy of the migrated
    template), closed after it."""
    from jobs.store import Store

    path = tmp_path / "farm.db"
    shutil.copyfile(farm_store_template, path)
    s = Store(str(path))
    yield s
    s.close()


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the whole session (tests/pgserver.py), shared by tests/jobs and
    tests/gateway; tests make their own databases on it. Missing: tests/services.py decides."""
    from pgserver import Unavailable, start_server

    try:
        server = start_server()
    except Unavailable as e:
        services.missing("postgresql", str(e))
    yield server
    server.stop()
