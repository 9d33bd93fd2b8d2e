"""Reports of stored jobs: tables and files (render.py), A/B of two jobs (ab.py), exports (export.py)."""
