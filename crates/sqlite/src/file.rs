//! SQLite's file methods (`sqlite3_io_methods`): reads, writes, truncation, sync, locks and
//! WAL shared memory of a file on the device, or in memory for temporary files; each behind
//! `guard`, so that a panic is an I/O error rather than an unwind into C.

use crate::cache::PAGE_BYTES;
use crate::dev::{device_of, lock, open_dev, Dev};
use crate::lock::{acquire, release};
use crate::plain::PlainError;
use crate::table::Kind;
use crate::{
    DEFAULT_DEVICE_BYTES, DEFAULT_OVER_PROVISIONING, SECTOR_BYTES, SQLITE_OPEN_SUPER_JOURNAL,
};
use ftlab_device::{IoError, LocalCommand};
use rusqlite::ffi;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file SQLite opened: on the device, or in memory (temporary files).
pub(crate) enum FileState {
    Device {
        dev: Arc<Dev>,
        kind: Kind,
        /// This file's level of the database lock (`SQLITE_LOCK_*`).
        level: c_int,
        /// The WAL locks it holds, as bits.
        shm_shared: u8,
        shm_exclusive: u8,
        shm_mapped: bool,
    },
    Memory {
        bytes: Vec<u8>,
    },
}

#[repr(C)]
pub(crate) struct File {
    pub(crate) base: ffi::sqlite3_file,
    pub(crate) state: *mut FileState,
}

/// Runs a callback, turning a panic into an I/O error (unwinding into SQLite's C would abort).
pub(crate) fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(ffi::SQLITE_IOERR)
}

/// # Safety
/// `file` is a `File` this VFS opened and has not closed.
pub(crate) unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> &'a mut FileState {
    // SAFETY: the caller's contract; `state` was set by x_open to a live box.
    unsafe { &mut *(*(file as *mut File)).state }
}

