"""Running a sweep: the runner, its live progress view and the Prometheus farm metrics."""
