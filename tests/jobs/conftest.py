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


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A fresh, empty store: an SQLite file, or a new database on the session's PostgreSQL server."""
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres")
        return server.url(server.create_database("farm"))
    return f"sqlite:///{tmp_path / 'farm.db'}"