pub(crate) unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let _ = vfs;
    guard(|| {
        let temporary = ffi::SQLITE_OPEN_TEMP_DB
            | ffi::SQLITE_OPEN_TEMP_JOURNAL
            | ffi::SQLITE_OPEN_SUBJOURNAL
            | ffi::SQLITE_OPEN_TRANSIENT_DB
            | SQLITE_OPEN_SUPER_JOURNAL;
        let state = if name.is_null() || flags & temporary != 0 {
            FileState::Memory { bytes: Vec::new() }
        } else {
            // SAFETY: SQLite passes a NUL-terminated name (with URI parameters after it).
            let full = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            let (kind, db) = Kind::of(&full);
            let dev = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
                let param = |key: &CStr| {
                    // SAFETY: `name` is the main database's name as SQLite gave it.
                    let v = unsafe { ffi::sqlite3_uri_parameter(name, key.as_ptr()) };
                    // SAFETY: a NUL-terminated parameter value owned by SQLite, or null.
                    (!v.is_null())
                        .then(|| unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
                };
                // `device=` names the directory (empty or `:memory:`: in memory); without it,
                // what `register_default` said for plain names (in memory unless told).
                let dir = match param(c"device") {
                    Some(d) => (!d.is_empty() && d != ":memory:").then(|| PathBuf::from(d)),
                    None => match &*lock(crate::plain_names()) {
                        crate::PlainNames::Memory => None,
                        crate::PlainNames::Under(root) => {
                            let create = flags & ffi::SQLITE_OPEN_CREATE != 0;
                            // SAFETY: as above; the path's own bytes, not the lossy
                            // name (an undecodable path is a path too).
                            let path = std::ffi::OsStr::from_bytes(
                                unsafe { CStr::from_ptr(name) }.to_bytes(),
                            );
                            match crate::plain::device_dir(root, Path::new(path), create) {
                                Ok(dir) => Some(dir),
                                // What a program may expect, as the unix VFS says it.
                                Err(PlainError::Missing | PlainError::IsDirectory) => {
                                    return ffi::SQLITE_CANTOPEN
                                }
                                Err(PlainError::Io { source, .. })
                                    if source.kind() == std::io::ErrorKind::NotFound =>
                                {
                                    return ffi::SQLITE_CANTOPEN
                                }
                                Err(e) => {
                                    eprintln!("ftlab sqlite: {full}: {e}");
                                    return ffi::SQLITE_CANTOPEN;
                                }
                            }
                        }
                    },
                };
                let size = match param(c"size") {
                    None => DEFAULT_DEVICE_BYTES,
                    Some(s) => match ftlab_core::units::parse_size(&s).ok() {
                        Some(n) => n,
                        None => return ffi::SQLITE_CANTOPEN,
                    },
                };
                // The page store's codec: none by default (memory as the database's size, no
                // compression's CPU in what is measured); lz4 or zstd to hold more.
                let codec = match param(c"codec") {
                    None => ftlab_store::codec::Codec::None,
                    Some(s) => match ftlab_store::codec::Codec::parse(&s) {
                        Ok(c) => c,
                        Err(e) => {
                            eprintln!("ftlab sqlite: {full}: codec={s}: {e}");
                            return ffi::SQLITE_CANTOPEN;
                        }
                    },
                };
                let over_provisioning = match param(c"op") {
                    None => DEFAULT_OVER_PROVISIONING,
                    Some(s) => match s.parse::<f64>() {
                        Ok(op) if (0.02..=4.0).contains(&op) => op,
                        _ => {
                            eprintln!("ftlab sqlite: {full}: op={s}: a fraction from 0.02 to 4");
                            return ffi::SQLITE_CANTOPEN;
                        }
                    },
                };
                match open_dev(&full, dir, size, over_provisioning, codec) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("ftlab sqlite: {full}: {e}");
                        return ffi::SQLITE_CANTOPEN;
                    }
                }
            } else {
                // A journal or WAL: its database is open already.
                match device_of(db) {
                    Some(d) => d,
                    None => return ffi::SQLITE_CANTOPEN,
                }
            };
            {
                let mut t = lock(&dev.table);
                if kind == Kind::Main && !t.name.is_empty() && t.name != full {
                    eprintln!("ftlab sqlite: {full}: the device holds database {}", t.name);
                    return ffi::SQLITE_CANTOPEN;
                }
                let meta = &mut t.files[kind as usize];
                if !meta.exists {
                    if flags & ffi::SQLITE_OPEN_CREATE == 0 {
                        return ffi::SQLITE_CANTOPEN;
                    }
                    meta.exists = true;
                    meta.size_bytes = 0;
                    t.dirty = true;
                    if kind == Kind::Main {
                        t.name = full.clone();
                    }
                }
            }
            FileState::Device {
                dev,
                kind,
                level: ffi::SQLITE_LOCK_NONE,
                shm_shared: 0,
                shm_exclusive: 0,
                shm_mapped: false,
            }
        };
        let f = file as *mut File;
        // SAFETY: SQLite gives `szOsFile` bytes for the file, which is a `File`.
        unsafe {
            (*f).state = Box::into_raw(Box::new(state));
            (*f).base.pMethods = &IO_METHODS;
            if !out_flags.is_null() {
                *out_flags = flags;
            }
        }
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    guard(|| {
        // Its WAL locks and mapping go first, while the state is still the file's.
        // SAFETY: a file of this VFS, open.
        if let FileState::Device {
            shm_mapped: true, ..
        } = unsafe { state(file) }
        {
            // SAFETY: the same file.
            unsafe { x_shm_unmap(file, 0) };
        }
        let f = file as *mut File;
        // SAFETY: x_open set `state` to a box; SQLite closes a file once, and no reference
        // made from it above is alive.
        let state = unsafe { Box::from_raw((*f).state) };
        if let FileState::Device { dev, level, .. } = &*state {
            release(&mut lock(&dev.lock), *level, ffi::SQLITE_LOCK_NONE);
        }
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite gives a buffer of `amount` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amount as usize) };
        let offset = offset as u64;
        // The bytes the file has from `offset`, read into `buf`.
        // SAFETY: a file of this VFS.
        let have = match unsafe { state(file) } {
            FileState::Memory { bytes } => {
                let have = bytes.len().saturating_sub(offset as usize).min(buf.len());
                buf[..have].copy_from_slice(&bytes[offset as usize..offset as usize + have]);
                have
            }
            FileState::Device { dev, kind, .. } => {
                let size = lock(&dev.table).files[*kind as usize].size_bytes;
                let have = size.saturating_sub(offset).min(buf.len() as u64) as usize;
                if have > 0 && dev.read(*kind, offset, &mut buf[..have]).is_err() {
                    return ffi::SQLITE_IOERR_READ;
                }
                have
            }
        };
        // Past the end: zeros, and SQLite is told (it relies on both).
        buf[have..].fill(0);
        if have < buf.len() {
            ffi::SQLITE_IOERR_SHORT_READ
        } else {
            ffi::SQLITE_OK
        }
    })
}

