"""tests/services.py: a missing service fails a CI run, naming it, and skips a developer's run, counted.

Each case runs pytest itself, in a child process, with PATH holding none of the services' executables
(what a CI machine that failed to install them would see), on tests that need Redis, Prometheus and
Chromium by their ``service`` mark (tests/harness/needs_services.py) and, in CI, on a real gateway test
whose session fixture starts Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKED = ["tests/harness/needs_services.py"]
REDIS_FIXTURE = [
    "tests/gateway/redis/test_redis_shared_state.py::test_rpm_admits_exactly_the_limit_across_two_gateways"
]


def _pytest(tmp_path: Path, *tests: str, **env: str) -> subprocess.CompletedProcess:
    bare = tmp_path / "bin"  # a PATH without redis-server, prometheus, promtool or chromium
    bare.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "FARM_TEST_SERVICES")}
    environ |= {"PATH": str(bare), **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", *tests],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow  # two child pytest runs, one of them importing the gateway
def test_in_ci_a_missing_service_fails_the_run_naming_it(tmp_path):
    ci = _pytest(tmp_path, *MARKED, *REDIS_FIXTURE, CI="true")
    out = ci.stdout + ci.stderr
    assert ci.returncode == 1, out
    assert "4 errors" in out.splitlines()[-1], out  # each fails before it runs
    assert "skipped" not in out.splitlines()[-1], out  # nothing quietly skipped
    for service, what in (("redis", "redis-server"), ("prometheus", "prometheus"), ("chromium", "chromium")):
        assert re.search(rf"^{service} is required for this run .* is missing: {what}", out, re.M), (
            service,
            out,
        )
    assert "redis-server is not installed" in out, out  # the fixture's own reason, from redis_server.py

    # the explicit switch does the same without CI
    switched = _pytest(tmp_path, *MARKED, FARM_TEST_SERVICES="required")
    assert switched.returncode == 1 and "redis is required for this run" in switched.stdout


def test_a_developer_run_skips_them_and_the_summary_counts_them(tmp_path):
    dev = _pytest(tmp_path, *MARKED)
    out = dev.stdout + dev.stderr
    assert dev.returncode == 0, out
    assert "3 skipped" in out.splitlines()[-1], out
    assert "3 test(s) SKIPPED because a service is missing: chromium (1), prometheus (1), redis (1)" in out


def test_a_bad_switch_is_named(tmp_path):
    bad = _pytest(tmp_path, *MARKED, FARM_TEST_SERVICES="sometimes")
    assert bad.returncode == 4, bad.stdout + bad.stderr  # a usage error: nothing ran
    assert "FARM_TEST_SERVICES='sometimes'" in bad.stdout + bad.stderr
