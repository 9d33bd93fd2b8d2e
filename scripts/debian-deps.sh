#!/usr/bin/env bash
# Debian packages the tests start real servers from: prometheus (promtool, prometheus),
# prometheus-alertmanager (make monitor's Alertmanager), redis-server and postgresql, and the headless browser the report tests load pages in (chromium); `scripts/debian-deps.sh prometheus` checks only the named ones (scripts/monitor.sh does).
# Installs whichever is missing (as root, or with passwordless sudo); a no-op once all are there. With DEPS_OPTIONAL=1 (make test) a machine that cannot install them (not root, no sudo, no
# apt-get) gets a warning and exit 0, and the tests that need them skip with that reason; an apt failure
# as root still fails.
set -euo pipefail

[ $# -gt 0 ] || set -- prometheus prometheus-alertmanager redis-server postgresql chromium
missing=()
for pkg in "$@"; do
  case $pkg in
    prometheus) { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus) ;;
    prometheus-alertmanager)
      { command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null 2>&1 || missing+=(prometheus-alertmanager) ;;
    redis-server) command -v redis-server >/dev/null 2>&1 || missing+=(redis-server) ;;
    postgresql) compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql) ;;
    chromium) command -v chromium >/dev/null 2>&1 || missing+=(chromium) ;;
    *) echo "deps: unknown package $pkg (known: prometheus prometheus-alertmanager redis-server postgresql chromium)" >&2; exit 2 ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    echo "deps: missing ${missing[*]} and this is not root: run" \
      "'sudo apt-get install --no-install-recommends ${missing[*]}' (their tests skip until then)" >&2
    [ "${DEPS_OPTIONAL:-0}" = 1 ] && exit 0
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: no apt-get here: install ${missing[*]} yourself (their tests skip until then)" >&2
  [ "${DEPS_OPTIONAL:-0}" = 1 ] && exit 0
  exit 1
fi
echo "deps: installing Debian's ${missing[*]}"
$sudo apt-get update -q
# policy-rc.d: install the servers without starting their system services (the tests start their own)
if [ -d /usr/sbin ] && [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
