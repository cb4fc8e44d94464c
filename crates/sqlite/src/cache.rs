//! The page cache between SQLite and the device, as a kernel's is between a file and a disk:
//! writes land in whole 4 KiB pages here and reach the device at xSync (or when too many are
//! dirty), each page once however many times SQLite wrote into it, contiguous pages as one
//! request. Without it a rollback journal's records (a page plus 8 bytes, so never aligned)
//! cost each device page a read-modify-write per record.
//!
//! What an fsync would have made durable is all that survives a crash here, as with a
//! power cut under a file system: SQLite's commit protocol syncs before it relies on anything.

use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;

pub const PAGE_BYTES: u64 = 4096;

/// (file kind, page index in the file).
pub type Key = (u8, u64);

#[derive(Default)]
pub struct PageCache {
    pages: HashMap<Key, Box<[u8]>>,
    dirty: BTreeSet<Key>,
    /// Clean pages beyond this many are dropped (dirty ones stay until written).
    pub capacity_pages: usize,
}

/// A run of dirty pages to write: the file kind, its first page, the bytes.
pub struct Run {
    pub kind: u8,
    pub first: u64,
    pub bytes: Vec<u8>,
}

impl PageCache {
    pub fn new(capacity_pages: usize) -> Self {
        Self {
            capacity_pages,
            ..Self::default()
        }
    }

    pub fn get(&self, key: Key) -> Option<&[u8]> {
        self.pages.get(&key).map(|p| &p[..])
    }

    /// Puts a page read from the device (clean).
    pub fn insert_clean(&mut self, key: Key, page: Box<[u8]>) {
        debug_assert_eq!(page.len() as u64, PAGE_BYTES);
        if self.pages.len() >= self.capacity_pages {
            self.shed_clean();
        }
        self.pages.entry(key).or_insert(page);
    }

    /// The page to write into (present: the caller read or zeroed it first), marked dirty.
    pub fn page_mut(&mut self, key: Key) -> Option<&mut [u8]> {
        let page = self.pages.get_mut(&key)?;
        self.dirty.insert(key);
        Some(&mut page[..])
    }

    /// Puts a whole page written by SQLite (dirty).
    pub fn insert_dirty(&mut self, key: Key, page: Box<[u8]>) {
        if self.pages.len() >= self.capacity_pages {
            self.shed_clean();
        }
        self.pages.insert(key, page);
        self.dirty.insert(key);
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty.len()
    }

    /// Drops every clean page: simple, and rare (the cache holds a database many times
    /// SQLite's own cache).
    fn shed_clean(&mut self) {
        let dirty = &self.dirty;
        self.pages.retain(|k, _| dirty.contains(k));
    }

    /// Takes the dirty pages of `kind` (or all), in order, joined into runs of contiguous
    /// pages of at most `max_pages`; they are clean from now on.
    pub fn take_dirty(&mut self, kind: Option<u8>, max_pages: usize) -> Vec<Run> {
        let keys: Vec<Key> = match kind {
            Some(k) => self.dirty.range((k, 0)..=(k, u64::MAX)).copied().collect(),
            None => self.dirty.iter().copied().collect(),
        };
        let mut runs: Vec<Run> = Vec::new();
        for key in keys {
            self.dirty.remove(&key);
            let page = &self.pages[&key];
            match runs.last_mut() {
                Some(r)
                    if r.kind == key.0
                        && r.first + (r.bytes.len() as u64 / PAGE_BYTES) == key.1
                        && r.bytes.len() / (PAGE_BYTES as usize) < max_pages =>
                {
                    r.bytes.extend_from_slice(page);
                }
                _ => runs.push(Run {
                    kind: key.0,
                    first: key.1,
                    bytes: page.to_vec(),
                }),
            }
        }
        runs
    }

    /// Forgets the pages of `kind` from page `from` on (a truncated or deleted file).
    pub fn forget_from(&mut self, kind: u8, from: u64) {
        self.pages.retain(|k, _| k.0 != kind || k.1 < from);
        let gone: Vec<Key> = self
            .dirty
            .range((kind, from)..=(kind, u64::MAX))
            .copied()
            .collect();
        for k in gone {
            self.dirty.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Box<[u8]> {
        vec![b; PAGE_BYTES as usize].into_boxed_slice()
    }

    /// Dirty pages leave in order, contiguous ones joined, each once; clean ones are shed
    /// first when full; forgotten pages do not leave.
    #[test]
    fn dirty_pages_leave_in_runs_once() {
        let mut c = PageCache::new(4);
        c.insert_dirty((0, 3), page(3));
        c.insert_dirty((0, 1), page(1));
        c.insert_dirty((0, 2), page(2));
        c.insert_dirty((1, 7), page(7));
        c.insert_clean((1, 9), page(9));
        // Full, but nothing clean to shed: dirty pages are never dropped.
        assert!(c.get((1, 9)).is_some());
        c.insert_clean((1, 10), page(10));
        assert!(c.get((1, 9)).is_none(), "full again: the clean page went");
        assert!(c.get((0, 1)).is_some() && c.get((1, 10)).is_some());
        let runs = c.take_dirty(Some(0), 2);
        let shape: Vec<(u8, u64, usize)> = runs
            .iter()
            .map(|r| (r.kind, r.first, r.bytes.len() / PAGE_BYTES as usize))
            .collect();
        assert_eq!(shape, vec![(0, 1, 2), (0, 3, 1)]);
        assert_eq!(runs[0].bytes[PAGE_BYTES as usize], 2);
        assert!(c.take_dirty(Some(0), 8).is_empty());
        c.page_mut((0, 1)).unwrap()[0] = 9;
        c.forget_from(0, 1);
        assert!(c.take_dirty(Some(0), 8).is_empty());
        assert_eq!(c.take_dirty(None, 8).len(), 1);
        assert_eq!(c.dirty_pages(), 0);
    }
}
