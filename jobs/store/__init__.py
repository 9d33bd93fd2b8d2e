"""The results store: the tables and their repository (repository.py), the schema version (schema.py) and
the Alembic migrations (migrations/)."""
