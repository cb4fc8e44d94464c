#!/usr/bin/env bash
# PostgreSQL's pgbench on ext4 on the emulated SSD: `ftlab serve` -> nbdfuse -> loop device ->
# ext4 -> PostgreSQL. Prints pgbench's figures, checks the database (pg_amcheck) and the file
# system (e2fsck -fn), and ends the server, whose summary gives WAF, GC and client latency; its
# recorded trace replays with `ftlab sim --trace WORK/record.log` and the same --set flags.
#
# usage: scripts/pgbench.sh [SECONDS] [ftlab serve flags...]
#   scripts/pgbench.sh 60 --set flash.blocks_per_die=40 --set capacity.logical_bytes=2147483648 --latency real
# Needs root (mount, losetup), /dev/fuse, nbdfuse (libnbd-bin), fuse3 and PostgreSQL (its
# initdb, pg_ctl, pgbench, pg_amcheck; the server runs as the `postgres` user). Environment:
# WORK (default /tmp/ftlab-pgbench), MNT (default WORK/mnt), SCALE (pgbench -s, default 30),
# PORT (default 5499), FTLAB (default target/release/ftlab).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
WORK=${WORK:-/tmp/ftlab-pgbench}
MNT=${MNT:-$WORK/mnt}
SCALE=${SCALE:-30}
PORT=${PORT:-5499}
FTLAB=${FTLAB:-target/release/ftlab}

die() { echo "scripts/pgbench.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mount and losetup)"
[ -e /dev/fuse ] || die "needs /dev/fuse"
command -v nbdfuse >/dev/null || die "needs nbdfuse (apt-get install libnbd-bin fuse3)"
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || die "needs PostgreSQL (apt-get install postgresql)"
id postgres >/dev/null 2>&1 || die "needs the postgres user (the postgresql package makes it)"
[ -x "$FTLAB" ] || cargo build --release
[ ! -e "$WORK" ] || die "$WORK exists; remove it or set WORK"

mkdir -p "$WORK/nbd" "$MNT"
sock=$WORK/ftlab.sock
serve_pid= dev= mounted= fuse_pid= pg_started=
cleanup() {
  [ -z "$pg_started" ] || su postgres -c "$pgbin/pg_ctl -D $MNT/pg/data -m fast stop" >/dev/null 2>&1 || true
  [ -z "$mounted" ] || umount "$MNT" || true
  [ -z "$dev" ] || losetup -d "$dev" || true
  [ -z "$fuse_pid" ] || fusermount3 -u "$WORK/nbd" 2>/dev/null || true
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -INT "$serve_pid"; wait "$serve_pid" || true
  fi
}
trap cleanup EXIT

"$FTLAB" serve --no-tcp --unix "$sock" --record "$WORK/record.log" --stats "$WORK/stats.json" "$@" \
  > "$WORK/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$WORK/serve.log" >&2; die "ftlab serve did not start"; }
nbdfuse "$WORK/nbd" "nbd+unix:///ftlab?socket=$sock" > "$WORK/nbdfuse.log" 2>&1 &
fuse_pid=$!
for _ in $(seq 50); do [ -e "$WORK/nbd/nbd" ] && break; sleep 0.1; done
dev=$(losetup --direct-io=on -f --show "$WORK/nbd/nbd")
mkfs.ext4 -q "$dev"
mount "$dev" "$MNT"; mounted=1
mkdir "$MNT/pg"; chown postgres "$MNT/pg"
su postgres -c "$pgbin/initdb -D $MNT/pg/data" > "$WORK/initdb.log" 2>&1
su postgres -c "$pgbin/pg_ctl -D $MNT/pg/data -o '-p $PORT -k /tmp' -l $MNT/pg/log start" >/dev/null
pg_started=1
pgbench() { su postgres -c "$pgbin/pgbench -h /tmp -p $PORT $*"; }
echo "== pgbench -i -s $SCALE"
pgbench -i -s "$SCALE" -q postgres 2>&1 | tail -1
echo "== pgbench -c 8 -j 2 -T $seconds"
pgbench -c 8 -j 2 -T "$seconds" postgres 2>&1 | grep -E "processed|failed|latency average|tps"
su postgres -c "$pgbin/pg_amcheck -h /tmp -p $PORT --install-missing --heapallindexed postgres"
echo "pg_amcheck --heapallindexed: clean"
su postgres -c "$pgbin/pg_ctl -D $MNT/pg/data stop" >/dev/null
pg_started=
umount "$MNT"; mounted=
e2fsck -fn "$dev" > "$WORK/e2fsck.log" 2>&1 || { cat "$WORK/e2fsck.log" >&2; die "e2fsck found errors"; }
echo "e2fsck -fn: clean"
losetup -d "$dev"; dev=
fusermount3 -u "$WORK/nbd"; fuse_pid=
kill -INT "$serve_pid"; wait "$serve_pid"; serve_pid=
echo "== ftlab serve"
cat "$WORK/serve.log"
# The device flags again (serve's own, such as --latency, are not sim's).
device=()
while [ $# -gt 0 ]; do
  case $1 in
    --set|--preset|--config) device+=("$1" "$2"); shift 2 ;;
    *) shift ;;
  esac
done
echo "replay: $FTLAB sim --trace $WORK/record.log ${device[*]}"
