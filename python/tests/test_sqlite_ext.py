"""The ftlab SQLite VFS as a loadable extension, from Python (`conn.load_extension`).

The standard library's sqlite3 module is often built without extension loading; pysqlite3
(installed by scripts/test.sh) is the same API with it.
"""

import os
import pathlib

import pytest

sqlite3 = pytest.importorskip("pysqlite3.dbapi2")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def extension() -> str:
    given = os.environ.get("FTLAB_SQLITE_EXT")
    if given:
        return given
    for profile in ("debug", "release"):
        path = ROOT / "target" / profile / "libftlab_vfs.so"
        if path.exists():
            return str(path.with_suffix(""))
    pytest.fail("build it: cargo build --manifest-path crates/sqlite-ext/Cargo.toml --target-dir target")


def load() -> None:
    c = sqlite3.connect(":memory:")
    c.enable_load_extension(True)
    c.load_extension(extension())
    c.close()


@pytest.mark.parametrize("mode", ["delete", "wal"])
def test_a_database_on_a_durable_device_survives_reopening(tmp_path, mode):
    load()
    uri = f"file:py-{mode}.db?vfs=ftlab&device={tmp_path / 'dev'}"
    db = sqlite3.connect(uri, uri=True)
    assert db.execute(f"PRAGMA journal_mode={mode}").fetchone()[0] == mode
    db.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)")
    for batch in range(10):
        db.executemany(
            "INSERT INTO t(v) VALUES (?)", [(f"row {batch}-{i}" * 5,) for i in range(100)]
        )
        db.commit()
    db.close()
    db = sqlite3.connect(uri, uri=True)
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 1000
    assert db.execute("SELECT v FROM t WHERE k = 1000").fetchone()[0] == "row 9-99" * 5
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    # The device directory holds the log the VFS wrote (the durable device's files).
    assert any((tmp_path / "dev").iterdir())
