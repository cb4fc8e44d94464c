//! The mapping table's durable copy as the host path meets it: a translation page made dirty
//! before its entry changes (another written back when the protected budget is full), brought
//! into the mapping cache on a miss, and programmed at the translation frontier.

use super::mapping::MappingTable;
use super::Ftl;
use crate::addr::{Lpn, Ppn};
use crate::flash::{Cause, FlashOp, MAPPING_PLACEMENT};

impl<M: MappingTable> Ftl<M> {
    /// `lpn`'s entry is about to change: its translation page becomes dirty, after writing
    /// another back if the protected budget is full. Returns when the change may proceed.
    #[inline(always)]
    pub(super) fn make_dirty(&mut self, lpn: Lpn, ready_ns: u64) -> u64 {
        let Some(t) = &self.translation else {
            return ready_ns;
        };
        let page = t.page_of(lpn);
        let ready_ns = self.ensure_cached(page, ready_ns);
        let t = self.translation.as_ref().expect("persisted mapping");
        let ready_ns = match t.must_write_back_for(page) {
            Some(victim) => self.write_back(victim, Cause::Mapping, ready_ns),
            None => ready_ns,
        };
        if let Some(t) = &mut self.translation {
            t.touch(page);
        }
        ready_ns
    }

    /// Brings translation page `page` into the mapping cache if it is not there (a map read
    /// from flash, after dropping the least recently used page, written back first if dirty).
    /// Returns when its entries may be used. Without a cache every page is cached.
    #[inline(always)]
    pub(super) fn ensure_cached(&mut self, page: u32, ready_ns: u64) -> u64 {
        let hit = self.translation.as_mut().is_none_or(|t| t.use_cached(page));
        if hit {
            ready_ns
        } else {
            self.cache_miss(page, ready_ns)
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn cache_miss(&mut self, page: u32, ready_ns: u64) -> u64 {
        let mut ready_ns = ready_ns;
        let t = self.translation.as_ref().expect("persisted mapping");
        if let Some(victim) = t.cache_victim() {
            if t.is_dirty(victim) {
                ready_ns = self.write_back(victim, Cause::Mapping, ready_ns);
            }
            self.translation
                .as_mut()
                .expect("persisted")
                .uncache(victim);
        }
        let at = self.translation.as_ref().expect("persisted").location(page);
        if !at.is_none() {
            // Never written: its entries are all unmapped, nothing to read.
            let read = FlashOp::Read { ppn: at };
            ready_ns = self
                .flash(read, Cause::Mapping, MAPPING_PLACEMENT, ready_ns)
                .done_ns;
        }
        self.translation.as_mut().expect("persisted").cache(page);
        ready_ns
    }

    /// Programs translation page `page` with the table's current entries (mapping data, MD);
    /// returns when it is durable.
    #[cold]
    #[inline(never)]
    pub(super) fn write_back(&mut self, page: u32, cause: Cause, ready_ns: u64) -> u64 {
        let (ppn, filled) =
            self.allocate_at(self.mapping_frontier(), 0, MAPPING_PLACEMENT, ready_ns);
        let done_ns = self
            .flash(FlashOp::Program { ppn }, cause, MAPPING_PLACEMENT, ready_ns)
            .done_ns;
        let (map, logical) = (&self.map, self.geometry.logical_pages);
        let t = self.translation.as_mut().expect("persisted mapping");
        // The last translation page may hold entries past the end: unmapped.
        let entry = |lpn: u32| {
            (u64::from(lpn) < logical)
                .then(|| map.get_uncounted(lpn))
                .flatten()
                .unwrap_or(u32::MAX)
        };
        let old = t.written(page, ppn, entry);
        self.place_translation_page(page, ppn, old, filled);
        done_ns
    }

    /// Translation page `page` now lives at `ppn` (it lived at `old`).
    pub(super) fn place_translation_page(&mut self, page: u32, ppn: Ppn, old: Ppn, filled: bool) {
        if !old.is_none() {
            self.blocks.invalidate(old);
        }
        // In a translation superblock the reverse map holds translation page numbers.
        self.lpn_of_ppn[ppn.index()] = Lpn::new(page);
        self.blocks.mark_valid(ppn);
        if filled {
            self.blocks.close(self.geometry.superblock_of(ppn));
        }
    }

    /// When `lpn`'s entry may be read: at once, unless the mapping cache must read its
    /// translation page first.
    #[inline(always)]
    pub(super) fn lookup_ready(&mut self, lpn: Lpn, ready_ns: u64) -> u64 {
        match &self.translation {
            Some(t) if t.cache_capacity().is_some() => {
                let page = t.page_of(lpn);
                self.ensure_cached(page, ready_ns)
            }
            _ => ready_ns,
        }
    }
}
