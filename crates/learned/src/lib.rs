//! The `learned` table: a lossless, compressed LPN -> PPN map.
//!
//! The LPN space is cut into groups of `GROUP_LPNS`. Each group's mappings live in one blob, in the
//! encoding `group.rs` chooses for it: the learned one (`segments.rs`: the mapped LPNs as runs,
//! holes costing nothing per LPN, and over their ranks error-bounded piecewise-linear segments,
//! `fit.rs`, with bit-packed non-negative residuals), a run list, bitmap words, or one of those
//! with its outliers listed apart. Updates go first to a small per-group buffer of runs
//! (`delta.rs`), which is merged into the group's blob when the buffer as a whole exceeds its bound
//! (`merge.rs`): a buffered group holding at least the mean share is decoded to runs, the buffered
//! runs laid over them, and the group re-encoded. The bound is a fraction of the live mappings, so
//! the compressed layer, not the buffer, answers most lookups (`compressed_get_fraction`). A
//! one-entry cursor (`Span`) remembers the range the last lookup resolved, so sequential lookups
//! and updates skip the searches; and where that range ended in its blob (`Follow`), so a lookup of
//! the LPN right after it does too.
//!
//! Must not know: flash geometry beyond the LPN count, timing, or where PPNs come from.

mod bits;
mod cursor;
mod delta;
mod delta_index;
mod elias_fano;
pub mod fit;
pub mod group;
mod merge;
mod packed;
pub mod patches;
mod run_list;
mod segments;
pub mod store;
pub mod words;
mod write_times;

mod buffer;
mod lookup;
mod tail;

use tail::{tail_off, Tail};

#[cfg(any(test, feature = "oracle"))]
pub mod oracle;

use bits::{
    clear_around, is_buffered_bit, runs_clear_around, runs_hold, set_bits, BitsPool, BufferedBits,
    BITS_ABOVE_RUNS, BOUND_SCAN_WORDS, NO_BITS,
};
use cursor::{ppn_off, Follow, Span, NO_PPN_OFF};
use delta::{Delta, DeltaRun};
use delta_index::DeltaIndex;
use ftlab_core::ftl::mapping::runs::{self, Run};
use ftlab_core::ftl::mapping::MappingTable;
use merge::{MergeScratch, MIN_BUFFER_GROUPS, UNBOUNDED_BLOB_BYTES};
use std::cell::Cell;
use store::GroupStore;
use write_times::WriteTimes;

pub const GROUP_SHIFT: u32 = 12;
pub const GROUP_LPNS: usize = 1 << GROUP_SHIFT;
const OFFSET_MASK: u32 = GROUP_LPNS as u32 - 1;
/// No group has this number (groups are < 2^20).
const NO_LAST_DELTA: (u32, u32) = (u32::MAX, u32::MAX);
/// A buffered trim: the LPN is unmapped even if its group's blob still maps it.
const TOMBSTONE: u32 = u32::MAX;

/// The buffer may hold this many LPNs at least...
pub const BUFFER_MIN_ENTRIES: u64 = 256;
/// ...or one in this many live mappings, whichever is more (the default of
/// `LearnedMapping::buffer_live_divisor`)...
pub const BUFFER_LIVE_DIVISOR: u64 = 16;
/// ...but never more than this (8 MiB of runs at worst, on any device size).
pub const BUFFER_MAX_ENTRIES: u64 = 1 << 20;

