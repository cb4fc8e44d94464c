//! Counters the FTL keeps; the report derives every ratio from them.

use crate::flash::{Cause, FlashCounts, MAPPING_PLACEMENT};
use std::collections::VecDeque;

/// An NVMe FDP event (`nvme fdp events`), as the FTL logs it.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdpEvent {
    pub time_ns: u64,
    pub kind: FdpEventKind,
    pub reclaim_group: u8,
    /// The placement (handle) whose reclaim unit it concerns.
    pub placement: u8,
    /// The reclaim unit (superblock number).
    pub reclaim_unit: u32,
    /// Media relocated: pages moved; time limit exceeded: pages left unwritten.
    pub pages: u32,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdpEventKind {
    /// A reclaim unit open longer than `fdp.ru_time_limit_ns` was closed unfilled.
    RuTimeLimitExceeded,
    /// GC moved valid data out of a reclaim unit.
    MediaRelocated,
}

/// How many of the latest FDP events the FTL keeps (a device's event log is bounded too).
pub const FDP_EVENT_LOG: usize = 64;

/// What the host asked of the FTL and what the FTL did. Flash work is counted once, by cause and
/// placement, in `flash`; the page counts below it are views of that record.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct FtlStats {
    /// Pages the host asked to write (a partial page counts as one).
    pub host_write_pages: u64,
    pub host_read_pages: u64,
    pub host_trim_pages: u64,
    /// Every flash operation, by cause and placement (`Ftl::flash` records them).
    pub flash: FlashCounts,
    /// Superblocks reclaimed by GC, in the background and with host writes waiting.
    pub gc_background: u64,
    pub gc_foreground: u64,
    pub buffer_coalesced_pages: u64,
    pub buffer_read_hits: u64,
    pub flushes: u64,
    /// The latest FDP events, oldest first (at most [`FDP_EVENT_LOG`]; the per-placement
    /// counts in `flash` count them all).
    pub fdp_events: VecDeque<FdpEvent>,
}

impl FtlStats {
    pub fn log_event(&mut self, event: FdpEvent) {
        if self.fdp_events.len() == FDP_EVENT_LOG {
            self.fdp_events.pop_front();
        }
        self.fdp_events.push_back(event);
    }

    /// Flash programs carrying host data (fewer than host writes when the buffer coalesces).
    pub fn host_program_pages(&self) -> u64 {
        self.flash.program_pages(Cause::Host)
    }

    /// Flash programs moving valid pages out of GC victims.
    pub fn gc_write_pages(&self) -> u64 {
        self.flash.program_pages(Cause::Gc)
    }

    /// Flash programs of mapping-table pages (no table persists itself yet: 0).
    pub fn mapping_write_pages(&self) -> u64 {
        self.flash.program_pages(Cause::Mapping)
    }

    /// Flash page reads for host reads.
    pub fn host_flash_read_pages(&self) -> u64 {
        self.flash.read_pages(Cause::Host)
    }

    /// GC's programs of translation pages (moved out of translation superblocks: GMD).
    pub fn gc_mapping_write_pages(&self) -> u64 {
        self.flash.placements()[usize::from(MAPPING_PLACEMENT)].program_pages[Cause::Gc as usize]
    }

    /// GC's programs of user data (GUD).
    pub fn gc_user_write_pages(&self) -> u64 {
        self.gc_write_pages() - self.gc_mapping_write_pages()
    }

    pub fn gc_read_pages(&self) -> u64 {
        self.flash.read_pages(Cause::Gc)
    }

    /// Reads of the old page for a partial-page write.
    pub fn rmw_read_pages(&self) -> u64 {
        self.flash.read_pages(Cause::ReadModifyWrite)
    }

    /// Physical blocks erased, for any cause.
    pub fn erases(&self) -> u64 {
        Cause::ALL
            .iter()
            .map(|&c| self.flash.erased_blocks(c))
            .sum()
    }

    pub fn nand_write_pages(&self) -> u64 {
        Cause::ALL
            .iter()
            .map(|&c| self.flash.program_pages(c))
            .sum()
    }

    /// Flash page programs per host page write; `None` when the host wrote nothing (a ratio
    /// of nothing, shown as `n/a` and `null`, never as a WAF of 0).
    pub fn waf(&self) -> Option<f64> {
        (self.host_write_pages > 0)
            .then(|| self.nand_write_pages() as f64 / self.host_write_pages as f64)
    }
}
