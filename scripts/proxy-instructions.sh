#!/usr/bin/env bash
# The proxy's user-space instructions per transaction, counted by callgrind: a measure that does
# not move with the machine's load, unlike CPU time or TPS on two shared cores, so a change of a
# few percent in the proxy's per-flight work shows (issue #28; 2026-12-06). Starts a local cluster
# (1 primary, 1 replica, PostgreSQL 19 when installed), runs each given lsngate binary as
# `lsngate proxy` under valgrind (consistency $CONSISTENCY, session by default; reads to the
# replica), warms it up, then counts 4 pgbench clients x 1000 transactions of each workload with
# the extended protocol (`-M extended`; PROTOCOL below for another).
#
#   scripts/proxy-instructions.sh [BINARY...]    (default: target/release/lsngate)
#   CONSISTENCY=eventual scripts/proxy-instructions.sh ...   (any proxy consistency mode;
#   session by default: the difference between the two is what causal reads cost)
#   PGBOUNCER=1 scripts/proxy-instructions.sh ...   (also PgBouncer, transaction pooling in front
#   of the primary, counted the same way: the reference a plain pooler is held to)
#   PROTOCOL=simple scripts/proxy-instructions.sh ...   (pgbench's -M; extended by default)
#   PRIMARY_ONLY=1 scripts/proxy-instructions.sh ...   (no replica in the proxy's config: every
#   statement goes to the primary, as for `bench_pgbouncer`'s plain pooler row)
#   KEEP=DIR scripts/proxy-instructions.sh ...   (keeps each run's callgrind output in DIR, as
#   callgrind.<binary's index>.<workload>, for callgrind_annotate)
#
# Prints one line per binary and workload; kernel time (the sends and receives) is not counted.
# Needs valgrind (Debian's valgrind package) and pgbench (PostgreSQL's).
set -euo pipefail
cd "$(dirname "$0")/.."
consistency=${CONSISTENCY:-session}
protocol=${PROTOCOL:-extended}
case "$protocol" in simple|extended|prepared) ;; *) echo "PROTOCOL must be simple, extended or prepared (pgbench's -M), not $protocol" >&2; exit 2;; esac
command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install valgrind" >&2; exit 2; }
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(target/release/lsngate)
for b in "${binaries[@]}"; do [ -x "$b" ] || { echo "$b: not an executable; build it first (cargo build --release -p lsngate-cli)" >&2; exit 2; }; done
lsngate=$(realpath "${binaries[0]}")
work=$(mktemp -d /tmp/lsngate-instructions-XXXXXX)
chmod 755 "$work"
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null || true
  "$lsngate" cluster down --dir "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$lsngate" cluster up --replicas 1 --dir "$work/cluster" > "$work/cluster.env" 2>&1
