#!/usr/bin/env bash
# Two busy-loop processes beside a command: how the suite is shown to hold on a busy machine (issue 26).
#   scripts/busy-load.sh make test
# The loops run at the command's priority and stop when it ends; the command's exit code is kept.
set -uo pipefail
loops=()
for _ in 1 2; do
  ( while :; do :; done ) &
  loops+=($!)
done
trap 'kill "${loops[@]}" 2>/dev/null' EXIT
"$@"
