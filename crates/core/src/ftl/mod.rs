//! The FTL core: host requests in, flash operations and completion times out.
//!
//! Owns: the mapping table, the reverse map, the block manager, the write frontiers, the write
//! buffer, GC, and the flash timelines. Does not know: where requests come from (trace, generator,
//! NBD socket), wall-clock time, or how results are reported. It is sans-IO: the caller passes the
//! simulated time a request arrives and gets back the time it completes.

pub mod block_manager;
pub mod mapping;
pub mod stats;
pub mod translation;
pub mod write_buffer;

use crate::addr::{Lpn, Ppn, NO_SUPERBLOCK};
use crate::config::Config;
use crate::flash::{transfer_ns, Cause, FlashOp, FlashTiming, OpTimes, MAPPING_PLACEMENT};
use crate::geometry::Geometry;
use crate::request::{Op, PageSpan, Request};
use block_manager::{BlockManager, SuperblockState};
use mapping::MappingTable;
pub use stats::FtlStats;
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
    #[error("stream {stream} does not exist (ftl.streams = {streams})")]
    NoSuchStream { stream: u8, streams: u32 },
}

#[derive(Clone, Copy, Debug)]
struct Frontier {
    superblock: u32,
    next_slot: u32,
}

pub struct Ftl<M: MappingTable> {
    geometry: Geometry,
    map: M,
    /// ppn -> lpn of the data last programmed there; meaningful only where the page is valid.
    lpn_of_ppn: Vec<Lpn>,
    blocks: BlockManager,
    /// Index `stream * 2 + (cause == Gc)`; with a shared GC frontier both indices alias the host one.
    frontiers: Vec<Frontier>,
    gc_separate_frontier: bool,
    timing: FlashTiming,
    buffer: WriteBuffer,
    host_page_ns: u64,
    streams: u32,
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
        // One frontier per stream (two with GC's apart), and the translation pages' last.
        let frontiers = config.ftl.streams as usize * 2 + usize::from(translation.is_some());
        Self {
            map,
            lpn_of_ppn: crate::table::filled(geometry.physical_pages as usize, Lpn::NONE),
            blocks: BlockManager::new(&geometry, config.ftl.gc_policy),
            frontiers: vec![
                Frontier {
                    superblock: NO_SUPERBLOCK,
                    next_slot: 0
                };
                frontiers
            ],
            gc_separate_frontier: config.ftl.gc_separate_frontier,
            timing: FlashTiming::new(&config.flash, &geometry),
            buffer: WriteBuffer::new(
                buffer_pages as u32,
                geometry.logical_pages,
                config.ftl.buffer_policy,
                geometry.entries_per_translation_page,
            ),
            host_page_ns: transfer_ns(page_bytes, config.ftl.host_interface_mb_per_s),
            streams: config.ftl.streams,
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
        if u32::from(request.stream) >= self.streams {
            return Err(FtlError::NoSuchStream {
                stream: request.stream,
                streams: self.streams,
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
                for lpn in span.touched() {
                    let partial = !span.is_whole(lpn);
                    let lpn = Lpn::new(lpn as u32);
                    let t = self.write_page(lpn, request.stream, partial, now_ns);
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

    fn write_page(&mut self, lpn: Lpn, stream: u8, partial: bool, now_ns: u64) -> u64 {
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
            return self.program_host_page(lpn, stream, ready_ns).done_ns + self.host_page_ns;
        }
        if self.buffer.contains(lpn) {
            self.stats.buffer_coalesced_pages += 1;
            return ready_ns + self.host_page_ns;
        }
        if self.buffer.is_full() {
            // The new page waits until the evicted one has left for its die.
            ready_ns = ready_ns.max(self.evict_one(now_ns));
        }
        self.buffer.push(lpn, stream);
        ready_ns + self.host_page_ns
    }

    /// Writes the buffer's next page to flash; returns when its slot is free.
    fn evict_one(&mut self, now_ns: u64) -> u64 {
        match self.buffer.pop_next(self.translation.as_ref()) {
            Some((lpn, stream)) if !lpn.is_none() => {
                self.program_host_page(lpn, stream, now_ns).transferred_ns
            }
            _ => now_ns,
        }
    }

    fn drain_buffer(&mut self, now_ns: u64) -> u64 {
        let mut done_ns = now_ns;
        while let Some((lpn, stream)) = self.buffer.pop_next(self.translation.as_ref()) {
            if !lpn.is_none() {
                done_ns = done_ns.max(self.program_host_page(lpn, stream, now_ns).done_ns);
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
        self.buffer.discard(lpn);
        if self.translation.is_some() && self.map.get_uncounted(lpn.get()).is_some() {
            // The entry changes: its translation page becomes dirty.
            self.make_dirty(lpn, now_ns);
        }
        if let Some(old) = self.map.remove(lpn.get()) {
            self.blocks.invalidate(Ppn::new(old));
        }
    }

    /// GC as the thresholds demand, then one host page to flash.
    fn program_host_page(&mut self, lpn: Lpn, stream: u8, ready_ns: u64) -> OpTimes {
        let mut ready_ns = ready_ns;
        while self.blocks.free_count() < self.gc_foreground_below {
            match self.collect_one(0, ready_ns) {
                Some(done) => {
                    self.stats.gc_foreground += 1;
                    ready_ns = ready_ns.max(done);
                }
                // Nothing reclaimable: as FEMU, give up until the next write. Below the reserve
                // this cannot happen (the geometry refuses such over-provisioning).
                None => {
                    assert!(
                        self.blocks.free_count() >= self.geometry.free_superblocks_min,
                        "no reclaimable superblock with the free pool below its reserve"
                    );
                    break;
                }
            }
        }
        if self.blocks.free_count() < self.gc_background_below
            && self
                .collect_one(self.gc_background_min_invalid, ready_ns)
                .is_some()
        {
            self.stats.gc_background += 1;
        }
        self.program(lpn, stream, ready_ns, None)
    }

    /// Greedy GC of one superblock with at least `min_invalid` invalid pages: its valid pages are
    /// read and programmed elsewhere, then its blocks are erased. The flash operations occupy the
    /// dies from `now_ns`; returns when the erase completes, or None when there is no victim.
    fn collect_one(&mut self, min_invalid: u32, now_ns: u64) -> Option<u64> {
        let victim = self.blocks.pick_victim(min_invalid)?;
        let stream = self.blocks.stream_of(victim);
        if stream == MAPPING_PLACEMENT {
            return Some(self.collect_translation(victim, now_ns));
        }
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
            let t = self.program(lpn, stream, read_ns, Some(ppn));
            last_write_ns = last_write_ns.max(t.done_ns);
        }
        self.gc_moves = moves;
        debug_assert_eq!(self.blocks.valid_count(victim), 0);
        self.blocks.erase(victim);
        let erase = FlashOp::Erase { superblock: victim };
        let erased_ns = self.flash(erase, Cause::Gc, stream, now_ns).done_ns;
        Some(last_write_ns.max(erased_ns))
    }

    /// Programs `lpn` at its stream's frontier and updates mapping, reverse map and validity.
    /// `moved_from`: None for a host write; for a GC move, the PPN it reads `lpn` from (the
    /// table need not look it up).
    #[inline(always)]
    fn program(&mut self, lpn: Lpn, stream: u8, ready_ns: u64, moved_from: Option<Ppn>) -> OpTimes {
        let cause = if moved_from.is_some() {
            Cause::Gc
        } else {
            Cause::Host
        };
        // The entry is about to change: a translation page that must become dirty may first
        // need another written back, and this program waits for it.
        let ready_ns = self.make_dirty(lpn, ready_ns);
        let (ppn, filled) = self.allocate(stream, cause);
        let times = self.flash(FlashOp::Program { ppn }, cause, stream, ready_ns);
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
        let (ppn, filled) = self.allocate_at(self.mapping_frontier(), MAPPING_PLACEMENT);
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
                let (to, filled) = self.allocate_at(self.mapping_frontier(), MAPPING_PLACEMENT);
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

    /// The next page of the frontier, and whether that page fills its superblock.
    #[inline]
    fn allocate(&mut self, stream: u8, cause: Cause) -> (Ppn, bool) {
        let index =
            stream as usize * 2 + usize::from(cause == Cause::Gc && self.gc_separate_frontier);
        self.allocate_at(index, stream)
    }

    /// The next page of frontier `index`, whose superblocks belong to `placement`.
    #[inline]
    fn allocate_at(&mut self, index: usize, placement: u8) -> (Ppn, bool) {
        let pps = self.geometry.pages_per_superblock;
        let mut f = self.frontiers[index];
        if f.superblock == NO_SUPERBLOCK {
            f.superblock = self
                .blocks
                .take_free(placement)
                .expect("free pool empty: GC reserve violated");
            self.stats.flash.unit_opened(placement);
            f.next_slot = 0;
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
        for f in &self.frontiers {
            if f.superblock != NO_SUPERBLOCK {
                assert_eq!(self.blocks.state(f.superblock), SuperblockState::Open);
            }
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
            r.stream = 1;
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
