//! ftlab as SQLite's default VFS: programs that open plain file names keep their databases on
//! ftlab devices. A test binary of its own: the default VFS is the process's.

use rusqlite::{Connection, OpenFlags};

/// Before the host was fixed at registration, ftlab asked "the default VFS" for randomness,
/// which was ftlab itself: the first statement recursed for ever (a stack overflow in Python's
/// sqlite3; a loop at 100 % CPU here, the recursion made a tail call).
#[test]
fn ftlab_as_the_default_vfs_serves_plain_names_and_never_recurses() {
    let root = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::env::set_current_dir(cwd.path()).unwrap();
    ftlab_sqlite::register_default(ftlab_sqlite::PlainNames::Under(root.path().join("devices")))
        .unwrap();
    // SAFETY: null asks for the default VFS, and its name lives as long as it does.
    let default = unsafe {
        std::ffi::CStr::from_ptr((*rusqlite::ffi::sqlite3_vfs_find(std::ptr::null())).zName)
    };
    assert_eq!(default, ftlab_sqlite::VFS_NAME);

    // In memory: no file, but randomness and time through the host.
    let m = Connection::open_in_memory().unwrap();
    m.execute_batch("CREATE TABLE t(a); INSERT INTO t VALUES (randomblob(16)), (randomblob(16));")
        .unwrap();
    let distinct: i64 = m
        .query_row("SELECT count(DISTINCT a) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(distinct, 2, "the host's randomness, not a constant");
    let year: i64 = m
        .query_row("SELECT CAST(strftime('%Y', 'now') AS INTEGER)", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(year >= 2024, "the host's clock: {year}");

    // A plain name: a durable device under the root, and at the name a marker, not a database.
    let devices = root.path().join("devices");
    for mode in ["delete", "wal"] {
        let name = format!("app-{mode}.db");
        {
            let c = Connection::open(&name).unwrap();
            let got: String = c
                .query_row(&format!("PRAGMA journal_mode={mode}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(got, mode);
            c.execute_batch("CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT)")
                .unwrap();
            for i in 0..200 {
                c.execute("INSERT INTO kv(v) VALUES (?1)", [format!("value {i}")])
                    .unwrap();
            }
        }
        let marker = std::fs::read_to_string(cwd.path().join(&name)).unwrap();
        assert!(marker.starts_with("ftlab-sqlite device marker"), "{marker}");
        let c = Connection::open(&name).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM kv", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 200, "{name} reopened from its device");
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
        drop(c);
        // Names are absolute, as the unix VFS makes them: the device is the path's.
        let absolute = cwd.path().join(&name);
        let dir = ftlab_sqlite::device_dir_for(&devices, absolute.to_str().unwrap());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "one generation"
        );

        // Deleted as a program deletes its database: the next open is a new, empty one, and
        // the old generation's device is gone.
        std::fs::remove_file(&absolute).unwrap();
        let c = Connection::open(&name).unwrap();
        let tables: i64 = c
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0, "a new database after the file was deleted");
        drop(c);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "the old one removed"
        );
    }

    // What the unix VFS refuses, refused: a read-only open of no file (and none made), a
    // missing directory, a directory.
    let ro = OpenFlags::SQLITE_OPEN_READ_ONLY;
    assert!(Connection::open_with_flags("absent.db", ro).is_err());
    assert!(!cwd.path().join("absent.db").exists());
    assert!(Connection::open(cwd.path().join("no/such/dir/x.db")).is_err());
    assert!(Connection::open(cwd.path()).is_err());

    // A file ftlab did not make (here a real SQLite database) is never taken over.
    let foreign = cwd.path().join("host.db");
    std::fs::write(&foreign, b"SQLite format 3\0 and more of a database").unwrap();
    assert!(Connection::open(&foreign).is_err());
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"SQLite format 3\0 and more of a database"
    );
}

#[test]
fn device_directories_are_one_component_each_and_distinct() {
    let root = std::path::Path::new("/r");
    let a = ftlab_sqlite::device_dir_for(root, "/tmp/x/app.db");
    assert_eq!(a, root.join("%2Ftmp%2Fx%2Fapp.db"));
    assert_eq!(ftlab_sqlite::device_dir_for(root, ".."), root.join("%2E."));
    assert_eq!(ftlab_sqlite::device_dir_for(root, ""), root.join("%"));
    let long_a = "a".repeat(300);
    let long_b = format!("{}b", "a".repeat(299));
    let (da, db) = (
        ftlab_sqlite::device_dir_for(root, &long_a),
        ftlab_sqlite::device_dir_for(root, &long_b),
    );
    assert_ne!(da, db);
    assert!(da.file_name().unwrap().len() <= 200);
    assert_eq!(da.parent(), Some(root));
}
