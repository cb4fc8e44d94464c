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

use cache::{PageCache, PAGE_BYTES};
use ftlab_device::{Device, DeviceOptions, IoError, LocalCommand};
use rusqlite::ffi;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

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

/// The files of a database that live on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Main = 0,
    Journal = 1,
    Wal = 2,
}

impl Kind {
    /// The file `name` is to its database: (kind, the database's name).
    fn of(name: &str) -> (Kind, &str) {
        if let Some(db) = name.strip_suffix("-journal") {
            (Kind::Journal, db)
        } else if let Some(db) = name.strip_suffix("-wal") {
            (Kind::Wal, db)
        } else {
            (Kind::Main, name)
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct FileMeta {
    exists: bool,
    size_bytes: u64,
}

/// The table in page 0.
#[derive(Clone, Debug, Default)]
struct Table {
    name: String,
    files: [FileMeta; 3],
    /// Changed since last written.
    dirty: bool,
}

impl Table {
    fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; HEADER_BYTES as usize];
        page[..16].copy_from_slice(MAGIC);
        let mut at = 16;
        for f in &self.files {
            page[at] = u8::from(f.exists);
            page[at + 1..at + 9].copy_from_slice(&f.size_bytes.to_le_bytes());
            at += 9;
        }
        let name = &self.name.as_bytes()[..self.name.len().min(1024)];
        page[at..at + 2].copy_from_slice(&(name.len() as u16).to_le_bytes());
        page[at + 2..at + 2 + name.len()].copy_from_slice(name);
        page
    }

    /// None for a page that is no table (a fresh device reads zeros).
    fn decode(page: &[u8]) -> Option<Table> {
        if page.len() < HEADER_BYTES as usize || &page[..16] != MAGIC {
            return None;
        }
        let mut t = Table::default();
        let mut at = 16;
        for f in &mut t.files {
            f.exists = page[at] != 0;
            f.size_bytes = u64::from_le_bytes(page[at + 1..at + 9].try_into().ok()?);
            at += 9;
        }
        let len = u16::from_le_bytes([page[at], page[at + 1]]) as usize;
        t.name = String::from_utf8(page.get(at + 2..at + 2 + len)?.to_vec()).ok()?;
        Some(t)
    }
}

/// SQLite's database lock, shared by the process's connections to one device.
#[derive(Default)]
struct LockState {
    shared: u32,
    reserved: bool,
    pending: bool,
    exclusive: bool,
}

/// WAL's shared memory: its regions (never moved while mapped) and its eight locks.
#[derive(Default)]
struct Shm {
    regions: Vec<Box<[u8]>>,
    shared: [u32; ffi::SQLITE_SHM_NLOCK as usize],
    exclusive: [bool; ffi::SQLITE_SHM_NLOCK as usize],
    mapped_by: u32,
}

/// A device open in this process, with the table of its files.
pub struct Dev {
    device: Device,
    dir: Option<PathBuf>,
    capacity_bytes: u64,
    table: Mutex<Table>,
    cache: Mutex<PageCache>,
    lock: Mutex<LockState>,
    shm: Mutex<Shm>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Dev {
    fn open(
        dir: Option<PathBuf>,
        size_bytes: u64,
        over_provisioning: f64,
        codec: ftlab_store::codec::Codec,
    ) -> Result<Dev, String> {
        let mut builder =
            ftlab_core::config::ConfigBuilder::from_preset("femu").map_err(|e| e.to_string())?;
        // FEMU's flash has 16 GiB: under a database of a few MB, GC would never run and WAF
        // would say nothing. The flash is cut to the device's size plus `over_provisioning`
        // on 16 dies (FEMU's 64 would leave a few blocks each) of 1 MiB blocks.
        let pages_per_block = 256u64;
        let dies = 16u64;
        let logical_pages = size_bytes.div_ceil(4096);
        let blocks_per_die = ((logical_pages as f64 * (1.0 + over_provisioning))
            / (dies * pages_per_block) as f64)
            .ceil() as u64
            // The superblocks the FTL keeps back for GC and its open frontiers.
            + 4;
        for set in [
            format!("capacity.logical_bytes={size_bytes}"),
            "flash.channels=8".to_string(),
            "flash.dies_per_channel=2".to_string(),
            format!("flash.pages_per_block={pages_per_block}"),
            format!("flash.blocks_per_die={blocks_per_die}"),
        ] {
            builder.set(&set).map_err(|e| e.to_string())?;
        }
        let config = builder.build_device().map_err(|e| e.to_string())?;
        let device = Device::new(
            &config,
            DeviceOptions {
                export_name: "sqlite".into(),
                exports: Vec::new(),
                latency: ftlab_device::Latency::None,
                codec,
                record: None,
                record_format: ftlab_device::RecordFormat::Nbdkit,
                mem_limit_bytes: None,
                max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES,
                read_only: false,
                data: dir.clone(),
                durability: ftlab_device::Durability::Flush,
                checkpoint_every_bytes: 256 << 20,
                cache_bytes: 16 << 20,
                cache_policy: Default::default(),
            },
        )
        .map_err(|e| e.to_string())?;
        let capacity_bytes = device.size_bytes();
        let dev = Dev {
            device,
            dir,
            capacity_bytes,
            table: Mutex::default(),
            cache: Mutex::new(PageCache::new(CACHE_PAGES)),
            lock: Mutex::default(),
            shm: Mutex::default(),
        };
        let mut page = Vec::new();
        dev.device
            .local(LocalCommand::Read, 0, &[], HEADER_BYTES as u32, &mut page)
            .map_err(|e| format!("reading the file table: {e}"))?;
        if let Some(t) = Table::decode(&page) {
            *lock(&dev.table) = t;
        }
        Ok(dev)
    }

    /// The device's range for a file: (first byte, bytes).
    fn range(&self, kind: Kind) -> (u64, u64) {
        let half = self.capacity_bytes / 2;
        let quarter = self.capacity_bytes / 4;
        match kind {
            Kind::Main => (HEADER_BYTES, half - HEADER_BYTES),
            Kind::Journal => (half, quarter),
            Kind::Wal => (half + quarter, self.capacity_bytes - half - quarter),
        }
    }

    /// Writes the table if it changed.
    fn write_table(&self, table: &mut Table) -> Result<(), IoError> {
        if table.dirty {
            let mut none = Vec::new();
            self.device
                .local(LocalCommand::Write, 0, &table.encode(), 0, &mut none)?;
            table.dirty = false;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes of a file from `offset`, through the cache.
    fn read(&self, kind: Kind, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let (base, _) = self.range(kind);
        let mut cache = lock(&self.cache);
        let first = offset / PAGE_BYTES;
        let end = (offset + buf.len() as u64).div_ceil(PAGE_BYTES);
        // Missing pages, read from the device in runs.
        let mut index = first;
        while index < end {
            if cache.get((kind as u8, index)).is_some() {
                index += 1;
                continue;
            }
            let mut run_end = index + 1;
            while run_end < end && cache.get((kind as u8, run_end)).is_none() {
                run_end += 1;
            }
            let mut bytes = Vec::new();
            self.device.local(
                LocalCommand::Read,
                base + index * PAGE_BYTES,
                &[],
                ((run_end - index) * PAGE_BYTES) as u32,
                &mut bytes,
            )?;
            for (i, page) in bytes.chunks_exact(PAGE_BYTES as usize).enumerate() {
                cache.insert_clean((kind as u8, index + i as u64), page.into());
            }
            index = run_end;
        }
        let mut at = 0;
        for index in first..end {
            let page_start = index * PAGE_BYTES;
            let from = offset.max(page_start) - page_start;
            let to = (offset + buf.len() as u64).min(page_start + PAGE_BYTES) - page_start;
            let n = (to - from) as usize;
            let page = cache
                .get((kind as u8, index))
                .expect("read in above (a clean page is shed only when inserting)");
            buf[at..at + n].copy_from_slice(&page[from as usize..to as usize]);
            at += n;
        }
        Ok(())
    }

    /// Writes `data` into a file at `offset`, through the cache; `size_bytes` is the file's
    /// size before (pages wholly past it need not be read).
    fn write(&self, kind: Kind, offset: u64, data: &[u8], size_bytes: u64) -> Result<(), IoError> {
        let (base, _) = self.range(kind);
        let mut at = 0usize;
        let mut pos = offset;
        let end = offset + data.len() as u64;
        let dirty = {
            let mut cache = lock(&self.cache);
            while pos < end {
                let index = pos / PAGE_BYTES;
                let page_start = index * PAGE_BYTES;
                let from = (pos - page_start) as usize;
                let n = ((PAGE_BYTES as usize) - from).min((end - pos) as usize);
                let key = (kind as u8, index);
                if n == PAGE_BYTES as usize {
                    // Into the cached page if there is one: no allocation per page written.
                    match cache.page_mut(key) {
                        Some(page) => page.copy_from_slice(&data[at..at + n]),
                        None => cache.insert_dirty(key, data[at..at + n].into()),
                    }
                } else {
                    if cache.get(key).is_none() {
                        let page: Box<[u8]> = if page_start >= size_bytes {
                            vec![0u8; PAGE_BYTES as usize].into()
                        } else {
                            let mut bytes = Vec::new();
                            self.device.local(
                                LocalCommand::Read,
                                base + page_start,
                                &[],
                                PAGE_BYTES as u32,
                                &mut bytes,
                            )?;
                            bytes.into()
                        };
                        cache.insert_dirty(key, page);
                    }
                    let page = cache.page_mut(key).expect("present");
                    page[from..from + n].copy_from_slice(&data[at..at + n]);
                }
                at += n;
                pos += n as u64;
            }
            cache.dirty_pages()
        };
        if dirty >= WRITEBACK_PAGES {
            self.write_back()?;
        }
        Ok(())
    }

    /// Sends every dirty page to the device.
    fn write_back(&self) -> Result<(), IoError> {
        let runs = lock(&self.cache).take_dirty(None, RUN_PAGES);
        for run in runs {
            let kind = match run.kind {
                0 => Kind::Main,
                1 => Kind::Journal,
                _ => Kind::Wal,
            };
            let (base, _) = self.range(kind);
            self.device.local(
                LocalCommand::Write,
                base + run.first * PAGE_BYTES,
                &run.bytes,
                0,
                &mut Vec::new(),
            )?;
        }
        Ok(())
    }

    /// What fsync does: the dirty pages, then the table (the files' sizes), then a FLUSH.
    fn flush(&self) -> Result<(), IoError> {
        self.write_back()?;
        self.write_table(&mut lock(&self.table))?;
        self.device
            .local(LocalCommand::Flush, 0, &[], 0, &mut Vec::new())
    }

    /// The device itself: its statistics, its model's report.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            eprintln!("ftlab sqlite: the last flush failed: {e}");
        }
        if let Err(e) = self.device.finish() {
            eprintln!("ftlab sqlite: closing the device: {e}");
        }
    }
}

/// The devices open in this process, by database name.
fn devices() -> MutexGuard<'static, HashMap<String, Weak<Dev>>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, Weak<Dev>>>> = OnceLock::new();
    lock(DEVICES.get_or_init(Mutex::default))
}

/// The device a database `name` is open on in this process, if it is (for its statistics).
pub fn device_of(name: &str) -> Option<Arc<Dev>> {
    devices().get(name).and_then(Weak::upgrade)
}

fn open_dev(
    name: &str,
    dir: Option<PathBuf>,
    size_bytes: u64,
    over_provisioning: f64,
    codec: ftlab_store::codec::Codec,
) -> Result<Arc<Dev>, String> {
    let mut open = devices();
    open.retain(|_, d| d.strong_count() > 0);
    if let Some(dev) = open.get(name).and_then(Weak::upgrade) {
        if dev.dir != dir {
            return Err(format!(
                "{name} is open on another device ({:?}) in this process",
                dev.dir
            ));
        }
        return Ok(dev);
    }
    if let Some(dir) = &dir {
        if open
            .values()
            .filter_map(Weak::upgrade)
            .any(|d| d.dir.as_ref() == Some(dir))
        {
            return Err(format!(
                "{} is open for another database in this process",
                dir.display()
            ));
        }
    }
    let dev = Arc::new(Dev::open(dir, size_bytes, over_provisioning, codec)?);
    open.insert(name.to_string(), Arc::downgrade(&dev));
    Ok(dev)
}

/// A file SQLite opened: on the device, or in memory (temporary files).
enum FileState {
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
struct File {
    base: ffi::sqlite3_file,
    state: *mut FileState,
}

/// Runs a callback, turning a panic into an I/O error (unwinding into SQLite's C would abort).
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(ffi::SQLITE_IOERR)
}

/// # Safety
/// `file` is a `File` this VFS opened and has not closed.
unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> &'a mut FileState {
    // SAFETY: the caller's contract; `state` was set by x_open to a live box.
    unsafe { &mut *(*(file as *mut File)).state }
}

