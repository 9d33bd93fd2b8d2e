"""The farm's orchestration, in layers that import downwards only (import-linter, pyproject.toml):

  entry.py        the `farm` executable
  cli/            the command line, one module per verb group
  report/         tables, HTML pages (Jinja2 templates), the static site, A/B, exports
  drafts/ history/  anomalies compressed for the gateway, and their review | one point's series across jobs
  judge/ queue/   checks, acceptance, confirmation, anomalies, baselines | submit, warm pools, notify
  run/            running a sweep: the runner, progress, Prometheus farm metrics
  store/ spec/    the results store (SQLite / PostgreSQL, Alembic) | YAML specs and metric cards
  settings.py errors.py  FarmSettings | the exit-code errors

A job id through `farm accept`: cli.accept -> cli.common -> store.trial_store -> judge.acceptance ->
store.judging (everything the judge reads, at once) -> store.finding_store (`python -m benchmarks call-path`).
"""
