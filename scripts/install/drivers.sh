#!/usr/bin/env bash
# Install what the proxy's driver tests (crates/lsngate-proxy/tests/proxy/drivers.rs) need, all
# from Debian's packages: pgjdbc (libpostgresql-jdbc-java, /usr/share/java/postgresql.jar) with a
# JDK to compile the session program (javac; default-jdk-headless when missing), and Go with pgx
# v4's sources (golang-go, golang-github-jackc-pgx-v4-dev under /usr/share/gocode), which the test
# builds in GOPATH mode with nothing downloaded. Idempotent: re-running only checks.
set -euo pipefail

missing=()
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
command -v go >/dev/null 2>&1 || missing+=(golang-go)
[ -d /usr/share/gocode/src/github.com/jackc/pgx/v4/pgxpool ] || missing+=(golang-github-jackc-pgx-v4-dev)

if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'; }
echo "driver test dependencies installed: pgjdbc $(version libpostgresql-jdbc-java)," \
  "pgx v4 $(version golang-github-jackc-pgx-v4-dev), $(go version | cut -d' ' -f3), $(javac -version 2>&1)"
