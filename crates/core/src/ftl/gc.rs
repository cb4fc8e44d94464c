//! Garbage collection: a victim's valid pages read and programmed at its destination, then the
//! superblock erased; translation superblocks collected apart (GC of mapping data).

use super::mapping::MappingTable;
use super::{FdpEvent, FdpEventKind, Ftl};
use crate::addr::Ppn;
use crate::flash::{Cause, FlashOp, MAPPING_PLACEMENT};
use crate::request::Placement;

/// How many GC moves ahead the mapping entry is prefetched: enough to overlap cache misses.
const GC_PREFETCH_DISTANCE: usize = 32;
/// How many moves ahead the second stage (`MappingTable::prefetch_near`) runs: late enough that
/// the first stage's lines have arrived.
const GC_PREFETCH_NEAR: usize = 16;

impl<M: MappingTable> Ftl<M> {
    /// GC of one superblock of reclaim group `group` with at least `min_invalid` invalid pages
    /// (of placement `only` first, when given): its valid pages are read and programmed
    /// elsewhere, then its blocks are erased. The flash operations occupy the dies from
    /// `now_ns`; returns when the erase completes, or None when there is no victim.
    pub(super) fn collect_one(
        &mut self,
        group: u8,
        min_invalid: u32,
        only: Option<u8>,
        now_ns: u64,
    ) -> Option<u64> {
        let victim = self.blocks.pick_victim(group, min_invalid, only)?;
        let stream = self.blocks.stream_of(victim);
        if stream == MAPPING_PLACEMENT {
            return Some(self.collect_translation(victim, now_ns));
        }
        // Where this victim's pages go: decided once, not per page.
        let to = self.destination(
            Placement {
                reclaim_group: group,
                handle: stream,
            },
            Cause::Gc,
        );
        let base = victim * self.geometry.pages_per_superblock;
        // Gather the moves first: the reverse map is read sequentially, and each mapping entry
        // (a likely cache miss) is prefetched a few moves before it is updated.
        let mut moves = std::mem::take(&mut self.gc_moves);
        moves.clear();
        for (w, &word) in self.blocks.valid_words(victim).iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let ppn = Ppn::new(base + w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
                moves.push((ppn, self.lpn_of_ppn[ppn.index()]));
            }
        }
        for &(_, lpn) in moves.iter().take(GC_PREFETCH_DISTANCE) {
            self.map.prefetch(lpn.get());
        }
        for &(_, lpn) in moves.iter().take(GC_PREFETCH_NEAR) {
            self.map.prefetch_near(lpn.get());
        }
        let mut last_write_ns = now_ns;
        for i in 0..moves.len() {
            if let Some(&(_, ahead)) = moves.get(i + GC_PREFETCH_DISTANCE) {
                self.map.prefetch(ahead.get());
            }
            if let Some(&(_, ahead)) = moves.get(i + GC_PREFETCH_NEAR) {
                self.map.prefetch_near(ahead.get());
            }
            let (ppn, lpn) = moves[i];
            debug_assert_eq!(self.map.get_uncounted(lpn.get()), Some(ppn.get()));
            let read_ns = self
                .flash(FlashOp::Read { ppn }, Cause::Gc, stream, now_ns)
                .done_ns;
            let t = self.program(lpn, to, read_ns, Some(ppn));
            last_write_ns = last_write_ns.max(t.done_ns);
        }
        if !moves.is_empty() {
            let counts = self.stats.flash.placement_mut(stream);
            counts.relocations += 1;
            counts.relocated_pages += moves.len() as u64;
            self.stats.log_event(FdpEvent {
                time_ns: now_ns,
                kind: FdpEventKind::MediaRelocated,
                reclaim_group: group,
                placement: stream,
                reclaim_unit: victim,
                pages: moves.len() as u32,
            });
        }
        self.gc_moves = moves;
        debug_assert_eq!(self.blocks.valid_count(victim), 0);
        self.blocks.erase(victim);
        let erase = FlashOp::Erase { superblock: victim };
        let erased_ns = self.flash(erase, Cause::Gc, stream, now_ns).done_ns;
        Some(last_write_ns.max(erased_ns))
    }

    /// GC of a translation superblock: its valid translation pages move to the translation
    /// frontier (GC of mapping data, GMD), then it is erased.
    #[cold]
    #[inline(never)]
    pub(super) fn collect_translation(&mut self, victim: u32, now_ns: u64) -> u64 {
        let base = victim * self.geometry.pages_per_superblock;
        let mut done_ns = now_ns;
        for w in 0..self.blocks.valid_words(victim).len() {
            let mut bits = self.blocks.valid_words(victim)[w];
            while bits != 0 {
                let from = Ppn::new(base + w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
                let page = self.lpn_of_ppn[from.index()].get();
                let read_ns = self
                    .flash(
                        FlashOp::Read { ppn: from },
                        Cause::Gc,
                        MAPPING_PLACEMENT,
                        now_ns,
                    )
                    .done_ns;
                let (to, filled) =
                    self.allocate_at(self.mapping_frontier(), 0, MAPPING_PLACEMENT, read_ns);
                let t = self.flash(
                    FlashOp::Program { ppn: to },
                    Cause::Gc,
                    MAPPING_PLACEMENT,
                    read_ns,
                );
                done_ns = done_ns.max(t.done_ns);
                self.translation
                    .as_mut()
                    .expect("translation superblocks only when persisted")
                    .moved(page, from, to);
                self.place_translation_page(page, to, from, filled);
            }
        }
        debug_assert_eq!(self.blocks.valid_count(victim), 0);
        self.blocks.erase(victim);
        let erase = FlashOp::Erase { superblock: victim };
        done_ns.max(
            self.flash(erase, Cause::Gc, MAPPING_PLACEMENT, now_ns)
                .done_ns,
        )
    }
}
