#!/usr/bin/env bash
# Install what the proxy's `dns` topology tests need: a real DNS server to publish the members'
# records — Debian's dnsmasq-base (the dnsmasq binary alone, no system service: each test runs
# its own on a free loopback port). Idempotent: re-running only checks.
set -euo pipefail

if ! command -v dnsmasq >/dev/null 2>&1 && [ ! -x /usr/sbin/dnsmasq ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq dnsmasq-base >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq dnsmasq-base >/dev/null; }
fi
echo "dnsmasq $(/usr/sbin/dnsmasq --version | awk 'NR==1 {print $3}') installed"
