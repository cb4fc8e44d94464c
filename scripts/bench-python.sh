#!/usr/bin/env bash
# The Python package against the CLI on the default job (`ftlab sim`: FEMU-like 16 GiB SSD,
# steady state, 1 M random 4 KiB writes): wall time of `ftlab sim --quiet --json FILE` and of a
# fresh python3 that imports ftlab and calls ftlab.simulate(), alternating, ROUNDS each (default 5);
# prints the medians and their ratio. Both from the same sources in release mode: the wheel is
# built here (maturin) and installed in target/pyenv.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
cargo build --release --quiet
[ -x target/pyenv/bin/python ] || python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check maturin numpy pandas
rm -rf target/wheels && target/pyenv/bin/maturin build --release --quiet --out target/wheels
target/pyenv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/ftlab-*.whl
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
cli=() py=()
for i in $(seq "$rounds"); do
  t0=$(date +%s.%N)
  target/release/ftlab sim --quiet --json "$tmp/cli.json"
  t1=$(date +%s.%N)
  # What ftlab.simulate() does (the report's JSON, then a dict of it), keeping the JSON to compare.
  target/pyenv/bin/python -c "import ftlab, json, sys; j = ftlab.simulate_json(); json.loads(j); open(sys.argv[1], 'w').write(j)" "$tmp/py.json"
  t2=$(date +%s.%N)
  cli+=("$(awk "BEGIN {print $t1 - $t0}")") py+=("$(awk "BEGIN {print $t2 - $t1}")")
  echo "round $i: cli ${cli[-1]} s, python ${py[-1]} s"
done
cmp "$tmp/cli.json" "$tmp/py.json" && echo "the two reports are the same bytes"
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
c=$(median "${cli[@]}") p=$(median "${py[@]}")
echo "median: cli $c s, python $p s: python/cli = $(awk "BEGIN {printf \"%.4f\", $p / $c}")"
