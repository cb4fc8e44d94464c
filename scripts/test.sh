#!/usr/bin/env bash
# Every test ftlab has, as CI runs it. Installs what the tests need beyond Rust, cargo-nextest and
# Python 3 (only when missing, so it is quick on a developer's machine).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# `ftlab plot` draws text with DejaVu Sans (tests/it/readme.rs plots a report).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# Real NBD clients for tests/it/tools.rs: fio (nbd engine), nbdcopy and nbdfuse, FUSE.
command -v fio >/dev/null || need_apt+=(fio)
command -v nbdcopy >/dev/null || need_apt+=(libnbd-bin)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
# RocksDB's db_bench for the FDP test (scripts/rocksdb-fdp.sh, its short version).
command -v db_bench >/dev/null || need_apt+=(rocksdb-tools)
# The sqlite3 shell loads the VFS as an extension (tests/it/tools.rs).
command -v sqlite3 >/dev/null || need_apt+=(sqlite3)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq "${need_apt[@]}"
  fi
fi
# Each phase's start, in seconds since this script began: where CI's time goes.
phase() { echo "== test.sh [${SECONDS} s] $*"; }
[ -d ../shared/traces ] || { echo "scripts/test.sh: ../shared (traces, tools) must sit beside the project" >&2; exit 1; }

phase "fmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The SQLite extension is a workspace of its own (crates/sqlite-ext/Cargo.toml says why); built
# here for tests/it/tools.rs, into the same target directory so it shares the workspace's deps.
ext=(--manifest-path crates/sqlite-ext/Cargo.toml)
cargo fmt "${ext[@]}" -- --check
cargo clippy "${ext[@]}" --target-dir target -- -D warnings
phase "SQLite extension"
cargo build "${ext[@]}" --target-dir target
# The API docs build without warnings (broken or private intra-doc links).
phase "API docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# A test that cannot run here appends its name and reason to this file (tests/it/support.rs,
# `skip`); nextest hides a passing test's output, so the summary below is where a skip shows.
skipped_log=target/tmp/skipped-tests.txt
mkdir -p target/tmp && : > "$skipped_log"
status=0
phase "nextest"
FTLAB_SKIPPED_LOG="$PWD/$skipped_log" cargo nextest run --workspace --no-fail-fast || status=$?
phase "doc tests"
cargo test --workspace --doc || status=$?
# The Python package (pyproject.toml, crates/py, python/): a venv holding what its tests import,
# the abi3 wheel built by maturin and installed, then pytest (python/tests), which compares the
# package with the `ftlab` binary nextest just built.
phase "Python package"
[ -x target/pyenv/bin/python ] || python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check maturin pytest numpy pandas pyarrow distributed prometheus_client pysqlite3-binary nbclient ipykernel matplotlib
rm -rf target/wheels
target/pyenv/bin/maturin build --release --out target/wheels
target/pyenv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/ftlab-*.whl
phase "pytest"
FTLAB_SKIPPED_LOG="$PWD/$skipped_log" FTLAB_BIN="$PWD/target/debug/ftlab" target/pyenv/bin/python -m pytest -q python/tests || status=$?
phase "done"
if [ -s "$skipped_log" ]; then
  echo "SKIPPED: $(wc -l < "$skipped_log") test(s) could not run here and passed without testing:"
  sed 's/^/  SKIPPED /' "$skipped_log"
else
  echo "SKIPPED: none (every test ran)"
fi
exit $status
