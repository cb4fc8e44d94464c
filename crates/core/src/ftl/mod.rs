//! The FTL core: host requests in, flash operations and completion times out.
//!
//! Owns: the mapping table, the reverse map, the block manager, the write frontiers, the write
//! buffer, GC, and the flash timelines. Does not know: where requests come from (trace, generator,
//! NBD socket), wall-clock time, or how results are reported. It is sans-IO: the caller passes the
//! simulated time a request arrives and gets back the time it completes.

pub mod block_manager;
pub mod mapping;
pub mod placer;
pub mod stats;
pub mod translation;
pub mod write_buffer;

use crate::addr::{Lpn, Ppn, NO_SUPERBLOCK};
use crate::config::{Config, GcScope};
use crate::flash::{
    transfer_ns, Cause, FlashOp, FlashTiming, OpTimes, MAPPING_PLACEMENT, SHARED_GC_PLACEMENT,
};
use crate::geometry::Geometry;
use crate::request::{Op, PageSpan, Placement, Request};
use block_manager::{BlockManager, SuperblockState};
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

#[derive(Clone, Copy, Debug)]
struct Frontier {
    superblock: u32,
    next_slot: u32,
    /// When its reclaim unit was opened (for the RU time limit).
    opened_ns: u64,
}

/// A frontier to program at: its index, the reclaim group its superblocks come from, and the
/// placement they belong to.
#[derive(Clone, Copy, Debug)]
struct Destination {
    index: usize,
    group: u8,
    placement: u8,
}

pub struct Ftl<M: MappingTable> {
    geometry: Geometry,
    map: M,
    /// ppn -> lpn of the data last programmed there; meaningful only where the page is valid.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerCut {
    pub buffered_pages: u64,
    pub dirty_translation_pages: u64,
    /// When the last of them is durable.
    pub done_ns: u64,
}

