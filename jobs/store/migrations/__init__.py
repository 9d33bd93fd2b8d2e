"""Alembic migrations of the farm's results store (run by ``farm db upgrade``; see jobs.store.schema)."""
