"""Run only by tests/harness/test_services.py, in a child pytest (the name keeps it out of collection):
one test for each way a test needs a service."""

from __future__ import annotations

import pytest


@pytest.mark.service("redis")
def test_marked_redis():
    pass


@pytest.mark.service("prometheus")
def test_marked_prometheus():
    pass


@pytest.mark.service("chromium")
def test_marked_chromium():
    pass
