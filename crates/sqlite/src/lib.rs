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
mod plain;
mod table;
mod vfs;

pub use dev::{device_of, Dev, OpenError};
use file::{x_open, File};
use rusqlite::ffi;
use std::ffi::{c_int, CStr};
use std::path::PathBuf;
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
/// databases ask for it by `vfs=ftlab` (or see [`register_default`]).
///
/// The VFS SQLite had as its default until now becomes the host that ftlab asks for what is
/// no file's business (randomness, sleep, time): fixed here, so that making ftlab the default
/// later never makes it its own host.
pub fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| {
        if let Err(rc) = vfs::set_host() {
            return rc;
        }
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

/// Where a database opened without `device=` keeps its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlainNames {
    /// In process memory, shared by the connections to that name while one is open.
    Memory,
    /// A durable device directory under this one per database name (the name escaped to one
    /// path component, [`device_dir_for`]), and at the name's own path a small marker file, so
    /// that the program sees the file it expects: made by an open that may create, absent
    /// otherwise, a new database once the program deleted it. Names are made absolute, as the
    /// unix VFS makes them.
    Under(PathBuf),
}

/// The environment variable the loadable extension reads when loaded: set, it makes ftlab
/// SQLite's default VFS, its value a directory under which plain database names get their
/// devices ([`PlainNames::Under`]), or `:memory:` ([`PlainNames::Memory`]).
pub const DEFAULT_ENV: &str = "FTLAB_SQLITE_DEFAULT";

/// Registers the `ftlab` VFS as SQLite's default, so that programs which open plain file names
/// (`sqlite3.connect("app.db")`) keep their databases on ftlab devices: each main database
/// opened without `device=` gets its device as `plain` says. The VFS that was the default
/// before stays ftlab's host (randomness, sleep, time). Called again, the latest `plain` holds.
pub fn register_default(plain: PlainNames) -> Result<(), c_int> {
    register()?;
    if let PlainNames::Under(root) = &plain {
        if let Err(e) = std::fs::create_dir_all(root) {
            eprintln!("ftlab sqlite: {}: {e}", root.display());
            return Err(ffi::SQLITE_CANTOPEN);
        }
    }
    *dev::lock(plain_names()) = plain;
    // SAFETY: the VFS `register` registered, found by its name; registering it again with 1
    // moves it to the head of SQLite's list, which is the default.
    let rc = unsafe {
        let vfs = ffi::sqlite3_vfs_find(VFS_NAME.as_ptr());
        if vfs.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        ffi::sqlite3_vfs_register(vfs, 1)
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

/// What [`DEFAULT_ENV`] asks for: `None` unset or empty.
pub fn plain_names_from_env() -> Option<PlainNames> {
    let v = std::env::var_os(DEFAULT_ENV)?;
    if v.is_empty() {
        None
    } else if v == ":memory:" {
        Some(PlainNames::Memory)
    } else {
        Some(PlainNames::Under(PathBuf::from(v)))
    }
}

pub(crate) fn plain_names() -> &'static std::sync::Mutex<PlainNames> {
    static PLAIN: OnceLock<std::sync::Mutex<PlainNames>> = OnceLock::new();
    PLAIN.get_or_init(|| std::sync::Mutex::new(PlainNames::Memory))
}

/// The device directory a database name gets under `root`: the name as one path component,
/// every byte but ASCII letters, digits, `_`, `-` and `.` (and a leading `.`) written `%XX`;
/// one longer than 200 bytes is cut, with a hash of the whole name after `~`, so that two
/// names never share a directory by accident; the empty name is `%`.
pub fn device_dir_for(root: &std::path::Path, name: &str) -> PathBuf {
    device_dir_for_bytes(root, name.as_bytes())
}

/// As [`device_dir_for`], for a name that need not be UTF-8 (a path's bytes).
pub(crate) fn device_dir_for_bytes(root: &std::path::Path, name: &[u8]) -> PathBuf {
    let mut escaped = String::with_capacity(name.len());
    for (i, &b) in name.iter().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if plain {
            escaped.push(b as char);
        } else {
            escaped.push_str(&format!("%{b:02X}"));
        }
    }
    if escaped.is_empty() {
        // Never the root itself; no escaped name is a lone `%`.
        escaped.push('%');
    }
    if escaped.len() > 200 {
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let hash = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        escaped.truncate(180);
        escaped.push_str(&format!("~{hash:016x}"));
    }
    root.join(escaped)
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
