#!/usr/bin/env bash
# Bounds of a durable device over long service: a SIZE device (default 64M) written ROUNDS
# times over (default 100) by fio through the NBD server (4 KiB random writes of incompressible
# data at queue depth 8, a FLUSH every 64 writes, or RW=write for 1 MiB sequential ones), the
# directory's bytes on disk sampled every second (largest and final, against the device's
# size); then the server killed with SIGKILL and restarted: the time from the restart to its
# socket answering and the restarted server's peak memory (VmHWM) against the first server's
# resident memory before the kill (its steady state).
# Usage: scripts/model-bounds.sh    (SIZE=64M ROUNDS=100 RW=randwrite; BENCH_DIR=target/model-bounds;
#        extra serve flags in SERVE_FLAGS, e.g. SERVE_FLAGS="--checkpoint-every 256M";
#        FTLAB_BIN=PATH measures that binary instead of building one)
set -euo pipefail
cd "$(dirname "$0")/.."
size="${SIZE:-64M}"
rounds="${ROUNDS:-100}"
rw="${RW:-randwrite}"
work="${BENCH_DIR:-target/model-bounds}"
if [ -z "${FTLAB_BIN:-}" ]; then
    cargo build --release -q -p ftlab
fi
ftlab="${FTLAB_BIN:-$PWD/target/release/ftlab}"
bytes=$(numfmt --from=iec "$size")
rm -rf "$work"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
sock="$work/s.sock"
uri="nbd+unix:///ftlab?socket=$sock"
serve() {
    rm -f "$sock"
    # shellcheck disable=SC2086
    "$ftlab" serve --no-tcp --unix "$sock" --data "$work/data" --set capacity.logical_bytes="$bytes" \
        ${SERVE_FLAGS:-} 2>>"$work/serve.log" &
    pid=$!
}
wait_socket() {
    for _ in $(seq 20000); do
        [ -S "$sock" ] && nbdinfo --size "$uri" >/dev/null 2>&1 && return 0
        sleep 0.005
    done
    echo "no server" >&2
    exit 1
}
# du may see a segment the cleaner deletes meanwhile: what it did count is taken.
disk() { { du -sb "$work/data" 2>/dev/null || true; } | cut -f1; }
trap 'kill -9 "${pid:-}" "${fio_pid:-}" 2>/dev/null || true' EXIT
serve
wait_socket
if [ "$rw" = randwrite ]; then
    job=(--rw=randwrite --bs=4k --fsync=64 --norandommap --randrepeat=0)
else
    job=(--rw=write --bs=1M --fsync=4)
fi
fio --name=fill --ioengine=nbd --uri="$uri" "${job[@]}" --iodepth=8 --size="$bytes" \
    --io_size=$((bytes * rounds)) --refill_buffers --output="$work/fio.out" &
fio_pid=$!
max=0
while kill -0 "$fio_pid" 2>/dev/null; do
    d=$(disk)
    [ "$d" -gt "$max" ] && max=$d
    sleep 1
done
wait "$fio_pid"
grep -E "IOPS|WRITE:" "$work/fio.out" | head -2
sleep 1
d=$(disk)
[ "$d" -gt "$max" ] && max=$d
awk -v m="$max" -v d="$d" -v b="$bytes" -v r="$rounds" 'BEGIN {
    printf "disk after writing %dx the device: largest %.1f MiB (%.2fx), final %.1f MiB (%.2fx)\n",
        r, m / 1048576, m / b, d / 1048576, d / b }'
steady_kb=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
ls -l "$work/data" | awk 'NR > 1 {print "  " $5 "\t" $9}'
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
start=$(date +%s.%N)
serve
wait_socket
end=$(date +%s.%N)
peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
grep "replayed" "$work/serve.log" | tail -1
awk -v a="$start" -v b="$end" -v s="$steady_kb" -v p="$peak_kb" 'BEGIN {
    printf "restart to the export answering: %.2f s; peak memory %.1f MiB against %.1f MiB steady (%.2fx)\n",
        b - a, p / 1024, s / 1024, p / s }'
kill -INT "$pid"
wait "$pid" 2>/dev/null || true
