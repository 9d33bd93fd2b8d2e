"""The shipped Prometheus config, alert rules, Grafana provisioning and dashboard JSON are valid."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import yaml
from promkit import GRAFANA, PROMTOOL, dashboards, needs_promtool, panels


def promtool(*args: str, cwd: Path = GRAFANA) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_check_config_passes():
    r = promtool("check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_promtool_check_rules_passes():
    r = promtool("check", "rules", "alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "10 rules found" in r.stdout


def test_prometheus_yml_scrapes_the_gateway_the_farm_and_ray():
    cfg = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["kernelfarm-gateway"]["static_configs"][0]["targets"] == ["127.0.0.1:8787"]
    assert jobs["kernelfarm-farm"]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    assert jobs["ray"]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
    assert cfg["rule_files"] == ["alerts.yml"]


ALERT_TESTS = """
rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # alpha: 10 requests a minute, 2 of them turned away by rpm (20 %)
      - series: 'gateway_requests_total{project="alpha", model="m", task="t", status="ok"}'
        values: '0+8x30'
      - series: 'gateway_requests_total{project="alpha", model="m", task="t", status="rejected"}'
        values: '0+2x30'
      - series: 'gateway_rejections_total{project="alpha", limit="rpm"}'
        values: '0+2x30'
      # beta: no rejections
      - series: 'gateway_requests_total{project="beta", model="m", task="t", status="ok"}'
        values: '0+10x30'
      - series: 'gateway_daily_budget_tokens{project="alpha"}'
        values: '1000x30'
      - series: 'gateway_daily_budget_remaining_tokens{project="alpha"}'
        values: '800x2 500x8 50x20'
      # beta's cost budget, reported by two instances (one of them behind): 30% used, 60% by 5m, spent by 20m
      - series: 'gateway_daily_cost_budget_usd{project="beta", instance="a"}'
        values: '10x30'
      - series: 'gateway_daily_cost_budget_usd{project="beta", instance="b"}'
        values: '10x30'
      - series: 'gateway_daily_cost_budget_remaining_usd{project="beta", instance="a"}'
        values: '7x4 4x15 0x11'
      - series: 'gateway_daily_cost_budget_remaining_usd{project="beta", instance="b"}'
        values: '7x30'
      - series: 'gateway_request_latency_seconds_bucket{project="beta", model="m", status="ok", le="60"}'
        values: '0+1x30'
      - series: 'gateway_request_latency_seconds_bucket{project="beta", model="m", status="ok", le="120"}'
        values: '0+10x30'
      - series: 'gateway_request_latency_seconds_bucket{project="beta", model="m", status="ok", le="+Inf"}'
        values: '0+10x30'
      - series: 'farm_trials_total{family="fp8_gemm", backend="triton", status="ok"}'
        values: '0+6x30'
      - series: 'farm_trials_total{family="fp8_gemm", backend="triton", status="crashed"}'
        values: '0+4x30'
      - series: 'farm_trials_total{family="probe", backend="noop", status="ok"}'
        values: '0+10x30'
"""


# (alert, its labels besides severity warning, its summary) expected at 25m of ALERT_TESTS' series
FIRING = [
    ("GatewayHigh429Rate", {"project": "alpha", "limit": "rpm"}, "alpha: 20% of requests hit the rpm limit"),
    ("GatewayLatencyP95High", {"project": "beta", "model": "m"}, "beta/m: p95 latency 1m 56s"),
    ("FarmTrialFailureRateHigh", {"family": "fp8_gemm"}, "fp8_gemm: 40% of trials failed"),
]


# (eval time, the budget alerts firing then: project, budget, band, severity, summary); one per project in
# one band at a time, whatever the number of instances reporting it
BUDGET_FIRING = [
    ("1m", []),  # alpha 20%, beta 30%: under every band
    ("5m", [("alpha", "tokens", "50%", "warning", "alpha: 50% of today's token budget used"),
            ("beta", "cost", "50%", "warning", "beta: 60% of today's cost budget used")]),
    ("25m", [("alpha", "tokens", "80%", "warning", "alpha: 95% of today's token budget used"),
             ("beta", "cost", "100%", "critical", "beta: 100% of today's cost budget used")]),
]  # fmt: skip


@needs_promtool
def test_alerts_fire_on_synthetic_series(tmp_path):
    """`promtool test rules`: each alert fires for the project or family over its threshold, no other."""
    test_file = tmp_path / "alerts_test.yml"
    rules = yaml.safe_load((GRAFANA / "alerts.yml").read_text())
    desc = {r["alert"]: r["annotations"]["description"] for g in rules["groups"] for r in g["rules"]}
    desc["GatewayDailyBudgetUsed"] = {
        r["labels"]["budget"]: r["annotations"]["description"]
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == "GatewayDailyBudgetUsed"
    }
    spec = yaml.safe_load(textwrap.dedent(ALERT_TESTS))
    spec["rule_files"] = [str(GRAFANA / "alerts.yml")]
    spec["tests"][0]["alert_rule_test"] = [
        {
            "eval_time": "25m",
            "alertname": alert,
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", **labels},
                    "exp_annotations": {"summary": summary, "description": desc[alert]},
                }
            ],
        }
        for alert, labels, summary in FIRING
    ] + [
        {
            "eval_time": when,
            "alertname": "GatewayDailyBudgetUsed",
            "exp_alerts": [
                {
                    "exp_labels": {
                        "severity": severity,
                        "project": project,
                        "budget": budget,
                        "threshold": band,
                    },
                    "exp_annotations": {
                        "summary": summary,
                        "description": desc["GatewayDailyBudgetUsed"][budget],
                    },
                }
                for project, budget, band, severity, summary in firing
            ],
        }
        for when, firing in BUDGET_FIRING
    ]
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_provisioning_points_at_prometheus_and_the_dashboards():
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/kernelfarm.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["url"] == "${KF_PROMETHEUS_URL}"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/kernelfarm.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "${KF_DASHBOARDS}"


def test_dashboards_are_grafana_10_json_with_a_prometheus_datasource_variable():
    boards = dashboards()
    assert set(boards) == {"gateway.json", "farm.json"}
    uids = set()
    for name, board in boards.items():
        assert board["schemaVersion"] >= 38, name  # Grafana 10.0 writes 38
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = []
        for panel in panels(board):
            ids.append(panel["id"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]
            for t in panel["targets"]:
                assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), panel["title"]
        assert len(ids) == len(set(ids)), name
    assert len(uids) == len(boards)


def test_dashboards_cover_the_issue():
    titles = {name: " | ".join(p["title"].lower() for p in panels(b)) for name, b in dashboards().items()}
    for words in [
        "requests/s by project and status", "input tokens/s", "output tokens/s", "tokens per task",
        "end-to-end latency", "upstream latency", "overhead", "time to first token", "retries",
        "429s", "in flight", "queue wait", "budget",
        # the token account's row (issue 33)
        "tokens per task and model", "upstream 429s/s per task", "retry wait per task",
        "calls and cost per task and model",
    ]:  # fmt: skip
        assert words in titles["gateway.json"], words
    for words in [
        "trials/s", "trial duration", "failures", "timeouts and retries", "busy workers per node and gpu",
        "queue length", "kernel median latency by family and backend", "anomalies by kind",
    ]:  # fmt: skip
        assert words in titles["farm.json"], words
