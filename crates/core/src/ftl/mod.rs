//! The FTL core: host requests in, flash operations and completion times out.
//!
//! Owns: the mapping table, the reverse map, the block manager, the write frontiers, the write
//! buffer, GC, and the flash timelines. Does not know: where requests come from (trace, generator,
//! NBD socket), wall-clock time, or how results are reported. It is sans-IO: the caller passes the
//! simulated time a request arrives and gets back the time it completes.

pub mod block_manager;
mod frontier;
mod gc;
mod invariants;
pub mod mapping;
mod mapping_cache;
pub mod placer;
pub mod stats;
pub mod translation;
pub mod write_buffer;

use crate::addr::{Lpn, Ppn, NO_SUPERBLOCK};
use crate::config::{Config, GcScope};
use crate::flash::{transfer_ns, Cause, FlashOp, FlashTiming, OpTimes};
use crate::geometry::Geometry;
use crate::request::{Op, PageSpan, Placement, Request};
use block_manager::BlockManager;
use frontier::{Destination, Frontier};
use mapping::MappingTable;
use placer::Placer;
pub use placer::{ideal_handles, lifetimes_from_log};
pub use stats::{FdpEvent, FdpEventKind, FtlStats};
use translation::TranslationPages;
use write_buffer::WriteBuffer;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FtlError {
    #[error("request [{offset_bytes}, +{length_bytes}) ends beyond the logical capacity of {capacity_bytes} bytes")]
    OutOfRange {
        offset_bytes: u64,
        length_bytes: u64,
        capacity_bytes: u64,
    },
    #[error("placement handle {handle} does not exist (the device has {handles}: fdp.handles or ftl.streams)")]
    NoSuchHandle { handle: u8, handles: u32 },
    #[error("reclaim group {group} does not exist (fdp.reclaim_groups = {groups})")]
    NoSuchReclaimGroup { group: u8, groups: u32 },
}

/// Its whole state serialises (`save`, `load`): a live device's model is checkpointed so, and a
/// restart replays only the requests after the checkpoint.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Ftl<M: MappingTable> {
    geometry: Geometry,
    map: M,
    /// ppn -> lpn of the data last programmed there; meaningful only where the page is valid.
    #[serde(with = "crate::serde_state::words")]
    lpn_of_ppn: Vec<Lpn>,
    blocks: BlockManager,
    /// Reclaim group `g`'s frontiers from `g * frontiers_per_group`: handle `h`'s at `2h` (its
    /// GC's at `2h + 1`, used when GC has a frontier apart), then the initially isolated
    /// handles' shared GC frontier at `2 * handles`; the translation pages' is the last of all.
    frontiers: Vec<Frontier>,
    frontiers_per_group: usize,
    gc_separate_frontier: bool,
    timing: FlashTiming,
    buffer: WriteBuffer,
    host_page_ns: u64,
    handles: u32,
    reclaim_groups: u32,
    /// Bit `h`: handle `h` is persistently isolated.
    persistent_handles: u64,
    gc_scope: GcScope,
    placer: Placer,
    ru_time_limit_ns: u64,
    /// Foreground GC while fewer superblocks than this are free.
    gc_foreground_below: u32,
    /// Background GC while fewer superblocks than this are free.
    gc_background_below: u32,
    /// Background GC only takes victims with at least this many invalid pages (FEMU: 1/8).
    gc_background_min_invalid: u32,
    dirty_victim: crate::config::DirtyVictim,
    /// GC's list of (ppn, lpn) to move, kept to avoid allocating per victim.
    gc_moves: Vec<(Ppn, Lpn)>,
    /// The mapping table's durable copy in translation pages, when the protected ratio is
    /// below 1 (`translation.rs`); None: every change is protected, nothing is written back.
    translation: Option<TranslationPages>,
    stats: FtlStats,
}

/// What a power cut costs (`Ftl::power_cut`): the write buffer and the dirty translation pages
/// programmed on capacitor power.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerCut {
    pub buffered_pages: u64,
    pub dirty_translation_pages: u64,
    /// When the last of them is durable.
    pub done_ns: u64,
}

