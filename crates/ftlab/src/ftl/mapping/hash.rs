//! The `hash` baseline: std's `HashMap` (hashbrown, SwissTable) with the Fx hash. Memory grows
//! with live mappings instead of with capacity, at about 9 bytes per bucket.

use super::MappingTable;
use crate::heap::hashbrown_bytes;
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
