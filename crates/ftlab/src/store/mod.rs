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

pub mod codec;
pub mod same_fill;
pub mod slab;

use codec::{Codec, Dictionary, Encoding};
use rayon::prelude::*;
use serde::Serialize;
use slab::{Handle, SlabAllocator};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use xxhash_rust::xxh3::xxh3_64_with_seed;

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
}

impl StoreConfig {
    pub fn new(page_bytes: usize, codec: Codec) -> Self {
        Self {
            page_bytes,
            codec,
            shards: 16,
            // zram's huge class for 4 KiB pages is 3264 bytes: about 4/5 of a page.
            huge_bytes: page_bytes * 4 / 5,
            dictionary_bytes: 64 << 10,
            dictionary_sample_pages: 8192,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("lpn {lpn}: stored page fails its checksum (corrupt), not served")]
    Corrupt { lpn: u64 },
    #[error("lpn {lpn}: {reason}")]
    Codec { lpn: u64, reason: String },
    #[error("buffer of {got} bytes where whole pages of {page_bytes} bytes were expected")]
    BadLength { got: usize, page_bytes: usize },
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("dictionary training failed: {0}")]
    Training(String),
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
    pub same_pages: u64,
    pub huge_pages: u64,
    pub pages_compacted: u64,
    pub pages_stored: u64,
}

#[derive(Clone, Copy, Debug)]
enum Body {
    Same(u64),
    Stored {
        handle: Handle,
        len: u32,
        encoding: Option<Encoding>,
        checksum: u64,
    },
}

struct Shard {
    entries: HashMap<u64, Body>,
    slabs: SlabAllocator,
    compr_bytes: u64,
    same_pages: u64,
    huge_pages: u64,
}

impl Shard {
    fn remove(&mut self, lpn: u64) {
        match self.entries.remove(&lpn) {
            Some(Body::Same(_)) => self.same_pages -= 1,
            Some(Body::Stored {
                handle,
                len,
                encoding,
                ..
            }) => {
                self.slabs.free(handle);
                self.compr_bytes -= u64::from(len);
                if encoding.is_none() {
                    self.huge_pages -= 1;
                }
            }
            None => {}
        }
    }

    fn insert(&mut self, lpn: u64, page: &Prepared) {
        self.remove(lpn);
        let body = match page {
            Prepared::Same(word) => {
                self.same_pages += 1;
                Body::Same(*word)
            }
            Prepared::Stored { bytes, encoding } => {
                let handle = self.slabs.alloc(bytes.len(), lpn);
                self.slabs.slot_mut(handle)[..bytes.len()].copy_from_slice(bytes);
                self.compr_bytes += bytes.len() as u64;
                if encoding.is_none() {
                    self.huge_pages += 1;
                }
                Body::Stored {
                    handle,
                    len: bytes.len() as u32,
                    encoding: *encoding,
                    checksum: xxh3_64_with_seed(bytes, lpn),
                }
            }
        };
        self.entries.insert(lpn, body);
    }
}

