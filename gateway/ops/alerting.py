"""The configs `make monitor` (scripts/monitor.sh) starts Prometheus and Alertmanager with.

- ``alertmanager.yml``: one route, to the Slack-compatible incoming webhook of the gateway config's
  ``alerting.slack_webhook_url`` (Slack, Mattermost and Rocket.Chat take Slack's payload), grouped by alert,
  project, budget and band, so that a project crossing 80% of a budget is one message; resolved alerts
  are not sent (crossing 80% resolves the 50% band: that is no news). Without a webhook the route ends in a
  receiver that sends nothing (the alerts are still in Alertmanager's UI).
- ``prometheus.yml``: the shipped grafana/prometheus.yml with its rule files at their absolute paths and an
  ``alerting:`` section pointing at that Alertmanager.

    python -m gateway.ops.alerting --config gateway.yaml --alertmanager 127.0.0.1:9093 --out .farm/prometheus

A bad config is one line and exit 2 (``ConfigError``), as for ``serve``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.config import ConfigError, GatewaySettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PROMETHEUS = ROOT / "grafana" / "prometheus.yml"
GROUP_BY = ["alertname", "project", "budget", "threshold"]
# what one message says: the alert and its group's labels, each alert's summary, the runbook line once
TITLE = "{{ .CommonLabels.alertname }}" + "".join(
    f"{{{{ with .CommonLabels.{label} }}}} {{{{ . }}}}{{{{ end }}}}" for label in GROUP_BY[1:]
)
TEXT = "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ end }}{{ .CommonAnnotations.description }}"


def alertmanager_config(
    settings: GatewaySettings,
    *,
    group_wait: str = "30s",
    group_interval: str = "5m",
    repeat_interval: str = "12h",
) -> dict[str, Any]:
    """Alertmanager's configuration for the gateway's alerting settings (the intervals: Alertmanager's
    durations; a test shortens them)."""
    hook = settings.alerting.slack_webhook_url
    receiver: dict[str, Any] = {"name": "team"}
    if hook is not None:
        slack: dict[str, Any] = {
            "api_url": hook.get_secret_value(),
            "send_resolved": False,
            "title": TITLE,
            "text": TEXT,
        }
        if settings.alerting.channel:
            slack["channel"] = settings.alerting.channel
        receiver["slack_configs"] = [slack]
    return {
        "route": {
            "receiver": "team",
            "group_by": GROUP_BY,
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [receiver],
    }


def prometheus_config(alertmanager: str, shipped: Path = SHIPPED_PROMETHEUS) -> dict[str, Any]:
    """The shipped Prometheus config, its rule files made absolute, alerting to ``alertmanager``
    (host:port)."""
    cfg = yaml.safe_load(shipped.read_text())
    cfg["rule_files"] = [str((shipped.parent / f).resolve()) for f in cfg.get("rule_files", [])]
    cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return cfg


def write_configs(
    settings: GatewaySettings, alertmanager: str, out: Path, **intervals: str
) -> tuple[Path, Path]:
    """``alertmanager.yml`` and ``prometheus.yml`` written into ``out`` (readable by their owner only: the
    webhook URL is a secret)."""
    out.mkdir(parents=True, exist_ok=True)
    am, prom = out / "alertmanager.yml", out / "prometheus.yml"
    for path, cfg in (
        (am, alertmanager_config(settings, **intervals)),
        (prom, prometheus_config(alertmanager)),
    ):
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return am, prom


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gateway.ops.alerting", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="the gateway's config (its alerting section)")
    ap.add_argument("--alertmanager", required=True, help="host:port Alertmanager listens on")
    ap.add_argument("--out", required=True, type=Path, help="folder to write the two configs into")
    args = ap.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    am, prom = write_configs(settings, args.alertmanager, args.out)
    where = (
        "to the Slack-compatible webhook" if settings.alerting.slack_webhook_url else "nowhere (no webhook)"
    )
    print(f"alerting: {am} routes alerts {where}; {prom} sends them to {args.alertmanager}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
