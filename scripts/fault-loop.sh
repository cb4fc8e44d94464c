#!/usr/bin/env bash
# The crash-and-fault loop, long: N rounds (default 200) of `ftlab serve --data` on a tmpfs of
# its own under kill -9, a clean stop, a full disk and space returned, a deleted lock with a
# second server started, and a damaged model.log or model.state, in random order, every page
# checked against an oracle client after each (tests/it/fault_loop.rs,
# the_fault_loop_loses_nothing_acknowledged). Needs root (it mounts a tmpfs).
# Usage: scripts/fault-loop.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-200}"
export FTLAB_FAULT_ROUNDS="$n"
start=$(date +%s)
log="${TMPDIR:-/tmp}/fault-loop.log"
set +e
cargo nextest run --release -p ftlab --no-capture \
    -E 'test(the_fault_loop_loses_nothing_acknowledged)' >"$log" 2>&1
status=$?
grep -E "PASS|FAIL|SKIPPED|panicked" "$log"
echo "fault loop: $n rounds, $(( $(date +%s) - start )) s, exit $status (log: $log)"
exit $status
