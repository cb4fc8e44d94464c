#!/usr/bin/env bash
# Reproduces the speed bars of the mapping tables (docs/results.md): runs
# `ftlab mapbench --ppns both --repeat 5 --json F TRACE` ROUNDS times over each trace, one process
# per run, and prints each figure as the median [min-max] over the rounds. Separate processes,
# because a process's rates move together (where its memory landed, what else the host ran then);
# within one, `--repeat` already keeps the fastest of five runs. Run it on an otherwise idle
# machine: every rate is compared with the flat u64 array's of the same run, but a busy second
# core still moves the ratios. Between builds, code placement alone moves the array's rates by up
# to 15 % (docs/mapping.md, "`ftlab mapbench`"); a build with RUSTFLAGS="-C
# llvm-args=-align-loops=64" (and FTLAB pointing at it) holds them steadier. About a minute a
# round for the three nbdkit traces.
#
# usage: scripts/mapping_speed.sh [ROUNDS [TRACE...]]   (default 6 rounds, the nbdkit traces)
# Environment: FTLAB (default target/release/ftlab; build it first), WORK (where the JSON files go;
# default a temporary directory, removed), MAPBENCH_ARGS (more options for every run, e.g.
# "--learned-buffer-divisor 64"; with --tables, flat-u64 and learned must be among them).
set -euo pipefail
rounds=${1:-6}
shift || true
# Paths given are the caller's; the defaults are the repository's.
traces=()
for t in "$@"; do traces+=("$(realpath -m "$t")"); done
ftlab=${FTLAB:+$(realpath -m "$FTLAB")}
work=${WORK:+$(realpath -m "$WORK")}
cd "$(dirname "$0")/.."
ftlab=${ftlab:-target/release/ftlab}
if [ ${#traces[@]} -eq 0 ]; then
  traces=(../shared/traces/rocksdb.nbdlog.gz ../shared/traces/files.nbdlog.gz ../shared/traces/pgbench.nbdlog.gz)
fi
[ -x "$ftlab" ] || { echo "mapping_speed.sh: no $ftlab (cargo build --release)" >&2; exit 2; }
case $rounds in '' | *[!0-9]* | 0) echo "mapping_speed.sh: ROUNDS must be a positive integer, not '$rounds'" >&2; exit 2 ;; esac
work=${work:-$(mktemp -d)}
[ -z "${WORK:-}" ] && trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
echo "ftlab $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%MZ), $rounds round(s), $(nproc) cores" >&2
for r in $(seq "$rounds"); do
  for i in "${!traces[@]}"; do
    echo "round $r/$rounds: ${traces[$i]}" >&2
    # Word splitting of MAPBENCH_ARGS is wanted: it holds options.
    # shellcheck disable=SC2086
    "$ftlab" mapbench --ppns both --repeat 5 ${MAPBENCH_ARGS:-} --json "$work/r$r-t$i.json" "${traces[$i]}" > "$work/r$r-t$i.txt"
  done
done

python3 - "$work" <<'PY'
import glob, json, os, statistics, sys
from collections import defaultdict

runs = defaultdict(list)  # (trace, ppns) -> one {table name: row} per round
fractions = defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], "r*-t*.json"))):
    for run in json.load(open(f)):
        key = (run["trace"], run["ppns"])
        runs[key].append({t["name"]: t for t in run["tables"]})
        fractions[key].append(run["compressed_get_fraction"])

def spread(values, digits, unit=""):
    """median [min-max], or the value alone when they agree at this precision."""
    values = [v for v in values if v is not None]  # null: a phase with no operations
    if not values:
        return "-"
    med, lo, hi = (f"{v:.{digits}f}" for v in (statistics.median(values), min(values), max(values)))
    return med + unit if lo == hi else f"{med}{unit} [{lo}-{hi}]"

def col(key, table, field, digits, sub=None, unit=""):
    if table not in runs[key][0]:  # not among MAPBENCH_ARGS' --tables
        return "-"
    values = [r[table][field][sub] if sub else r[table][field] for r in runs[key]]
    return spread(values, digits, unit)

traces = list(dict.fromkeys(t for t, _ in runs))  # in the order given
ppns = ["log-head", "simulator"]
print(f"Median [range] over {len(next(iter(runs.values())))} round(s); log-head / simulator PPNs.\n")
print("| trace | GET (bar 0.5x) | SET (bar 0.3x) | GET p99 ns, learned (array) | hash GET / SET, log-head |")
print("|---|---:|---:|---:|---:|")
for t in traces:
    k = [(t, p) for p in ppns]
    get = " / ".join(col(x, "learned", "vs_flat_u64", 2, "get", "x") for x in k)
    set_ = " / ".join(col(x, "learned", "vs_flat_u64", 3, "set", "x") for x in k)
    p99 = " / ".join(col(x, "learned", "get_p99_ns", 0) for x in k)
    p99 += f" ({col(k[0], 'flat-u64', 'get_p99_ns', 0)})"
    hash_ = " / ".join(col(k[0], "hash", "vs_flat_u64", 2, f, "x") for f in ("get", "set"))
    print(f"| {os.path.basename(t)} | {get} | {set_} | {p99} | {hash_} |")
print()
print("| trace | learned GET / SET / random GET M/s, log-head | learned SET M/s, simulator | array GET / SET M/s, log-head | learned SET p99.99 us, log-head / simulator | compressed GET fraction | random GET p99 ns, learned (array) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for t in traces:
    lh, sim = (t, "log-head"), (t, "simulator")
    mine = " / ".join(col(lh, "learned", f, 1) for f in ("get_mops", "set_mops", "get_random_mops"))
    array = " / ".join(col(lh, "flat-u64", f, 0) for f in ("get_mops", "set_mops"))
    us = lambda ns: None if ns is None else ns / 1000
    p9999 = " / ".join(spread([us(r["learned"]["set_p9999_ns"]) for r in runs[x]], 1) for x in (lh, sim))
    rand = f"{col(lh, 'learned', 'get_random_p99_ns', 0)} ({col(lh, 'flat-u64', 'get_random_p99_ns', 0)})"
    print(f"| {os.path.basename(t)} | {mine} | {col(sim, 'learned', 'set_mops', 1)} | {array} | {p9999} | {spread(fractions[lh], 3)} | {rand} |")
print()
# Bytes do not depend on timing: every round gives the same, so the first round's are printed.
names = list(runs[(traces[0], "log-head")][0])
print("| bytes per live mapping, log-head | " + " | ".join(names) + " | peak bytes, learned |")
print("|---|" + "---:|" * (len(names) + 1))
for t in traces:
    first = runs[(t, "log-head")][0]
    cells = [f"{first[n]['bytes_per_live_mapping']:.3f}" for n in names]
    print(f"| {os.path.basename(t)} | " + " | ".join(cells) + f" | {first['learned']['bytes_peak']} |")
PY
