//! The compressed page store: the data plane that keeps a live device's bytes in RAM,
//! compressed, as Linux zram does, keyed by LPN.
//!
//! Owns: page bytes, their codecs and checksums, the slab memory, zram-style statistics.
//! Does not know: the FTL, flash timing, or any protocol. Safe for many threads: LPNs are spread
//! over `shards` independently locked shards (no global lock on the hot path), and compression
//! happens outside any lock.
//!
//! Per page: same-fill first (one repeated 8-byte word is kept as that word), then the codec;
//! pages that do not shrink below `huge_bytes` are kept raw (zram's "huge" pages). Every stored
//! page carries an xxh3 checksum of its stored bytes, seeded with its LPN, verified on read.

pub mod backend;
pub mod cache;
pub mod codec;
pub mod content_class;
pub mod durable;
pub mod log;
mod page_table;
pub mod same_fill;
pub mod slab;
mod stream_copy;

pub use backend::RecordBackend;
use codec::{Codec, Dictionary, Encoding};
use page_table::PageTable;
use rayon::prelude::*;
use serde::Serialize;
use slab::{Handle, SlabAllocator};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// 4096, 8192 or 16384.
    pub page_bytes: usize,
    pub codec: Codec,
    /// Independently locked shards (a power of two).
    pub shards: usize,
    /// Pages whose compressed form is at least this long are stored raw.
    pub huge_bytes: usize,
    /// Largest dictionary `train_dictionary` builds.
    pub dictionary_bytes: usize,
    /// Pages sampled to train a dictionary.
    pub dictionary_sample_pages: usize,
    /// Compact a shard by itself when its slabs exceed its compressed bytes by more than this
    /// fraction (checked every 1024 frees; zram leaves this to a user-space daemon writing to
    /// its `compact` attribute). None = only on `compact()`.
    pub auto_compact_above: Option<f64>,
    /// As zram's `mem_limit`: once the slabs hold this many bytes, writes of pages that need
    /// slab memory fail with `StoreError::MemLimit` (same-filled pages and trims still work).
    /// None = no limit.
    pub mem_limit_bytes: Option<u64>,
}

impl StoreConfig {
    pub fn new(page_bytes: usize, codec: Codec) -> Self {
        Self {
            page_bytes,
            codec,
            shards: 8,
            // zram's huge class for 4 KiB pages is 3264 bytes: about 4/5 of a page.
            huge_bytes: page_bytes * 4 / 5,
            // Large: on real files a 1 MiB dictionary gains several times what 64 KiB does
            // (measured by `ftlab bench store`), and it is one per store.
            dictionary_bytes: 1 << 20,
            dictionary_sample_pages: 16384,
            auto_compact_above: Some(0.05),
            mem_limit_bytes: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("lpn {lpn}: stored page fails its checksum (corrupt), not served")]
    Corrupt { lpn: u64 },
    #[error("lpn {lpn}: {reason}")]
    Codec { lpn: u64, reason: codec::CodecError },
    #[error("buffer of {got} bytes where whole pages of {page_bytes} bytes were expected")]
    BadLength { got: usize, page_bytes: usize },
    #[error("lpn {lpn} is beyond the store's 2^63 keys")]
    LpnOutOfRange { lpn: u64 },
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("dictionary training failed: {0}")]
    Training(String),
    #[error("lpn {lpn}: the store is at its memory limit of {limit_bytes} bytes")]
    MemLimit { lpn: u64, limit_bytes: u64 },
}

/// zram's `mm_stat` fields, plus the page count.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Uncompressed bytes of all stored pages (same-filled included), as zram.
    pub orig_data_size: u64,
    /// Bytes of compressed (or raw huge) page data.
    pub compr_data_size: u64,
    /// Memory the slab allocator holds.
    pub mem_used_total: u64,
    /// `mem_limit_bytes` (0: none), as zram's `mem_limit`.
    pub mem_limit: u64,
    /// The most `mem_used_total` has been since the store was made.
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
    pub pages_compacted: u64,
    pub pages_stored: u64,
    /// Bytes of the zstd dictionaries held (the current one and any stored page still uses):
    /// memory beside `mem_used_total` that `zstd-dict` costs.
    pub dictionary_bytes: u64,
}

