#!/usr/bin/env bash
# RocksDB on the emulated SSD, with and without FDP placement: `ftlab serve` -> nbdfuse -> loop
# device -> ext4 -> db_bench (Debian's rocksdb-tools), run twice on identical devices:
#   one:  one export; the WAL and the SSTs on one ext4, every write on handle 0;
#   fdp:  two exports of the same device, `wal` (handle 1) and `db` (handle 2), an ext4 on each,
#         db_bench --wal_dir on the first: the WAL's writes and the SSTs' on their own handles.
# Each run: db_bench fillrandom, then overwrite (the WAL and the SSTs synced to the device every
# MiB, as production settings do: without it a WAL lives and dies in the page cache); then
# e2fsck -fn of each file system. Prints each
# run's WAF (the server's --stats at exit) and the cut, and leaves both statistics in WORK.
#
# usage: scripts/rocksdb-fdp.sh [NUM_KEYS] [ftlab serve flags...]
#   scripts/rocksdb-fdp.sh 1500000
#   NUM_KEYS: keys per db_bench step (default 1500000; 1000-byte values, so about 1.5 GB per step:
#   the database must fit the db export with room for compactions).
#   Flags after it replace the device's defaults below (give them all: --set ...).
# Needs root (mount, losetup), /dev/fuse, nbdfuse (libnbd-bin), fuse3, db_bench (rocksdb-tools).
# Environment: WORK (default /tmp/ftlab-rocksdb), WAL_BYTES (the wal export, default 512M),
# FTLAB (default target/release/ftlab), DB_BENCH_TIMEOUT (seconds per db_bench, default 7200).
set -euo pipefail
cd "$(dirname "$0")/.."
num=${1:-1500000}
shift || true
WORK=${WORK:-/tmp/ftlab-rocksdb}
WAL_BYTES=${WAL_BYTES:-512M}
FTLAB=${FTLAB:-target/release/ftlab}
# A 5 GiB FEMU-like drive (64 dies, 80 blocks of 1 MiB each) exposing 4 GiB, background GC once
# 60 % of it is used (the seed's threshold), three handles (0 for the one-export run).
device=(--set flash.blocks_per_die=80 --set capacity.logical_bytes=4294967296
        --set ftl.gc_thres_pcent=60 --set ftl.streams=3)
[ $# -eq 0 ] || device=("$@")

die() { echo "scripts/rocksdb-fdp.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mount and losetup)"
[ -e /dev/fuse ] || die "needs /dev/fuse"
command -v nbdfuse >/dev/null || die "needs nbdfuse (apt-get install libnbd-bin fuse3)"
command -v db_bench >/dev/null || die "needs db_bench (apt-get install rocksdb-tools)"
[ -x "$FTLAB" ] || cargo build --release
[ ! -e "$WORK" ] || die "$WORK exists; remove it or set WORK"
mkdir -p "$WORK"

serve_pid= mounts=() loops=() fuses=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null || true; done
  for dev in "${loops[@]}"; do losetup -d "$dev" 2>/dev/null || true; done
  for dir in "${fuses[@]}"; do fusermount3 -u "$dir" 2>/dev/null || true; done
  mounts=() loops=() fuses=()
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -INT "$serve_pid"; wait "$serve_pid" || true
  fi
  serve_pid=
}
trap cleanup EXIT

# mount_export RUN EXPORT: ext4 on the export, mounted at RUN/mnt-EXPORT.
mount_export() {
  local run=$1 export=$2 fuse=$1/nbd-$2 mnt=$1/mnt-$2 dev
  mkdir -p "$fuse" "$mnt"
  nbdfuse "$fuse" "nbd+unix:///$export?socket=$run/ftlab.sock" > "$run/nbdfuse-$export.log" 2>&1 &
  fuses+=("$fuse")
  for _ in $(seq 100); do [ -e "$fuse/nbd" ] && break; sleep 0.1; done
  dev=$(losetup --direct-io=on -f --show "$fuse/nbd")
  loops+=("$dev")
  mkfs.ext4 -q -E nodiscard "$dev"
  # discard: deleted SSTs and WAL files reach the device as trims, as on an SSD.
  mount -o discard "$dev" "$mnt"
  mounts+=("$mnt")
}

# run NAME EXPORT_FLAGS...: a fresh server, its file systems, db_bench, fsck, the statistics.
run() {
  local name=$1 run=$WORK/$1
  shift
  mkdir -p "$run"
  "$FTLAB" serve --no-tcp --unix "$run/ftlab.sock" --stats "$run/stats.json" "${device[@]}" "$@" \
    > "$run/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 100); do [ -S "$run/ftlab.sock" ] && break; sleep 0.1; done
  [ -S "$run/ftlab.sock" ] || { cat "$run/serve.log" >&2; die "ftlab serve did not start"; }
  local db wal=()
  if [ "$name" = fdp ]; then
    mount_export "$run" wal
    mount_export "$run" db
    db=$run/mnt-db/rocksdb
    wal=(--wal_dir="$run/mnt-wal/wal")
  else
    mount_export "$run" ftlab
    db=$run/mnt-ftlab/rocksdb
  fi
  echo "== $name: db_bench fillrandom,overwrite --num=$num"
  # RocksDB out of space retries for ever; a run that long has failed.
  timeout "${DB_BENCH_TIMEOUT:-7200}" db_bench --benchmarks=fillrandom,overwrite --num="$num" --key_size=16 --value_size=1000 \
    --compression_type=none --write_buffer_size=16777216 --target_file_size_base=16777216 \
    --max_background_jobs=2 --wal_bytes_per_sync=1048576 --bytes_per_sync=1048576 \
    --db="$db" "${wal[@]}" --statistics=0 \
    > "$run/db_bench.log" 2>&1 || { cat "$run/db_bench.log" >&2; die "db_bench failed"; }
  grep -E "^(fillrandom|overwrite) " "$run/db_bench.log"
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}"; done
  mounts=()
  for dev in "${loops[@]}"; do
    e2fsck -fn "$dev" > "$run/e2fsck.log" 2>&1 || { cat "$run/e2fsck.log" >&2; die "e2fsck found errors"; }
  done
  echo "e2fsck -fn: clean"
  cleanup
}

run one
run fdp --export "wal=$WAL_BYTES,handle=1" --export db,handle=2
python3 - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
waf = {}
for name in ("one", "fdp"):
    s = json.load(open(f"{work}/{name}/stats.json"))
    waf[name] = s["waf"]
    handles = ", ".join(
        f"handle {p['placement']}: {p['host_pages']} host pages, WAF {p['waf'] or 0:.3f}"
        for p in s["fdp"]["placements"] if p["kind"] in ("persistent", "initial") and p["host_pages"])
    print(f"{name}: WAF {s['waf']:.3f}, {s['host_write_pages']} host pages, {s['gc_write_pages']} GC pages ({handles})")
print(f"WAF with the WAL on its own export and handle: {(waf['fdp'] / waf['one'] - 1) * 100:+.1f} %")
EOF
