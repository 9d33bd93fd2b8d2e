"""Judging a job: the card's checks, acceptance, interleaved confirmation, anomalies and baselines."""
