"""Judging a job: the card's checks, acceptance, interleaved confirmation, anomalies, baselines, and what
differs between two environments (environment.py)."""
