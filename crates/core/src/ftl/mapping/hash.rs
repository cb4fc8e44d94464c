//! The `hash` baseline: std's `HashMap` (hashbrown, SwissTable) with the Fx hash. Memory grows
//! with live mappings instead of with capacity, at about 9 bytes per bucket.

use super::MappingTable;
use crate::heap::hashbrown_bytes;
use rustc_hash::FxHashMap;

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
#[serde(into = "SavedHash", from = "SavedHash")]
pub struct HashMapping {
    ppn_of_lpn: FxHashMap<u32, u32>,
    /// The largest `capacity()` since the table last grew or shrank: its buckets' capacity.
    /// `capacity()` alone counts the room left, which a removal that leaves a tombstone does
    /// not give back, so it falls below the buckets allocated (by half, with trims).
    full_capacity: usize,
    /// The heap before the last `compact` (the table only grows between them).
    peak_bytes: usize,
}

impl HashMapping {
    pub fn new() -> Self {
        Self::default()
    }
}

/// A `HashMapping` as saved: its entries in the table's order and its capacities, so that a
/// restored table has the same buckets (its memory is reported from them) and grows as the
/// saved one would have. Tombstones are not saved: a restored table has none, so a later
/// in-place rehash may come at another time; it changes no bucket count, only slots.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedHash {
    entries: Vec<(u32, u32)>,
    full_capacity: usize,
    peak_bytes: usize,
}

impl From<HashMapping> for SavedHash {
    fn from(h: HashMapping) -> Self {
        SavedHash {
            entries: h.ppn_of_lpn.iter().map(|(&l, &p)| (l, p)).collect(),
            full_capacity: h.full_capacity.max(h.ppn_of_lpn.capacity()),
            peak_bytes: h.peak_bytes,
        }
    }
}

impl From<SavedHash> for HashMapping {
    fn from(s: SavedHash) -> Self {
        let mut ppn_of_lpn =
            FxHashMap::with_capacity_and_hasher(s.full_capacity, Default::default());
        ppn_of_lpn.extend(s.entries);
        HashMapping {
            full_capacity: s.full_capacity.max(ppn_of_lpn.capacity()),
            ppn_of_lpn,
            peak_bytes: s.peak_bytes,
        }
    }
}

impl MappingTable for HashMapping {
    fn name(&self) -> &'static str {
        "hash"
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        self.ppn_of_lpn.get(&lpn).copied()
    }

    #[inline]
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        let old = self.ppn_of_lpn.insert(lpn, ppn);
        // Right after the buckets grow, nothing is spent: `capacity()` is theirs.
        self.full_capacity = self.full_capacity.max(self.ppn_of_lpn.capacity());
        old
    }

    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        self.ppn_of_lpn.remove(&lpn)
    }

    fn for_each_live(&self, logical_pages: u64, f: &mut dyn FnMut(u32, u32)) {
        let mut live: Vec<(u32, u32)> = self
            .ppn_of_lpn
            .iter()
            .filter(|(&lpn, _)| u64::from(lpn) < logical_pages)
            .map(|(&lpn, &ppn)| (lpn, ppn))
            .collect();
        live.sort_unstable();
        for (lpn, ppn) in live {
            f(lpn, ppn);
        }
    }

    fn live_mappings(&self) -> u64 {
        self.ppn_of_lpn.len() as u64
    }

    fn heap_bytes(&self) -> usize {
        hashbrown_bytes(self.full_capacity.max(self.ppn_of_lpn.capacity()), 8)
    }

    fn peak_heap_bytes(&self) -> usize {
        self.peak_bytes.max(self.heap_bytes())
    }

    fn compact(&mut self) {
        self.peak_bytes = self.peak_heap_bytes();
        self.ppn_of_lpn.shrink_to_fit();
        self.full_capacity = self.ppn_of_lpn.capacity();
    }
}
