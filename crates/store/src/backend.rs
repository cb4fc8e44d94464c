//! Where the page store keeps its records: the stored (compressed, or raw) bytes of each page.
//!
//! The store decides what a page's record is (same-fill, codec, checksum) and finds records by
//! LPN; a backend keeps the bytes and says where they are, and may move them (compaction) as long
//! as it tells the store. The first backend is RAM: `slab::SlabAllocator`, size-class slabs in
//! the manner of zsmalloc. A durable, log-structured backend goes beside it, implementing the
//! same trait. The store is generic over its backend (`PageStore<B>`): one monomorphised hot
//! path each, no dynamic dispatch per page.

pub use crate::slab::Handle;

/// A store of records of up to one page, each owned by one key (the LPN).
///
/// A [`Handle`] is 64 bits the backend interprets; the RAM arena reads them as (size class,
/// object, slab). Each shard of the store has its own backend, used under the shard's lock.
pub trait RecordBackend: Send + 'static {
    /// A backend for records of 1 to `page_bytes` bytes.
    fn new(page_bytes: usize) -> Self
    where
        Self: Sized;

    /// Stores `bytes` as a record owned by `owner` (< 2^63); returns where it is.
    fn put(&mut self, owner: u64, bytes: &[u8]) -> Handle;

    /// Replaces the record at `at` by `bytes` where it is, if they fit there (no free, no
    /// allocation: what an overwrite of a like-sized page costs). false: they do not, and
    /// nothing changed.
    fn replace(&mut self, at: Handle, bytes: &[u8]) -> bool;

    /// The first `len` bytes of the record at `at` (`len` as stored).
    fn get(&self, at: Handle, len: usize) -> &[u8];

    /// As `get`, mutably: tests corrupt records through it.
    fn get_mut(&mut self, at: Handle, len: usize) -> &mut [u8];

    /// Forgets the record at `at`.
    fn free(&mut self, at: Handle);

    /// Packs the records into less memory or space; `moved(owner, new)` for each record that
    /// moved. Returns the bytes released.
    fn compact(&mut self, moved: &mut dyn FnMut(u64, Handle)) -> usize;

    /// Bytes the backend holds for records, free room inside its units included (zram's
    /// `mem_used_total`).
    fn bytes(&self) -> usize;

    /// How far `bytes()` may exceed the records' own bytes without being fragmentation that
    /// compaction would win back.
    fn slack_allowance(&self) -> usize;

    /// Units released by compaction so far, in 4 KiB pages (zram's `pages_compacted`).
    fn pages_compacted(&self) -> u64;

    /// Heap bytes of the backend's own bookkeeping.
    fn bookkeeping_bytes(&self) -> usize;

    /// Panics if the backend's counts disagree with its contents; for tests.
    fn check(&self);
}

impl RecordBackend for crate::slab::SlabAllocator {
    fn new(page_bytes: usize) -> Self {
        crate::slab::SlabAllocator::new(page_bytes)
    }

    #[inline]
    fn put(&mut self, owner: u64, bytes: &[u8]) -> Handle {
        let handle = self.alloc(bytes.len(), owner);
        self.write(handle, bytes);
        handle
    }

    #[inline]
    fn replace(&mut self, at: Handle, bytes: &[u8]) -> bool {
        // The slot fits when the new bytes fall in its size class.
        if self.class_of(bytes.len()) != usize::from(at.class) {
            return false;
        }
        self.write(at, bytes);
        true
    }

    #[inline]
    fn get(&self, at: Handle, len: usize) -> &[u8] {
        self.slot(at, len)
    }

    fn get_mut(&mut self, at: Handle, len: usize) -> &mut [u8] {
        self.slot_mut(at, len)
    }

    #[inline]
    fn free(&mut self, at: Handle) {
        crate::slab::SlabAllocator::free(self, at)
    }

    fn compact(&mut self, moved: &mut dyn FnMut(u64, Handle)) -> usize {
        crate::slab::SlabAllocator::compact(self, moved)
    }

    fn bytes(&self) -> usize {
        crate::slab::SlabAllocator::bytes(self)
    }

    fn slack_allowance(&self) -> usize {
        self.tail_allowance()
    }

    fn pages_compacted(&self) -> u64 {
        crate::slab::SlabAllocator::pages_compacted(self)
    }

    fn bookkeeping_bytes(&self) -> usize {
        crate::slab::SlabAllocator::bookkeeping_bytes(self)
    }

