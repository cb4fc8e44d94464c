#!/usr/bin/env bash
# The crash loops, long: N iterations (default 200) of
#   - fio writing with verify headers to `ftlab serve --data --durability always`, the server
#     killed with SIGKILL at a random moment, restarted, fio verifying every write it issued
#     but the last QD (tests/it/tools.rs, fio_verify_survives_a_kill_9_loop);
#   - a client of ftlab's own writing and trimming with a FLUSH every 16 requests under
#     `--durability flush`, killed mid-stream, every page checked against what the last FLUSH
#     covered (tests/it/server.rs, a_killed_durable_server_keeps_every_flushed_write);
#   - ext4 mounted on the device through nbdfuse and a loop device (root, /dev/fuse), the server
#     killed mid-copy, every file synced before checked after the journal's recovery, e2fsck -fn
#     at the end (tests/it/tools.rs, ext4_on_a_durable_device_survives_kill_9_mid_copy).
# Usage: scripts/crash-loop.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-200}"
export FTLAB_CRASH_ITERATIONS="$n"
start=$(date +%s)
set +e
cargo nextest run --release -p ftlab --no-capture \
    -E 'test(fio_verify_survives_a_kill_9_loop) | test(a_killed_durable_server_keeps_every_flushed_write) | test(ext4_on_a_durable_device_survives_kill_9_mid_copy)' \
    >"${TMPDIR:-/tmp}/crash-loop.log" 2>&1
status=$?
grep -E "iterations|PASS|FAIL|SKIPPED|panicked|verified|lost" "${TMPDIR:-/tmp}/crash-loop.log"
echo "crash loops: $n iterations each, $(( $(date +%s) - start )) s, exit $status (log: ${TMPDIR:-/tmp}/crash-loop.log)"
exit $status
