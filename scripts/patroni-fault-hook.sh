#!/usr/bin/env bash
# `lsngate verify --fault-hook` for a Patroni cluster started by `lsngate cluster up --patroni`:
# failover = patronictl switchover, kill-primary = kill -9 of the leader's Patroni and PostgreSQL;
# heal restarts killed members and waits for every member to stream from a leader.
#   lsngate verify --proxy URL --faults failover,kill-primary --fault-period 40s \
#     --fault-hook scripts/patroni-fault-hook.sh
# LSNGATE_PATRONI_DIR: the cluster's --dir (default: lsngate cluster's default directory).
# LSNGATE: the lsngate binary (default: lsngate on PATH).
set -euo pipefail
args=("$@")
if [ -n "${LSNGATE_PATRONI_DIR:-}" ]; then args+=(--dir "$LSNGATE_PATRONI_DIR"); fi
exec "${LSNGATE:-lsngate}" cluster patroni-fault "${args[@]}"
