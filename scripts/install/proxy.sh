#!/usr/bin/env bash
# Install what the lsngate-proxy test suite and benchmark need beyond the Rust toolchain and
# PostgreSQL: the Python clients (psycopg 3, asyncpg), the Node clients (pg, pg-copy-streams,
# pinned by crates/lsngate-proxy/clients/package-lock.json), Debian's PgBouncer and pgpool-II
# for the benchmark, openssl for the TLS tests (the proxy's client TLS test, and lsngate-cluster's TLS-only
# clusters that the proxy and library tests use). Idempotent: re-running only checks.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"

if ! python3 -c 'import psycopg, asyncpg' 2>/dev/null; then
  python3 -m pip install --quiet 'psycopg[binary]>=3.2' 'asyncpg>=0.29'
fi

clients="$root/crates/lsngate-proxy/clients"
if [ ! -d "$clients/node_modules/pg" ] || [ ! -d "$clients/node_modules/pg-copy-streams" ]; then
  (cd "$clients" && npm ci --no-audit --no-fund --silent)
fi

if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq pgbouncer >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null; }
fi
# pgpool-II for the benchmark's pgpool-<setting> rows (lsngate bench starts its own per row on
# free loopback ports): the package's own service is stopped and kept from starting again, so
# it holds no port and no memory.
if [ ! -x /usr/sbin/pgpool ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq pgpool2 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq pgpool2 >/dev/null; }
fi
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet pgpool2 2>/dev/null; then
  systemctl stop pgpool2 || true
  systemctl disable pgpool2 >/dev/null 2>&1 || true
fi
# The TLS tests make throwaway CAs and certificates with the openssl command.
if ! command -v openssl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq openssl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
fi
echo "proxy test clients installed"
