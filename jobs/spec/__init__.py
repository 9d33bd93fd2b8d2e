"""Specs and metric cards: the YAML a job starts from, validated before anything runs."""
