//! The VFS's own methods (`sqlite3_vfs`): delete, access and names of files on a device; the
//! host's randomness, sleep and time.

use crate::dev::{device_of, lock, Dev};
use crate::file::{guard, trim_from};
use crate::table::{FileMeta, Kind};
use rusqlite::ffi;
use std::ffi::{c_char, c_int, CStr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

/// The database a journal or WAL name belongs to, and the device it is open on.
pub(crate) fn named(name: *const c_char) -> Option<(Kind, Arc<Dev>)> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes a NUL-terminated name.
    let full = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let (kind, db) = Kind::of(&full);
    device_of(db).map(|d| (kind, d))
}

pub(crate) unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    guard(|| {
        let Some((kind, dev)) = named(name) else {
            return ffi::SQLITE_IOERR_DELETE_NOENT;
        };
        let old = {
            let mut t = lock(&dev.table);
            let meta = &mut t.files[kind as usize];
            if !meta.exists {
                return ffi::SQLITE_IOERR_DELETE_NOENT;
            }
            let old = meta.size_bytes;
            *meta = FileMeta::default();
            t.dirty = true;
            old
        };
        lock(&dev.cache).forget_from(kind as u8, 0);
        // A deleted file's pages are free, as a file system with discard says.
        if trim_from(&dev, kind, 0, old).is_err() {
            return ffi::SQLITE_IOERR_DELETE;
        }
        // Durable at once, whatever `sync_dir` says: deleting the journal is the commit in
        // DELETE mode, and SQLite syncs it only under synchronous=EXTRA. On a file system a
        // killed process loses no unlink; here the device is the process's, so a kill is a
        // power cut, and a commit whose COMMIT returned would come back as a hot journal and
        // be rolled back (seen by the kill -9 test).
        let _ = sync_dir;
        let done = dev.flush();
        if done.is_err() {
            return ffi::SQLITE_IOERR_DELETE;
        }
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        let exists =
            named(name).is_some_and(|(kind, dev)| lock(&dev.table).files[kind as usize].exists);
        // SAFETY: SQLite gives a place for the answer.
        unsafe { *out = c_int::from(exists) };
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    out_bytes: c_int,
    out: *mut c_char,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite passes a NUL-terminated name and `out_bytes` of room.
        let given = unsafe { CStr::from_ptr(name) };
        // Names are keys of the device's table, kept as given; but plain names with a device
        // root are paths too (their markers'), absolute as the unix VFS makes them, so that a
        // change of directory does not change the database.
        let absolute = match &*lock(crate::plain_names()) {
            crate::PlainNames::Under(_) if !given.to_bytes().starts_with(b"/") => {
                let relative = std::ffi::OsStr::from_bytes(given.to_bytes());
                match std::path::absolute(relative) {
                    Ok(p) => std::ffi::CString::new(p.into_os_string().into_vec()).ok(),
                    Err(_) => return ffi::SQLITE_CANTOPEN,
                }
            }
            _ => None,
        };
        let bytes = absolute.as_deref().unwrap_or(given).to_bytes_with_nul();
        if bytes.len() > out_bytes as usize {
            return ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, out, bytes.len()) };
        ffi::SQLITE_OK
    })
}

/// The VFS ftlab asks for what is no file's business (randomness, sleep, time): SQLite's
/// default when ftlab registered, never ftlab itself (asking "the default" at each call would
/// recurse for ever once ftlab is the default).
static HOST: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(std::ptr::null_mut());

/// Fixes the host: SQLite's default now, or its `unix` VFS if the default is an ftlab already
/// (another copy of this library, loaded and made the default).
pub(crate) fn set_host() -> Result<(), c_int> {
    let is_ftlab = |v: *mut ffi::sqlite3_vfs| {
        // SAFETY: a registered VFS has a NUL-terminated name that lives as long as it does.
        !v.is_null() && unsafe { CStr::from_ptr((*v).zName) } == crate::VFS_NAME
    };
    // SAFETY: null asks for the default VFS; a name for that one.
    let mut host = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
    if is_ftlab(host) {
        // SAFETY: as above.
        host = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    }
    if host.is_null() || is_ftlab(host) {
        eprintln!("ftlab sqlite: no host VFS (SQLite's default is ftlab, and no unix VFS)");
        return Err(ffi::SQLITE_ERROR);
    }
    HOST.store(host, Ordering::Release);
    Ok(())
}

fn host() -> *mut ffi::sqlite3_vfs {
    let h = HOST.load(Ordering::Acquire);
    assert!(
        !h.is_null(),
        "register() fixes the host before the VFS exists"
    );
    h
}

pub(crate) unsafe extern "C" fn x_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let h = host();
    // SAFETY: the default VFS's own method, with SQLite's arguments.
    unsafe { ((*h).xRandomness.expect("every VFS has xRandomness"))(h, n, out) }
}

pub(crate) unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    let h = host();
    // SAFETY: as x_randomness.
    unsafe { ((*h).xSleep.expect("every VFS has xSleep"))(h, us) }
}

pub(crate) unsafe extern "C" fn x_current_time(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut f64,
) -> c_int {
    let h = host();
    // SAFETY: as x_randomness.
    unsafe { ((*h).xCurrentTime.expect("every VFS has xCurrentTime"))(h, out) }
}

pub(crate) unsafe extern "C" fn x_current_time_int64(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut i64,
) -> c_int {
    let h = host();
    // SAFETY: as x_randomness; version 2 VFSs have it.
    match unsafe { (*h).xCurrentTimeInt64 } {
        Some(f) => unsafe { f(h, out) },
        None => ffi::SQLITE_ERROR,
    }
}

pub(crate) unsafe extern "C" fn x_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    _n: c_int,
    _out: *mut c_char,
) -> c_int {
    0
}
