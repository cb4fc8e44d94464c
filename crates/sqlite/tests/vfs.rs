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
