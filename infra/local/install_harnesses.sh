#!/usr/bin/env bash
# Install the real agent harnesses Orchard's adapters drive, under project-local prefixes.
#   - Codex CLI (npm @openai/codex) into .orchard/harnesses/codex (binary: .orchard/harnesses/codex/node_modules/.bin/codex)
#   - mini-swe-agent comes from pip: the `harnesses` (and `dev`) extra of orchard-rl.
# Idempotent: a second run only checks the installed version.
set -euo pipefail
cd "$(dirname "$0")/../.."

CODEX_VERSION="${ORCHARD_CODEX_VERSION:-0.169.0}"
CODEX_PREFIX=".orchard/harnesses/codex"
CODEX_BIN="$CODEX_PREFIX/node_modules/.bin/codex"

installed=""
if [ -f "$CODEX_PREFIX/node_modules/@openai/codex/package.json" ]; then
  installed="$(node -p "require('./$CODEX_PREFIX/node_modules/@openai/codex/package.json').version")"
fi
if [ "$installed" != "$CODEX_VERSION" ] || [ ! -x "$CODEX_BIN" ]; then
  command -v npm >/dev/null 2>&1 || { echo "npm (node >= 20) is needed to install Codex CLI" >&2; exit 1; }
  mkdir -p "$CODEX_PREFIX"
  echo "installing @openai/codex@$CODEX_VERSION into $CODEX_PREFIX" >&2
  npm install --prefix "$CODEX_PREFIX" --no-audit --no-fund --loglevel=error "@openai/codex@$CODEX_VERSION" >&2
fi
"$CODEX_BIN" --version >&2