    fn check(&self) {
        crate::slab::SlabAllocator::check(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;
    use crate::{PageStore, StoreConfig, StoreError};
    use ftlab_core::rng::SplitMix64;

    /// A second backend, as unlike the slab arena as can be: one heap allocation per record,
    /// the handle's `slab` its index, compaction that moves every record to a fresh index.
    #[derive(Default)]
    struct BoxedRecords {
        records: Vec<Option<(u64, Box<[u8]>)>>,
        moves: u64,
    }

    fn at(i: usize) -> Handle {
        Handle {
            class: 0,
            object: 0,
            slab: i as u32,
        }
    }

    impl RecordBackend for BoxedRecords {
        fn new(_page_bytes: usize) -> Self {
            Self::default()
        }
        fn put(&mut self, owner: u64, bytes: &[u8]) -> Handle {
            self.records.push(Some((owner, bytes.into())));
            at(self.records.len() - 1)
        }
        fn replace(&mut self, at: Handle, bytes: &[u8]) -> bool {
            let r = self.records[at.slab as usize].as_mut().expect("live");
            if r.1.len() != bytes.len() {
                return false;
            }
            r.1.copy_from_slice(bytes);
            true
        }
        fn get(&self, at: Handle, len: usize) -> &[u8] {
            &self.records[at.slab as usize].as_ref().expect("live").1[..len]
        }
        fn get_mut(&mut self, at: Handle, len: usize) -> &mut [u8] {
            &mut self.records[at.slab as usize].as_mut().expect("live").1[..len]
        }
        fn free(&mut self, at: Handle) {
            assert!(
                self.records[at.slab as usize].take().is_some(),
                "double free"
            );
        }
        fn compact(&mut self, moved: &mut dyn FnMut(u64, Handle)) -> usize {
            let before = self.records.len();
            let live: Vec<_> = self.records.drain(..).flatten().collect();
            for (i, (owner, bytes)) in live.into_iter().enumerate() {
                self.records.push(Some((owner, bytes)));
                moved(owner, at(i));
                self.moves += 1;
            }
            (before - self.records.len()) * 8
        }
        fn bytes(&self) -> usize {
            self.records.iter().flatten().map(|r| r.1.len()).sum()
        }
        fn slack_allowance(&self) -> usize {
            0
        }
        fn pages_compacted(&self) -> u64 {
            0
        }
        fn bookkeeping_bytes(&self) -> usize {
            self.records.capacity() * std::mem::size_of::<Option<(u64, Box<[u8]>)>>()
        }
        fn check(&self) {}
    }

    /// The store over another backend keeps every page as a model says it should, through
    /// overwrites of every size, trims, compactions that move every record, and corruption.
    #[test]
    fn the_store_works_over_another_backend() {
        const PAGE: usize = 4096;
        let store =
            PageStore::<BoxedRecords>::with_backend(StoreConfig::new(PAGE, Codec::Lz4)).unwrap();
        let mut model: Vec<Option<Vec<u8>>> = vec![None; 64];
        let mut rng = SplitMix64::new(11);
        let mut out = vec![0u8; PAGE];
        for step in 0..4000 {
            let lpn = rng.bounded(64);
            match rng.bounded(10) {
                0 => {
                    store.trim(lpn);
                    model[lpn as usize] = None;
                }
                1 => {
                    store.compact();
                }
                _ => {
                    // Compressible to varying degrees: a run of one byte, then noise.
                    let run = rng.bounded(PAGE as u64 + 1) as usize;
                    let mut page = vec![step as u8; PAGE];
                    for b in &mut page[run..] {
                        *b = rng.next_u64() as u8;
                    }
                    store.write(lpn, &page).unwrap();
                    model[lpn as usize] = Some(page);
                }
            }
            let check = rng.bounded(64);
            store.read(check, &mut out).unwrap();
            match &model[check as usize] {
                Some(page) => assert_eq!(&out, page, "lpn {check} at step {step}"),
                None => assert!(out.iter().all(|&b| b == 0), "lpn {check} at step {step}"),
            }
        }
        store.check();
        let stats = store.stats();
        assert_eq!(
            stats.pages_stored,
            model.iter().filter(|p| p.is_some()).count() as u64
        );
        let stored = (0..64)
            .find(|&l| store.corrupt_for_test(l))
            .expect("a page with stored bytes");
        assert_eq!(
            store.read(stored, &mut out),
            Err(StoreError::Corrupt { lpn: stored })
        );
    }
}
