#!/usr/bin/env bash
# Installs the PostgreSQL servers lsngate tests and benchmarks against:
#   * Debian's own `postgresql` package (version 15 on Debian 12), via apt;
#   * PostgreSQL 19 as a self-contained, relocated bundle in $LSNGATE_PG19_DIR
#     (default /opt/lsngate/pg19), built from Debian sid/experimental packages
#     inside a debootstrap chroot, because Debian's build needs a newer C library
#     than this release ships.
# Also creates the unprivileged `lsngate` user the servers run as (initdb refuses root).
#
# Idempotent: each part is skipped when already in place. The chroot is kept in
# $LSNGATE_PG_CACHE (default /var/cache/lsngate) so a rebuild is quick.
# `--refresh` re-checks the package archive and rebuilds the bundle when a newer
# PostgreSQL 19 is there (e.g. 19.0 replacing 19rc1). A fresh install always takes the newest.
set -euo pipefail

BUNDLE=${LSNGATE_PG19_DIR:-/opt/lsngate/pg19}
CACHE=${LSNGATE_PG_CACHE:-/var/cache/lsngate}
CHROOT=$CACHE/sid-chroot
REFRESH=0
[ "${1:-}" = "--refresh" ] && REFRESH=1

log() { echo "install-postgres: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

APT_UPDATED=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $APT_UPDATED = 0 ]; then as_root apt-get update -qq; APT_UPDATED=1; fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# 1. Debian's PostgreSQL (server, client, contrib for pgbench) and the bundle tools.
apt_install postgresql postgresql-contrib debootstrap patchelf ca-certificates
# Debian's package creates and starts a "main" cluster on 5432; lsngate never uses it.
if command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q online; then
  as_root pg_ctlcluster "$(pg_lsclusters -h | awk 'NR==1{print $1}')" main stop 2>/dev/null || true
fi

# 2. The unprivileged user servers run as.
if ! id lsngate >/dev/null 2>&1; then
  as_root useradd --system --no-create-home --shell /usr/sbin/nologin lsngate
  log "created user lsngate"
fi

bundle_version() { "$BUNDLE/bin/postgres" --version 2>/dev/null | awk '{print $3}'; }

chroot_apt() {
  as_root chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive \
    apt-get -o Acquire::Check-Valid-Until=false -qq "$@"
}

# "VERSION SUITE" of the newest postgresql-19 in sid or experimental
newest_pg19() {
  chroot "$CHROOT" apt-cache madison postgresql-19 2>/dev/null \
    | awk -F'|' '{gsub(/ /,"",$2); split($3,a," "); split(a[2],s,"/"); print $2, s[1]}' \
    | sort -V | tail -n1
}

build_chroot() {
  if [ ! -x "$CHROOT/usr/bin/apt-get" ]; then
    log "debootstrap sid into $CHROOT (about a minute)"
    as_root rm -rf "$CHROOT"; as_root mkdir -p "$CACHE"
    as_root debootstrap --variant=minbase sid "$CHROOT" >/dev/null
  fi
  # experimental, derived from the chroot's own source (only the suite name changes)
  if [ ! -f "$CHROOT/etc/apt/sources.list.d/experimental.list" ]; then
    sed -n 's/^\(deb[^ ]* [^ ]*\) sid\b/\1 experimental/p' "$CHROOT/etc/apt/sources.list" \
      | as_root tee "$CHROOT/etc/apt/sources.list.d/experimental.list" >/dev/null
  fi
  # No services and no default cluster inside the chroot: only the package files are wanted.
  as_root mkdir -p "$CHROOT/etc/postgresql-common" "$CHROOT/usr/sbin"
  echo "create_main_cluster = false" | as_root tee "$CHROOT/etc/postgresql-common/createcluster.conf" >/dev/null
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$CHROOT/usr/sbin/policy-rc.d" >/dev/null
  as_root chmod +x "$CHROOT/usr/sbin/policy-rc.d"
  chroot_apt update
}