/// A page ready to insert: compressed outside the lock.
enum Prepared {
    Same(u64),
    Stored {
        bytes: Vec<u8>,
        /// None = raw (huge).
        encoding: Option<Encoding>,
    },
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

pub struct PageStore {
    config: StoreConfig,
    shards: Box<[Mutex<Shard>]>,
    shard_mask: u64,
    /// The dictionary new pages are compressed with (zstd-dict).
    current_dictionary: RwLock<Option<Arc<Dictionary>>>,
    /// Every dictionary some stored page may still need.
    dictionaries: RwLock<HashMap<u32, Arc<Dictionary>>>,
}

/// Dictionary ids are unique in the process: per-thread codec contexts are cached by id, and a
/// thread may serve several stores.
static NEXT_DICTIONARY_ID: AtomicU32 = AtomicU32::new(1);

impl PageStore {
    pub fn new(config: StoreConfig) -> Result<Self, StoreError> {
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
            .map(|_| {
                Mutex::new(Shard {
                    entries: HashMap::new(),
                    slabs: SlabAllocator::new(config.page_bytes),
                    compr_bytes: 0,
                    same_pages: 0,
                    huge_pages: 0,
                })
            })
            .collect();
        Ok(Self {
            shard_mask: config.shards as u64 - 1,
            config,
            shards,
            current_dictionary: RwLock::new(None),
            dictionaries: RwLock::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn page_bytes(&self) -> usize {
        self.config.page_bytes
    }

    fn shard(&self, lpn: u64) -> std::sync::MutexGuard<'_, Shard> {
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

    fn prepare(&self, lpn: u64, page: &[u8]) -> Result<Prepared, StoreError> {
        if let Some(word) = same_fill::same_filled(page) {
            return Ok(Prepared::Same(word));
        }
        let dictionary = match self.config.codec {
            Codec::ZstdDict { .. } => self
                .current_dictionary
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            _ => None,
        };
        SCRATCH.with(|scratch| {
            let mut out = scratch.borrow_mut();
            let encoding = codec::compress(self.config.codec, dictionary.as_ref(), page, &mut out)
                .map_err(|reason| StoreError::Codec { lpn, reason })?;
            Ok(if out.len() >= self.config.huge_bytes {
                Prepared::Stored {
                    bytes: page.to_vec(),
                    encoding: None,
                }
            } else {
                Prepared::Stored {
                    bytes: out.clone(),
                    encoding: Some(encoding),
                }
            })
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
        let prepared = self.prepare(lpn, page)?;
        self.shard(lpn).insert(lpn, &prepared);
        Ok(())
    }

    /// Stores `pages` (concatenated) under `lpns`, compressing in parallel; within the batch the
    /// last write to an LPN wins.
    pub fn write_batch(&self, lpns: &[u64], pages: &[u8]) -> Result<(), StoreError> {
        let n = self.check_pages(pages.len())?;
        if n != lpns.len() {
            return Err(StoreError::BadLength {
                got: pages.len(),
                page_bytes: self.config.page_bytes,
            });
        }
        let prepared: Vec<Prepared> = pages
            .par_chunks(self.config.page_bytes)
            .zip(lpns.par_iter())
            .map(|(page, &lpn)| self.prepare(lpn, page))
            .collect::<Result<_, _>>()?;
        // Insert in batch order, so duplicates resolve to the last one.
        for (&lpn, p) in lpns.iter().zip(&prepared) {
            self.shard(lpn).insert(lpn, p);
        }
        Ok(())
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
        match shard.entries.get(&lpn) {
            None => out.fill(0),
            Some(Body::Same(word)) => same_fill::fill(out, *word),
            Some(&Body::Stored {
                handle,
                len,
                encoding,
                checksum,
            }) => {
                let stored = &shard.slabs.slot(handle)[..len as usize];
                if xxh3_64_with_seed(stored, lpn) != checksum {
                    return Err(StoreError::Corrupt { lpn });
                }
                match encoding {
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
            }
        }
        Ok(())
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
        self.shard(lpn).remove(lpn);
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
        s
    }

    /// Packs each size class's objects into fewer slabs; returns the bytes freed.
    pub fn compact(&self) -> u64 {
        let mut freed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let Shard { entries, slabs, .. } = &mut *shard;
            freed += slabs.compact(|lpn, handle| {
                if let Some(Body::Stored { handle: h, .. }) = entries.get_mut(&lpn) {
                    *h = handle;
                }
            }) as u64;
        }
        freed
    }

    /// Trains a new zstd dictionary from a sample of the stored pages (spread evenly over the
    /// LPNs, same-filled pages skipped); pages written from now on use it, pages stored earlier
    /// keep theirs. Returns the dictionary's size in bytes.
    pub fn train_dictionary(&self) -> Result<usize, StoreError> {
        let page = self.config.page_bytes;
        let mut lpns: Vec<u64> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            lpns.extend(
                shard
                    .entries
                    .iter()
                    .filter(|(_, b)| matches!(b, Body::Stored { .. }))
                    .map(|(&lpn, _)| lpn),
            );
        }
        lpns.sort_unstable();
        let step = (lpns.len() / self.config.dictionary_sample_pages.max(1)).max(1);
        let sample: Vec<u64> = lpns.into_iter().step_by(step).collect();
        if sample.len() < 8 {
            return Err(StoreError::Training(format!(
                "{} compressible pages stored; at least 8 are needed",
                sample.len()
            )));
        }
        let mut samples = vec![0u8; sample.len() * page];
        self.read_batch(&sample, &mut samples)?;
        let bytes = codec::train(&samples, page, self.config.dictionary_bytes)
            .map_err(StoreError::Training)?;
        let id = NEXT_DICTIONARY_ID.fetch_add(1, Ordering::Relaxed);
        let dictionary = Arc::new(Dictionary { id, bytes });
        let size = dictionary.bytes.len();
        self.dictionaries
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, dictionary.clone());
        *self
            .current_dictionary
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(dictionary);
        self.drop_unused_dictionaries();
        Ok(size)
    }

    /// Forgets dictionaries no stored page refers to (other than the current one).
    fn drop_unused_dictionaries(&self) {
        let mut used = std::collections::HashSet::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for body in shard.entries.values() {
                if let Body::Stored {
                    encoding: Some(Encoding::ZstdDict(id)),
                    ..
                } = body
                {
                    used.insert(*id);
                }
            }
        }
        let current = self
            .current_dictionary
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|d| d.id);
        self.dictionaries
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| used.contains(id) || Some(*id) == current);
    }

    /// Flips one bit of a stored page's bytes, to test corruption detection. Returns false when
    /// the page has no stored bytes (absent or same-filled).
    #[doc(hidden)]
    pub fn corrupt_for_test(&self, lpn: u64) -> bool {
        let mut shard = self.shard(lpn);
        let Some(&Body::Stored { handle, .. }) = shard.entries.get(&lpn) else {
            return false;
        };
        shard.slabs.slot_mut(handle)[0] ^= 1;
        true
    }

    /// Checks every shard's allocator counts; for tests.
    #[doc(hidden)]
    pub fn check(&self) {
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.slabs.check();
            let stored: u64 = shard
                .entries
                .values()
                .map(|b| match b {
                    Body::Stored { len, .. } => u64::from(*len),
                    Body::Same(_) => 0,
                })
                .sum();
            assert_eq!(stored, shard.compr_bytes);
        }
    }
}