/// The fewest runs a delta's list grows by (see `write_delta_slow`).
const MIN_RUNS_GROWTH: usize = 8;
pub use ftlab_core::ftl::mapping::activity::{GroupEncodings, LearnedActivity, LearnedStats};

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct LearnedMapping {
    groups: GroupStore,
    /// Group -> index in `deltas`, for groups with buffered updates.
    delta_index: DeltaIndex,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    deltas: Vec<Delta>,
    /// Which offsets each delta of many runs holds (`Delta::bits`).
    bits_pool: BitsPool,
    /// The deltas' run lists' capacities, in bytes (so `heap_bytes` is O(1)).
    run_bytes: usize,
    /// `heap_bytes` at its largest so far (`peak_heap_bytes`).
    peak_bytes: usize,
    /// Buffered writes of PPNs so far, while `write_times` is kept (restarted before it wraps).
    buffer_clock: u32,
    write_times: WriteTimes,
    buffered_entries: u64,
    /// Where the search for the next delta to merge resumes.
    clock: usize,
    /// (group, index in `deltas`) of the last delta written: runs of updates skip the hash.
    last_delta: (u32, u32),
    tail: Tail,
    live: u64,
    buffer_min_entries: u64,
    /// The fewest groups the buffer may hold (`MIN_BUFFER_GROUPS`; tests lower it).
    buffer_min_groups: u64,
    /// The bound on groups as of the last check (`merge_while_over_bound`): deferred trims lower
    /// the live count, and with it the bound, without a check, but add no group.
    buffer_group_cap: usize,
    /// Deltas whose `small` is set: those the bound on groups counts.
    small_deltas: usize,
    /// The buffer may hold one in `2^this` live mappings (`BUFFER_LIVE_DIVISOR` unless set; a
    /// shift, as the bound is checked on every update that is not a stream's).
    buffer_live_shift: u32,
    /// Lookups (`get`) the caller made, as `note_gets` was told.
    gets: Cell<u64>,
    /// Lookups the buffer answered (the rare case, so the common one writes one counter).
    buffered_gets: Cell<u64>,
    /// Lookups the cursor (`span`) did not answer (counted on that slower path only).
    get_cursor_misses: Cell<u64>,
    span: Cell<Span>,
    follow: Cell<Follow>,
    /// What the last lookup made for an update learned of its LPN's blob (`group::Lookup::room`):
    /// the PPNs that could go in place. Only a hint (`update_in_place` checks again).
    room_hint: Cell<(u32, (u32, u32))>,
    stats: LearnedStats,
}

impl LearnedMapping {
    pub fn new(logical_pages: u64) -> Self {
        Self::with_buffer(logical_pages, BUFFER_MIN_ENTRIES)
    }

    /// A table whose buffer holds at least `buffer_min_entries` LPNs before merging (tests use
    /// tiny buffers to merge often).
    pub fn with_buffer(logical_pages: u64, buffer_min_entries: u64) -> Self {
        assert!(logical_pages <= 1 << 32, "LPNs are u32");
        assert!(buffer_min_entries <= 1 << 32, "the tail's budget is a u32");
        let groups = logical_pages.div_ceil(GROUP_LPNS as u64) as usize;
        Self {
            groups: GroupStore::new(groups),
            delta_index: DeltaIndex::new(groups),
            deltas: Vec::new(),
            bits_pool: BitsPool::default(),
            run_bytes: 0,
            peak_bytes: 0,
            buffer_clock: 0,
            write_times: WriteTimes::default(),
            buffered_entries: 0,
            clock: 0,
            last_delta: NO_LAST_DELTA,
            tail: Tail::NONE,
            live: 0,
            buffer_min_entries,
            buffer_min_groups: MIN_BUFFER_GROUPS,
            buffer_group_cap: MIN_BUFFER_GROUPS as usize,
            small_deltas: 0,
            buffer_live_shift: BUFFER_LIVE_DIVISOR.trailing_zeros(),
            gets: Cell::new(0),
            buffered_gets: Cell::new(0),
            get_cursor_misses: Cell::new(0),
            span: Cell::new(Span::default()),
            follow: Cell::new(Follow::NONE),
            room_hint: Cell::new((0, group::NO_ROOM)),
            stats: LearnedStats::default(),
        }
    }

    /// The same table with a buffer of up to one in `divisor` live mappings (a power of two; the
    /// default is `BUFFER_LIVE_DIVISOR`): a larger buffer merges less often and answers more
    /// lookups itself (`ftlab mapbench --learned-buffer-divisor`, docs/mapping.md).
    pub fn buffer_live_divisor(mut self, divisor: u64) -> Self {
        assert!(divisor.is_power_of_two(), "buffer divisor {divisor}");
        self.buffer_live_shift = divisor.trailing_zeros();
        self
    }