/// How many GC moves ahead the mapping entry is prefetched: enough to overlap cache misses.
const GC_PREFETCH_DISTANCE: usize = 32;
/// How many moves ahead the second stage (`MappingTable::prefetch_near`) runs: late enough that
/// the first stage's lines have arrived.
const GC_PREFETCH_NEAR: usize = 16;

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

    /// Whether handle (placement) `handle` is persistently isolated.
    #[inline(always)]
    fn is_persistent(&self, handle: u8) -> bool {
        handle < 64 && self.persistent_handles >> handle & 1 != 0
    }

    /// Closes the placement's open host reclaim unit unfilled if it has been open longer than
    /// the time limit (an "RU time limit exceeded" event); its next write opens another.
    #[cold]
    #[inline(never)]
    fn enforce_time_limit(&mut self, placement: Placement, now_ns: u64) {
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

    /// GC of one superblock of reclaim group `group` with at least `min_invalid` invalid pages
    /// (of placement `only` first, when given): its valid pages are read and programmed
    /// elsewhere, then its blocks are erased. The flash operations occupy the dies from
    /// `now_ns`; returns when the erase completes, or None when there is no victim.
    fn collect_one(
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
        self.stats.flash.record(op, cause, placement, units);
        times
    }

    /// `lpn`'s entry is about to change: its translation page becomes dirty, after writing
    /// another back if the protected budget is full. Returns when the change may proceed.
    #[inline(always)]
    fn make_dirty(&mut self, lpn: Lpn, ready_ns: u64) -> u64 {
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
    fn ensure_cached(&mut self, page: u32, ready_ns: u64) -> u64 {
        let hit = self.translation.as_mut().is_none_or(|t| t.use_cached(page));
        if hit {
            ready_ns
        } else {
            self.cache_miss(page, ready_ns)
        }
    }

    #[cold]
    #[inline(never)]
    fn cache_miss(&mut self, page: u32, ready_ns: u64) -> u64 {
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
    fn write_back(&mut self, page: u32, cause: Cause, ready_ns: u64) -> u64 {
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
    fn place_translation_page(&mut self, page: u32, ppn: Ppn, old: Ppn, filled: bool) {
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
    fn lookup_ready(&mut self, lpn: Lpn, ready_ns: u64) -> u64 {
        match &self.translation {
            Some(t) if t.cache_capacity().is_some() => {
                let page = t.page_of(lpn);
                self.ensure_cached(page, ready_ns)
            }
            _ => ready_ns,
        }
    }

    /// The translation pages' frontier: the last one.
    fn mapping_frontier(&self) -> usize {
        self.frontiers.len() - 1
    }

    /// GC of a translation superblock: its valid translation pages move to the translation
    /// frontier (GC of mapping data, GMD), then it is erased.
    #[cold]
    #[inline(never)]
    fn collect_translation(&mut self, victim: u32, now_ns: u64) -> u64 {
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

    /// Frontier index of the placement's host writes.
    #[inline(always)]
    fn host_frontier(&self, placement: Placement) -> usize {
        usize::from(placement.reclaim_group) * self.frontiers_per_group
            + 2 * usize::from(placement.handle)
    }

    /// Where data of `placement` written for `cause` goes: the handle's own frontier, except GC
    /// moves of initially isolated handles' data (and of the superblocks they share), which go
    /// to the group's shared GC frontier.
    #[inline(always)]
    fn destination(&self, placement: Placement, cause: Cause) -> Destination {
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
    #[inline]
    fn allocate_at(&mut self, index: usize, group: u8, placement: u8, now_ns: u64) -> (Ppn, bool) {
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
        let ppn = Ppn::new(f.superblock * pps + f.next_slot);
        f.next_slot += 1;
        let filled = f.next_slot == pps;
        if filled {
            f.superblock = NO_SUPERBLOCK;
        }
        self.frontiers[index] = f;
        (ppn, filled)
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigBuilder;
    use crate::flash::Cause;
    use crate::ftl::mapping::FlatMapping;

    /// Every program, read and erase lands under its cause and placement: host pages under the
    /// stream that wrote them, GC's under the stream of the victim it cleaned, and the report's
    /// totals are the sums.
    #[test]
    fn flash_work_is_counted_by_cause_and_placement() {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in [
            "flash.channels=2",
            "flash.dies_per_channel=2",
            "flash.blocks_per_die=32",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.25",
            "ftl.streams=2",
        ] {
            b.set(s).unwrap();
        }
        let config = b.build().unwrap();
        let g = config.geometry().unwrap();
        let mut ftl = Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages));
        let page = u64::from(g.page_size_bytes);
        let pages = g.logical_pages;
        // Stream 1 fills the device once, then stream 0 overwrites it three times (GC runs), a
        // partial write reads its old page, and a read reads one.
        let mut now = 0;
        for lpn in 0..pages {
            let mut r = Request::new(now, Op::Write, lpn * page, page);
            r.placement = Placement::handle(1);
            now = ftl.submit(&r, now).unwrap();
        }
        let mut rng = crate::rng::SplitMix64::new(7);
        for _ in 0..3 * pages {
            let lpn = rng.bounded(pages);
            now = ftl
                .submit(&Request::new(now, Op::Write, lpn * page, page), now)
                .unwrap();
        }
        now = ftl
            .submit(&Request::new(now, Op::Write, 512, 512), now)
            .unwrap();
        ftl.submit(&Request::new(now, Op::Read, page, page), now)
            .unwrap();
        ftl.check_invariants();

        let s = ftl.stats();
        let f = &s.flash;
        let at = |p: usize| &f.placements()[p];
        assert_eq!(at(1).program_pages[Cause::Host as usize], pages);
        assert_eq!(at(0).program_pages[Cause::Host as usize], 3 * pages + 1);
        assert!(s.gc_write_pages() > 0 && s.erases() > 0, "{s:?}");
        // GC moved pages of both streams' superblocks, and erased blocks of both.
        for p in 0..2 {
            assert!(at(p).program_pages[Cause::Gc as usize] > 0, "{s:?}");
            assert!(at(p).erased_blocks[Cause::Gc as usize] > 0, "{s:?}");
        }
        assert_eq!(s.gc_read_pages(), s.gc_write_pages());
        assert_eq!(s.rmw_read_pages(), 1);
        assert_eq!(s.host_flash_read_pages(), 1);
        assert_eq!(s.mapping_write_pages(), 0);
        assert_eq!(
            s.erases() % u64::from(g.superblock_dies),
            0,
            "a superblock erase is one block per die"
        );
        assert_eq!(
            s.nand_write_pages(),
            s.host_program_pages() + s.gc_write_pages() + s.mapping_write_pages()
        );
        assert_eq!(s.host_program_pages(), s.host_write_pages);
    }
}

#[cfg(test)]
mod translation_tests {
    use super::*;
    use crate::config::ConfigBuilder;
    use crate::ftl::mapping::FlatMapping;

    /// A device of 48 superblocks of 8 pages, translation pages of 8 entries, with `extra`
    /// settings; its FTL keeps the durable copy.
    fn small_device(extra: &[&str]) -> (Geometry, Ftl<FlatMapping>) {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        let base = [
            "flash.channels=2",
            "flash.dies_per_channel=1",
            "flash.blocks_per_die=24",
            "flash.pages_per_block=8",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.5",
            "ftl.mapping_entry_bytes=512",
        ];
        for s in base.iter().chain(extra) {
            b.set(s).unwrap();
        }
        let config = b.build().unwrap();
        let g = config.geometry().unwrap();
        let mut ftl = Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages));
        ftl.keep_durable_copy();
        (g, ftl)
    }

    /// A small device with a tiny protected budget, overwritten many times: translation pages
    /// are written back (MD), their superblocks fill with stale copies and GC collects them
    /// (GMD), and every invariant (the durable copy's included) holds throughout.
    #[test]
    fn translation_superblocks_are_collected_like_data() {
        let (g, mut ftl) = small_device(&["ftl.protected_ratio=0.1"]);
        let mut rng = crate::rng::SplitMix64::new(3);
        let mut now = 0;
        for i in 0..20 * g.logical_pages {
            let lpn = rng.bounded(g.logical_pages);
            let r = Request::new(now, Op::Write, lpn * 4096, 4096);
            now = ftl.submit(&r, now).unwrap();
            if i % 97 == 0 {
                ftl.check_invariants();
            }
        }
        ftl.check_invariants();
        let s = ftl.stats();
        assert!(s.mapping_write_pages() > 0, "{s:?}");
        assert!(
            s.gc_mapping_write_pages() > 0,
            "no translation superblock collected: {s:?}"
        );
        assert!(s.gc_user_write_pages() > 0, "{s:?}");
        let t = ftl.translation().unwrap();
        assert!(t.max_dirty() <= t.budget());
    }

    /// A cache of two translation pages: lookups of uncached pages read them from flash (map
    /// reads), dropping others (written back when dirty), and the durable copy stays right.
    #[test]
    fn a_small_mapping_cache_reads_translation_pages_on_misses() {
        let (g, mut ftl) = small_device(&["ftl.mapping_cache_bytes=8192"]);
        assert_eq!(g.cached_translation_pages, Some(2));
        let mut rng = crate::rng::SplitMix64::new(5);
        let mut now = 0;
        for _ in 0..5 * g.logical_pages {
            let lpn = rng.bounded(g.logical_pages);
            let op = if rng.bounded(3) == 0 {
                Op::Read
            } else {
                Op::Write
            };
            now = ftl
                .submit(&Request::new(now, op, lpn * 4096, 4096), now)
                .unwrap();
            ftl.check_invariants();
        }
        let s = ftl.stats();
        assert!(s.flash.read_pages(Cause::Mapping) > 0, "no map read: {s:?}");
        assert!(s.mapping_write_pages() > 0, "{s:?}");
        ftl.power_cut(now);
        ftl.check_invariants();
    }
}

#[cfg(test)]
mod fdp_tests {
    use super::*;
    use crate::config::ConfigBuilder;
    use crate::flash::Cause;
    use crate::ftl::mapping::FlatMapping;

    /// A device of 2 channels x 32 blocks of 8 pages, one die per superblock, with `extra`.
    fn device(extra: &[&str]) -> Ftl<FlatMapping> {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        let base = [
            "flash.channels=2",
            "flash.dies_per_channel=1",
            "flash.blocks_per_die=32",
            "flash.pages_per_block=8",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.5",
        ];
        for s in base.iter().chain(extra) {
            b.set(s).unwrap();
        }
        let config = b.build().unwrap();
        let g = config.geometry().unwrap();
        Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages))
    }

    fn write(ftl: &mut Ftl<FlatMapping>, lpn: u64, placement: Placement, now: u64) -> u64 {
        let mut r = Request::new(now, Op::Write, lpn * 4096, 4096);
        r.placement = placement;
        ftl.submit(&r, now).unwrap()
    }

    /// Handle 0 (initially isolated) and handle 1 (persistently isolated) churn: GC moves
    /// handle 0's data into the shared GC reclaim units (254), handle 1's only into its own,
    /// and the FDP counts (media relocated) see it.
    #[test]
    fn gc_mixes_only_initially_isolated_handles() {
        let mut ftl = device(&["fdp.handles=[\"initial\", \"persistent\"]"]);
        let logical = ftl.geometry().logical_pages;
        let mut rng = crate::rng::SplitMix64::new(11);
        let mut now = 0;
        let mut handle_of = vec![0u8; logical as usize];
        for _ in 0..8 * logical {
            let lpn = rng.bounded(logical);
            let h = (lpn % 2) as u8;
            handle_of[lpn as usize] = h;
            now = write(&mut ftl, lpn, Placement::handle(h), now);
        }
        ftl.check_invariants();
        ftl.check_isolation(|lpn| handle_of[lpn.index()]);
        let p = ftl.stats().flash.placements();
        assert!(p[usize::from(SHARED_GC_PLACEMENT)].program_pages[Cause::Gc as usize] > 0);
        assert_eq!(
            p[0].program_pages[Cause::Gc as usize],
            0,
            "handle 0's GC goes to 254"
        );
        assert!(
            p[1].program_pages[Cause::Gc as usize] > 0,
            "handle 1's GC stays in it"
        );
        assert!(p[0].relocations > 0 && p[1].relocations > 0);
        assert!(ftl.stats().fdp_events.len() <= stats::FDP_EVENT_LOG);
        assert!(ftl
            .stats()
            .fdp_events
            .iter()
            .any(|e| e.kind == FdpEventKind::MediaRelocated));
    }

    /// Two reclaim groups: each write's data stays in its group's superblocks through GC.
    #[test]
    fn reclaim_groups_keep_their_data() {
        let mut ftl = device(&["fdp.reclaim_groups=2"]);
        let logical = ftl.geometry().logical_pages;
        let mut rng = crate::rng::SplitMix64::new(12);
        let mut now = 0;
        for _ in 0..6 * logical {
            let lpn = rng.bounded(logical);
            let placement = Placement {
                reclaim_group: (lpn % 2) as u8,
                handle: 0,
            };
            now = write(&mut ftl, lpn, placement, now);
        }
        ftl.check_invariants();
        assert!(ftl.stats().gc_write_pages() > 0);
        let g = ftl.geometry().clone();
        for lpn in 0..logical {
            if let Some(ppn) = ftl.lookup(Lpn::new(lpn as u32)) {
                assert_eq!(
                    u64::from(ftl.blocks().group_of(g.superblock_of(ppn))),
                    lpn % 2,
                    "lpn {lpn}"
                );
            }
        }
        // A group that does not exist is refused.
        let mut r = Request::new(now, Op::Write, 0, 4096);
        r.placement.reclaim_group = 2;
        assert_eq!(
            ftl.submit(&r, now),
            Err(FtlError::NoSuchReclaimGroup {
                group: 2,
                groups: 2
            })
        );
    }

    /// A reclaim unit open past the time limit is closed unfilled at its handle's next write:
    /// an event, counted, with the pages it left unwritten.
    #[test]
    fn the_ru_time_limit_closes_a_slow_reclaim_unit() {
        let mut ftl = device(&["fdp.ru_time_limit_ns=1000000"]);
        write(&mut ftl, 0, Placement::default(), 0);
        write(&mut ftl, 1, Placement::default(), 10);
        // 2 ms later: the unit opened at 0 is past its 1 ms.
        write(&mut ftl, 2, Placement::default(), 2_000_000);
        let s = ftl.stats();
        assert_eq!(s.flash.placements()[0].units_closed_unfilled, 1);
        assert_eq!(s.flash.placements()[0].units_opened, 2);
        let e = s.fdp_events.back().unwrap();
        assert_eq!(e.kind, FdpEventKind::RuTimeLimitExceeded);
        assert_eq!(e.pages, 8 - 2);
        ftl.check_invariants();
    }

    /// Auto placement: pages rewritten often go to the hot handle, pages written once to the
    /// coldest; the host's placement is ignored.
    #[test]
    fn auto_placement_separates_by_rewrite_interval() {
        let mut ftl = device(&["ftl.streams=2", "fdp.placement=\"auto\""]);
        let logical = ftl.geometry().logical_pages;
        let mut now = 0;
        // LPN 0 rewritten every other write; LPNs 1.. written once each.
        for lpn in 1..logical / 2 {
            now = write(&mut ftl, 0, Placement::handle(1), now);
            now = write(&mut ftl, lpn, Placement::handle(0), now);
        }
        let p = ftl.stats().flash.placements();
        let hot = p[0].program_pages[Cause::Host as usize];
        let cold = p[1].program_pages[Cause::Host as usize];
        // Every rewrite of LPN 0 (all but its first write) is hot; every other page is cold.
        assert_eq!(hot, logical / 2 - 2);
        assert_eq!(cold, logical / 2);
    }

    /// Handle-scoped GC: writes of handle 1 that need room collect handle 1's superblocks,
    /// and take handle 0's (emptier, all invalid) only when handle 1 has none to give; with
    /// device scope they take handle 0's first.
    #[test]
    fn handle_scoped_gc_collects_the_writers_own_superblocks() {
        let mut erased_in_phase_two = Vec::new();
        for scope in ["device", "handle"] {
            let mut ftl = device(&["ftl.streams=2", &format!("fdp.gc_scope=\"{scope}\"")]);
            let logical = ftl.geometry().logical_pages;
            let mut now = 0;
            // Handle 0 writes the first half twice (its first copies become garbage); then
            // handle 1 fills and rewrites the second half.
            let half = logical / 2;
            for _ in 0..2 {
                for lpn in 0..half {
                    now = write(&mut ftl, lpn, Placement::handle(0), now);
                }
            }
            let erased = |ftl: &Ftl<FlatMapping>| {
                ftl.stats().flash.placements()[0].erased_blocks[Cause::Gc as usize]
            };
            let before = erased(&ftl);
            let mut rng = crate::rng::SplitMix64::new(3);
            for _ in 0..4 * half {
                let lpn = half + rng.bounded(half);
                now = write(&mut ftl, lpn, Placement::handle(1), now);
            }
            ftl.check_invariants();
            erased_in_phase_two.push(erased(&ftl) - before);
        }
        let (device, handle) = (erased_in_phase_two[0], erased_in_phase_two[1]);
        assert!(handle < device, "handle 0's superblocks erased by handle 1's writes: device scope {device}, handle scope {handle}");
    }

    /// Lifetimes from a log: a write's lifetime ends at its LPN's next write or trim.
    #[test]
    fn lifetimes_count_host_writes_to_the_next_write_or_trim() {
        // Writes: 0:a, 1:b, 2:a, (trim b), 3:c, 4:a.
        let (a, b, c) = (0u64, 1u64, 2u64);
        let log = [a, b, a, b | placer::TRIMMED, c, a];
        assert_eq!(
            lifetimes_from_log(&log, 3),
            vec![2, 2, 2, u64::MAX, u64::MAX]
        );
    }

    /// Ideal placement on two handles, fed the lifetimes of its own run, puts the pages that
    /// die soon in handle 0 and the long-lived in handle 1, and beats host placement that
    /// knows nothing (everything in handle 0).
    #[test]
    fn ideal_placement_uses_the_recorded_lifetimes() {
        let run = |ideal: Option<Vec<u64>>| {
            let mut ftl = device(&["ftl.streams=2", "fdp.placement=\"ideal\""]);
            match ideal {
                Some(l) => ftl.use_lifetimes(l),
                None => ftl.record_writes(),
            }
            let logical = ftl.geometry().logical_pages;
            let mut rng = crate::rng::SplitMix64::new(9);
            let mut now = 0;
            // A hot tenth of the space takes 90 % of the writes.
            for lpn in 0..logical {
                now = write(&mut ftl, lpn, Placement::default(), now);
            }
            for _ in 0..10 * logical {
                let lpn = if rng.bounded(10) < 9 {
                    rng.bounded(logical / 10)
                } else {
                    rng.bounded(logical)
                };
                now = write(&mut ftl, lpn, Placement::default(), now);
            }
            ftl.check_invariants();
            let log = ftl.take_write_log();
            (ftl.stats().waf().unwrap(), log, logical)
        };
        let (host_waf, log, logical) = run(None);
        assert_eq!(log.len() as u64, 11 * logical);
        let (ideal_waf, _, _) = run(Some(lifetimes_from_log(&log, logical)));
        assert!(
            ideal_waf < host_waf,
            "ideal {ideal_waf} against host {host_waf}"
        );
    }

    /// Ideal bins hold equal shares of the writes, shortest lifetimes first; equal lifetimes
    /// share a bin; never-overwritten data lands in the last.
    #[test]
    fn ideal_bins_are_quantiles_of_the_lifetimes() {
        let lifetimes = [5, 1, 100, u64::MAX, 7, 2, 50, u64::MAX];
        assert_eq!(ideal_handles(&lifetimes, 4), vec![1, 0, 2, 3, 1, 0, 2, 3]);
        assert_eq!(ideal_handles(&lifetimes, 1), vec![0; 8]);
        assert_eq!(ideal_handles(&[3, 3, 3, 3], 2), vec![1; 4]);
    }
}
