#!/usr/bin/env bash
# Writes the JSON reports of a fixed set of simulations (every mapping table, the generators,
# streams, a write buffer, replays of nbdkit and MSR traces open and closed loop) to OUT_DIR, so
# that a refactoring can be shown to change no report: run it before and after, then
#   diff -r BEFORE AFTER
# Usage: scripts/fixed_reports.sh OUT_DIR [FTLAB_BINARY]   (default target/release/ftlab)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/fixed_reports.sh OUT_DIR [FTLAB_BINARY]}
bin=${2:-target/release/ftlab}
traces=../shared/traces
mkdir -p "$out"
i=0
run() {
  i=$((i + 1))
  "$bin" sim -q --json "$out/$i.json" "$@"
}
small=(--set flash.blocks_per_die=64 --set capacity.over_provisioning=0.25)
for m in flat hash extent learned; do
  run --set ftl.mapping=$m --set workload.requests=100000 "${small[@]}"
done
run --set workload.kind=zipf --set workload.requests=100000 --set workload.read_pcent=30 --set ftl.write_buffer_mib=16 "${small[@]}"
run --preset hexa --set workload.kind=hotcold --set ftl.streams=2 --set workload.stream_by_temperature=true --set workload.requests=100000
run --set workload.kind=jesd219 --set workload.requests=50000 "${small[@]}"
run --set workload.kind=sequential --set workload.requests=50000 "${small[@]}"
run --trace $traces/pgbench.nbdlog.gz --set capacity.logical_bytes=4294967296
run --trace $traces/msr-hm0-sample.csv --wrap --set capacity.logical_bytes=1073741824 --replay closed --set workload.queue_depth=8
run --trace $traces/files.msr.csv.gz --format msr --set ftl.mapping=learned --time-scale 0.5
run --preset validation-uniform --set workload.overwrites=0.5 --set workload.precondition_overwrites=1
echo "wrote $i reports to $out"