make_bundle() {
  local ver=$1 suite=$2 stage="$BUNDLE.new"
  log "installing postgresql-19 $ver from $suite in the chroot"
  # pkg/suite (not pkg=version) lets apt take libpq5 from the same suite; -t experimental fails on perl
  # maintainer scripts want /proc; only the unpacked files matter to the bundle
  as_root mount -t proc proc "$CHROOT/proc" 2>/dev/null && trap 'umount "$CHROOT/proc" 2>/dev/null || true' EXIT
  local apt_log="$CACHE/apt-install.log"
  chroot_apt install -y --no-install-recommends "postgresql-19/$suite" "postgresql-client-19/$suite" >"$apt_log" 2>&1 \
    || chroot_apt install -y -f >>"$apt_log" 2>&1 \
    || log "package configuration failed in the chroot (see $apt_log); continuing with the unpacked files"
  umount "$CHROOT/proc" 2>/dev/null || true
  [ -x "$CHROOT/usr/lib/postgresql/19/bin/postgres" ] || { log "postgresql-19 did not unpack"; exit 1; }
  # same relative layout as in Debian, so the binaries find share/ from bin/ by relative path
  as_root rm -rf "$stage"
  as_root mkdir -p "$stage/lib" "$stage/usr/lib/postgresql" "$stage/usr/share/postgresql"
  as_root cp -a "$CHROOT/usr/lib/postgresql/19" "$stage/usr/lib/postgresql/19"
  as_root cp -a "$CHROOT/usr/share/postgresql/19" "$stage/usr/share/postgresql/19"
  # every library the binaries and extension modules need, from the chroot, plus its loader
  local elves
  elves=$(cd "$CHROOT" && find usr/lib/postgresql/19 -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
  for f in $elves; do
    as_root chroot "$CHROOT" ldd "/$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'
  done | sort -u | while read -r lib; do
    as_root cp -L "$CHROOT$lib" "$stage/lib/"
  done
  as_root cp -L "$CHROOT/lib64/ld-linux-x86-64.so.2" "$stage/lib/" 2>/dev/null || true
  for f in $elves; do
    local p="$stage/$f"
    if patchelf --print-interpreter "$p" >/dev/null 2>&1; then
      as_root patchelf --set-interpreter "$BUNDLE/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$BUNDLE/lib" "$p"
    else
      as_root patchelf --force-rpath --set-rpath "$BUNDLE/lib" "$p"
    fi
  done
  for l in "$stage"/lib/*.so*; do
    case "$(basename "$l")" in ld-linux*|libc.so*) continue;; esac
    as_root patchelf --force-rpath --set-rpath "$BUNDLE/lib" "$l" 2>/dev/null || true
  done
  as_root ln -s usr/lib/postgresql/19/bin "$stage/bin"
  echo "$ver" | as_root tee "$stage/VERSION" >/dev/null
  as_root rm -rf "$BUNDLE.old"
  [ -e "$BUNDLE" ] && as_root mv "$BUNDLE" "$BUNDLE.old"
  as_root mv "$stage" "$BUNDLE"
  as_root rm -rf "$BUNDLE.old"
}

# 3. PostgreSQL 19 bundle.
current=$(bundle_version || true)
if [ -z "$current" ] || [ $REFRESH = 1 ]; then
  build_chroot
  read -r want suite < <(newest_pg19) || true
  [ -n "${want:-}" ] || { log "no postgresql-19 package found in sid or experimental"; exit 1; }
  if [ -z "$current" ] || [ "$(cat "$BUNDLE/VERSION" 2>/dev/null)" != "$want" ]; then
    make_bundle "$want" "$suite"
  fi
fi

v19=$(bundle_version) || { log "the PostgreSQL 19 bundle at $BUNDLE does not run"; exit 1; }
deb_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
log "PostgreSQL $v19 ($(cat "$BUNDLE/VERSION")) at $BUNDLE/bin"
log "PostgreSQL $("$deb_bin/postgres" --version | awk '{print $3}') (Debian) at $deb_bin"