impl StoreStats {
    /// Pages kept compressed (neither same-filled nor raw): what `train_dictionary` samples.
    pub fn compressed_pages(&self) -> u64 {
        self.pages_stored
            .saturating_sub(self.same_pages + self.huge_pages)
    }
}

/// One stored page, packed into 24 bytes (key + value = 32 bytes a bucket).
#[derive(Clone, Copy, Debug)]
struct Body {
    /// Same-filled: the word. Otherwise the xxh3 of the stored bytes, seeded with the LPN.
    word_or_checksum: u64,
    slab: u32,
    /// zstd dictionary id (Kind::ZstdDict only).
    dictionary: u32,
    object: u16,
    class: u16,
    len: u16,
    kind: Kind,
}

/// What a page holds (`PageStore::page_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// Never written, or trimmed: reads as zeros and takes no memory.
    Absent,
    /// Stored as a page of zero words.
    Zeros,
    /// Anything else.
    Data,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Same,
    /// Stored uncompressed (zram's "huge" page).
    Raw,
    Lz4,
    Zstd,
    ZstdDict,
}

impl Body {
    fn handle(&self) -> Handle {
        Handle {
            class: self.class,
            object: self.object,
            slab: self.slab,
        }
    }

    fn encoding(&self) -> Option<Encoding> {
        match self.kind {
            Kind::Lz4 => Some(Encoding::Lz4),
            Kind::Zstd => Some(Encoding::Zstd),
            Kind::ZstdDict => Some(Encoding::ZstdDict(self.dictionary)),
            Kind::Same | Kind::Raw => None,
        }
    }
}

struct Shard<B> {
    entries: PageTable<Body>,
    /// The records' bytes.
    slabs: B,
    compr_bytes: u64,
    same_pages: u64,
    huge_pages: u64,
    frees_since_check: u32,
    auto_compact_above: Option<f64>,
}

impl<B: RecordBackend> Shard<B> {
    /// Every 1024 frees, compacts when the slabs hold too much beyond the compressed bytes: one
    /// slab per size class always stays part-filled, so that much is allowed on top.
    fn maybe_compact(&mut self) {
        self.frees_since_check += 1;
        if self.frees_since_check < 1024 {
            return;
        }
        self.frees_since_check = 0;
        let Some(limit) = self.auto_compact_above else {
            return;
        };
        let allowed = self.compr_bytes as f64 * (1.0 + limit) + self.slabs.slack_allowance() as f64;
        if self.slabs.bytes() as f64 > allowed {
            self.compact();
        }
    }

    fn compact(&mut self) -> usize {
        let Shard { entries, slabs, .. } = self;
        slabs.compact(&mut |lpn, handle| {
            if let Some(body) = entries.get_mut(lpn) {
                body.slab = handle.slab;
                body.object = handle.object;
            }
        })
    }

    fn remove(&mut self, lpn: u64) {
        let Some(body) = self.entries.remove(lpn) else {
            return;
        };
        match body.kind {
            Kind::Same => self.same_pages -= 1,
            kind => {
                self.slabs.free(body.handle());
                self.compr_bytes -= u64::from(body.len);
                if kind == Kind::Raw {
                    self.huge_pages -= 1;
                }
                self.maybe_compact();
            }
        }
    }

    fn insert(&mut self, lpn: u64, page: &Prepared<'_>) {
        if let Prepared::Stored {
            bytes,
            encoding,
            checksum,
        } = page
        {
            // An overwrite whose bytes fit the old slot's size class reuses the slot: no free,
            // no alloc, one page-table lookup. (A sequential overwrite of incompressible pages
            // spent 9 % of its time freeing a slot and allocating one of the same class.)
            let Shard {
                entries,
                slabs,
                compr_bytes,
                huge_pages,
                ..
            } = self;
            if let Some(body) = entries.get_mut(lpn) {
                if body.kind != Kind::Same && slabs.replace(body.handle(), bytes) {
                    *compr_bytes = *compr_bytes - u64::from(body.len) + bytes.len() as u64;
                    let (kind, dictionary) = kind_of(*encoding);
                    *huge_pages = *huge_pages - u64::from(body.kind == Kind::Raw)
                        + u64::from(kind == Kind::Raw);
                    body.word_or_checksum = *checksum;
                    body.len = bytes.len() as u16;
                    body.kind = kind;
                    body.dictionary = dictionary;
                    return;
                }
            }
        }
        self.remove(lpn);
        let body = match page {
            Prepared::Same(word) => {
                self.same_pages += 1;
                Body {
                    word_or_checksum: *word,
                    slab: 0,
                    dictionary: 0,
                    object: 0,
                    class: 0,
                    len: 0,
                    kind: Kind::Same,
                }
            }
            Prepared::Stored {
                bytes,
                encoding,
                checksum,
            } => {
                let handle = self.slabs.put(lpn, bytes);
                self.compr_bytes += bytes.len() as u64;
                let (kind, dictionary) = kind_of(*encoding);
                self.huge_pages += u64::from(kind == Kind::Raw);
                Body {
                    word_or_checksum: *checksum,
                    slab: handle.slab,
                    dictionary,
                    object: handle.object,
                    class: handle.class,
                    len: bytes.len() as u16,
                    kind,
                }
            }
        };
        self.entries.insert(lpn, body);
    }
}

