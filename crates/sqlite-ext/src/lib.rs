//! `libftlab_vfs.so`: the ftlab SQLite VFS (`ftlab-sqlite`) for a process that loads it:
//! `.load ./libftlab_vfs` in the sqlite3 shell, `conn.load_extension("./libftlab_vfs")` in
//! Python, then `file:app.db?vfs=ftlab&device=DIR`; or, with `FTLAB_SQLITE_DEFAULT` set when it
//! loads, as SQLite's default VFS for every plain file name.

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
    // FTLAB_SQLITE_DEFAULT=DIR (or `:memory:`) makes ftlab the default VFS, so that programs
    // opening plain file names use it (docs/sqlite.md, "ftlab as the default VFS").
    let registered = match ftlab_sqlite::plain_names_from_env() {
        Some(plain) => ftlab_sqlite::register_default(plain),
        None => ftlab_sqlite::register(),
    };
    match registered {
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