unsafe extern "C" fn x_open(
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
                let dir = param(c"device")
                    .filter(|d| !d.is_empty() && d != ":memory:")
                    .map(PathBuf::from);
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

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
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

unsafe extern "C" fn x_read(
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

unsafe extern "C" fn x_write(
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
fn trim_from(dev: &Dev, kind: Kind, from: u64, to: u64) -> Result<(), IoError> {
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

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
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

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
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

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
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

/// Takes the database lock from `from` up to `to` (`SQLITE_LOCK_*`): the level reached, and
/// whether it is `to` (else SQLITE_BUSY).
fn acquire(l: &mut LockState, from: c_int, to: c_int) -> (c_int, bool) {
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
fn release(l: &mut LockState, from: c_int, to: c_int) {
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

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, to: c_int) -> c_int {
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

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, to: c_int) -> c_int {
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

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
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

unsafe extern "C" fn x_file_control(
    _file: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    SECTOR_BYTES
}

unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    // Writing part of a sector never harms the rest of it (the store rewrites whole pages
    // under a lock; the log's records are checksummed).
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

unsafe extern "C" fn x_shm_map(
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

unsafe extern "C" fn x_shm_lock(
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

unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
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

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
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

/// The database a journal or WAL name belongs to, and the device it is open on.
fn named(name: *const c_char) -> Option<(Kind, Arc<Dev>)> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes a NUL-terminated name.
    let full = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let (kind, db) = Kind::of(&full);
    device_of(db).map(|d| (kind, d))
}

unsafe extern "C" fn x_delete(
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

unsafe extern "C" fn x_access(
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

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    out_bytes: c_int,
    out: *mut c_char,
) -> c_int {
    guard(|| {
        // Names are keys of the device's table, not paths: kept as given.
        // SAFETY: SQLite passes a NUL-terminated name and `out_bytes` of room.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes_with_nul();
        if bytes.len() > out_bytes as usize {
            return ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, out, bytes.len()) };
        ffi::SQLITE_OK
    })
}

/// The default VFS, for what is no file's business (randomness, sleep, time).
fn host() -> *mut ffi::sqlite3_vfs {
    // SAFETY: null asks for the default VFS, registered by SQLite at initialisation.
    unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) }
}

unsafe extern "C" fn x_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let h = host();
    // SAFETY: the default VFS's own method, with SQLite's arguments.
    unsafe { ((*h).xRandomness.expect("every VFS has xRandomness"))(h, n, out) }
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    let h = host();
    // SAFETY: as x_randomness.
    unsafe { ((*h).xSleep.expect("every VFS has xSleep"))(h, us) }
}

unsafe extern "C" fn x_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let h = host();
    // SAFETY: as x_randomness.
    unsafe { ((*h).xCurrentTime.expect("every VFS has xCurrentTime"))(h, out) }
}

unsafe extern "C" fn x_current_time_int64(_vfs: *mut ffi::sqlite3_vfs, out: *mut i64) -> c_int {
    let h = host();
    // SAFETY: as x_randomness; version 2 VFSs have it.
    match unsafe { (*h).xCurrentTimeInt64 } {
        Some(f) => unsafe { f(h, out) },
        None => ffi::SQLITE_ERROR,
    }
}

unsafe extern "C" fn x_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    _n: c_int,
    _out: *mut c_char,
) -> c_int {
    0
}

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
    use proptest::prelude::*;

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
