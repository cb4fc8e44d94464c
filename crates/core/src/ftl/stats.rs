//! Counters the FTL keeps; the report derives every ratio from them.

use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FtlStats {
    /// Pages the host asked to write (a partial page counts as one).
    pub host_write_pages: u64,
    pub host_read_pages: u64,
    pub host_trim_pages: u64,
    /// Flash programs carrying host data (fewer than host writes when the buffer coalesces).
    pub host_program_pages: u64,
    /// Flash programs moving valid pages out of GC victims.
    pub gc_write_pages: u64,
    /// Flash programs of mapping-table pages (no mapping persistence is modelled yet: always 0).
    pub mapping_write_pages: u64,
    /// Flash page reads for host reads.
    pub host_flash_read_pages: u64,
    pub gc_read_pages: u64,
    /// Reads of the old page for a partial-page write.
    pub rmw_read_pages: u64,
    /// Physical blocks erased.
    pub erases: u64,
    /// Superblocks reclaimed by GC, in the background and with host writes waiting.
    pub gc_background: u64,
    pub gc_foreground: u64,
    pub buffer_coalesced_pages: u64,
    pub buffer_read_hits: u64,
    pub flushes: u64,
}

impl FtlStats {
    pub fn nand_write_pages(&self) -> u64 {
        self.host_program_pages + self.gc_write_pages + self.mapping_write_pages
    }

    /// Flash page programs per host page write; `None` when the host wrote nothing (a ratio
    /// of nothing, shown as `n/a` and `null`, never as a WAF of 0).
    pub fn waf(&self) -> Option<f64> {
        (self.host_write_pages > 0)
            .then(|| self.nand_write_pages() as f64 / self.host_write_pages as f64)
    }
}
