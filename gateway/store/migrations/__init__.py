"""Alembic migrations of the gateway's tables (run by ``farm gateway db upgrade``; see gateway.store.db)."""
