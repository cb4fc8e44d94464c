//! `libftlab_vfs.so`: the ftlab SQLite VFS (`ftlab-sqlite`) for a process that loads it:
//! `.load ./libftlab_vfs` in the sqlite3 shell, `conn.load_extension("./libftlab_vfs")` in
//! Python, then `file:app.db?vfs=ftlab&device=DIR`.

use rusqlite::ffi;
use std::ffi::{c_char, c_int};

/// The entry point SQLite derives from the file name (`libftlab_vfs.so`: `ftlabvfs`).
///
/// # Safety
/// Called by SQLite's extension loader with its API routines.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_ftlabvfs_init(
    _db: *mut ffi::sqlite3,
    _error: *mut *mut c_char,
    api: *mut ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: the loader's own routines, valid while the process runs.
    if unsafe { ffi::rusqlite_extension_init2(api) }.is_err() {
        return ffi::SQLITE_ERROR;
    }
    match ftlab_sqlite::register() {
        // The VFS outlives the connection that loaded it.
        Ok(()) => ffi::SQLITE_OK_LOAD_PERMANENTLY,
        Err(rc) => rc,
    }
}

/// The generic entry point, for loaders given no name.
///
/// # Safety
/// As `sqlite3_ftlabvfs_init`.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_extension_init(
    db: *mut ffi::sqlite3,
    error: *mut *mut c_char,
    api: *mut ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { sqlite3_ftlabvfs_init(db, error, api) }
}
