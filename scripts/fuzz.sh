#!/usr/bin/env bash
# Runs every fuzz target for a while (default 30 s each): `scripts/fuzz.sh [SECONDS]`.
# Stable Rust, so no sanitizer (`--sanitizer none`); libFuzzer still guides by coverage and
# every panic or failed assertion is a finding. Installs cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for dir in fuzz crates/*/fuzz; do
  [ -f "$dir/Cargo.toml" ] || continue
  for target in $(cd "$dir" && cargo fuzz list); do
    echo "== fuzz $dir $target for ${seconds}s"
    (cd "$dir" && cargo fuzz run --sanitizer none "$target" -- -max_total_time="$seconds" -max_len=512)
  done
done
