#!/usr/bin/env bash
# Runs every fuzz target (the five trace parsers, placement range files, sweep files, the NBD connection in plain and over TLS, the mapping tables on a small and a sparse device, one group's encodings) for SECONDS each (default 60), seeded with real trace lines.
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP lets it use the stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
# Without cargo-fuzz every run below would fail inside the filter and the script would pass
# having fuzzed nothing.
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
  exit 2
fi
shared=../../shared
mkdir -p corpus/parse_msr corpus/parse_nbdkit corpus/parse_disksim corpus/parse_blkparse corpus/parse_fio
head -50 "$shared/traces/msr-hm0-sample.csv" > corpus/parse_msr/seed
zcat "$shared/traces/rocksdb.nbdlog.gz" | head -50 > corpus/parse_nbdkit/seed || true  # head closes the pipe early
printf '0 0 0 8 0\n10000 0 8 8 1\n' > corpus/parse_disksim/seed
printf '  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n8,0 0 5 2.0 123 Q FWS [jbd2]\n' > corpus/parse_blkparse/seed
printf 'fio version 3 iolog\n0 /dev/x add\n878 /dev/x write 0 16384\n9 /dev/x sync\n' > corpus/parse_fio/seed
mkdir -p corpus/placement_ranges
printf '# wal, then the rest\n0, 0x40000000, 1\n0x40000000, 0xffffffffffffffff, 0:2\n' > corpus/placement_ranges/seed
printf '0 0 0 8 0 1\n10000 0 8 8 0 1:3\n' > corpus/parse_disksim/seed-pid
mkdir -p corpus/nbd_connection
# A client greeting: flags, then NBD_OPT_GO for "ftlab" (the fuzzer mutates from here).
printf '\x00\x00\x00\x03IHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x0b\x00\x00\x00\x05ftlab\x00\x00' > corpus/nbd_connection/seed
# Structured replies, SET_META_CONTEXT base:allocation, GO, then a write, two BLOCK_STATUS (one
# with REQ_ONE) and a CACHE.
printf '\x00\x00\x00\x03IHAVEOPT\x00\x00\x00\x08\x00\x00\x00\x00IHAVEOPT\x00\x00\x00\x0a\x00\x00\x00\x20\x00\x00\x00\x05ftlab\x00\x00\x00\x01\x00\x00\x00\x0fbase\x3aallocationIHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x0b\x00\x00\x00\x05ftlab\x00\x00\x25\x60\x95\x13\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x10xxxxxxxxxxxxxxxx\x25\x60\x95\x13\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x25\x60\x95\x13\x00\x08\x00\x07\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00d\x00\x01\x00\x00\x25\x60\x95\x13\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00' > corpus/nbd_connection/seed-block-status
mkdir -p corpus/tls_connection
# Over TLS (chunks: a tag byte, even sealed by the client and odd raw, a little-endian u16
# length, the bytes): NBD_OPT_GO, a 4 KiB read, then a raw record header cut short.
printf '\x00\x1b\x00IHAVEOPT\x00\x00\x00\x07\x00\x00\x00\x0b\x00\x00\x00\x05ftlab\x00\x00\x00\x1c\x00\x25\x60\x95\x13\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x01\x05\x00\x17\x03\x03\x00\x20' > corpus/tls_connection/seed
failed=()
mkdir -p corpus/sweep_spec
cp ../sweeps/*.toml corpus/sweep_spec/
for t in parse_msr parse_nbdkit parse_disksim parse_blkparse parse_fio placement_ranges device_log checkpoint nbd_connection tls_connection mapping_tables mapping_sparse group_encodings sweep_spec; do
  echo "== $t (${seconds}s)"
  # nbd_connection starts worker threads per input; libFuzzer's leak check can catch a joined
  # thread still in its TLS destructors and report std's own thread handle (see docs/testing.md), and
  # the exit-time check reports the buffers of rayon's pool threads, which live until exit.
  leaks=1; [ "$t" = nbd_connection ] || [ "$t" = tls_connection ] && leaks=0
  # The full output is kept: a crash's reproducer path and stack are in it.
  # -a: debug assertions and overflow checks. Without them an overflow wraps silently; with
  # them three targets found one each within minutes (a nbdkit date past 2554, a flush's
  # offset near 2^64, a learned-table run ending at the last PPN).
  log="target/fuzz-$t.log"
  mkdir -p target
  if ! ASAN_OPTIONS=detect_leaks=$leaks RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a "$t" -- -max_total_time="$seconds" -detect_leaks="$leaks" > "$log" 2>&1; then
    grep -E 'panicked|ERROR|SUMMARY|artifact' "$log" || tail -20 "$log"
    echo "fuzz.sh: $t failed; full output in fuzz/$log" >&2
    failed+=("$t")
    continue
  fi
  # INITED ends the replay of the saved corpus (its number: the runs the replay took); the runs
  # after it are new. A large corpus can take the whole budget to replay (docs/testing.md, "Fuzzing").
  grep -E 'INITED|^Done' "$log"
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