/// How an entry records an encoding (None = raw), and its dictionary id (0 = none).
fn kind_of(encoding: Option<Encoding>) -> (Kind, u32) {
    match encoding {
        None => (Kind::Raw, 0),
        Some(Encoding::Lz4) => (Kind::Lz4, 0),
        Some(Encoding::Zstd) => (Kind::Zstd, 0),
        Some(Encoding::ZstdDict(id)) => (Kind::ZstdDict, id),
    }
}

/// A page ready to insert: compressed and checksummed outside the lock; the bytes are the
/// thread's scratch buffer (or the page itself when stored raw), copied once, into the slab.
enum Prepared<'a> {
    Same(u64),
    Stored {
        bytes: &'a [u8],
        /// None = raw (huge).
        encoding: Option<Encoding>,
        checksum: u64,
    },
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Pages in a row this thread found incompressible (stored raw).
    static RAW_STREAK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A stored page's checksum: xxh3-64 of its stored bytes, seeded with its LPN (so a page that
/// ends up under the wrong LPN fails too).
#[inline]
fn checksum(stored: &[u8], lpn: u64) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(lpn, stored)
}

/// After this many incompressible pages in a row, a thread first compresses a page's first
/// `PROBE_BYTES` and stores the page raw if they do not shrink: a stream of random or
/// already-compressed data then costs an eighth of the codec's work, while compressible data
/// never pays for the probe (the streak ends at the first page that compresses). A 512-byte
/// sample is the smallest that judges real files well: 256 bytes misjudged five times as many
/// compressible pages as raw (25 K of 340 K pages of /usr, against 5 K).
const RAW_STREAK_PROBE: u32 = 8;
/// Deeper in a streak a thread probes only one page in 2, 4, 8 and then this many (the spacing
/// doubles with the streak: 16, 32, 64 and 128 pages), and stores the pages in between raw
/// untested: a compressible page after an incompressible run is found within this many pages.
const MAX_PROBE_SPACING: u32 = 16;
const PROBE_BYTES: usize = 512;
/// Fewest sampled pages a dictionary is trained from (zstd's trainer needs several samples).
const MIN_TRAINING_PAGES: usize = 8;
/// Smallest dictionary worth training for a class (a class with a tiny share of the sample gets
/// none, and its pages stay plain zstd).
const MIN_DICTIONARY_BYTES: usize = 4096;

/// The store, over a record backend (`B`; by default RAM, the slab arena).
pub struct PageStore<B = SlabAllocator> {
    config: StoreConfig,
    shards: Box<[Mutex<Shard<B>>]>,
    shard_mask: u64,
    /// The dictionaries new pages are compressed with (zstd-dict), one per content class
    /// (`content_class`); a class without one is compressed without.
    current_dictionary: RwLock<[Option<Arc<Dictionary>>; content_class::CLASSES]>,
    /// Every dictionary some stored page may still need.
    dictionaries: RwLock<HashMap<u32, Arc<Dictionary>>>,
    /// Bytes all shards' slabs hold, kept up to date under each shard's lock so that the memory
    /// limit is checked without visiting every shard.
    mem_used: AtomicU64,
    mem_used_max: AtomicU64,
}

