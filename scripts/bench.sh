#!/usr/bin/env bash
# The main job: installs PostgreSQL if missing, builds lsngate in release mode, then runs
# `lsngate bench` on a local PostgreSQL 19 cluster (or with the arguments you pass, e.g.
# `scripts/bench.sh --ops 5000 --json bench.json --svg bench.svg`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-postgres.sh
cargo build --release --locked -p lsngate-cli
exec target/release/lsngate bench "$@"