primary=$(sed -n 's/^LSNGATE_PRIMARY_URL=//p' "$work/cluster.env")
replica=$(sed -n 's/^LSNGATE_REPLICA_URLS=//p' "$work/cluster.env")
pgbench=$(command -v pgbench || true)
for dir in /opt/lsngate/pg19/bin /usr/lib/postgresql/*/bin; do
  [ -x "$dir/pgbench" ] && { pgbench="$dir/pgbench"; break; }
done
[ -x "$pgbench" ] || { echo "needs pgbench (PostgreSQL's client tools)" >&2; exit 2; }
"$pgbench" -i -s 2 -q "$primary" >/dev/null 2>&1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/proxy.toml" <<EOF
listen = "127.0.0.1:$port"
primary = "$primary"
replicas = [$([ "${PRIMARY_ONLY:-0}" = 1 ] || echo "\"$replica\"")]
pool_size = 18
consistency = "$consistency"
EOF
cat > "$work/mixed.sql" <<'EOF'
\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 1;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 2;
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
EOF
url="postgres://postgres@127.0.0.1:$port/postgres"
index=0
for binary in "${binaries[@]}"; do
  index=$((index + 1))
  for workload in select-only mixed; do
    out="$work/callgrind.out"
    rm -f "$out"*
    valgrind --tool=callgrind --callgrind-out-file="$out" --dump-instr=no \
      "$binary" proxy --config "$work/proxy.toml" > "$work/valgrind.log" 2>&1 < /dev/null &
    proxy_pid=$!
    for _ in $(seq 1 100); do "$pgbench" -n -S -c 1 -t 1 "$url" >/dev/null 2>&1 && break; sleep 0.2; done
    kill -0 "$proxy_pid" 2>/dev/null || { echo "lsngate proxy exited; its output:" >&2; grep -v "^==" "$work/valgrind.log" | head -8 >&2; proxy_pid=""; exit 2; }
    args=(-S); [ "$workload" = mixed ] && args=(-f "$work/mixed.sql")
    "$pgbench" -n "${args[@]}" -M "$protocol" -c 1 -t 200 "$url" >/dev/null 2>&1
    callgrind_control -z "$proxy_pid" >/dev/null 2>&1
    tx=$("$pgbench" -n "${args[@]}" -M "$protocol" -c 4 -t 1000 "$url" 2>&1 | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    callgrind_control -d "$proxy_pid" >/dev/null 2>&1
    kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true; proxy_pid=""
    total=$(callgrind_annotate "$out".1 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP"; cp "$out".1 "$KEEP/callgrind.$index.$workload"; fi
    echo "$binary $workload: $((total / tx)) instructions per transaction ($tx transactions, -M $protocol, consistency $consistency$([ "${PRIMARY_ONLY:-0}" = 1 ] && echo ", primary only"))"
  done
done
[ "${PGBOUNCER:-0}" = 1 ] || exit 0
# PgBouncer will not run as root: as root it runs as the cluster's server user, and so does
# callgrind_control, which must be that process's user.
bouncer=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
[ -x "$bouncer" ] || { echo "PGBOUNCER=1 needs pgbouncer (scripts/install/proxy.sh installs it)" >&2; exit 2; }
as_server=()
if [ "$(id -u)" = 0 ]; then
  owner=$(stat -c %U "$work/cluster/primary")
  as_server=(runuser -u "$owner" --)
fi
mkdir -p "$work/pgbouncer"
[ ${#as_server[@]} -gt 0 ] && chown "$owner" "$work/pgbouncer"
bport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pport=$(echo "$primary" | sed -E 's|.*:([0-9]+)/.*|\1|')
echo '"postgres" ""' > "$work/pgbouncer/users.txt"
cat > "$work/pgbouncer/pgbouncer.ini" <<EOF
[databases]
postgres = host=127.0.0.1 port=$pport dbname=postgres user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $work/pgbouncer/users.txt
pool_mode = transaction
default_pool_size = 18
logfile = $work/pgbouncer/pgbouncer.log
pidfile = $work/pgbouncer/pgbouncer.pid
EOF
burl="postgres://postgres@127.0.0.1:$bport/postgres"
for workload in select-only mixed; do
  out="$work/pgbouncer/callgrind.out"
  rm -f "$out"* "$work/pgbouncer/pgbouncer.pid"
  "${as_server[@]}" valgrind --tool=callgrind --callgrind-out-file="$out" --dump-instr=no \
    "$bouncer" "$work/pgbouncer/pgbouncer.ini" > "$work/pgbouncer/valgrind.log" 2>&1 < /dev/null &
  for _ in $(seq 1 100); do "$pgbench" -n -S -c 1 -t 1 "$burl" >/dev/null 2>&1 && break; sleep 0.2; done
  bpid=$(cat "$work/pgbouncer/pgbouncer.pid" 2>/dev/null || true)
  [ -n "$bpid" ] || { echo "pgbouncer did not start; its output:" >&2; grep -v "^==" "$work/pgbouncer/valgrind.log" | head -8 >&2; exit 2; }
  proxy_pid=$bpid
  args=(-S); [ "$workload" = mixed ] && args=(-f "$work/mixed.sql")
  "$pgbench" -n "${args[@]}" -M "$protocol" -c 1 -t 200 "$burl" >/dev/null 2>&1
  "${as_server[@]}" callgrind_control -z "$bpid" >/dev/null 2>&1
  tx=$("$pgbench" -n "${args[@]}" -M "$protocol" -c 4 -t 1000 "$burl" 2>&1 | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  "${as_server[@]}" callgrind_control -d "$bpid" >/dev/null 2>&1
  kill "$bpid"; for _ in $(seq 1 50); do kill -0 "$bpid" 2>/dev/null || break; sleep 0.1; done; proxy_pid=""
  total=$(callgrind_annotate "$out".1 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
  echo "pgbouncer $workload: $((total / tx)) instructions per transaction ($tx transactions, -M $protocol, transaction pooling, the primary)"
done