pub(crate) unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    guard(|| {
        // SAFETY: SQLite gives `amount` bytes.
        let data = unsafe { std::slice::from_raw_parts(buf as *const u8, amount as usize) };
        let offset = offset as u64;
        let end = offset + data.len() as u64;
        // SAFETY: a file of this VFS.
        match unsafe { state(file) } {
            FileState::Memory { bytes } => {
                if bytes.len() < end as usize {
                    bytes.resize(end as usize, 0);
                }
                bytes[offset as usize..end as usize].copy_from_slice(data);
                ffi::SQLITE_OK
            }
            FileState::Device { dev, kind, .. } => {
                let (_, room) = dev.range(*kind);
                if end > room {
                    return ffi::SQLITE_FULL;
                }
                let size = lock(&dev.table).files[*kind as usize].size_bytes;
                if dev.write(*kind, offset, data, size).is_err() {
                    return ffi::SQLITE_IOERR_WRITE;
                }
                let mut t = lock(&dev.table);
                let meta = &mut t.files[*kind as usize];
                if end > meta.size_bytes {
                    meta.size_bytes = end;
                    t.dirty = true;
                }
                ffi::SQLITE_OK
            }
        }
    })
}

/// Trims the whole device pages of a file's range from `from` to `to` (bytes into it: the
/// file's old size, so only what it held).
pub(crate) fn trim_from(dev: &Dev, kind: Kind, from: u64, to: u64) -> Result<(), IoError> {
    let (base, room) = dev.range(kind);
    let page = 4096;
    let start = from.div_ceil(page) * page;
    let end = to.div_ceil(page).saturating_mul(page).min(room);
    // In pieces a request may carry.
    let mut at = start;
    while at < end {
        let n = (end - at).min(1 << 30);
        dev.device.local(
            LocalCommand::Trim,
            base + at,
            &[],
            n as u32,
            &mut Vec::new(),
        )?;
        at += n;
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    guard(|| {
        let size = size.max(0) as u64;
        // SAFETY: a file of this VFS.
        match unsafe { state(file) } {
            FileState::Memory { bytes } => {
                bytes.truncate(size as usize);
                ffi::SQLITE_OK
            }
            FileState::Device { dev, kind, .. } => {
                let old = {
                    let mut t = lock(&dev.table);
                    let meta = &mut t.files[*kind as usize];
                    let old = meta.size_bytes;
                    if size != old {
                        meta.size_bytes = size;
                        t.dirty = true;
                    }
                    old
                };
                if size < old {
                    let kept = size.div_ceil(PAGE_BYTES);
                    lock(&dev.cache).forget_from(*kind as u8, kept);
                    // The bytes past the end in the last page kept read as zeros if the file
                    // grows again.
                    let tail = (kept * PAGE_BYTES - size) as usize;
                    if tail > 0 && dev.write(*kind, size, &vec![0u8; tail], old).is_err() {
                        return ffi::SQLITE_IOERR_TRUNCATE;
                    }
                    if trim_from(dev, *kind, size, old).is_err() {
                        return ffi::SQLITE_IOERR_TRUNCATE;
                    }
                }
                ffi::SQLITE_OK
            }
        }
    })
}

pub(crate) unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        match unsafe { state(file) } {
            FileState::Memory { .. } => ffi::SQLITE_OK,
            FileState::Device { dev, .. } => match dev.flush() {
                Ok(()) => ffi::SQLITE_OK,
                Err(_) => ffi::SQLITE_IOERR_FSYNC,
            },
        }
    })
}

pub(crate) unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        let n = match unsafe { state(file) } {
            FileState::Memory { bytes } => bytes.len() as u64,
            FileState::Device { dev, kind, .. } => {
                lock(&dev.table).files[*kind as usize].size_bytes
            }
        };
        // SAFETY: SQLite gives a place for the size.
        unsafe { *size = n as i64 };
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, to: c_int) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        match unsafe { state(file) } {
            FileState::Memory { .. } => ffi::SQLITE_OK,
            FileState::Device { dev, level, .. } => {
                if *level >= to {
                    return ffi::SQLITE_OK;
                }
                let (reached, ok) = acquire(&mut lock(&dev.lock), *level, to);
                *level = reached;
                if ok {
                    ffi::SQLITE_OK
                } else {
                    ffi::SQLITE_BUSY
                }
            }
        }
    })
}

