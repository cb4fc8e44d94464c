//! The flat u64 array, the JDB-FTL report's baseline (ftlab's own `flat` table holds u32s).

use ftlab_core::ftl::mapping::MappingTable;

/// One u64 per logical page, the JDB-FTL report's baseline.
pub struct FlatU64 {
    ppn_of_lpn: Vec<u64>,
    live: u64,
}

impl FlatU64 {
    pub fn new(logical_pages: u64) -> Self {
        Self {
            ppn_of_lpn: ftlab_core::table::filled(logical_pages as usize, u64::MAX),
            live: 0,
        }
    }
}

impl MappingTable for FlatU64 {
    fn name(&self) -> &'static str {
        "flat-u64"
    }
    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let v = self.ppn_of_lpn[lpn as usize];
        (v != u64::MAX).then_some(v as u32)
    }
    #[inline]
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], u64::from(ppn));
        self.live += u64::from(old == u64::MAX);
        (old != u64::MAX).then_some(old as u32)
    }
    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], u64::MAX);
        self.live -= u64::from(old != u64::MAX);
        (old != u64::MAX).then_some(old as u32)
    }
    fn live_mappings(&self) -> u64 {
        self.live
    }
    fn heap_bytes(&self) -> usize {
        self.ppn_of_lpn.capacity() * 8
    }
}
