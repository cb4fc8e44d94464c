//! A SQLite VFS that keeps a database on an ftlab device, in-process: the FTL model in front of
//! the compressed page store, or of a durable device directory (`serve --data`'s log). Open
//! `file:app.db?vfs=ftlab&device=DIR` (or without `device`: a device in memory, shared by the
//! process's connections to that name while one is open) after [`register`]. Other URI
//! parameters: `size=` (the device's logical bytes, with K/M/G; 1G), `op=` (spare flash beyond
//! it, as a fraction; 0.07), `codec=` (the page store's: `none`, `lz4`, `zstd[:LEVEL]`; none).
//!
//! The device has no file system, so the VFS lays one out, as small as SQLite needs: page 0
//! holds the table of files (the database's name; whether the database, its rollback journal
//! and its WAL exist, and their sizes), and each of the three has a fixed range of the device's
//! logical space (the database its first half, the journal and the WAL a quarter each).
//! Logical space costs nothing until written, so the ranges are generous. A SQLite page write
//! is a device write of those bytes (never the whole file); xSync writes the table when it
//! changed, then FLUSHes the device, as fsync makes a file's size durable with its data; a
//! deleted journal is trimmed. Between SQLite and the device sits a page cache, as a kernel's
//! does (`cache.rs`): writes reach the device at xSync, in whole pages. Temporary files (sort
//! spills, statement journals) stay in process memory.
//!
//! Locks are this process's: the database's five-level lock in a mutex per device, WAL's
//! shared memory in process memory (`xShmMap`), with its eight locks beside it. Another process
//! opening the same device directory is not guarded against (the device is one process's).

mod cache;
mod dev;
mod file;
mod lock;
mod table;
mod vfs;

pub use dev::{device_of, Dev, OpenError};
use file::{x_open, File};
use rusqlite::ffi;
use std::ffi::{c_int, CStr};
use std::sync::OnceLock;
use vfs::{
    x_access, x_current_time, x_current_time_int64, x_delete, x_full_pathname, x_get_last_error,
    x_randomness, x_sleep,
};

/// The name to open databases with: `file:NAME?vfs=ftlab&device=DIR`.
pub const VFS_NAME: &CStr = c"ftlab";
/// Bytes of the device's logical space when `size=` is not given. A durable directory is
/// reopened with the `size=` and `op=` it was made with (another geometry is refused).
pub const DEFAULT_DEVICE_BYTES: u64 = 1 << 30;
/// Spare flash beyond the logical size when `op=` is not given: a consumer drive's 7 %.
pub const DEFAULT_OVER_PROVISIONING: f64 = 0.07;
const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 16] = b"ftlab-sqlite\0\0\0\x01";
const SECTOR_BYTES: c_int = 4096;
/// sqlite3.h's, absent from the loadable extension's older bindings (it was MASTER_JOURNAL).
const SQLITE_OPEN_SUPER_JOURNAL: c_int = 0x0000_4000;
/// The page cache's clean pages (64 MiB), and the dirty pages that make it write back before
/// an xSync asks (16 MiB, for `synchronous=off`).
const CACHE_PAGES: usize = 16 << 10;
const WRITEBACK_PAGES: usize = 4 << 10;
/// The longest write the cache sends (1 MiB).
const RUN_PAGES: usize = 256;

/// Registers the `ftlab` VFS with SQLite (once; later calls do nothing). Not the default VFS:
/// databases ask for it by `vfs=ftlab`.
pub fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| {
        let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: std::mem::size_of::<File>() as c_int,
            mxPathname: 1024,
            pNext: std::ptr::null_mut(),
            zName: VFS_NAME.as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        // SAFETY: a complete VFS that lives for ever; 0: not the default.
        unsafe { ffi::sqlite3_vfs_register(vfs, 0) }
    });
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock::{acquire, release, LockState};
    use proptest::prelude::*;
    use table::{FileMeta, Table};

    proptest! {
        /// The file table reads back as written, and any page read from a device (a tampered
        /// directory's included) decodes to a table or to none, never a panic.
        #[test]
        fn the_file_table_round_trips_and_any_page_decodes_safely(
            name in "[a-z./_-]{0,64}",
            sizes in proptest::array::uniform3(any::<u64>()),
            exists in proptest::array::uniform3(any::<bool>()),
            noise in proptest::collection::vec(any::<u8>(), 0..5000),
        ) {
            let mut t = Table { name: name.clone(), ..Table::default() };
            for i in 0..3 {
                t.files[i] = FileMeta { exists: exists[i], size_bytes: sizes[i] };
            }
            let back = Table::decode(&t.encode()).expect("a table");
            prop_assert_eq!(back.name, name);
            for i in 0..3 {
                prop_assert_eq!(back.files[i].exists, exists[i]);
                prop_assert_eq!(back.files[i].size_bytes, sizes[i]);
            }
            let mut page = noise.clone();
            if page.len() >= 16 {
                page[..16].copy_from_slice(MAGIC);
            }
            let _ = Table::decode(&page);
        }
    }

    /// The database lock's levels: readers share, one writer reserves, EXCLUSIVE waits for the
    /// other readers to leave (holding PENDING, which keeps new readers out meanwhile).
    #[test]
    fn the_database_lock_follows_sqlites_levels() {
        use ffi::{SQLITE_LOCK_EXCLUSIVE as X, SQLITE_LOCK_NONE as N, SQLITE_LOCK_PENDING as P};
        use ffi::{SQLITE_LOCK_RESERVED as R, SQLITE_LOCK_SHARED as S};
        let mut l = LockState::default();
        assert_eq!(acquire(&mut l, N, S), (S, true));
        assert_eq!(acquire(&mut l, N, S), (S, true));
        assert_eq!(acquire(&mut l, S, R), (R, true));
        assert_eq!(acquire(&mut l, S, R), (S, false), "one RESERVED");
        assert_eq!(acquire(&mut l, R, X), (P, false), "a reader is still there");
        assert_eq!(
            acquire(&mut l, N, S),
            (N, false),
            "PENDING keeps new readers out"
        );
        release(&mut l, S, N);
        assert_eq!(acquire(&mut l, P, X), (X, true));
        release(&mut l, X, S);
        assert!(!l.reserved && !l.pending && !l.exclusive);
        assert_eq!(l.shared, 1);
        release(&mut l, S, N);
        assert_eq!(l.shared, 0);
    }
}