pub(crate) unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, to: c_int) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        match unsafe { state(file) } {
            FileState::Memory { .. } => ffi::SQLITE_OK,
            FileState::Device { dev, level, .. } => {
                if *level > to {
                    release(&mut lock(&dev.lock), *level, to);
                    *level = to;
                }
                ffi::SQLITE_OK
            }
        }
    })
}

pub(crate) unsafe extern "C" fn x_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        let reserved = match unsafe { state(file) } {
            FileState::Memory { .. } => false,
            FileState::Device { dev, .. } => {
                let l = lock(&dev.lock);
                l.reserved || l.pending || l.exclusive
            }
        };
        // SAFETY: SQLite gives a place for the answer.
        unsafe { *out = c_int::from(reserved) };
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_file_control(
    _file: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

pub(crate) unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    SECTOR_BYTES
}

pub(crate) unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    // Writing part of a sector never harms the rest of it (the store rewrites whole pages
    // under a lock; the log's records are checksummed).
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

pub(crate) unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    region_bytes: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        let FileState::Device {
            dev, shm_mapped, ..
        } = (unsafe { state(file) })
        else {
            return ffi::SQLITE_IOERR_SHMMAP;
        };
        let mut shm = lock(&dev.shm);
        if !*shm_mapped {
            *shm_mapped = true;
            shm.mapped_by += 1;
        }
        let region = region as usize;
        while shm.regions.len() <= region {
            if extend == 0 {
                // SAFETY: SQLite gives a place for the pointer.
                unsafe { *out = std::ptr::null_mut() };
                return ffi::SQLITE_OK;
            }
            shm.regions
                .push(vec![0u8; region_bytes as usize].into_boxed_slice());
        }
        // SAFETY: as above; the region's bytes stay where they are until every file unmaps.
        unsafe { *out = shm.regions[region].as_mut_ptr() as *mut c_void };
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        let FileState::Device {
            dev,
            shm_shared,
            shm_exclusive,
            ..
        } = (unsafe { state(file) })
        else {
            return ffi::SQLITE_IOERR_SHMLOCK;
        };
        let mut shm = lock(&dev.shm);
        let slots = offset as usize..(offset + n) as usize;
        let mask = |i: usize| 1u8 << i;
        if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
            for i in slots {
                if *shm_shared & mask(i) != 0 {
                    shm.shared[i] -= 1;
                    *shm_shared &= !mask(i);
                }
                if *shm_exclusive & mask(i) != 0 {
                    shm.exclusive[i] = false;
                    *shm_exclusive &= !mask(i);
                }
            }
            return ffi::SQLITE_OK;
        }
        if flags & ffi::SQLITE_SHM_SHARED != 0 {
            for i in slots.clone() {
                if shm.exclusive[i] && *shm_exclusive & mask(i) == 0 {
                    return ffi::SQLITE_BUSY;
                }
            }
            for i in slots {
                if *shm_shared & mask(i) == 0 {
                    shm.shared[i] += 1;
                    *shm_shared |= mask(i);
                }
            }
        } else {
            for i in slots.clone() {
                let others_shared = shm.shared[i] - u32::from(*shm_shared & mask(i) != 0);
                if others_shared > 0 || (shm.exclusive[i] && *shm_exclusive & mask(i) == 0) {
                    return ffi::SQLITE_BUSY;
                }
            }
            for i in slots {
                shm.exclusive[i] = true;
                *shm_exclusive |= mask(i);
            }
        }
        ffi::SQLITE_OK
    })
}

pub(crate) unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

pub(crate) unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    guard(|| {
        // SAFETY: a file of this VFS.
        let FileState::Device {
            dev,
            shm_mapped,
            shm_shared,
            shm_exclusive,
            ..
        } = (unsafe { state(file) })
        else {
            return ffi::SQLITE_OK;
        };
        let mut shm = lock(&dev.shm);
        for i in 0..ffi::SQLITE_SHM_NLOCK as usize {
            if *shm_shared & (1 << i) != 0 {
                shm.shared[i] -= 1;
            }
            if *shm_exclusive & (1 << i) != 0 {
                shm.exclusive[i] = false;
            }
        }
        (*shm_shared, *shm_exclusive) = (0, 0);
        if *shm_mapped {
            *shm_mapped = false;
            shm.mapped_by -= 1;
        }
        if shm.mapped_by == 0 && delete != 0 {
            shm.regions.clear();
        }
        ffi::SQLITE_OK
    })
}

pub(crate) static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};
