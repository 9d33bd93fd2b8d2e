#!/usr/bin/env bash
# Prometheus for KernelFarm, on 127.0.0.1 with the shipped grafana/prometheus.yml.
#   scripts/monitor.sh [start]  install Prometheus if missing, start it in the background, print the URLs
#   scripts/monitor.sh stop     stop the Prometheus this script started
#   scripts/monitor.sh deps     only install Debian's prometheus package (promtool, prometheus) if missing;
#                               with DEPS_OPTIONAL=1 (make test) a machine that cannot install it (not root,
#                               no sudo, no apt-get) gets a warning and exit 0; an apt failure still fails
# Environment: PROM_PORT (9090; a free port is picked when it is taken), PROM_DATA (.farm/prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."

PROM_DATA=${PROM_DATA:-.farm/prometheus}
PIDFILE=$PROM_DATA/prometheus.pid
PORTFILE=$PROM_DATA/prometheus.port

deps() {  # the same installer as make test's, for prometheus alone
  scripts/debian-deps.sh prometheus
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

running() {
  [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

urls() {
  local port=$1
  cat <<TXT
Prometheus   http://127.0.0.1:$port            (targets: /targets, alerts: /alerts, rules: /rules)
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
    echo "monitor: Prometheus already running (pid $(cat "$PIDFILE"))"
    urls "$(cat "$PORTFILE")"
    return 0
  fi
  promtool check config grafana/prometheus.yml >/dev/null
  local port=${PROM_PORT:-9090}
  while port_busy "$port"; do
    echo "monitor: port $port is taken, trying $((port + 1))"
    port=$((port + 1))
  done
  nohup prometheus \
    --config.file=grafana/prometheus.yml \
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
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  deps) deps ;;
  *) echo "usage: $0 [start|stop|deps]" >&2; exit 2 ;;
esac
