"""Every dashboard query parses (promtool, Prometheus' own parser) and names only metrics that a live
gateway or a live farm exporter serves on /metrics."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from poolkit import busy_pool_metrics
from promkit import (
    PROMTOOL,
    LiveGateway,
    exported_sample_names,
    http_get,
    metric_names,
    needs_promtool,
    queries,
    substitute,
)

from jobs.run.farm_metrics import FarmMetrics


@pytest.fixture(scope="module")
def live_names(tmp_path_factory) -> set[str]:
    """Sample names from the /metrics of a running gateway (a budgeted project, so the budget gauges
    exist) and of a running farm exporter."""
    gw = LiveGateway(
        tmp_path_factory.mktemp("gw") / "gw.db", projects={"alpha": {"daily_token_budget": 1_000_000}}
    )
    farm = FarmMetrics()
    _pool, store = busy_pool_metrics(tmp_path_factory.mktemp("pool") / "farm.db", farm.registry)
    try:
        farm.serve(0)
        assert farm.url is not None
        names = exported_sample_names(http_get(f"{gw.url}/metrics")) | exported_sample_names(
            http_get(farm.url)
        )
    finally:
        farm.close()
        store.close()
        gw.stop()
    assert "gateway_requests_total" in names and "farm_trials_total" in names
    return names


@needs_promtool
def test_every_dashboard_query_parses(tmp_path):
    """Each query, as Grafana sends it, becomes a recording rule that `promtool check rules` parses."""
    qs = queries()
    assert len(qs) >= 30
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"kf:dashboard_query:{i}", "expr": substitute(t["expr"])}
                    for i, (_, _, t) in enumerate(qs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    assert PROMTOOL is not None
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(qs)} rules found" in r.stdout


def test_every_dashboard_query_names_only_exported_metrics(live_names):
    unknown = {}
    for board, title, target in queries():
        names = metric_names(substitute(target["expr"]))
        assert names, (board, title, target["expr"])
        missing = names - live_names
        if missing:
            unknown[f"{board}: {title} [{target['refId']}]"] = sorted(missing)
    assert not unknown, unknown


def test_metric_names_reads_selectors_not_functions_labels_or_durations():
    expr = substitute(
        "histogram_quantile(0.95, sum by (le, project) (rate(gateway_request_latency_seconds_bucket"
        '{project=~"$project", status!="ok"}[$__rate_interval] offset 5m))) / on (project) group_left '
        "sum without (model) (gateway_in_flight) > bool 1e3 and absent(farm_queue_length)"
    )
    assert metric_names(expr) == {
        "gateway_request_latency_seconds_bucket",
        "gateway_in_flight",
        "farm_queue_length",
    }
    assert "not_a_metric" in metric_names("sum(rate(not_a_metric[5m]))")