    /// The same table whose buffer may be held to as few as `groups` groups (at least 1; the
    /// default is 64): tests over a few groups use it to reach that bound.
    pub fn buffer_min_groups(mut self, groups: u64) -> Self {
        self.buffer_min_groups = groups.max(1);
        self
    }

    pub fn stats(&self) -> &LearnedStats {
        &self.stats
    }

    /// Groups holding mappings, by encoding: run lists, segments, bitmap words, patched (any
    /// of those three with outliers listed apart).
    pub fn encodings(&self) -> [u64; 4] {
        let mut counts = [0; 4];
        for g in 0..self.groups.groups() as u32 {
            if let Some(blob) = self.groups.blob(g) {
                counts[group::encoding(blob) as usize] += 1;
            }
        }
        counts
    }

    /// The statistics and encodings as `LearnedActivity` (the report's form).
    pub fn activity(&self) -> LearnedActivity {
        let [runs, segments, words, patched] = self.encodings();
        debug_assert!(
            self.get_cursor_misses.get() <= self.gets.get(),
            "{} cursor misses of {} GETs: a caller of `get` did not `note_gets`",
            self.get_cursor_misses.get(),
            self.gets.get()
        );
        LearnedActivity {
            counts: self.stats.clone(),
            buffered_entries: self.buffered_entries(),
            gets: self.gets.get(),
            get_cursor_misses: self.get_cursor_misses.get(),
            groups: GroupEncodings {
                runs,
                segments,
                words,
                patched,
            },
        }
    }

    /// Groups with updates in the buffer.
    pub fn buffered_groups(&self) -> usize {
        self.deltas.len()
    }

    /// LPNs whose latest update is still in the buffer.
    pub fn buffered_entries(&self) -> u64 {
        self.buffered_entries + u64::from(self.tail.pending())
    }

    /// Checks the buffer's bookkeeping against its runs (tests call it after every update: a
    /// count that drifted would not change a lookup, only when merges happen).
    pub fn assert_buffer_counts(&self) {
        let mut total = 0;
        let mut slots = std::collections::HashSet::new();
        for (d, delta) in self.deltas.iter().enumerate() {
            let covered: u32 = delta.runs.iter().map(|r| u32::from(r.len)).sum();
            assert_eq!(u32::from(delta.entries), covered, "group {}", delta.group);
            assert!(
                covered > 0,
                "group {} is buffered with nothing",
                delta.group
            );
            assert_eq!(self.delta_index.get(delta.group), Some(d as u32));
            // The bits, where kept, are the runs' offsets (the tail's deferred appends
            // excluded); a delta without them has few runs to scan.
            if delta.bits == NO_BITS {
                assert!(delta.runs.len() <= BITS_ABOVE_RUNS, "group {}", delta.group);
            } else {
                let mut bits = [0u64; GROUP_LPNS / 64];
                for r in &delta.runs {
                    set_bits(&mut bits, r.start(), r.start() + r.len(), true);
                }
                assert!(
                    bits == *self.bits_pool.get(delta.bits),
                    "group {}'s bits",
                    delta.group
                );
                assert!(slots.insert(delta.bits), "bits slot {} twice", delta.bits);
            }
            total += u64::from(covered);
        }
        assert_eq!(self.delta_index.len(), self.deltas.len());
        assert_eq!(self.bits_pool.in_use(), slots.len());
        assert_eq!(self.buffered_entries, total);
        // The deferred appends continue the tail's run, and the limit kept them within the
        // bound that checking after every update would keep.
        let t = self.tail;
        assert!(t.flushed <= t.lpn && t.lpn <= t.limit.max(t.flushed) && t.limit <= t.bound);
        if t.pending() > 0 {
            let delta = &self.deltas[t.d as usize];
            let r = delta.runs[t.at as usize];
            let end = (delta.group << GROUP_SHIFT) + r.start() + r.len() + t.pending();
            assert_eq!(end, t.lpn, "deferred appends of group {}", delta.group);
        }
        assert!(
            self.buffered_entries() <= self.buffer_bound(),
            "{} LPNs buffered, bound {}",
            self.buffered_entries(),
            self.buffer_bound()
        );
        let small = self.deltas.iter().filter(|d| d.small).count();
        assert_eq!(self.small_deltas, small);
        assert!(
            small <= self.buffer_group_cap,
            "{small} groups with small blobs buffered, bound {}",
            self.buffer_group_cap
        );
        for delta in &self.deltas {
            let bytes = self.groups.blob(delta.group).map_or(0, group::encoded_len);
            assert_eq!(
                delta.small,
                bytes < UNBOUNDED_BLOB_BYTES,
                "group {}",
                delta.group
            );
        }
    }

