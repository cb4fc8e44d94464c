//! The FTL's invariants, checked whole by the property tests after every step: map and reverse
//! map agree, bitmaps match counts, states and placements are consistent.

use super::block_manager::SuperblockState;
use super::mapping::MappingTable;
use super::Ftl;
use crate::addr::{Lpn, Ppn, NO_SUPERBLOCK};
use crate::flash::{MAPPING_PLACEMENT, SHARED_GC_PLACEMENT};

impl<M: MappingTable> Ftl<M> {
    /// Panics if map, reverse map, bitmaps, counts or superblock states disagree. For tests.
    pub fn check_invariants(&self) {
        self.blocks.check_invariants();
        let mut mapped = 0u64;
        for lpn in (0..self.geometry.logical_pages as u32).map(Lpn::new) {
            if let Some(ppn) = self.map.get_uncounted(lpn.get()).map(Ppn::new) {
                mapped += 1;
                assert!(
                    self.blocks.is_valid(ppn),
                    "lpn {lpn} -> ppn {ppn} not valid"
                );
                assert_eq!(
                    self.lpn_of_ppn[ppn.index()],
                    lpn,
                    "reverse map of ppn {ppn}"
                );
            }
        }
        assert_eq!(mapped, self.map.live_mappings());
        let valid: u64 = (0..self.geometry.superblocks)
            .map(|sb| u64::from(self.blocks.valid_count(sb)))
            .sum();
        let mut translation_pages = 0u64;
        if let Some(t) = &self.translation {
            t.check();
            for page in 0..self.geometry.translation_pages {
                // A clean page's durable copy is the table's: no change went unrecorded.
                if !t.is_dirty(page) {
                    for lpn in t.lpns_of(page, self.geometry.logical_pages).map(Lpn::new) {
                        if let Some(durable) = t.durable(lpn) {
                            let now = self.map.get_uncounted(lpn.get()).unwrap_or(u32::MAX);
                            assert_eq!(durable, now, "clean translation page {page}, lpn {lpn}");
                        }
                    }
                }
                let at = t.location(page);
                if at.is_none() {
                    continue;
                }
                translation_pages += 1;
                assert!(
                    self.blocks.is_valid(at),
                    "translation page {page} at {at} not valid"
                );
                assert_eq!(self.lpn_of_ppn[at.index()], Lpn::new(page));
                assert_eq!(
                    self.blocks.stream_of(self.geometry.superblock_of(at)),
                    MAPPING_PLACEMENT
                );
            }
        }
        assert_eq!(
            valid,
            mapped + translation_pages,
            "valid pages vs mapped LPNs and translation pages"
        );
        for (i, f) in self.frontiers.iter().enumerate() {
            if f.superblock != NO_SUPERBLOCK {
                assert_eq!(self.blocks.state(f.superblock), SuperblockState::Open);
                // A reclaim group's frontiers fill its own superblocks (the translation
                // pages', the last, group 0's).
                let group = (i / self.frontiers_per_group).min(self.reclaim_groups as usize - 1);
                let group = if i == self.frontiers.len() - 1 && self.translation.is_some() {
                    0
                } else {
                    group
                };
                assert_eq!(usize::from(self.blocks.group_of(f.superblock)), group);
            }
        }
        // Isolation: a superblock of a persistently isolated handle holds no page of data
        // another handle wrote last (`owner_of` says who did, when the caller tracks it).
        for sb in 0..self.geometry.superblocks {
            let p = self.blocks.stream_of(sb);
            if self.blocks.state(sb) != SuperblockState::Free && p != MAPPING_PLACEMENT {
                assert!(
                    u32::from(p) < self.handles || p == SHARED_GC_PLACEMENT,
                    "superblock {sb} of placement {p}"
                );
                assert!(
                    p != SHARED_GC_PLACEMENT || self.persistent_handles.count_ones() < self.handles,
                    "a shared GC superblock with no initially isolated handle"
                );
            }
        }
    }

    /// Panics unless every valid page of data lives in a superblock its writer's handle may
    /// use: its own, or (for an initially isolated handle) the shared GC ones. `handle_of(lpn)`
    /// is the handle the caller last wrote `lpn` with. Pages in the write buffer are skipped
    /// (their copy on flash, if any, is an older write's). For tests of isolation.
    pub fn check_isolation(&self, handle_of: impl Fn(Lpn) -> u8) {
        for lpn in (0..self.geometry.logical_pages as u32).map(Lpn::new) {
            if self.buffer.contains(lpn) {
                continue;
            }
            let Some(ppn) = self.map.get_uncounted(lpn.get()).map(Ppn::new) else {
                continue;
            };
            let held_by = self.blocks.stream_of(self.geometry.superblock_of(ppn));
            let wrote = handle_of(lpn);
            let shared_ok = held_by == SHARED_GC_PLACEMENT && !self.is_persistent(wrote);
            assert!(
                held_by == wrote || shared_ok,
                "lpn {lpn} written by handle {wrote} lives in a superblock of placement {held_by}"
            );
        }
    }
}
