"""Fixtures shared by the farm's job tests."""

from __future__ import annotations

import pytest

from jobs.store.repository import Store


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite store in the test's folder, closed after it."""
    s = Store(str(tmp_path / "farm.db"))
    yield s
    s.close()