/// Dictionary ids are unique in the process: per-thread codec contexts are cached by id, and a
/// thread may serve several stores.
static NEXT_DICTIONARY_ID: AtomicU32 = AtomicU32::new(1);

impl PageStore {
    /// A store keeping its records in RAM.
    pub fn new(config: StoreConfig) -> Result<Self, StoreError> {
        Self::with_backend(config)
    }
}

impl<B: RecordBackend> PageStore<B> {
    /// A store keeping its records in backend `B`, one per shard.
    pub fn with_backend(config: StoreConfig) -> Result<Self, StoreError> {
        if ![4096, 8192, 16384].contains(&config.page_bytes) {
            return Err(StoreError::Config(format!(
                "page size {} (4096, 8192 or 16384)",
                config.page_bytes
            )));
        }
        if !config.shards.is_power_of_two() || config.shards > 4096 {
            return Err(StoreError::Config(format!(
                "shards {} (a power of two up to 4096)",
                config.shards
            )));
        }
        if config.huge_bytes == 0 || config.huge_bytes > config.page_bytes {
            return Err(StoreError::Config(
                "huge_bytes must be in 1..=page size".into(),
            ));
        }
        let shards = (0..config.shards)
            .map(|shard| {
                Mutex::new(Shard {
                    entries: PageTable::new(config.shards.trailing_zeros(), shard as u64),
                    slabs: B::new(config.page_bytes),
                    compr_bytes: 0,
                    same_pages: 0,
                    huge_pages: 0,
                    frees_since_check: 0,
                    auto_compact_above: config.auto_compact_above,
                })
            })
            .collect();
        Ok(Self {
            shard_mask: config.shards as u64 - 1,
            config,
            shards,
            current_dictionary: RwLock::new(Default::default()),
            dictionaries: RwLock::new(HashMap::new()),
            mem_used: AtomicU64::new(0),
            mem_used_max: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn page_bytes(&self) -> usize {
        self.config.page_bytes
    }

    /// Runs `f` on shard `index` under its lock, accounting the change in slab memory.
    fn with_shard<R>(&self, index: usize, f: impl FnOnce(&mut Shard<B>) -> R) -> R {
        let mut shard = self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = shard.slabs.bytes() as u64;
        let r = f(&mut shard);
        let after = shard.slabs.bytes() as u64;
        if after != before {
            // Two's complement: a wrapping add of the difference also subtracts.
            let used = self
                .mem_used
                .fetch_add(after.wrapping_sub(before), Ordering::Relaxed)
                .wrapping_add(after.wrapping_sub(before));
            self.mem_used_max.fetch_max(used, Ordering::Relaxed);
        }
        r
    }

    /// Inserts a prepared page into shard `index`, unless it needs slab memory and the store is
    /// at its limit (checked before allocating; concurrent writers may overshoot by a slab each).
    fn insert_checked(
        &self,
        index: usize,
        lpn: u64,
        page: &Prepared<'_>,
    ) -> Result<(), StoreError> {
        if let (Some(limit), Prepared::Stored { .. }) = (self.config.mem_limit_bytes, page) {
            if self.mem_used.load(Ordering::Relaxed) >= limit {
                return Err(StoreError::MemLimit {
                    lpn,
                    limit_bytes: limit,
                });
            }
        }
        self.with_shard(index, |shard| shard.insert(lpn, page));
        Ok(())
    }

    fn shard_index(&self, lpn: u64) -> usize {
        (lpn & self.shard_mask) as usize
    }

    fn shard(&self, lpn: u64) -> std::sync::MutexGuard<'_, Shard<B>> {
        // Consecutive LPNs land in different shards, so a sequential stream spreads out.
        self.shards[(lpn & self.shard_mask) as usize]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_pages(&self, len: usize) -> Result<usize, StoreError> {
        if len == 0 || !len.is_multiple_of(self.config.page_bytes) {
            return Err(StoreError::BadLength {
                got: len,
                page_bytes: self.config.page_bytes,
            });
        }
        Ok(len / self.config.page_bytes)
    }

    /// Compresses and checksums `page`, then hands the result to `insert` (which takes the
    /// shard lock).
    fn prepare_and<R>(
        &self,
        lpn: u64,
        page: &[u8],
        insert: impl FnOnce(&Prepared<'_>) -> R,
    ) -> Result<R, StoreError> {
        if lpn >= 1 << 63 {
            return Err(StoreError::LpnOutOfRange { lpn });
        }
        if let Some(word) = same_fill::same_filled(page) {
            return Ok(insert(&Prepared::Same(word)));
        }
        let dictionary = match self.config.codec {
            Codec::ZstdDict { .. } => {
                let current = self
                    .current_dictionary
                    .read()
                    .unwrap_or_else(|p| p.into_inner());
                // A class without a dictionary of its own stays plain zstd: another class's
                // dictionary made pages larger than no dictionary did (docs/store.md).
                current[content_class::of(page)].clone()
            }
            _ => None,
        };
        SCRATCH.with(|scratch| {
            let mut out = scratch.borrow_mut();
            let streak = RAW_STREAK.get();
            // Deep in a streak, most pages are stored raw untested; one in `spacing` is probed.
            let spacing = (streak / RAW_STREAK_PROBE)
                .checked_ilog2()
                .map_or(1, |log| (1 << log).min(MAX_PROBE_SPACING));
            let probe_says_raw = self.config.codec == Codec::None
                || streak >= RAW_STREAK_PROBE
                    && (!streak.is_multiple_of(spacing) || {
                        let (_, n) = codec::compress(
                            self.config.codec,
                            dictionary.as_ref(),
                            &page[..PROBE_BYTES],
                            &mut out,
                        )
                        .map_err(|reason| StoreError::Codec { lpn, reason })?;
                        n >= PROBE_BYTES - PROBE_BYTES / 32
                    });
            let compressed = if probe_says_raw {
                None
            } else {
                let (encoding, n) =
                    codec::compress(self.config.codec, dictionary.as_ref(), page, &mut out)
                        .map_err(|reason| StoreError::Codec { lpn, reason })?;
                (n < self.config.huge_bytes).then_some((encoding, n))
            };
            RAW_STREAK.set(if compressed.is_some() {
                0
            } else {
                streak.saturating_add(1)
            });
            let (bytes, encoding) = match compressed {
                Some((encoding, n)) => (&out[..n], Some(encoding)),
                None => (page, None),
            };
            Ok(insert(&Prepared::Stored {
                checksum: checksum(bytes, lpn),
                bytes,
                encoding,
            }))
        })
    }

    /// Stores one page (exactly `page_bytes` long) under `lpn`.
    pub fn write(&self, lpn: u64, page: &[u8]) -> Result<(), StoreError> {
        if self.check_pages(page.len())? != 1 {
            return Err(StoreError::BadLength {
                got: page.len(),
                page_bytes: self.config.page_bytes,
            });
        }
        self.prepare_and(lpn, page, |p| {
            self.insert_checked(self.shard_index(lpn), lpn, p)
        })?
    }

    /// Stores `pages` (concatenated) under `lpns`, compressing in parallel; within the batch the
    /// last write to an LPN wins. On an error, pages of the batch other than the failing one may
    /// already be stored.
    pub fn write_batch(&self, lpns: &[u64], pages: &[u8]) -> Result<(), StoreError> {
        let n = self.check_pages(pages.len())?;
        if n != lpns.len() {
            return Err(StoreError::BadLength {
                got: pages.len(),
                page_bytes: self.config.page_bytes,
            });
        }
        // Pages are grouped by shard; shards run in parallel, each compressing its pages in
        // batch order and inserting each right away (its compressed bytes still in cache). Per
        // LPN the order is the batch's, so a duplicate resolves to its last copy.
        let mut by_shard: Vec<Vec<u32>> = vec![Vec::new(); self.shards.len()];
        for (i, &lpn) in lpns.iter().enumerate() {
            by_shard[(lpn & self.shard_mask) as usize].push(i as u32);
        }
        let page_bytes = self.config.page_bytes;
        by_shard
            .par_iter()
            .enumerate()
            .filter(|(_, indices)| !indices.is_empty())
            .try_for_each(|(shard, indices)| {
                for &i in indices {
                    let i = i as usize;
                    let page = &pages[i * page_bytes..(i + 1) * page_bytes];
                    self.prepare_and(lpns[i], page, |p| self.insert_checked(shard, lpns[i], p))??;
                }
                Ok(())
            })
    }

    /// Reads one page into `out`; never-written and trimmed pages read as zeros.
    pub fn read(&self, lpn: u64, out: &mut [u8]) -> Result<(), StoreError> {
        if self.check_pages(out.len())? != 1 {
            return Err(StoreError::BadLength {
                got: out.len(),
                page_bytes: self.config.page_bytes,
            });
        }
        let shard = self.shard(lpn);
        let Some(body) = shard.entries.get(lpn) else {
            out.fill(0);
            return Ok(());
        };
        if body.kind == Kind::Same {
            same_fill::fill(out, body.word_or_checksum);
            return Ok(());
        }
        let stored = shard.slabs.get(body.handle(), usize::from(body.len));
        if checksum(stored, lpn) != body.word_or_checksum {
            return Err(StoreError::Corrupt { lpn });
        }
        match body.encoding() {
            None => out.copy_from_slice(stored),
            Some(encoding) => {
                let lookup = |id: u32| {
                    self.dictionaries
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&id)
                        .cloned()
                };
                codec::decompress(encoding, &lookup, stored, out)
                    .map_err(|reason| StoreError::Codec { lpn, reason })?;
            }
        }
        Ok(())
    }

    /// What page `lpn` holds, without reading it: what a block-status query reports.
    pub fn page_state(&self, lpn: u64) -> PageState {
        let shard = self.shard(lpn);
        match shard.entries.get(lpn) {
            None => PageState::Absent,
            Some(body) if body.kind == Kind::Same && body.word_or_checksum == 0 => PageState::Zeros,
            Some(_) => PageState::Data,
        }
    }

    /// Reads `lpns` into `out` (concatenated pages), in parallel.
    pub fn read_batch(&self, lpns: &[u64], out: &mut [u8]) -> Result<(), StoreError> {
        let n = self.check_pages(out.len())?;
        if n != lpns.len() {
            return Err(StoreError::BadLength {
                got: out.len(),
                page_bytes: self.config.page_bytes,
            });
        }
        out.par_chunks_mut(self.config.page_bytes)
            .zip(lpns.par_iter())
            .try_for_each(|(page, &lpn)| self.read(lpn, page))
    }

    /// Forgets a page: it reads as zeros and its memory is freed.
    pub fn trim(&self, lpn: u64) {
        self.with_shard(self.shard_index(lpn), |shard| shard.remove(lpn));
    }

    pub fn stats(&self) -> StoreStats {
        let mut s = StoreStats::default();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            s.pages_stored += shard.entries.len() as u64;
            s.compr_data_size += shard.compr_bytes;
            s.mem_used_total += shard.slabs.bytes() as u64;
            s.same_pages += shard.same_pages;
            s.huge_pages += shard.huge_pages;
            s.pages_compacted += shard.slabs.pages_compacted();
        }
        s.orig_data_size = s.pages_stored * self.config.page_bytes as u64;
        s.mem_limit = self.config.mem_limit_bytes.unwrap_or(0);
        s.mem_used_max = self.mem_used_max.load(Ordering::Relaxed);
        s.dictionary_bytes = self
            .dictionaries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|d| d.bytes.len() as u64)
            .sum();
        s
    }

    /// Heap bytes of bookkeeping beside the slabs: the per-shard page tables and the
    /// allocators' slab lists.
    pub fn metadata_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
                (shard.entries.heap_bytes() + shard.slabs.bookkeeping_bytes()) as u64
            })
            .sum()
    }

    /// Packs each size class's objects into fewer slabs; returns the bytes freed.
    pub fn compact(&self) -> u64 {
        let mut freed = 0;
        for index in 0..self.shards.len() {
            freed += self.with_shard(index, |shard| shard.compact()) as u64;
        }
        freed
    }

    /// Trains new zstd dictionaries from a sample of the stored pages (spread evenly over the
    /// LPNs; same-filled and raw pages skipped: a word or incompressible bytes teach nothing and
    /// would take room in the sample), one per content class (`content_class`) from that class's
    /// pages, `dictionary_bytes` split by the classes' shares of the sample. Pages written from
    /// now on use them; pages stored earlier keep theirs. Returns the dictionaries' total bytes.
    pub fn train_dictionary(&self) -> Result<usize, StoreError> {
        let page = self.config.page_bytes;
        let mut lpns: Vec<u64> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            lpns.extend(
                shard
                    .entries
                    .iter()
                    .filter(|(_, b)| !matches!(b.kind, Kind::Same | Kind::Raw))
                    .map(|(lpn, _)| lpn),
            );
        }
        lpns.sort_unstable();
        let step = (lpns.len() / self.config.dictionary_sample_pages.max(1)).max(1);
        let sample: Vec<u64> = lpns.into_iter().step_by(step).collect();
        if sample.len() < MIN_TRAINING_PAGES {
            return Err(StoreError::Training(format!(
                "{} compressible pages stored; at least {MIN_TRAINING_PAGES} are needed",
                sample.len()
            )));
        }
        // Read in chunks, each page straight to its class's samples: the sample (64 MiB at the
        // default size) is held once, not twice.
        let mut by_class: [Vec<u8>; content_class::CLASSES] = Default::default();
        let mut chunk = vec![0u8; 256 * page];
        for lpns in sample.chunks(256) {
            let bytes = &mut chunk[..lpns.len() * page];
            self.read_batch(lpns, bytes)?;
            for p in bytes.chunks(page) {
                by_class[content_class::of(p)].extend_from_slice(p);
            }
        }
        let mut trained: [Option<Arc<Dictionary>>; content_class::CLASSES] = Default::default();
        let mut failures = Vec::new();
        for (class, pages) in by_class.iter().enumerate() {
            let n = pages.len() / page;
            let budget = self.config.dictionary_bytes * n / sample.len();
            if n < MIN_TRAINING_PAGES || budget < MIN_DICTIONARY_BYTES {
                continue;
            }
            match codec::train(pages, page, budget) {
                Ok(bytes) => {
                    let id = NEXT_DICTIONARY_ID.fetch_add(1, Ordering::Relaxed);
                    trained[class] = Some(Arc::new(Dictionary { id, bytes }));
                }
                Err(e) => failures.push(format!("{} pages: {e}", content_class::NAMES[class])),
            }
        }
        if trained.iter().all(Option::is_none) {
            return Err(StoreError::Training(if failures.is_empty() {
                "no class of pages had enough samples".into()
            } else {
                failures.join("; ")
            }));
        }
        let size = trained.iter().flatten().map(|d| d.bytes.len()).sum();
        {
            let mut all = self.dictionaries.write().unwrap_or_else(|p| p.into_inner());
            for d in trained.iter().flatten() {
                all.insert(d.id, d.clone());
            }
        }
        // A class whose training was skipped or failed has no dictionary until the next
        // training, rather than an older one: all current dictionaries come from one sample.
        *self
            .current_dictionary
            .write()
            .unwrap_or_else(|p| p.into_inner()) = trained;
        self.drop_unused_dictionaries();
        Ok(size)
    }

    /// Forgets dictionaries no stored page refers to (other than the current one).
    fn drop_unused_dictionaries(&self) {
        let mut used = std::collections::HashSet::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for body in shard.entries.values() {
                if body.kind == Kind::ZstdDict {
                    used.insert(body.dictionary);
                }
            }
        }
        let current: Vec<u32> = self
            .current_dictionary
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .map(|d| d.id)
            .collect();
        self.dictionaries
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| used.contains(id) || current.contains(id));
    }

    /// Flips one bit of a stored page's bytes, to test corruption detection. Returns false when
    /// the page has no stored bytes (absent or same-filled).
    #[doc(hidden)]
    pub fn corrupt_for_test(&self, lpn: u64) -> bool {
        let mut shard = self.shard(lpn);
        let Some(body) = shard.entries.get(lpn).copied() else {
            return false;
        };
        if body.kind == Kind::Same {
            return false;
        }
        shard.slabs.get_mut(body.handle(), 1)[0] ^= 1;
        true
    }

    /// Checks every shard's allocator counts; for tests.
    #[doc(hidden)]
    pub fn check(&self) {
        let mut slab_bytes = 0;
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.slabs.check();
            let stored: u64 = shard.entries.values().map(|b| u64::from(b.len)).sum();
            assert_eq!(stored, shard.compr_bytes);
            slab_bytes += shard.slabs.bytes() as u64;
        }
        assert_eq!(slab_bytes, self.mem_used.load(Ordering::Relaxed));
    }
}
