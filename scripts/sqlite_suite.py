#!/usr/bin/env python3
"""Python's own SQLite test suite (CPython's test.test_sqlite3) with ftlab as SQLite's default VFS,
beside the same suite on SQLite's own VFS.

    python3 scripts/sqlite_suite.py target/release/libftlab_vfs.so [--json OUT]

Each run is a child process. The ftlab one loads the extension into the SQLite library Python's
_sqlite3 module uses (through ctypes: Python's module is often built without load_extension)
with FTLAB_SQLITE_DEFAULT set to a fresh directory, so that every database the suite opens by a
plain file name gets a durable ftlab device there. The report: counts per outcome for both, and
every test that passes on SQLite's VFS but not on ftlab's. Exit status 1 if there is one not in
EXPECTED (a difference with its reason), 2 if the suite is not installed here (Debian keeps it in
libpython3.X-testsuite), 0 otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SUITE = "test.test_sqlite3"

# What ftlab's VFS does not do, as docs/sqlite.md says: each test id with why it cannot pass.
# Nothing else may differ.
EXPECTED: dict[str, str] = {
    "test.test_sqlite3.test_dbapi.MultiprocessTests.test_ctx_mgr_rollback_if_commit_failed":
        "two processes share one database: a device is one process's (its directory is locked), "
        "so the second process's open is refused, not made to wait for a lock",
}

CHILD = r"""
import ctypes, json, os, sys, unittest

out_path, ext = sys.argv[1], sys.argv[2]
import _sqlite3
if ext:
    # The libsqlite3 this process already has (the one _sqlite3 links): ctypes gets its handle.
    lib_path = next(
        line.split()[-1]
        for line in open("/proc/self/maps")
        if "libsqlite3" in line and line.split()[-1].startswith("/")
    )
    lib = ctypes.CDLL(lib_path)
    db = ctypes.c_void_p()
    assert lib.sqlite3_open(b":memory:", ctypes.byref(db)) == 0
    assert lib.sqlite3_enable_load_extension(db, 1) == 0
    err = ctypes.c_char_p()
    rc = lib.sqlite3_load_extension(db, ext.encode(), None, ctypes.byref(err))
    if rc != 0:
        sys.exit(f"loading {ext}: {err.value}")
    lib.sqlite3_close(db)

    class Vfs(ctypes.Structure):
        _fields_ = [("iVersion", ctypes.c_int), ("szOsFile", ctypes.c_int),
                    ("mxPathname", ctypes.c_int), ("pNext", ctypes.c_void_p),
                    ("zName", ctypes.c_char_p)]

    lib.sqlite3_vfs_find.restype = ctypes.POINTER(Vfs)
    name = lib.sqlite3_vfs_find(None).contents.zName
    if name != b"ftlab":
        sys.exit(f"the default VFS is {name!r}, not ftlab")

outcomes = {}

class Result(unittest.TextTestResult):
    def addSuccess(self, t):
        super().addSuccess(t); outcomes[t.id()] = ["passed", ""]
    def addFailure(self, t, e):
        super().addFailure(t, e); outcomes[t.id()] = ["failed", self._exc_info_to_string(e, t)]
    def addError(self, t, e):
        super().addError(t, e); outcomes[t.id()] = ["error", self._exc_info_to_string(e, t)]
    def addSkip(self, t, why):
        super().addSkip(t, why); outcomes[t.id()] = ["skipped", why]
    def addExpectedFailure(self, t, e):
        super().addExpectedFailure(t, e); outcomes[t.id()] = ["expected failure", ""]
    def addUnexpectedSuccess(self, t):
        super().addUnexpectedSuccess(t); outcomes[t.id()] = ["unexpected success", ""]
    def addSubTest(self, t, sub, e):
        super().addSubTest(t, sub, e)
        if e is not None:
            outcomes[sub.id()] = ["failed", self._exc_info_to_string(e, t)]

suite = unittest.defaultTestLoader.loadTestsFromName("test.test_sqlite3")
runner = unittest.TextTestRunner(stream=open(os.devnull, "w"), resultclass=Result)
runner.run(suite)
json.dump(outcomes, open(out_path, "w"))
"""


def run(ext: str | None, work: str) -> dict[str, list[str]]:
    """The suite's outcome per test id, in a child process (a crash is an error, with its code)."""
    out = os.path.join(work, "ftlab.json" if ext else "sqlite.json")
    cwd = os.path.join(work, "ftlab-cwd" if ext else "sqlite-cwd")
    os.makedirs(cwd)
    env = dict(os.environ)
    env.pop("FTLAB_SQLITE_DEFAULT", None)
    if ext:
        env["FTLAB_SQLITE_DEFAULT"] = os.path.join(work, "devices")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, out, os.path.abspath(ext) if ext else ""],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=1800,
    )
    if child.returncode != 0 or not os.path.exists(out):
        raise SystemExit(
            f"the suite {'on ftlab' if ext else 'on SQLite'} ended with status "
            f"{child.returncode}:\n{child.stderr[-4000:]}"
        )
    with open(out) as f:
        return json.load(f)


def counts(outcomes: dict[str, list[str]]) -> dict[str, int]:
    c: dict[str, int] = {}
    for kind, _ in outcomes.values():
        c[kind] = c.get(kind, 0) + 1
    return dict(sorted(c.items()))


def compare(ext: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="ftlab-sqlite-suite-") as work:
        sqlite = run(None, work)
        ftlab = run(ext, work)
        devices = len(os.listdir(os.path.join(work, "devices"))) if os.path.isdir(
            os.path.join(work, "devices")) else 0
    good = ("passed", "skipped", "expected failure")
    worse = {
        t: ftlab.get(t, ["missing", "not run on ftlab"])
        for t, (kind, _) in sqlite.items()
        if kind == "passed" and ftlab.get(t, ["missing"])[0] not in good
    }
    # A test skipped on ftlab but passing on SQLite's VFS is a difference too.
    worse.update({t: o for t, o in ftlab.items() if o[0] == "skipped" and sqlite.get(t, [""])[0] == "passed"})
    return {
        "sqlite": counts(sqlite),
        "ftlab": counts(ftlab),
        "devices_made": devices,
        "worse_on_ftlab": worse,
        "unexpected": sorted(t for t in worse if t not in EXPECTED),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("extension", help="libftlab_vfs.so (cargo build --release --manifest-path "
                   "crates/sqlite-ext/Cargo.toml --target-dir target)")
    p.add_argument("--json", help="write the comparison here too")
    a = p.parse_args()
    try:
        __import__(SUITE)
    except ImportError as e:
        print(f"SKIPPED: {SUITE} is not installed for {sys.executable} ({e})")
        return 2
    r = compare(a.extension)
    print(f"{SUITE} on SQLite's own VFS: {r['sqlite']}")
    print(f"{SUITE} with ftlab the default VFS: {r['ftlab']} ({r['devices_made']} devices made)")
    for t, (kind, why) in sorted(r["worse_on_ftlab"].items()):
        tag = "expected" if t in EXPECTED else "UNEXPECTED"
        reason = EXPECTED.get(t) or (why.strip().splitlines() or [""])[-1]
        print(f"  {tag}: {t}: {kind}: {reason}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)
    return 1 if r["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
