#!/usr/bin/env bash
# The agents the gateway exists for, from npm at pinned versions, into .agents/ (tests/gateway/ops/
# test_real_agents.py runs them through the gateway): Claude Code and the Codex CLI. A no-op once the pinned
# versions are there. Without node and npm: in CI (DEPS_OPTIONAL=0) this fails, elsewhere it warns and
# those tests skip (tests/services.py).
set -euo pipefail
cd "$(dirname "$0")/.."
CLAUDE_CODE=@anthropic-ai/claude-code@2.1.332
CODEX=@openai/codex@0.171.0
want="$CLAUDE_CODE $CODEX"
if [[ -f .agents/.installed ]] && [[ "$(cat .agents/.installed)" == "$want" ]]; then
  exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  msg="node and npm not found: the real-agent tests need them (Debian: apt-get install nodejs npm)"
  if [[ "${DEPS_OPTIONAL:-1}" == "0" ]]; then echo "error: $msg" >&2; exit 1; fi
  echo "warning: $msg; those tests skip" >&2
  exit 0
fi
mkdir -p .agents
npm install --prefix .agents --no-audit --no-fund --loglevel=error "$CLAUDE_CODE" "$CODEX" >/dev/null
echo "$want" > .agents/.installed