    /// Bytes of the compressed groups alone (blobs and their directory).
    pub fn compressed_bytes(&self) -> usize {
        self.groups.heap_bytes()
    }
}

impl MappingTable for LearnedMapping {
    fn name(&self) -> &'static str {
        "learned"
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        // `lookup`, written out to count the cursor's misses on their own path. The lookups
        // themselves are the caller's to count (`note_gets`): a hit writes nothing.
        let span = self.span.get();
        let (ppn, buffered) = match span.get(lpn) {
            Some(ppn) => (ppn, span.buffered),
            None => {
                self.get_cursor_misses.set(self.get_cursor_misses.get() + 1);
                self.lookup_slow::<false>(lpn)
            }
        };
        if buffered {
            self.buffered_gets.set(self.buffered_gets.get() + 1);
        }
        ppn
    }

    #[inline]
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        debug_assert_ne!(ppn, TOMBSTONE);
        // The common case of a stream of writes, in a few registers: the lookup cursor knows
        // the old PPN, and the write continues the last buffered write (`Tail`). The rest is out
        // of line: this path used to pay for the whole update's stack frame. A stream that
        // rewrites pages the blob maps goes to the buffer too, though the blob might take some
        // of them in place: the next merge re-encodes the stream as one run, where writes in
        // place would keep the group's old layout (that path is for random overwrites).
        // A write that continues the tail is at the span's first LPN if the span holds it at all:
        // the LPN before it is the tail's last, which a span (one run, of the buffer or of the
        // blob between buffered LPNs) holds only as its own last. So only that LPN is tried: no
        // offset into the span, and 1-6 % fewer instructions for the nbdkit traces' updates
        // (notes/mapping-log.md, "The update fast path tried at the span's first LPN only").
        let span = self.span.get();
        debug_assert!(
            lpn == span.lo
                || span.get(lpn).is_none()
                || !self.tail.continued_by(lpn, ppn_off(lpn, ppn)),
            "lpn {lpn} continues the tail inside the span {span:?}"
        );
        if lpn == span.lo && span.len != 0 {
            // A write of the PPN the span maps `lpn` to changes nothing, so it is not appended;
            // offsets compare as PPNs would (the span's offset of unmapped LPNs is no PPN's).
            let off = ppn_off(lpn, ppn);
            if off != span.ppn_off && self.defer_tail(lpn, off) {
                let old = span.ppn_of(lpn);
                self.live += u64::from(old.is_none());
                return old;
            }
        }
        self.set_slow(lpn, ppn)
    }

    fn relocate(&mut self, lpn: u32, from: u32, to: u32) {
        // A move knows the answer of the lookup `set` makes first (with GC moving most pages,
        // those lookups took 40 % of a simulation's time with this table).
        debug_assert_eq!(self.lookup(lpn).0, Some(from));
        debug_assert_ne!(to, TOMBSTONE);
        debug_assert_ne!(from, to);
        self.flush_tail();
        if !self.write_times.on {
            self.write_times.on = true;
            self.write_times.floor = self.buffer_clock;
        }
        let (g, off) = (lpn >> GROUP_SHIFT, lpn & OFFSET_MASK);
        let buffered = self.delta(g).is_some_and(|d| {
            if self.write_times.before(from, self.deltas[d as usize].since) {
                debug_assert!(!self.delta_holds(d, off).0, "lpn {lpn}");
                self.stats.gc_moves_known_unbuffered += 1;
                return false;
            }
            self.delta_holds(d, off).0
        });
        if !buffered && self.update_in_place(lpn, to) {
            return;
        }
        self.write_delta(lpn, Some(to));
        self.merge_while_over_bound();
    }

    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        // Trimming what is not mapped (most of a file system's discards) stays inline, and so
        // does a trim continuing the last one over pages the blob maps (a file deleted).
        // As in `set`, a trim that continues the tail is at the span's first LPN.
        let span = self.span.get();
        debug_assert!(
            lpn == span.lo || span.get(lpn).is_none() || !self.tail.continued_by(lpn, NO_PPN_OFF),
            "lpn {lpn} continues the tail inside the span {span:?}"
        );
        if let Some(old) = span.get(lpn) {
            let old = old?;
            if lpn == span.lo && !span.buffered && self.defer_tail(lpn, NO_PPN_OFF) {
                self.live -= 1;
                return Some(old);
            }
        }
        self.remove_slow(lpn)
    }

    fn live_mappings(&self) -> u64 {
        self.live
    }

    /// O(1): the run lists' share is kept as it changes (`run_bytes`).
    fn heap_bytes(&self) -> usize {
        debug_assert_eq!(
            self.run_bytes,
            self.deltas
                .iter()
                .map(|d| d.runs.capacity() * std::mem::size_of::<DeltaRun>())
                .sum::<usize>()
        );
        self.compressed_bytes()
            + self.delta_index.heap_bytes()
            + self.write_times.chunks.capacity() * 4
            + self.deltas.capacity() * std::mem::size_of::<Delta>()
            + self.bits_pool.heap_bytes()
            + self.run_bytes
    }

    fn peak_heap_bytes(&self) -> usize {
        self.peak_bytes.max(self.heap_bytes())
    }

    #[inline]
    fn prefetch(&self, lpn: u32) {
        // The blob's lines that can be found without reading a missed line (its first line, and
        // in bitmap words the offset's word: `group::prefetch` does not read the blob). The
        // directory entry is read, not prefetched: at most 6 bytes per group, a few KiB on the
        // simulator's devices, though not always still cached (notes/mapping-log.md, "Prefetches
        // that do not read the blob").
        // Prefetching the buffered runs' first search positions too gained nothing measurable
        // in `ftlab sim --set ftl.mapping=learned`, for GC moves or host requests (the probe to
        // find them waits on memory itself: notes/mapping-log.md).
        if let Some(blob) = self.groups.blob(lpn >> GROUP_SHIFT) {
            group::prefetch(blob, lpn & OFFSET_MASK);
        }
    }

    #[inline]
    fn get_uncounted(&self, lpn: u32) -> Option<u32> {
        self.lookup(lpn).0
    }

    /// The cursor's answer only: a lookup would cost more than the prefetch saves (with GC and
    /// lookahead, `ftlab sim` made one such lookup per host write). Not counted as a GET.
    #[inline]
    fn peek(&self, lpn: u32) -> Option<u32> {
        match self.span.get().get(lpn) {
            Some(ppn) => ppn,
            None => {
                self.prefetch_near(lpn);
                None
            }
        }
    }

    #[inline]
    fn prefetch_near(&self, lpn: u32) {
        if let Some(blob) = self.groups.blob(lpn >> GROUP_SHIFT) {
            group::prefetch_near(blob, lpn & OFFSET_MASK);
        }
    }

    fn compact(&mut self) {
        self.flush_tail();
        let mut work = MergeScratch::default();
        while !self.deltas.is_empty() {
            self.merge(0, &mut work);
        }
        self.deltas.shrink_to_fit();
        self.bits_pool.clear();
        // Nothing is buffered now: the index's chunks go too.
        self.delta_index.clear();
        self.write_times.chunks.shrink_to_fit();
        self.groups.shrink();
    }

    fn activity(&self) -> Option<ftlab_core::ftl::mapping::TableActivity> {
        Some(ftlab_core::ftl::mapping::TableActivity::Learned(
            LearnedMapping::activity(self),
        ))
    }

    fn reset_activity(&mut self) {
        self.stats = LearnedStats::default();
        self.gets.set(0);
        self.buffered_gets.set(0);
        self.get_cursor_misses.set(0);
    }

    #[inline]
    fn note_gets(&self, n: u64) {
        self.gets.set(self.gets.get() + n);
    }

    fn compressed_get_fraction(&self) -> Option<f64> {
        let gets = self.gets.get();
        let buffered = self.buffered_gets.get();
        debug_assert!(buffered <= gets, "{buffered} buffered of {gets} noted GETs");
        (gets > 0).then(|| gets.saturating_sub(buffered) as f64 / gets as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration's default buffer is the table's own (each keeps its constant so that
    /// configuration need not know the table's internals).
    #[test]
    fn the_configured_buffer_default_is_the_tables() {
        assert_eq!(
            ftlab_core::config::DEFAULT_LEARNED_BUFFER_DIVISOR,
            BUFFER_LIVE_DIVISOR
        );
    }
    use crate::oracle;

    /// The last valid PPN (`u32::MAX - 1`) ends a buffered run whose next value would be
    /// `u32::MAX`, the buffer's tombstone: a trim of the next LPN must not lengthen that run as
    /// if it continued it (found by the `mapping_tables` fuzz target with debug assertions, as
    /// an overflow once such a run grew past `u32::MAX`).
    #[test]
    fn a_run_ending_at_the_last_ppn_is_not_continued_by_a_trim() {
        let last = TOMBSTONE - 1;
        for via_tail in [true, false] {
            let mut t = LearnedMapping::new(GROUP_LPNS as u64);
            for lpn in 0..8 {
                t.set(lpn, 1000 + lpn);
            }
            t.compact();
            // LPNs 5 and 6 map to 1005 and 1006 in the blob; 5 is rewritten to the last PPN.
            assert_eq!(t.set(5, last), Some(1005));
            if !via_tail {
                // Another write in between: the trim below takes the general path.
                t.set(2, 7);
            }
            assert_eq!(t.remove(6), Some(1006));
            assert_eq!(
                (t.get(5), t.get(6), t.get(7)),
                (Some(last), None, Some(1007))
            );
            t.assert_buffer_counts();
            // Written after the trim, 6 takes a value again.
            assert_eq!(t.set(6, 3), None);
            t.compact();
            assert_eq!(
                (t.get(5), t.get(6), t.get(7)),
                (Some(last), Some(3), Some(1007))
            );
            assert_eq!(t.live_mappings(), 8);
        }
    }

    /// The buffer's clock restarts before it would wrap (here pushed close to that every 20 K
    /// host writes): every answer stays right (debug builds check each skipped search), and
    /// moves skip the search again after each restart.
    #[test]
    fn the_buffer_clock_restarts_without_a_wrong_answer() {
        const N: u32 = 1 << 13;
        let mut t = LearnedMapping::with_buffer(u64::from(N), 64).buffer_live_divisor(1 << 20);
        let mut skipped_at_restart = Vec::new();
        oracle::check_fifo_cleaning(&mut t, N, N + N / 4, 200_000, 5, |t, step| {
            if step % 20_000 == 0 && t.write_times.on {
                skipped_at_restart.push(t.stats.gc_moves_known_unbuffered);
                t.buffer_clock = u32::MAX - 50;
            }
        });
        skipped_at_restart.push(t.stats.gc_moves_known_unbuffered);
        assert!(skipped_at_restart.len() >= 8, "{skipped_at_restart:?}");
        // Every interval after the first restart skipped some searches.
        assert!(
            skipped_at_restart[1..].windows(2).all(|w| w[1] > w[0]),
            "{skipped_at_restart:?}"
        );
        assert!(
            t.buffer_clock < 1 << 20,
            "the clock restarted: {}",
            t.buffer_clock
        );
    }
}
