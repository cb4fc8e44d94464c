//! The `hash` baseline: std's `HashMap` (hashbrown, SwissTable) with the Fx hash. Memory grows
//! with live mappings instead of with capacity, at about 9 bytes per bucket.

use super::MappingTable;
use rustc_hash::FxHashMap;

#[derive(Clone, Debug, Default)]
pub struct HashMapping {
    ppn_of_lpn: FxHashMap<u32, u32>,
}

impl HashMapping {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Bytes hashbrown allocates for a table of this `capacity()` with (u32, u32) entries: one entry
/// and one control byte per bucket, plus a group of trailing control bytes. Derived from the
/// layout (buckets = capacity * 8 / 7, a power of two); `ftlab mapbench` cross-checks it against
/// the allocator's own statistics.
pub fn hashbrown_bytes(capacity: usize, entry_bytes: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        if capacity < 4 {
            4
        } else {
            8
        }
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    const GROUP_WIDTH: usize = 16;
    let data = (buckets * entry_bytes).next_multiple_of(GROUP_WIDTH);
    data + buckets + GROUP_WIDTH
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
        self.ppn_of_lpn.insert(lpn, ppn)
    }

    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        self.ppn_of_lpn.remove(&lpn)
    }

    fn live_mappings(&self) -> u64 {
        self.ppn_of_lpn.len() as u64
    }

    fn heap_bytes(&self) -> usize {
        hashbrown_bytes(self.ppn_of_lpn.capacity(), 8)
    }

    fn compact(&mut self) {
        self.ppn_of_lpn.shrink_to_fit();
    }
}
