//! A device open in this process (`Dev`: the device, the table of its files, the page cache,
//! the locks), and the registry that shares it between the connections to one name.

use crate::cache::{PageCache, PAGE_BYTES};
use crate::lock::{LockState, Shm};
use crate::table::{Kind, Table};
use crate::{CACHE_PAGES, HEADER_BYTES, RUN_PAGES, WRITEBACK_PAGES};
use ftlab_device::{Device, DeviceOptions, IoError, LocalCommand};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// A device open in this process, with the table of its files.
pub struct Dev {
    pub(crate) device: Device,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) capacity_bytes: u64,
    pub(crate) table: Mutex<Table>,
    pub(crate) cache: Mutex<PageCache>,
    pub(crate) lock: Mutex<LockState>,
    pub(crate) shm: Mutex<Shm>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Dev {
    pub(crate) fn open(
        dir: Option<PathBuf>,
        size_bytes: u64,
        over_provisioning: f64,
        codec: ftlab_store::codec::Codec,
    ) -> Result<Dev, OpenError> {
        let mut builder = ftlab_core::config::ConfigBuilder::from_preset("femu")?;
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
            builder.set(&set)?;
        }
        let config = builder.build_device()?;
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
                checkpoint_every_bytes: None,
                maintenance: ftlab_device::Maintenance::default(),
                cache_bytes: 16 << 20,
                cache_policy: Default::default(),
            },
        )?;
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
            .map_err(OpenError::Table)?;
        if let Some(t) = Table::decode(&page) {
            *lock(&dev.table) = t;
        }
        Ok(dev)
    }

    /// The device's range for a file: (first byte, bytes).
    pub(crate) fn range(&self, kind: Kind) -> (u64, u64) {
        let half = self.capacity_bytes / 2;
        let quarter = self.capacity_bytes / 4;
        match kind {
            Kind::Main => (HEADER_BYTES, half - HEADER_BYTES),
            Kind::Journal => (half, quarter),
            Kind::Wal => (half + quarter, self.capacity_bytes - half - quarter),
        }
    }

    /// Writes the table if it changed.
    pub(crate) fn write_table(&self, table: &mut Table) -> Result<(), IoError> {
        if table.dirty {
            let mut none = Vec::new();
            self.device
                .local(LocalCommand::Write, 0, &table.encode(), 0, &mut none)?;
            table.dirty = false;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes of a file from `offset`, through the cache.
    pub(crate) fn read(&self, kind: Kind, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
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
    pub(crate) fn write(
        &self,
        kind: Kind,
        offset: u64,
        data: &[u8],
        size_bytes: u64,
    ) -> Result<(), IoError> {
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
    pub(crate) fn write_back(&self) -> Result<(), IoError> {
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
    pub(crate) fn flush(&self) -> Result<(), IoError> {
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
pub(crate) fn devices() -> MutexGuard<'static, HashMap<String, Weak<Dev>>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, Weak<Dev>>>> = OnceLock::new();
    lock(DEVICES.get_or_init(Mutex::default))
}

/// The device a database `name` is open on in this process, if it is (for its statistics).
pub fn device_of(name: &str) -> Option<Arc<Dev>> {
    devices().get(name).and_then(Weak::upgrade)
}

/// Why a database's device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Config(#[from] ftlab_core::config::ConfigError),
    #[error(transparent)]
    Device(#[from] ftlab_device::DeviceError),
    #[error("reading the file table: {0}")]
    Table(ftlab_device::IoError),
    #[error("{name} is open on another device ({dir:?}) in this process")]
    OtherDevice { name: String, dir: Option<PathBuf> },
    #[error("{} is open for another database in this process", .0.display())]
    DeviceInUse(PathBuf),
}

pub(crate) fn open_dev(
    name: &str,
    dir: Option<PathBuf>,
    size_bytes: u64,
    over_provisioning: f64,
    codec: ftlab_store::codec::Codec,
) -> Result<Arc<Dev>, OpenError> {
    let mut open = devices();
    open.retain(|_, d| d.strong_count() > 0);
    if let Some(dev) = open.get(name).and_then(Weak::upgrade) {
        if dev.dir != dir {
            return Err(OpenError::OtherDevice {
                name: name.to_string(),
                dir: dev.dir.clone(),
            });
        }
        return Ok(dev);
    }
    if let Some(dir) = &dir {
        if open
            .values()
            .filter_map(Weak::upgrade)
            .any(|d| d.dir.as_ref() == Some(dir))
        {
            return Err(OpenError::DeviceInUse(dir.clone()));
        }
    }
    let dev = Arc::new(Dev::open(dir, size_bytes, over_provisioning, codec)?);
    open.insert(name.to_string(), Arc::downgrade(&dev));
    Ok(dev)
}
