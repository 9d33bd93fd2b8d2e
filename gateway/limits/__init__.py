"""Per-project limits: admit, release, settle."""
