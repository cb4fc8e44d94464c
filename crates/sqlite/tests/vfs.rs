//! The ftlab VFS against SQLite's own checks and against the default VFS on a normal file.

use rusqlite::{Connection, OpenFlags};

const MODES: [&str; 5] = ["delete", "truncate", "persist", "wal", "memory"];

/// A small OLTP-like workload: inserts in transactions, an index, updates, deletes. Returns a
/// digest of the final table, row by row.
fn workload(c: &Connection, mode: &str, seed: u64) -> String {
    let got: String = c
        .query_row(&format!("PRAGMA journal_mode={mode}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(got, mode);
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
         CREATE INDEX IF NOT EXISTS t_k ON t(k);",
    )
    .unwrap();
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for _ in 0..40 {
        c.execute_batch("BEGIN").unwrap();
        for _ in 0..50 {
            let k = (next() % 1000) as i64;
            let len = 20 + (next() % 400) as usize;
            let v: String = (0..len)
                .map(|i| (b'a' + ((k as usize + i) % 26) as u8) as char)
                .collect();
            c.execute("INSERT INTO t(k, v) VALUES (?1, ?2)", (k, v))
                .unwrap();
        }
        let k = (next() % 1000) as i64;
        c.execute("UPDATE t SET v = v || 'x' WHERE k = ?1", [k])
            .unwrap();
        let k = (next() % 1000) as i64;
        c.execute("DELETE FROM t WHERE k = ?1", [k]).unwrap();
        c.execute_batch("COMMIT").unwrap();
    }
    let mut s = c.prepare("SELECT id, k, v FROM t ORDER BY id").unwrap();
    let rows = s
        .query_map([], |r| {
            Ok(format!(
                "{}:{}:{}",
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?
            ))
        })
        .unwrap();
    let mut digest = 0u64;
    let mut n = 0;
    for row in rows {
        for b in row.unwrap().bytes() {
            digest = (digest ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
        n += 1;
    }
    format!("{n} rows, digest {digest:016x}")
}

fn integrity(c: &Connection) -> String {
    c.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

fn open_ftlab(uri: &str) -> Connection {
    ftlab_sqlite::register().unwrap();
    Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap()
}

/// Every journal mode: integrity_check passes, and the table equals the same workload's on a
/// normal file with the default VFS.
#[test]
fn every_journal_mode_matches_a_normal_file() {
    let dir = tempfile::tempdir().unwrap();
    for (i, mode) in MODES.iter().enumerate() {
        let plain = Connection::open(dir.path().join(format!("{mode}.db"))).unwrap();
        let expected = workload(&plain, mode, i as u64);
        let c = open_ftlab(&format!("file:{mode}.db?vfs=ftlab"));
        let got = workload(&c, mode, i as u64);
        assert_eq!(got, expected, "{mode}");
        assert_eq!(integrity(&c), "ok", "{mode}");
    }
}

/// A database on a durable device directory is there, whole, after every connection closed
/// and the device was opened again.
#[test]
fn a_durable_device_keeps_the_database_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("dev");
    let uri = format!("file:keep.db?vfs=ftlab&device={}", device.display());
    let expected = {
        let c = open_ftlab(&uri);
        workload(&c, "delete", 7)
    };
    assert!(
        ftlab_sqlite::device_of("keep.db").is_none(),
        "closed with its last connection"
    );
    let c = open_ftlab(&uri);
    assert_eq!(integrity(&c), "ok");
    let rows: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert!(
        expected.starts_with(&format!("{rows} rows")),
        "{expected} vs {rows}"
    );
    // Another name on the same device is refused: the device holds keep.db.
    ftlab_sqlite::register().unwrap();
    drop(c);
    let other = Connection::open_with_flags(
        format!("file:other.db?vfs=ftlab&device={}", device.display()),
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    );
    assert!(other.is_err());
}

/// Connections of one process share the database's locks and WAL's shared memory: a writer
/// holds off a second writer (SQLITE_BUSY) while readers read; what one commits the other sees;
/// under a rollback journal an exclusive writer holds off readers.
#[test]
fn connections_in_one_process_share_locks_and_the_wal() {
    let a = open_ftlab("file:shared.db?vfs=ftlab");
    let b = open_ftlab("file:shared.db?vfs=ftlab");
    // BUSY at once rather than after rusqlite's 5 s of retries.
    b.busy_timeout(std::time::Duration::ZERO).unwrap();
    let mode: String = a
        .query_row("PRAGMA journal_mode=wal", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    a.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    a.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (2);")
        .unwrap();
    let busy = b.execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert!(busy.to_string().contains("locked"), "{busy}");
    let seen: i64 = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        seen, 1,
        "the reader sees the last commit, not the open transaction"
    );
    a.execute_batch("COMMIT").unwrap();
    let seen: i64 = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 2);
    assert_eq!(integrity(&b), "ok");
    drop((a, b));

    let a = open_ftlab("file:rollback.db?vfs=ftlab");
    let b = open_ftlab("file:rollback.db?vfs=ftlab");
    b.busy_timeout(std::time::Duration::ZERO).unwrap();
    a.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    // RESERVED: one writer at a time, readers go on.
    a.execute_batch("BEGIN IMMEDIATE").unwrap();
    let busy = b.execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert!(busy.to_string().contains("locked"), "{busy}");
    let seen: i64 = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 1);
    a.execute_batch("COMMIT").unwrap();
    // EXCLUSIVE: readers wait too.
    a.execute_batch("BEGIN EXCLUSIVE; INSERT INTO t VALUES (2);")
        .unwrap();
    let busy = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert!(busy.to_string().contains("locked"), "{busy}");
    a.execute_batch("COMMIT").unwrap();
    let seen: i64 = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 2);
}

/// A SQLite page write is a device write of the pages it covers: after a workload the device
/// saw far fewer page writes than rewriting the database file at every commit would make.
#[test]
fn writes_are_page_granular() {
    let c = open_ftlab("file:granular.db?vfs=ftlab");
    workload(&c, "wal", 3);
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let pages: u64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    let report = ftlab_sqlite::device_of("granular.db")
        .unwrap()
        .device()
        .stats_json();
    let host = report["host_write_pages"].as_u64().unwrap();
    let whole_file_per_commit = pages * 40;
    assert!(pages > 20, "{pages}");
    assert!(
        host * 4 < whole_file_per_commit,
        "{host} device pages written for 40 commits of a {pages}-page database"
    );
    assert!(
        report["requests"]["flush"].as_u64().unwrap() >= 40,
        "xSync is a FLUSH"
    );
}
