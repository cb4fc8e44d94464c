"""CPython's own SQLite test suite with ftlab as SQLite's default VFS (scripts/sqlite_suite.py):
every test that passes on SQLite's own VFS passes on ftlab's, but those the script names with
their reasons."""

import importlib.util
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import sqlite_suite  # noqa: E402

from test_sqlite_ext import extension  # noqa: E402


def test_pythons_sqlite_suite_passes_with_ftlab_as_the_default_vfs():
    if importlib.util.find_spec(sqlite_suite.SUITE) is None:
        why = f"{sqlite_suite.SUITE} is not installed for {sys.executable}"
        log = os.environ.get("FTLAB_SKIPPED_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"python/tests/test_sqlite_suite.py: {why}\n")
        pytest.skip(why)
    ext = extension()
    r = sqlite_suite.compare(ext if ext.endswith(".so") else ext + ".so")
    print(f"SQLite's VFS: {r['sqlite']}; ftlab's: {r['ftlab']}")
    assert r["unexpected"] == [], {t: r["worse_on_ftlab"][t] for t in r["unexpected"]}
    # The suite ran, and its file databases were ftlab's devices.
    assert r["sqlite"].get("passed", 0) > 300
    assert r["ftlab"].get("passed", 0) >= r["sqlite"]["passed"] - len(sqlite_suite.EXPECTED)
    assert r["devices_made"] > 0
