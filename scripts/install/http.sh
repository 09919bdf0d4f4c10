#!/usr/bin/env bash
# Test dependencies of crates/lsngate-http: Debian's headless Chromium and redis-server (both from
# apt), and playwright-core (npm, pinned by crates/lsngate-http/e2e/package-lock.json) to drive the
# browser. crates/lsngate-proxy's dashboard test renders the admin page with the same Chromium
# (and its dashboard_screenshot example uses the same playwright-core), and its causal-scope test
# shares floors between two proxies through the same redis-server (redis-cli, from
# redis-tools, which redis-server depends on, reads the stored key). Idempotent: does nothing
# that is already done.
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends "${missing[@]}"; then
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi

# The Debian redis-server package starts a system instance; tests start their own on random
# ports, so the system one is not needed (and is left alone if it runs).

e2e=crates/lsngate-http/e2e
if [ -f "$e2e/package-lock.json" ] && [ ! -d "$e2e/node_modules/playwright-core" ]; then
  (cd "$e2e" && npm ci --no-audit --no-fund)
fi
