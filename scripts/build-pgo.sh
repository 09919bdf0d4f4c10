#!/usr/bin/env bash
# Builds the `lsngate` binary with profile-guided optimisation: an instrumented build serves a
# training workload through the proxy on a local cluster, then the release build uses that
# profile to lay out and inline the code the proxy runs per statement. Result: target/pgo/lsngate
# (same code, same features as target/release/lsngate).
#
# The training workload is not the benchmark's (examples/bench_pgbouncer.rs): pgbench's built-in
# TPC-B-like transactions and select-only in the extended and prepared protocols, and an autocommit
# script of its own (insert, point reads, update on other tables than the benchmark's), through a
# plain pooler (consistency eventual) and through causal reads on a replica (session).
#
# Installs what it needs (idempotent): PostgreSQL (scripts/install-postgres.sh) and the rustup
# component llvm-tools (llvm-profdata, to merge the profile).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash scripts/install-postgres.sh
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  rustup component add llvm-tools
fi

out=$root/target/pgo
raw=$out/raw
rm -rf "$raw" "$out/train"
mkdir -p "$raw" "$out/train"

# --target: RUSTFLAGS then apply to the binary only, not to build scripts and proc macros.
echo "== pgo: instrumented build"
RUSTFLAGS="-Cprofile-generate=$raw" cargo build --release --locked -p lsngate-cli \
  --target "$host" --target-dir "$out/gen"
lsngate=$out/gen/$host/release/lsngate

pg=/opt/lsngate/pg19/bin
work=$out/train
cluster=$work/cluster
proxy_pid=
cleanup() {
  [ -n "$proxy_pid" ] && kill -9 "$proxy_pid" 2>/dev/null || true
  "$lsngate" cluster down --dir "$cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== pgo: training cluster"
eval "$("$lsngate" cluster up --replicas 1 --dir "$cluster")"
primary=$LSNGATE_PRIMARY_URL
replica=${LSNGATE_REPLICA_URLS%%,*}
# Clients log in as the primary URL's user (postgres://USER[:PASSWORD]@...).
user=${primary#*://}
user=${user%%@*}
user=${user%%:*}
"$pg/pgbench" -i -s 5 -q "$primary" >/dev/null 2>&1

cat > "$work/autocommit.sql" <<'EOF'
\set bid random(1, :scale)
\set tid random(1, 10 * :scale)
\set aid random(1, 100000 * :scale)
\set delta random(-5000, 5000)
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, now());
SELECT tbalance FROM pgbench_tellers WHERE tid = :tid;
SELECT bid, bbalance FROM pgbench_branches WHERE bid = :bid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
EOF

# A free loopback port for the training proxy.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# serve CONSISTENCY REPLICAS...: runs the instrumented proxy on $port in the background.
serve() {
  local consistency=$1 replicas="" url
  shift
  for url in "$@"; do replicas+="${replicas:+, }\"$url\""; done
  {
    echo "listen = \"127.0.0.1:$port\""
    echo "primary = \"$primary\""
    echo "replicas = [$replicas]"
    echo "consistency = \"$consistency\""
    echo 'pool_size = 8'
  } > "$work/lsngate.toml"
  "$lsngate" proxy --config "$work/lsngate.toml" > "$work/proxy-$consistency.log" 2>&1 &
  proxy_pid=$!
  for _ in $(seq 50); do
    "$pg/pg_isready" -q -h 127.0.0.1 -p "$port" && return 0
    sleep 0.2
  done
  echo "pgo: the training proxy did not start; see $work/proxy-$consistency.log" >&2
  exit 1
}

# drive ARGS...: one pgbench run through the proxy.
drive() {
  "$pg/pgbench" -n -c 8 -j 2 -T "${LSNGATE_PGO_SECONDS:-4}" -h 127.0.0.1 -p "$port" \
    -U "$user" "$@" postgres 2>&1 |
    awk -v run="${*/#*\//}" '/^tps/ { printf "   %-32s %8.0f TPS\n", run, $3 }'
}

# stop: SIGTERM drains and exits normally, which writes the profile.
stop() {
  kill -TERM "$proxy_pid"
  wait "$proxy_pid" || true
  proxy_pid=
}

echo "== pgo: training, plain pooler (consistency eventual)"
serve eventual
drive -M simple -f "$work/autocommit.sql"
drive -M extended -f "$work/autocommit.sql"
for mode in simple extended prepared; do drive -M "$mode"; done
for mode in extended prepared; do drive -M "$mode" -S; done
stop

echo "== pgo: training, causal reads on a replica (consistency session)"
serve session "$replica"
drive -M simple -f "$work/autocommit.sql"
drive -M simple
drive -M extended -S
stop

"$profdata" merge -o "$out/lsngate.profdata" "$raw"
echo "== pgo: optimised build"
RUSTFLAGS="-Cprofile-use=$out/lsngate.profdata" cargo build --release --locked -p lsngate-cli \
  --target "$host" --target-dir "$out/use"
cp "$out/use/$host/release/lsngate" "$out/lsngate"
echo "pgo: built $out/lsngate"
