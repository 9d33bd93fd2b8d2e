"""Fixtures of tests/jobs."""

from __future__ import annotations

import pytest
import services


@pytest.fixture(scope="session")
def browser():
    """One headless chromium for the session (tests/jobs/chromium_cdp.py): `load(path)` a page, then
    `evaluate(js)` on it. Tests that use it carry ``@pytest.mark.service("chromium")``."""
    from chromium_cdp import Browser

    b = Browser(services.require("chromium")["chromium"])
    yield b
    b.close()
