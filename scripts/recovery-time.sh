#!/usr/bin/env bash
# Recovery and snapshot bars of a durable device: a 4 GiB device written whole (fio, 1 MiB
# sequential writes of incompressible data) with one checkpoint after the first 3 GiB, then
# 1 GiB more written after the checkpoint, a snapshot made through the server on the full
# device after a FLUSH (five, each timed by the server), the server killed with SIGKILL,
# and the time from the restart to its socket answering (checkpoint read, the 1 GiB tail scanned
# and checksummed, the FTL model's requests replayed).
# Usage: scripts/recovery-time.sh        (SIZE=4G TAIL=1G; BENCH_DIR=target/recovery-time)
set -euo pipefail
cd "$(dirname "$0")/.."
size="${SIZE:-4G}"
tail_size="${TAIL:-1G}"
work="${BENCH_DIR:-target/recovery-time}"
cargo build --release -q -p ftlab
ftlab="$PWD/target/release/ftlab"
bytes=$(numfmt --from=iec "$size")
tail_bytes=$(numfmt --from=iec "$tail_size")
head_bytes=$((bytes - tail_bytes))
rm -rf "$work"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
sock="$work/s.sock"
uri="nbd+unix:///ftlab?socket=$sock"
serve() {
    rm -f "$sock"
    "$ftlab" serve --no-tcp --unix "$sock" --data "$work/data" --set capacity.logical_bytes="$bytes" \
        --checkpoint-every "$((head_bytes - (16 << 20)))" 2>>"$work/serve.log" &
    pid=$!
}
wait_socket() {
    for _ in $(seq 2000); do
        [ -S "$sock" ] && nbdinfo --size "$uri" >/dev/null 2>&1 && return 0
        sleep 0.005
    done
    echo "no server" >&2
    exit 1
}
serve
wait_socket
fio --name=head --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$head_bytes" >/dev/null
sleep 2 # the maintenance thread's checkpoint
grep -c "checkpoint at record" "$work/serve.log" >/dev/null || { echo "no checkpoint" >&2; exit 1; }
fio --name=tail --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 \
    --offset="$head_bytes" --size="$tail_bytes" --end_fsync=1 >/dev/null
# Five snapshots of the full device, after the FLUSH that ended the writes (a snapshot's commit
# would otherwise also sync the data written before it).
snapshot=$(for k in 1 2 3 4 5; do "$ftlab" snapshot create "$work/data" "full$k"; done)
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
echo "$snapshot"
echo "directory: $(du -sh "$work/data" | cut -f1)"
start=$(date +%s.%N)
serve
wait_socket
end=$(date +%s.%N)
grep "replayed" "$work/serve.log" | tail -1
awk -v a="$start" -v b="$end" 'BEGIN {printf "recovery (restart to the export answering): %.2f s\n", b - a}'
kill -INT "$pid"
wait "$pid" 2>/dev/null || true
