//! The locks of one process's connections to a device: SQLite's five-level database lock
//! (its state machine as `acquire` and `release`), and WAL's shared memory with its eight locks.

use rusqlite::ffi;
use std::ffi::c_int;

/// SQLite's database lock, shared by the process's connections to one device.
#[derive(Default)]
pub(crate) struct LockState {
    pub(crate) shared: u32,
    pub(crate) reserved: bool,
    pub(crate) pending: bool,
    pub(crate) exclusive: bool,
}

/// WAL's shared memory: its regions (never moved while mapped) and its eight locks.
#[derive(Default)]
pub(crate) struct Shm {
    pub(crate) regions: Vec<Box<[u8]>>,
    pub(crate) shared: [u32; ffi::SQLITE_SHM_NLOCK as usize],
    pub(crate) exclusive: [bool; ffi::SQLITE_SHM_NLOCK as usize],
    pub(crate) mapped_by: u32,
}

/// Takes the database lock from `from` up to `to` (`SQLITE_LOCK_*`): the level reached, and
/// whether it is `to` (else SQLITE_BUSY).
pub(crate) fn acquire(l: &mut LockState, from: c_int, to: c_int) -> (c_int, bool) {
    let mut level = from;
    if level < ffi::SQLITE_LOCK_SHARED {
        if l.pending || l.exclusive {
            return (level, false);
        }
        l.shared += 1;
        level = ffi::SQLITE_LOCK_SHARED;
    }
    // EXCLUSIVE goes through RESERVED too (stricter than unix's, which may hold PENDING
    // beside another's RESERVED): a level then always means every lock below it is held.
    if to >= ffi::SQLITE_LOCK_RESERVED && level < ffi::SQLITE_LOCK_RESERVED {
        if l.reserved {
            return (level, false);
        }
        l.reserved = true;
        level = ffi::SQLITE_LOCK_RESERVED;
    }
    if to == ffi::SQLITE_LOCK_EXCLUSIVE {
        if level < ffi::SQLITE_LOCK_PENDING {
            if l.pending {
                return (level, false);
            }
            l.pending = true;
            level = ffi::SQLITE_LOCK_PENDING;
        }
        // Every other reader gone?
        if l.shared > 1 {
            return (level, false);
        }
        l.exclusive = true;
        level = ffi::SQLITE_LOCK_EXCLUSIVE;
    }
    (level, true)
}

/// Lowers the database lock from `from` to `to` (SHARED or NONE).
pub(crate) fn release(l: &mut LockState, from: c_int, to: c_int) {
    if from >= ffi::SQLITE_LOCK_RESERVED && to < ffi::SQLITE_LOCK_RESERVED {
        // RESERVED is held alone or under PENDING/EXCLUSIVE: whoever holds those held it.
        l.reserved = false;
    }
    if from >= ffi::SQLITE_LOCK_PENDING && to < ffi::SQLITE_LOCK_PENDING {
        l.pending = false;
    }
    if from == ffi::SQLITE_LOCK_EXCLUSIVE && to < ffi::SQLITE_LOCK_EXCLUSIVE {
        l.exclusive = false;
    }
    if from >= ffi::SQLITE_LOCK_SHARED && to < ffi::SQLITE_LOCK_SHARED {
        l.shared -= 1;
    }
}
