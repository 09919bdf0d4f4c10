#!/usr/bin/env bash
# Install what the Patroni test kit (`lsngate cluster up --patroni`, the proxy's `patroni`
# topology tests) needs: Debian's patroni (3.0.2 on Debian 12) and etcd-server (3.4), and
# python3-etcd, the DCS client module Patroni's etcd and etcd3 backends import (Debian lists it
# as one of several alternatives, so it is named here). Idempotent: re-running only checks.
set -euo pipefail

missing=()
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
/usr/bin/python3 -c 'import etcd' 2>/dev/null || missing+=(python3-etcd)
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
# The packages start a system etcd on the default ports; the test kit runs its own on free
# loopback ports, so the system one is stopped when it runs (it would only take memory).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  systemctl stop etcd || true
fi
echo "patroni $(patroni --version 2>&1 | awk '{print $2}') and etcd $(etcd --version | awk 'NR==1 {print $3}') installed"
