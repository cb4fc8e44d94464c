#!/usr/bin/env bash
# Runs the simulator with every mapping table (flat, learned, hash, extent) over the shared traces
# and the workload generators, and checks that each table's JSON report equals flat's but for the
# mapping figures (`mapping`, the series' `mapping_bytes`), the echoed `config` (which names the
# table) and wall time: the tables are lossless, so GC, WAF, latencies and every counter must not
# move. Larger and more varied than the tests' `every_mapping_table_gives_the_flat_tables_results`
# (full traces, several presets, streams, a write buffer, reads, a buffer of one in 1024 live
# mappings); about 5 minutes on two cores.
#
# usage: scripts/lossless_sweep.sh [FTLAB]   (default target/release/ftlab; build it first)
# Environment: TRACES (default ../shared/traces), WORK (default a temporary directory, removed).
set -euo pipefail
# Paths given are the caller's; the defaults are the repository's.
ftlab=${1:+$(realpath -m "$1")}
traces=${TRACES:+$(realpath -m "$TRACES")}
work=${WORK:+$(realpath -m "$WORK")}
cd "$(dirname "$0")/.."
ftlab=${ftlab:-target/release/ftlab}
traces=${traces:-../shared/traces}
work=${work:-$(mktemp -d)}
[ -z "${WORK:-}" ] && trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
[ -x "$ftlab" ] || { echo "lossless_sweep.sh: no $ftlab (cargo build --release)" >&2; exit 2; }
failed=()

compare() { # flat.json other.json
  python3 - "$1" "$2" <<'PY'
import json, sys
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items()
                if k not in ("mapping", "mapping_bytes", "config") and "wall" not in k}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
a, b = (strip(json.load(open(f))) for f in sys.argv[1:3])
if a != b:
    print("  differs in:", ", ".join(k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)))
    sys.exit(1)
PY
}

case_() { # name, sim arguments...
  local name=$1 m
  shift
  for m in flat learned hash extent; do
    if ! "$ftlab" sim -q "$@" --set ftl.mapping="$m" --json "$work/$name.$m.json" 2> "$work/$name.$m.err"; then
      echo "$name: $m failed: $(head -c 300 "$work/$name.$m.err")"
      failed+=("$name/$m")
      continue
    fi
    [ "$m" = flat ] && continue
    if compare "$work/$name.flat.json" "$work/$name.$m.json"; then
      echo "$name: $m reports what flat does"
    else
      echo "$name: $m DIFFERS from flat"
      failed+=("$name/$m")
    fi
  done
}

t=$traces
case_ msr-hm0 --trace "$t/msr-hm0-sample.csv" --wrap --set capacity.logical_bytes=4294967296
case_ msr-rsrch0 --trace "$t/msr-rsrch0-sample.csv" --wrap --set capacity.logical_bytes=4294967296
case_ rocksdb --trace "$t/rocksdb.nbdlog.gz" --wrap --set capacity.logical_bytes=8589934592
case_ files --trace "$t/files.nbdlog.gz" --wrap --set capacity.logical_bytes=8589934592
case_ files-msr-full --trace "$t/files.msr.csv.gz" --wrap --precondition --set capacity.logical_bytes=8589934592
case_ pgbench-full --trace "$t/pgbench.nbdlog.gz" --wrap --precondition --set capacity.logical_bytes=8589934592
case_ pgbench-msr-streams --trace "$t/pgbench.msr.csv.gz" --wrap --set capacity.logical_bytes=8589934592 --set ftl.streams=4
case_ hotcold-streams --set workload.kind=hotcold --set workload.requests=300000 --set ftl.streams=2 \
  --set workload.stream_by_temperature=true --set ftl.gc_separate_frontier=true
case_ zipf-reads-buffer --set workload.kind=zipf --set workload.requests=300000 --set workload.read_pcent=30 \
  --set ftl.write_buffer_mib=4
case_ jesd219-hexa --preset hexa --set workload.kind=jesd219 --set workload.requests=200000
case_ sequential-128k --set workload.kind=sequential --set workload.requests=300000 \
  --set workload.request_size_bytes=131072
case_ uniform-small-buffer --set workload.requests=300000 --set ftl.learned_buffer_divisor=1024

if [ ${#failed[@]} -gt 0 ]; then
  echo "lossless_sweep.sh: ${#failed[@]} failed: ${failed[*]}" >&2
  exit 1
fi
echo "lossless_sweep.sh: every table reported what flat does in every case"