impl<M: MappingTable> Ftl<M> {
    /// An FTL for `config` on `geometry`, which `config.geometry()` validated and computed.
    pub fn new(config: &Config, geometry: Geometry, map: M) -> Self {
        let page_bytes = u64::from(geometry.page_size_bytes);
        let buffer_pages = (config.ftl.write_buffer_mib * (1u64 << 20) as f64) as u64 / page_bytes;
        let buffer_pages = buffer_pages
            .min(geometry.logical_pages)
            .min(u64::from(u32::MAX) - 1);
        let below = |free_at_most: Option<u32>| free_at_most.map_or(0, |f| f + 1);
        let gc_foreground_below =
            below(geometry.gc_foreground_free_superblocks).max(geometry.free_superblocks_min);
        let gc_background_below = below(geometry.gc_background_free_superblocks);
        let translation = geometry.protected_translation_pages.map(|budget| {
            let t = TranslationPages::new(
                geometry.entries_per_translation_page,
                geometry.translation_pages,
                budget,
                config.ftl.dirty_victim,
                false,
            );
            match geometry.cached_translation_pages {
                Some(capacity) => t.with_cache(capacity),
                None => t,
            }
        });
        let frontiers_per_group = geometry.handles as usize * 2 + 1;
        let frontiers = geometry.reclaim_groups as usize * frontiers_per_group
            + usize::from(translation.is_some());
        let placer = Placer::new(config.fdp.placement, &geometry);
        Self {
            map,
            lpn_of_ppn: crate::table::filled(geometry.physical_pages as usize, Lpn::NONE),
            blocks: BlockManager::new(&geometry, config.ftl.gc_policy),
            frontiers: vec![
                Frontier {
                    superblock: NO_SUPERBLOCK,
                    next_slot: 0,
                    opened_ns: 0,
                };
                frontiers
            ],
            frontiers_per_group,
            gc_separate_frontier: config.ftl.gc_separate_frontier,
            timing: FlashTiming::new(&config.flash, &geometry),
            buffer: WriteBuffer::new(
                buffer_pages as u32,
                geometry.logical_pages,
                config.ftl.buffer_policy,
                geometry.entries_per_translation_page,
            ),
            host_page_ns: transfer_ns(page_bytes, config.ftl.host_interface_mb_per_s),
            handles: geometry.handles,
            reclaim_groups: geometry.reclaim_groups,
            persistent_handles: geometry.persistent_handles,
            gc_scope: config.fdp.gc_scope,
            placer,
            ru_time_limit_ns: config.fdp.ru_time_limit_ns,
            gc_foreground_below,
            gc_background_below,
            gc_background_min_invalid: (geometry.pages_per_superblock / 8).max(1),
            dirty_victim: config.ftl.dirty_victim,
            gc_moves: Vec::with_capacity(geometry.pages_per_superblock as usize),
            translation,
            stats: FtlStats::default(),
            geometry,
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// After `Deserialize`: the geometry the configuration computes, in place of the saved one
    /// (whose precomputed divisors are not saved); the caller checked they describe the same.
    pub fn restore_geometry(&mut self, geometry: Geometry) {
        self.geometry = geometry;
    }

    pub fn stats(&self) -> &FtlStats {
        &self.stats
    }

    /// Starts the counts over (after preconditioning), the mapping table's own included.
    pub fn reset_stats(&mut self) {
        self.stats = FtlStats::default();
        self.timing.reset_busy();
        if let Some(t) = &mut self.translation {
            t.reset_max();
        }
        self.map.reset_activity();
    }

    pub fn mapping(&self) -> &M {
        &self.map
    }

    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    pub fn free_superblocks(&self) -> u32 {
        self.blocks.free_count()
    }

    pub fn timing(&self) -> &FlashTiming {
        &self.timing
    }

    /// DRAM of the FTL's own tables: mapping, reverse map, block metadata, buffer index.
    pub fn mapping_bytes(&self) -> usize {
        self.map.heap_bytes()
    }

    /// Folds the mapping table's pending updates into its compact form (`MappingTable::compact`):
    /// what it maps does not change, only how it is held.
    pub fn compact_mapping(&mut self) {
        self.map.compact();
    }

    pub fn metadata_bytes(&self) -> usize {
        self.map.heap_bytes()
            + self.lpn_of_ppn.capacity() * 4
            + self.blocks.heap_bytes()
            + self.buffer.heap_bytes()
            + self.translation.as_ref().map_or(0, |t| t.heap_bytes())
            + self.placer.heap_bytes()
    }

    /// Ideal placement (`fdp.placement = "ideal"`): the lifetime of each host page write to
    /// come, in order, counted in host page writes until the page is next overwritten or
    /// trimmed (u64::MAX: never), binned by [`ideal_handles`]. Pages beyond the list go to the
    /// coldest handle.
    pub fn use_lifetimes(&mut self, lifetimes: Vec<u64>) {
        self.placer.use_lifetimes(&lifetimes);
    }

    /// Records every host page write's LPN and every trim from now on, placing writes where
    /// the host asks: the first pass of ideal placement ([`lifetimes_from_log`]).
    pub fn record_writes(&mut self) {
        self.placer = Placer::record(&self.geometry);
    }

    /// The log `record_writes` kept (empty otherwise).
    pub fn take_write_log(&mut self) -> Vec<u64> {
        self.placer.take_write_log()
    }

    /// Pages still available in each handle's open reclaim units (host frontiers, all reclaim
    /// groups): FDP's "reclaim unit available media writes", by handle.
    pub fn available_media_writes(&self) -> Vec<u64> {
        let pps = u64::from(self.geometry.pages_per_superblock);
        let mut pages = vec![0; self.handles as usize];
        for g in 0..self.reclaim_groups as usize {
            for (h, pages) in pages.iter_mut().enumerate() {
                let f = self.frontiers[g * self.frontiers_per_group + 2 * h];
                if f.superblock != NO_SUPERBLOCK {
                    *pages += pps - u64::from(f.next_slot);
                }
            }
        }
        pages
    }

    /// The translation pages' books, when the mapping is persisted (protected ratio below 1).
    pub fn translation(&self) -> Option<&TranslationPages> {
        self.translation.as_ref()
    }

    /// Keeps every entry's durable copy (4 bytes per LPN), so that a check can compare what a
    /// restart after `power_cut` would read with what was acknowledged. Call before any write.
    pub fn keep_durable_copy(&mut self) {
        if let Some(t) = &self.translation {
            let fresh = TranslationPages::new(
                t.entries_per_page(),
                self.geometry.translation_pages,
                t.budget(),
                self.dirty_victim,
                true,
            );
            self.translation = Some(match t.cache_capacity() {
                Some(capacity) => fresh.with_cache(capacity),
                None => fresh,
            });
        }
    }

    /// Power fails at `now_ns`: on capacitor power the write buffer is programmed, then every
    /// dirty translation page. Afterwards the durable state (translation pages on flash) maps
    /// every acknowledged write.
    pub fn power_cut(&mut self, now_ns: u64) -> PowerCut {
        let buffered_pages = u64::from(self.buffer.len());
        let mut done_ns = self.drain_buffer(now_ns);
        let dirty = self
            .translation
            .as_ref()
            .map(|t| t.dirty_pages())
            .unwrap_or_default();
        for &page in &dirty {
            done_ns = done_ns.max(self.write_back(page, Cause::Mapping, now_ns));
        }
        PowerCut {
            buffered_pages,
            dirty_translation_pages: dirty.len() as u64,
            done_ns,
        }
    }

    /// Where `lpn` lives on flash now (None when unmapped), ignoring the write buffer. For
    /// checks: not a GET in the table's statistics.
    pub fn lookup(&self, lpn: Lpn) -> Option<Ppn> {
        self.map.get_uncounted(lpn.get()).map(Ppn::new)
    }

    pub fn is_buffered(&self, lpn: Lpn) -> bool {
        self.buffer.contains(lpn)
    }

    /// Hints for a driver that knows the next requests (`next`, then `after`): for `after`, two
    /// requests ahead, fetch the mapping entry of its first page; for `next` (whose entry has
    /// arrived), fetch the validity state of the page it will invalidate. Only the cache is
    /// touched.
    #[inline]
    pub fn prefetch_ahead(&self, next: Option<&Request>, after: Option<&Request>) {
        if let Some(r) = after {
            self.prefetch_mapping(r);
        }
        if let Some(r) = next {
            self.prefetch_block_state(r);
        }
    }

    #[inline]
    fn prefetch_mapping(&self, request: &Request) {
        let lpn = request.offset_bytes / u64::from(self.geometry.page_size_bytes);
        if lpn < self.geometry.logical_pages {
            self.map.prefetch(lpn as u32);
        }
    }

    #[inline]
    fn prefetch_block_state(&self, request: &Request) {
        let lpn = request.offset_bytes / u64::from(self.geometry.page_size_bytes);
        if request.op == Op::Write && lpn < self.geometry.logical_pages {
            if let Some(ppn) = self.map.peek(lpn as u32) {
                self.blocks.prefetch(Ppn::new(ppn));
            }
        }
    }

    /// Applies one host request arriving at `now_ns` and returns when it completes.
    pub fn submit(&mut self, request: &Request, now_ns: u64) -> Result<u64, FtlError> {
        let capacity_bytes = self.geometry.logical_bytes();
        let end = request.offset_bytes.checked_add(request.length_bytes);
        if request.op != Op::Flush && end.is_none_or(|e| e > capacity_bytes) {
            return Err(FtlError::OutOfRange {
                offset_bytes: request.offset_bytes,
                length_bytes: request.length_bytes,
                capacity_bytes,
            });
        }
        let placement = request.placement;
        if u32::from(placement.handle) >= self.handles {
            return Err(FtlError::NoSuchHandle {
                handle: placement.handle,
                handles: self.handles,
            });
        }
        if u32::from(placement.reclaim_group) >= self.reclaim_groups {
            return Err(FtlError::NoSuchReclaimGroup {
                group: placement.reclaim_group,
                groups: self.reclaim_groups,
            });
        }
        if request.op == Op::Flush {
            self.stats.flushes += 1;
            return Ok(self.drain_buffer(now_ns));
        }
        if request.length_bytes == 0 {
            return Ok(now_ns + self.host_page_ns);
        }
        let span = PageSpan::new(
            request.offset_bytes,
            request.length_bytes,
            u64::from(self.geometry.page_size_bytes),
        );
        let mut done_ns = now_ns;
        match request.op {
            Op::Write => {
                // The host's placement (the common case) is the request's, page after page.
                let by_host = self.placer.is_host();
                for lpn in span.touched() {
                    let partial = !span.is_whole(lpn);
                    let lpn = Lpn::new(lpn as u32);
                    let placement = if by_host {
                        placement
                    } else {
                        self.placer.place(placement, lpn)
                    };
                    let t = self.write_page(lpn, placement, partial, now_ns);
                    done_ns = done_ns.max(t);
                }
            }
            Op::Read => {
                for lpn in span.touched() {
                    done_ns = done_ns.max(self.read_page(Lpn::new(lpn as u32), now_ns));
                }
            }
            Op::Trim => {
                // Only whole pages are deallocated; the partial ends of a trim keep their data,
                // as an SSD with page-granular mapping does.
                for lpn in span.whole() {
                    self.trim_page(Lpn::new(lpn as u32), now_ns);
                }
                done_ns = now_ns + self.host_page_ns;
            }
            Op::Flush => unreachable!(),
        }
        Ok(done_ns)
    }

    fn read_page(&mut self, lpn: Lpn, now_ns: u64) -> u64 {
        self.stats.host_read_pages += 1;
        if self.buffer.contains(lpn) {
            self.stats.buffer_read_hits += 1;
            return now_ns + self.host_page_ns;
        }
        self.map.note_gets(1);
        let now_ns = self.lookup_ready(lpn, now_ns);
        match self.map.get(lpn.get()).map(Ppn::new) {
            Some(ppn) => {
                self.flash(FlashOp::Read { ppn }, Cause::Host, 0, now_ns)
                    .done_ns
                    + self.host_page_ns
            }
            // Never written or trimmed: zeros, no flash access.
            None => now_ns + self.host_page_ns,
        }
    }

    fn write_page(&mut self, lpn: Lpn, placement: Placement, partial: bool, now_ns: u64) -> u64 {
        self.stats.host_write_pages += 1;
        let mut ready_ns = now_ns;
        if partial && !self.buffer.contains(lpn) {
            self.map.note_gets(1);
            ready_ns = self.lookup_ready(lpn, ready_ns);
            if let Some(ppn) = self.map.get(lpn.get()).map(Ppn::new) {
                // Read-modify-write: the untouched part of the page comes from flash.
                ready_ns = self
                    .flash(FlashOp::Read { ppn }, Cause::ReadModifyWrite, 0, now_ns)
                    .done_ns;
            }
        }
        if !self.buffer.enabled() {
            return self.program_host_page(lpn, placement, ready_ns).done_ns + self.host_page_ns;
        }
        if self.buffer.contains(lpn) {
            self.stats.buffer_coalesced_pages += 1;
            self.buffer.replace_placement(lpn, placement);
            return ready_ns + self.host_page_ns;
        }
        if self.buffer.is_full() {
            // The new page waits until the evicted one has left for its die.
            ready_ns = ready_ns.max(self.evict_one(now_ns));
        }
        self.buffer.push(lpn, placement);
        ready_ns + self.host_page_ns
    }

    /// Writes the buffer's next page to flash; returns when its slot is free.
    fn evict_one(&mut self, now_ns: u64) -> u64 {
        match self.buffer.pop_next(self.translation.as_ref()) {
            Some((lpn, placement)) if !lpn.is_none() => {
                self.program_host_page(lpn, placement, now_ns)
                    .transferred_ns
            }
            _ => now_ns,
        }
    }

    fn drain_buffer(&mut self, now_ns: u64) -> u64 {
        let mut done_ns = now_ns;
        while let Some((lpn, placement)) = self.buffer.pop_next(self.translation.as_ref()) {
            if !lpn.is_none() {
                done_ns = done_ns.max(self.program_host_page(lpn, placement, now_ns).done_ns);
            }
        }
        done_ns
    }

    /// Writes every buffered page to flash, as at shutdown; returns when the last is durable.
    pub fn flush(&mut self, now_ns: u64) -> u64 {
        self.drain_buffer(now_ns)
    }

    fn trim_page(&mut self, lpn: Lpn, now_ns: u64) {
        self.stats.host_trim_pages += 1;
        self.placer.trimmed(lpn);
        self.buffer.discard(lpn);
        if self.translation.is_some() && self.map.get_uncounted(lpn.get()).is_some() {
            // The entry changes: its translation page becomes dirty.
            self.make_dirty(lpn, now_ns);
        }
        if let Some(old) = self.map.remove(lpn.get()) {
            self.blocks.invalidate(Ppn::new(old));
        }
    }

    /// GC of the placement's reclaim group as the thresholds demand, then one host page to
    /// flash.
    fn program_host_page(&mut self, lpn: Lpn, placement: Placement, ready_ns: u64) -> OpTimes {
        let mut ready_ns = ready_ns;
        let group = placement.reclaim_group;
        // GC scoped to a persistently isolated handle collects its superblocks first.
        let only = (self.gc_scope == GcScope::Handle && self.is_persistent(placement.handle))
            .then_some(placement.handle);
        while self.blocks.free_in(group) < self.gc_foreground_below {
            match self.collect_one(group, 0, only, ready_ns) {
                Some(done) => {
                    self.stats.gc_foreground += 1;
                    ready_ns = ready_ns.max(done);
                }
                // Nothing reclaimable: as FEMU, give up until the next write. Below the reserve
                // this cannot happen (the geometry refuses such over-provisioning).
                None => {
                    assert!(
                        self.blocks.free_in(group) >= self.geometry.free_superblocks_min,
                        "no reclaimable superblock with the free pool below its reserve"
                    );
                    break;
                }
            }
        }
        if self.blocks.free_in(group) < self.gc_background_below
            && self
                .collect_one(group, self.gc_background_min_invalid, only, ready_ns)
                .is_some()
        {
            self.stats.gc_background += 1;
        }
        if self.ru_time_limit_ns > 0 {
            self.enforce_time_limit(placement, ready_ns);
        }
        let to = self.destination(placement, Cause::Host);
        self.program(lpn, to, ready_ns, None)
    }

    /// Programs `lpn` at frontier `to` and updates mapping, reverse map and validity.
    /// `moved_from`: None for a host write; for a GC move, the PPN it reads `lpn` from (the
    /// table need not look it up).
    #[inline(always)]
    fn program(
        &mut self,
        lpn: Lpn,
        to: Destination,
        ready_ns: u64,
        moved_from: Option<Ppn>,
    ) -> OpTimes {
        let cause = if moved_from.is_some() {
            Cause::Gc
        } else {
            Cause::Host
        };
        // The entry is about to change: a translation page that must become dirty may first
        // need another written back, and this program waits for it.
        let ready_ns = self.make_dirty(lpn, ready_ns);
        let (ppn, filled) = self.allocate_at(to.index, to.group, to.placement, ready_ns);
        let times = self.flash(FlashOp::Program { ppn }, cause, to.placement, ready_ns);
        let old = match moved_from {
            Some(from) => {
                self.map.relocate(lpn.get(), from.get(), ppn.get());
                Some(from)
            }
            None => self.map.set(lpn.get(), ppn.get()).map(Ppn::new),
        };
        if let Some(old) = old {
            self.blocks.invalidate(old);
        }
        self.lpn_of_ppn[ppn.index()] = lpn;
        self.blocks.mark_valid(ppn);
        if filled {
            // Only now, with its last page valid, does it join the GC candidates.
            self.blocks.close(self.geometry.superblock_of(ppn));
        }
        times
    }

    /// Issues one flash operation, occupying its die (and channel) from `ready_ns`, and counts it
    /// under `cause` and `placement`: every flash operation the FTL makes goes through here. A
    /// read's or an erase's `transferred_ns` is its `done_ns`. Always inlined: each call site
    /// names its operation, so the match folds away (as a call it cost 15 % more instructions).
    #[inline(always)]
    fn flash(&mut self, op: FlashOp, cause: Cause, placement: u8, ready_ns: u64) -> OpTimes {
        let (times, units) = match op {
            FlashOp::Read { ppn } => {
                let done_ns = self.timing.read(self.geometry.die_of(ppn), ready_ns);
                (OpTimes::at(done_ns), 1)
            }
            FlashOp::Program { ppn } => {
                (self.timing.program(self.geometry.die_of(ppn), ready_ns), 1)
            }
            FlashOp::Erase { superblock } => {
                let first_die = self.geometry.first_die_of_superblock(superblock);
                let dies = self.geometry.superblock_dies;
                let done_ns = (first_die..first_die + dies)
                    .map(|die| self.timing.erase(die, ready_ns))
                    .max()
                    .unwrap_or(ready_ns);
                (OpTimes::at(done_ns), u64::from(dies))
            }
        };
        // Time runs forward: nothing completes before it was issued, nor is its data moved
        // after it completes.
        // A debug assertion (every test build has them): two compares per flash operation
        // cost the default job 2-4 % of its instructions in release.
        if cfg!(debug_assertions)
            && (times.transferred_ns < ready_ns || times.done_ns < times.transferred_ns)
        {
            time_ran_backwards(op, ready_ns, times);
        }
        self.stats.flash.record(op, cause, placement, units);
        times
    }
}

/// The panic of a flash operation that completed before it was issued, out of line so the
/// check costs the hot path two compares.
#[cold]
#[inline(never)]
fn time_ran_backwards(op: FlashOp, ready_ns: u64, times: OpTimes) -> ! {
    panic!("{op:?} issued at {ready_ns} ns: {times:?}")
}

#[cfg(test)]
mod tests;
