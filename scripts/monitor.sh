#!/usr/bin/env bash
# Prometheus and its Alertmanager for KernelFarm, on 127.0.0.1: the shipped grafana/prometheus.yml and
# alerts.yml, alerting to an Alertmanager whose route goes to the Slack-compatible webhook of the gateway
# config's `alerting.slack_webhook_url` (both configs written by gateway.ops.alerting into PROM_DATA).
#   scripts/monitor.sh [start]  install them if missing, start both in the background, print the URLs
#   scripts/monitor.sh stop     stop the Prometheus and Alertmanager this script started
#   scripts/monitor.sh deps     only install Debian's prometheus and prometheus-alertmanager if missing;
#                               with DEPS_OPTIONAL=1 (make test) a machine that cannot install them (not root,
#                               no sudo, no apt-get) gets a warning and exit 0; an apt failure still fails
# Environment: PROM_PORT (9090) and AM_PORT (9093; a free port is picked when one is taken), PROM_DATA
# (.farm/prometheus), GATEWAY_CONFIG (gateway/example-config.yaml; FARM_GATEWAY_ALERTING__SLACK_WEBHOOK_URL
# overrides its webhook), PYTHON (.venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PROM_DATA=${PROM_DATA:-.farm/prometheus}
PIDFILE=$PROM_DATA/prometheus.pid
PORTFILE=$PROM_DATA/prometheus.port
AM_PIDFILE=$PROM_DATA/alertmanager.pid
AM_PORTFILE=$PROM_DATA/alertmanager.port
GATEWAY_CONFIG=${GATEWAY_CONFIG:-gateway/example-config.yaml}
PYTHON=${PYTHON:-.venv/bin/python}

deps() {  # the same installer as make test's, for these two alone
  scripts/debian-deps.sh prometheus prometheus-alertmanager
}

port_busy() {  # bash's /dev/tcp: no curl or python needed
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

ready() {
  local reply
  reply=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /-/ready HTTP/1.0\r\n\r\n' >&3 && head -n1 <&3) \
    2>/dev/null || true)
  [[ $reply == *" 200 "* ]]
}

running() {  # running [PIDFILE]
  local f=${1:-$PIDFILE}
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

free_port() {  # free_port PORT: PORT, or the next one nothing listens on
  local port=$1
  while port_busy "$port"; do
    echo "monitor: port $port is taken, trying $((port + 1))" >&2
    port=$((port + 1))
  done
  echo "$port"
}

alertmanager_bin() {
  command -v prometheus-alertmanager || command -v alertmanager
}

start_alertmanager() {  # Alertmanager on AM_PORT (written to AM_PORTFILE), waiting until it is ready
  if running "$AM_PIDFILE"; then
    return 0
  fi
  local port
  port=$(free_port "${AM_PORT:-9093}")
  "$PYTHON" -m gateway.ops.alerting --config "$GATEWAY_CONFIG" --alertmanager "127.0.0.1:$port" \
    --out "$PROM_DATA"
  nohup "$(alertmanager_bin)" \
    --config.file="$PROM_DATA/alertmanager.yml" \
    --storage.path="$PROM_DATA/alertmanager" \
    --web.listen-address="127.0.0.1:$port" \
    --cluster.listen-address= \
    >"$PROM_DATA/alertmanager.log" 2>&1 &
  echo $! >"$AM_PIDFILE"
  echo "$port" >"$AM_PORTFILE"
  for _ in $(seq 1 60); do
    if ready "$port"; then
      echo "monitor: Alertmanager is up (pid $(cat "$AM_PIDFILE"))"
      return 0
    fi
    if ! running "$AM_PIDFILE"; then
      echo "monitor: Alertmanager exited; last lines of $PROM_DATA/alertmanager.log:" >&2
      tail -n 20 "$PROM_DATA/alertmanager.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "monitor: Alertmanager did not become ready in 30 s; see $PROM_DATA/alertmanager.log" >&2
  exit 1
}

urls() {
  local port=$1
  cat <<TXT
Prometheus   http://127.0.0.1:$port            (targets: /targets, alerts: /alerts, rules: /rules)
Alertmanager http://127.0.0.1:$(cat "$AM_PORTFILE")            (routes to alerting.slack_webhook_url of $GATEWAY_CONFIG)
Gateway      http://127.0.0.1:8787/metrics      (make gateway)
Farm         http://127.0.0.1:9464/metrics      (while a sweep runs with FARM_METRICS_PORT=9464)
Grafana      see grafana/README.md; point it at http://127.0.0.1:$port (KF_PROMETHEUS_URL)
Stop         scripts/monitor.sh stop           (data and log: $PROM_DATA)
TXT
}

start() {
  deps || exit 1
  mkdir -p "$PROM_DATA"
  if running; then
    start_alertmanager
    echo "monitor: Prometheus already running (pid $(cat "$PIDFILE"))"
    urls "$(cat "$PORTFILE")"
    return 0
  fi
  start_alertmanager
  promtool check config "$PROM_DATA/prometheus.yml" >/dev/null
  local port
  port=$(free_port "${PROM_PORT:-9090}")
  nohup prometheus \
    --config.file="$PROM_DATA/prometheus.yml" \
    --storage.tsdb.path="$PROM_DATA/data" \
    --web.listen-address="127.0.0.1:$port" \
    --web.enable-lifecycle \
    >"$PROM_DATA/prometheus.log" 2>&1 &
  echo $! >"$PIDFILE"
  echo "$port" >"$PORTFILE"
  for _ in $(seq 1 60); do
    if ready "$port"; then
      echo "monitor: Prometheus is up (pid $(cat "$PIDFILE"))"
      urls "$port"
      return 0
    fi
    if ! running; then
      echo "monitor: Prometheus exited; last lines of $PROM_DATA/prometheus.log:" >&2
      tail -n 20 "$PROM_DATA/prometheus.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "monitor: Prometheus did not become ready in 30 s; see $PROM_DATA/prometheus.log" >&2
  exit 1
}

stop() {
  if running; then
    kill "$(cat "$PIDFILE")" && echo "monitor: stopped Prometheus (pid $(cat "$PIDFILE"))"
  else
    echo "monitor: no Prometheus started by this script is running"
  fi
  if running "$AM_PIDFILE"; then
    kill "$(cat "$AM_PIDFILE")" && echo "monitor: stopped Alertmanager (pid $(cat "$AM_PIDFILE"))"
  fi
  rm -f "$PIDFILE" "$AM_PIDFILE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  deps) deps ;;
  *) echo "usage: $0 [start|stop|deps]" >&2; exit 2 ;;
esac
