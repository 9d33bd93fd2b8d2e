"""What `make monitor` starts the alerting with (gateway.ops.alerting, scripts/monitor.sh): Alertmanager's
route to the config's Slack-compatible webhook (amtool-checked), Prometheus' config alerting to it, a bad
webhook URL refused in one line; the cost budget's gauge beside the token budget's; and monitor.sh bringing
up a real Prometheus and Alertmanager that know each other."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from gateway.config import GatewaySettings
from gateway.ops.alerting import alertmanager_config, write_configs
from tests.gateway.serving import ROOT, free_port

HOOK = "http://127.0.0.1:9/hooks/team"


def _settings(**alerting) -> GatewaySettings:
    return GatewaySettings(alerting=alerting)


def test_the_route_goes_to_the_webhook_grouped_by_project_budget_and_band(tmp_path):
    am, prom = write_configs(
        _settings(slack_webhook_url=HOOK, channel="#gpu-team"), "127.0.0.1:9093", tmp_path
    )
    cfg = yaml.safe_load(am.read_text())
    (receiver,) = cfg["receivers"]
    (slack,) = receiver["slack_configs"]
    assert slack["api_url"] == HOOK and slack["channel"] == "#gpu-team" and slack["send_resolved"] is False
    assert cfg["route"]["receiver"] == receiver["name"]
    assert cfg["route"]["group_by"] == ["alertname", "project", "budget", "threshold"]
    assert stat.S_IMODE(am.stat().st_mode) == 0o600  # the webhook URL is a secret
    p = yaml.safe_load(prom.read_text())
    assert p["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    assert p["rule_files"] == [str(ROOT / "grafana" / "alerts.yml")]
    if shutil.which("amtool"):
        r = subprocess.run(["amtool", "check-config", str(am)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_without_a_webhook_alertmanager_holds_the_alerts():
    (receiver,) = alertmanager_config(_settings())["receivers"]
    assert receiver == {"name": "team"}


def test_a_bad_webhook_url_is_one_line_and_exit_2(tmp_path):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({"alerting": {"slack_webhook_url": "hooks.slack.com/services/x"}}))
    r = subprocess.run(
        [sys.executable, "-m", "gateway.ops.alerting", "--config", str(cfg), "--alertmanager", "127.0.0.1:1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("FARM_GATEWAY_")},
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "alerting.slack_webhook_url" in r.stderr.replace(
        ": slack", ".slack"
    )
    assert "Traceback" not in r.stderr


async def test_the_cost_budget_has_a_gauge_beside_the_token_budget(start_gateway, fake, oai):
    prices = {"gpt-upstream": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}}
    gw = await start_gateway(prices=prices, projects={"alpha": {"daily_cost_budget_usd": 2.0}})
    registry = gw.gw.metrics.registry
    assert registry.get_sample_value("gateway_daily_cost_budget_usd", {"project": "alpha"}) == 2.0
    assert registry.get_sample_value("gateway_daily_cost_budget_remaining_usd", {"project": "alpha"}) == 2.0
    await oai(gw).chat.completions.create(model="gpt-fake", messages=[{"role": "user", "content": "hi"}])
    (row,) = await gw.rows()
    left = registry.get_sample_value("gateway_daily_cost_budget_remaining_usd", {"project": "alpha"})
    assert left == pytest.approx(2.0 - row["cost_usd"]) and row["cost_usd"] > 0
    assert registry.get_sample_value("gateway_daily_cost_budget_usd", {"project": "beta"}) is None  # none set


@pytest.mark.service("prometheus")
@pytest.mark.service("alertmanager")
def test_make_monitor_starts_prometheus_alerting_to_its_alertmanager(tmp_path):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump({"alerting": {"slack_webhook_url": HOOK}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_GATEWAY_")}
    env |= {"PROM_DATA": str(tmp_path / "mon"), "PROM_PORT": str(free_port()), "AM_PORT": str(free_port()),
            "GATEWAY_CONFIG": str(cfg), "PYTHON": sys.executable}  # fmt: skip
    script = str(ROOT / "scripts" / "monitor.sh")
    try:
        r = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Alertmanager is up" in r.stdout and "Prometheus is up" in r.stdout
        prom = f"http://127.0.0.1:{(tmp_path / 'mon' / 'prometheus.port').read_text().strip()}"
        am_port = (tmp_path / "mon" / "alertmanager.port").read_text().strip()
        deadline = time.monotonic() + 120
        while True:  # Prometheus finds its Alertmanager at its first service discovery round
            with urllib.request.urlopen(f"{prom}/api/v1/alertmanagers", timeout=10) as resp:
                active = json.load(resp)["data"]["activeAlertmanagers"]
            if active:
                break
            assert time.monotonic() < deadline, "prometheus never found its alertmanager"
            time.sleep(0.2)
        assert active[0]["url"].startswith(f"http://127.0.0.1:{am_port}/")
        with urllib.request.urlopen(f"http://127.0.0.1:{am_port}/api/v2/status", timeout=10) as resp:
            loaded = json.load(resp)["config"]["original"]  # the webhook URL is shown as <secret>
        assert "slack_configs" in loaded and "api_url: <secret>" in loaded, loaded
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, timeout=60)
