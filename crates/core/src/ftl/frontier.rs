//! Write frontiers: where the next page of each placement goes (one open superblock per
//! handle per reclaim group, GC's apart when configured, the initially isolated handles' shared
//! GC frontier, the translation pages'), and the reclaim unit time limit that closes one early.

use super::mapping::MappingTable;
use super::{FdpEvent, FdpEventKind, Ftl};
use crate::addr::{Ppn, NO_SUPERBLOCK};
use crate::flash::{Cause, SHARED_GC_PLACEMENT};
use crate::request::Placement;

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub(super) struct Frontier {
    pub(super) superblock: u32,
    pub(super) next_slot: u32,
    /// When its reclaim unit was opened (for the RU time limit).
    pub(super) opened_ns: u64,
}

/// A frontier to program at: its index, the reclaim group its superblocks come from, and the
/// placement they belong to.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub(super) struct Destination {
    pub(super) index: usize,
    pub(super) group: u8,
    pub(super) placement: u8,
}

impl<M: MappingTable> Ftl<M> {
    /// Whether handle (placement) `handle` is persistently isolated.
    #[inline(always)]
    pub(super) fn is_persistent(&self, handle: u8) -> bool {
        handle < 64 && self.persistent_handles >> handle & 1 != 0
    }

    /// Closes the placement's open host reclaim unit unfilled if it has been open longer than
    /// the time limit (an "RU time limit exceeded" event); its next write opens another.
    #[cold]
    #[inline(never)]
    pub(super) fn enforce_time_limit(&mut self, placement: Placement, now_ns: u64) {
        let index = self.host_frontier(placement);
        let f = self.frontiers[index];
        if f.superblock == NO_SUPERBLOCK
            || now_ns.saturating_sub(f.opened_ns) <= self.ru_time_limit_ns
        {
            return;
        }
        self.frontiers[index].superblock = NO_SUPERBLOCK;
        self.blocks.close(f.superblock);
        let p = &mut self.stats.flash;
        p.unit_closed_unfilled(placement.handle);
        self.stats.log_event(FdpEvent {
            time_ns: now_ns,
            kind: FdpEventKind::RuTimeLimitExceeded,
            reclaim_group: placement.reclaim_group,
            placement: placement.handle,
            reclaim_unit: f.superblock,
            pages: self.geometry.pages_per_superblock - f.next_slot,
        });
    }

    /// Frontier index of the placement's host writes.
    #[inline(always)]
    pub(super) fn host_frontier(&self, placement: Placement) -> usize {
        usize::from(placement.reclaim_group) * self.frontiers_per_group
            + 2 * usize::from(placement.handle)
    }

    /// Where data of `placement` written for `cause` goes: the handle's own frontier, except GC
    /// moves of initially isolated handles' data (and of the superblocks they share), which go
    /// to the group's shared GC frontier.
    #[inline(always)]
    pub(super) fn destination(&self, placement: Placement, cause: Cause) -> Destination {
        let gc = cause == Cause::Gc;
        let group = placement.reclaim_group;
        if gc && !self.is_persistent(placement.handle) {
            Destination {
                index: (usize::from(group) + 1) * self.frontiers_per_group - 1,
                group,
                placement: SHARED_GC_PLACEMENT,
            }
        } else {
            Destination {
                index: self.host_frontier(placement) + usize::from(gc && self.gc_separate_frontier),
                group,
                placement: placement.handle,
            }
        }
    }

    /// The next page of frontier `index`, whose superblocks are taken from reclaim group `group`
    /// and belong to `placement`.
    // Always: as a call from `program` (the module it lives in is not its callers') it cost
    // GC 9 % more instructions.
    #[inline(always)]
    pub(super) fn allocate_at(
        &mut self,
        index: usize,
        group: u8,
        placement: u8,
        now_ns: u64,
    ) -> (Ppn, bool) {
        let pps = self.geometry.pages_per_superblock;
        let mut f = self.frontiers[index];
        if f.superblock == NO_SUPERBLOCK {
            f.superblock = self
                .blocks
                .take_free(group, placement)
                .expect("free pool empty: GC reserve violated");
            self.stats.flash.unit_opened(placement);
            f.next_slot = 0;
            f.opened_ns = now_ns;
        }
        // A frontier never passes the end of its superblock (it is closed on its last page).
        if f.next_slot >= pps {
            frontier_overrun(index, f.next_slot, pps);
        }
        let ppn = Ppn::new(f.superblock * pps + f.next_slot);
        f.next_slot += 1;
        let filled = f.next_slot == pps;
        if filled {
            f.superblock = NO_SUPERBLOCK;
        }
        self.frontiers[index] = f;
        (ppn, filled)
    }

    /// The translation pages' frontier: the last one.
    pub(super) fn mapping_frontier(&self) -> usize {
        self.frontiers.len() - 1
    }
}

/// The panic of a broken frontier bound, out of line so the check costs the hot path a compare.
#[cold]
#[inline(never)]
fn frontier_overrun(index: usize, slot: u32, pages_per_superblock: u32) -> ! {
    panic!("frontier {index} at slot {slot} of a {pages_per_superblock}-page superblock")
}
