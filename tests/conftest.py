"""Process-wide test setup. Runs before any test module imports triton or ray."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Triton kernels run in the interpreter on CPU; this must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Ray: no telemetry, no auth tokens on the local test cluster, temp files in a folder we remove.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# RAY_TMPDIR moves all of Ray's files (sessions, sockets, the current-cluster file) under one folder.
_RAY_TMP = tempfile.mkdtemp(prefix="kfray-", dir="/tmp")
os.makedirs(os.path.join(_RAY_TMP, "ray"), exist_ok=True)
os.environ["RAY_TMPDIR"] = _RAY_TMP


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    shutil.rmtree(_RAY_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the whole session (tests/pgserver.py), shared by tests/jobs and
    tests/gateway; a skip saying why where none can be started. Tests make their own databases on it."""
    from pgserver import Unavailable, start_server

    try:
        server = start_server()
    except Unavailable as e:
        pytest.skip(str(e))
    yield server
    server.stop()
