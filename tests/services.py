"""The outside services the tests run real copies of, and what a test does when one is missing.

`make test` installs them from Debian (scripts/debian-deps.sh): PostgreSQL and Redis (the team deployment:
the farm's store, the gateway's keys, ledger and shared limits), Prometheus (the dashboards' queries), its
Alertmanager (the budget alerts' notifications) and
Chromium (the HTML reports in a real browser). Where one cannot be found or started:

- **required** (CI: the ``CI`` variable is set and not ``false``/``0``; or ``FARM_TEST_SERVICES=required``):
  the test that needs it fails, naming the service and the fix. A CI run is never green without them.
- **optional** (a developer's own run, or ``FARM_TEST_SERVICES=optional``): the test skips with the same
  reason, and the run's summary says how many tests each missing service skipped.

Every such test reaches this module one way: a fixture or helper calls :func:`missing`, or the test carries
``@pytest.mark.service("prometheus")`` (checked in tests/conftest.py before it runs).

This module is imported as ``services`` (pytest puts tests/ on sys.path for tests/conftest.py).
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import NoReturn

import pytest

SKIP_PREFIX = "service missing: "  # how the run's summary finds these skips among the others
INSTALL = "`make test` installs it (scripts/debian-deps.sh)"

# service -> (the executables it needs, the Debian package)
SERVICES: dict[str, tuple[tuple[str, ...], str]] = {
    "postgresql": (("initdb", "pg_ctl"), "postgresql"),
    "redis": (("redis-server",), "redis-server"),
    "prometheus": (("prometheus", "promtool"), "prometheus"),
    "alertmanager": (("prometheus-alertmanager", "amtool"), "prometheus-alertmanager"),
    "chromium": (("chromium",), "chromium"),
}


def required() -> bool:
    """Whether a missing service fails the tests that need it (CI) instead of skipping them."""
    mode = os.environ.get("FARM_TEST_SERVICES", "").strip().lower()
    if mode in ("required", "optional"):
        return mode == "required"
    if mode:
        raise pytest.UsageError(f"FARM_TEST_SERVICES={mode!r}: expected `required` or `optional`")
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(service: str, reason: str) -> NoReturn:
    """A test cannot have ``service``: fail it (required) or skip it, naming the service and why."""
    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r} (known: {', '.join(SERVICES)})")
    if required():
        pytest.fail(
            f"{service} is required for this run (CI, or FARM_TEST_SERVICES=required) and is missing: "
            f"{reason}",
            pytrace=False,
        )
    pytest.skip(f"{SKIP_PREFIX}{service}: {reason}")


def executable(name: str) -> str | None:
    """Where ``name`` is: PostgreSQL's server binaries in Debian's newest versioned folder (not on PATH),
    anything else on PATH."""
    if name not in ("initdb", "pg_ctl", "postgres"):
        return shutil.which(name)
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return versions[-1] if versions else shutil.which(name)


def require(service: str) -> dict[str, str]:
    """The executables of ``service`` by name; calls :func:`missing` when one is not installed."""
    names, package = SERVICES[service]
    paths = {name: executable(name) for name in names}
    absent = [name for name, path in paths.items() if path is None]
    if absent:
        missing(service, f"{', '.join(absent)} not found: {INSTALL}, or `apt-get install {package}`")
    return {name: path for name, path in paths.items() if path is not None}


def summary(skip_reasons: list[str]) -> list[str]:
    """The lines the run's summary adds for tests skipped because a service is missing."""
    counts: dict[str, int] = {}
    for reason in skip_reasons:
        if SKIP_PREFIX in reason:
            service = reason.split(SKIP_PREFIX, 1)[1].split(":", 1)[0]
            counts[service] = counts.get(service, 0) + 1
    if not counts:
        return []
    total = sum(counts.values())
    each = ", ".join(f"{service} ({n})" for service, n in sorted(counts.items()))
    return [
        f"{total} test(s) SKIPPED because a service is missing: {each}. "
        "They fail instead in CI (CI=true or FARM_TEST_SERVICES=required); "
        "`make test` installs the services (scripts/debian-deps.sh)."
    ]
