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

/// Where the last buffered write can be continued without reading its run: writing `lpn` with
/// the run's offset (`tail_off`) lengthens run `at` of delta `d` by one, while `lpn < bound` (the
/// LPN before the group's next buffered run, which a longer run would reach or coalesce with, or
/// the group's end). Kept by every buffered write; forgotten when a delta is dropped (indices
/// move).
///
/// `set` and `remove` continue it in a few registers: the run, its delta's count and the
/// buffer's total are written once the stream ends (`pending` of them, `flush_tail`), and the
/// buffer's bound is not checked per update (`limit`), so a sequential stream moves the tail's
/// `lpn` and the cursor's front only. Everything else flushes first; `lookup_slow` adds
/// `pending` to the run.
#[derive(Clone, Copy, Debug)]
struct Tail {
    lpn: u32,
    /// What continues the run (`tail_off`): its PPNs less their LPNs (`ppn_off`), the same for
    /// each of them, or `NO_PPN_OFF` for a run of trims. Kept rather than the next PPN, so an
    /// append changes `lpn` alone.
    off: u64,
    bound: u32,
    /// Where deferred appends stop: `bound`, or sooner, where they would use up the room
    /// `merge_while_over_bound` leaves before the buffer could outgrow `buffer_bound`.
    limit: u32,
    /// `lpn` when the deferred appends were last written: `lpn - flushed` of them are pending
    /// (counted so, the append increments `lpn` alone).
    flushed: u32,
    d: u32,
    at: u32,
}

impl Tail {
    /// Whether writing a value of offset `off` (`tail_off`) to `lpn` lengthens the tail's run
    /// by one.
    #[inline(always)]
    fn continued_by(&self, lpn: u32, off: u64) -> bool {
        lpn == self.lpn && off == self.off && lpn < self.bound
    }

    /// Appends to the run not yet written into it (`flush_tail`).
    #[inline(always)]
    fn pending(&self) -> u32 {
        self.lpn - self.flushed
    }

    /// Continues nothing (`lpn < bound` never holds).
    const NONE: Tail = Tail {
        lpn: 0,
        off: 0,
        bound: 0,
        limit: 0,
        flushed: 0,
        d: 0,
        at: 0,
    };
}

/// What a run holding `value` at `lpn` keeps for every LPN (`Tail::off`; `DeltaRun::continues`
/// compares runs this way too): `ppn_off`, or `NO_PPN_OFF` for a trim, which no PPN's offset
/// equals. So a trim continues only trims, and a PPN only PPNs: a run ending at the last valid
/// PPN (`u32::MAX - 1`) would be continued only by `u32::MAX`, which is the tombstone.
#[inline(always)]
fn tail_off(lpn: u32, value: u32) -> u64 {
    if value == TOMBSTONE {
        NO_PPN_OFF
    } else {
        ppn_off(lpn, value)
    }
}

/// The fewest runs a delta's list grows by (see `write_delta_slow`).
const MIN_RUNS_GROWTH: usize = 8;
pub use ftlab_core::ftl::mapping::activity::{GroupEncodings, LearnedActivity, LearnedStats};

#[derive(Clone, Debug)]
pub struct LearnedMapping {
    groups: GroupStore,
    /// Group -> index in `deltas`, for groups with buffered updates.
    delta_index: DeltaIndex,
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

    /// The current mapping and whether the buffer holds it, without counting a lookup.
    #[inline]
    fn lookup(&self, lpn: u32) -> (Option<u32>, bool) {
        self.lookup_with::<false>(lpn)
    }

    /// `lookup`; with `ROOM`, a search of the compressed layer also leaves what the blob could
    /// take in place in `room_hint`.
    #[inline]
    fn lookup_with<const ROOM: bool>(&self, lpn: u32) -> (Option<u32>, bool) {
        let span = self.span.get();
        if let Some(ppn) = span.get(lpn) {
            return (ppn, span.buffered);
        }
        self.lookup_slow::<ROOM>(lpn)
    }

    /// Searches the buffer, then the compressed layer, and remembers the span found; an LPN
    /// right after the last span the compressed layer gave is found without a search.
    fn lookup_slow<const ROOM: bool>(&self, lpn: u32) -> (Option<u32>, bool) {
        let g = lpn >> GROUP_SHIFT;
        let off = lpn & OFFSET_MASK;
        let group_lpn = lpn - off;
        let follow = self.follow.get();
        if lpn == follow.lpn && off != 0 {
            // Its group has a blob, and its buffered runs have not changed since (a write
            // would have forgotten `follow`); the next of them bounds the span.
            if let Some(blob) = self.groups.blob(g) {
                let found = group::lookup_next::<ROOM>(blob, off, follow.at);
                return self.found::<ROOM>(lpn, found, (0, follow.hi));
            }
        }
        // An offset the buffer holds (its bit, or the tail's deferred appends, offsets
        // `p_lo..p_hi`, which have no bits yet) is answered from there.
        let delta = self.delta(g);
        let (mut p_lo, mut p_hi) = (0, 0);
        // Its delta's bits, read once for both the test and the bounds (`None` where it keeps
        // none: its few runs are scanned).
        let mut bits = None;
        if let Some(d) = delta {
            let t = &self.tail;
            if t.pending() != 0 && t.d == d {
                p_hi = t.lpn - group_lpn;
                p_lo = p_hi - t.pending();
            }
            let held;
            (held, bits) = self.delta_holds(d, off);
            if held || off.wrapping_sub(p_lo) < p_hi - p_lo {
                return self.buffered_lookup(d, lpn);
            }
        }
        let found = match self.groups.blob(g) {
            Some(blob) => group::lookup_with::<ROOM>(blob, off),
            None => group::Lookup {
                ppn: None,
                lo: 0,
                hi: GROUP_LPNS as u32,
                room: group::NO_ROOM,
                next: group::Finger::NONE,
            },
        };
        // The buffered offsets nearest `off` bound the span, looked for only as far as the
        // blob's span reaches (for bitmap words, the offset's word).
        let (mut lo, mut hi) = (0, GROUP_LPNS as u32);
        if let Some(d) = delta {
            (lo, hi) = match bits {
                Some(b) => clear_around(b, off, found.lo, found.hi),
                None => runs_clear_around(&self.deltas[d as usize].runs, off),
            };
            if p_lo != p_hi {
                if p_hi <= off {
                    lo = lo.max(p_hi);
                } else {
                    hi = hi.min(p_lo);
                }
            }
            debug_assert_eq!(
                (lo, hi),
                self.buffer_bounds_by_search(d, off, (lo, hi), (found.lo, found.hi)),
                "lpn {lpn}"
            );
        }
        self.found::<ROOM>(lpn, found, (lo, hi))
    }

    /// The buffer's answer for `lpn`, which delta `d` holds (its bit or the tail says so): its
    /// run, kept as the span.
    #[inline(never)]
    fn buffered_lookup(&self, d: u32, lpn: u32) -> (Option<u32>, bool) {
        let off = lpn & OFFSET_MASK;
        let runs = &self.deltas[d as usize].runs;
        let i = runs::upper_spread(runs, off, GROUP_LPNS as u32);
        let mut r = runs[i - 1];
        let t = &self.tail;
        if t.pending() != 0 && (t.d, t.at) == (d, i as u32 - 1) {
            r.len += t.pending() as u16;
        }
        debug_assert!(off - r.start() < r.len(), "lpn {lpn}");
        let ppn = (r.ppn != TOMBSTONE).then(|| r.ppn + (off - r.start()));
        self.span
            .set(Span::at((lpn - off) + r.start(), r.len(), lpn, ppn, true));
        (ppn, true)
    }

    /// For debug builds: `lo..hi` (what `clear_around` gave for unbuffered `off`), checked
    /// against a search of delta `d`'s runs and the tail: no buffered offset in it, and a buffered
    /// offset (or the group's edge) right outside it unless it reaches past the blob's span
    /// `found_lo..found_hi` or `BOUND_SCAN_WORDS` words.
    /// Returns `lo..hi` when it holds.
    fn buffer_bounds_by_search(
        &self,
        d: u32,
        off: u32,
        (lo, hi): (u32, u32),
        (found_lo, found_hi): (u32, u32),
    ) -> (u32, u32) {
        let runs = &self.deltas[d as usize].runs;
        let t = &self.tail;
        let (mut below, mut above) = (None, None);
        for (k, r) in runs.iter().enumerate() {
            let extra = if t.pending() != 0 && (t.d, t.at) == (d, k as u32) {
                t.pending()
            } else {
                0
            };
            let (start, end) = (r.start(), r.start() + r.len() + extra);
            assert!(off < start || off >= end, "{off} is buffered");
            if end <= off {
                below = Some(end);
            } else if above.is_none() {
                above = Some(start);
            }
        }
        let true_lo = below.unwrap_or(0);
        let true_hi = above.unwrap_or(GROUP_LPNS as u32);
        let scan = 64 * BOUND_SCAN_WORDS as u32;
        assert!(
            lo >= true_lo && hi <= true_hi,
            "{lo}..{hi} against {true_lo}..{true_hi}"
        );
        assert!(
            lo == true_lo || lo <= found_lo || off - lo >= scan,
            "{lo} against {true_lo}"
        );
        assert!(
            hi == true_hi || hi > found_hi || hi - off > scan,
            "{hi} against {true_hi}"
        );
        (lo, hi)
    }

    /// Remembers what the compressed layer answered for `lpn`, within `lo..hi` (offsets the
    /// buffer does not hold): the span; where the next lookup may follow on, when the span
    /// ends before `hi` (which the follow-on lookup's span must not pass either); and for an
    /// update, the room in place.
    #[inline(always)]
    fn found<const ROOM: bool>(
        &self,
        lpn: u32,
        found: group::Lookup,
        (lo, hi): (u32, u32),
    ) -> (Option<u32>, bool) {
        let off = lpn & OFFSET_MASK;
        let group_lpn = lpn - off;
        // The answer's span, within the offsets the buffer does not hold.
        let (span_lo, span_hi) = (lo.max(found.lo), hi.min(found.hi));
        self.span.set(Span::at(
            group_lpn + span_lo,
            span_hi - span_lo,
            lpn,
            found.ppn,
            false,
        ));
        // (An empty group's span is the whole group: nothing follows it.)
        if found.hi < hi {
            self.follow.set(Follow {
                lpn: group_lpn + found.hi,
                at: found.next,
                hi,
            });
        }
        if ROOM {
            self.room_hint.set((lpn, found.room));
        }
        (found.ppn, false)
    }

    /// The buffered updates of group `g`, if any (no hashing while the buffer is empty).
    #[inline]
    fn delta(&self, g: u32) -> Option<u32> {
        if self.deltas.is_empty() {
            None
        } else {
            self.delta_index.get(g)
        }
    }

    /// Whether delta `d`'s runs hold offset `off` (its bit, or a scan of its few runs; the
    /// tail's deferred appends are not looked at), and its bits if it keeps them.
    #[inline]
    fn delta_holds(&self, d: u32, off: u32) -> (bool, Option<&BufferedBits>) {
        let delta = &self.deltas[d as usize];
        if delta.bits == NO_BITS {
            (runs_hold(&delta.runs, off), None)
        } else {
            let bits = self.bits_pool.get(delta.bits);
            (is_buffered_bit(bits, off), Some(bits))
        }
    }

    /// Gives delta `d`, which has none, its bits, set from its runs: it holds more than
    /// `BITS_ABOVE_RUNS` runs now (runs are added only where `write_delta_slow` assigns).
    #[cold]
    #[inline(never)]
    fn keep_bits(&mut self, d: u32) {
        let delta = &self.deltas[d as usize];
        debug_assert!(delta.bits == NO_BITS && delta.runs.len() > BITS_ABOVE_RUNS);
        let slot = self.bits_pool.take();
        let bits = self.bits_pool.get_mut(slot);
        for r in &delta.runs {
            set_bits(bits, r.start(), r.start() + r.len(), true);
        }
        self.deltas[d as usize].bits = slot;
        self.note_peak();
    }

    /// Whether the buffer holds the latest update of `lpn` (then the compressed layer may be
    /// stale for it).
    pub fn is_buffered(&self, lpn: u32) -> bool {
        self.lookup(lpn).1
    }

    /// What the compressed layer alone maps `lpn` to.
    #[inline]
    pub fn compressed(&self, lpn: u32) -> Option<u32> {
        let blob = self.groups.blob(lpn >> GROUP_SHIFT)?;
        group::get(blob, lpn & OFFSET_MASK)
    }

    /// Buffers `value` for `lpn` (`None`: forgets a buffered update of an LPN the blob does not
    /// map). The common case, inline: a write continuing the run its group's last write went
    /// to (`runs::extend_at`). The rest stays out of line so callers stay small.
    #[inline(always)]
    fn write_delta(&mut self, lpn: u32, value: Option<u32>) {
        if self.write_times.on {
            if let Some(v) = value.filter(|&v| v != TOMBSTONE) {
                let now = self.tick(1);
                self.write_times.note(v, v, now);
            }
        }
        if !value.is_some_and(|v| self.extend_tail(lpn, v)) {
            self.write_delta_slow(lpn, value);
        }
    }

    /// Buffers `lpn -> value` if it continues the last buffered write (`Tail`), which it
    /// lengthens by one without reading it; false, changing nothing, otherwise. (Reading the run
    /// back to check it, as `extend_cursor` does, cost streams of updates a quarter more
    /// instructions: notes/mapping-log.md.) For the slow paths, which have flushed the tail and check
    /// the bound themselves; `set` and `remove` use `defer_tail`.
    #[inline(always)]
    fn extend_tail(&mut self, lpn: u32, value: u32) -> bool {
        let t = self.tail;
        debug_assert_eq!(t.pending(), 0);
        if !t.continued_by(lpn, tail_off(lpn, value)) {
            return false;
        }
        let delta = &mut self.deltas[t.d as usize];
        let r = &mut delta.runs[t.at as usize];
        let group_lpn = delta.group << GROUP_SHIFT;
        debug_assert_eq!(
            (t.lpn & OFFSET_MASK, t.off),
            (r.start() + r.len(), tail_off(group_lpn + r.start(), r.ppn))
        );
        r.len += 1;
        delta.entries += 1;
        self.bits_pool.set_bit(delta.bits, lpn & OFFSET_MASK, true);
        self.buffered_entries += 1;
        self.step_tail(lpn);
        self.tail.flushed = self.tail.lpn;
        true
    }

    /// `extend_tail` for `set` and `remove`: the run and the counts are written by
    /// `flush_tail`, and no merge is due (`limit`). False, changing nothing, where it does not
    /// apply. `off` is `tail_off` of the value: `set` passes its PPN's, `remove` `NO_PPN_OFF`.
    #[inline(always)]
    fn defer_tail(&mut self, lpn: u32, off: u64) -> bool {
        let t = &self.tail;
        debug_assert!(t.limit <= t.bound);
        if lpn != t.lpn || off != t.off || lpn >= t.limit {
            return false;
        }
        self.step_tail(lpn);
        true
    }

    /// The tail now ends after `lpn` (just appended); the cursor and the follow-on position no
    /// longer hold for it.
    #[inline(always)]
    fn step_tail(&mut self, lpn: u32) {
        self.tail.lpn += 1;
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
    }

    /// Advances the buffer's clock by `n` writes and returns it; restarts it first where it
    /// would wrap.
    #[inline]
    fn tick(&mut self, n: u32) -> u32 {
        if self.buffer_clock > u32::MAX - n {
            self.restart_clock();
        }
        self.buffer_clock += n;
        self.buffer_clock
    }

    /// Every delta and chunk so far reads as time 1, which tells nothing of any of them (a delta
    /// of `since` 1 skips no search); later writes read 2 and on.
    #[cold]
    fn restart_clock(&mut self) {
        self.buffer_clock = 1;
        for delta in &mut self.deltas {
            delta.since = 1;
        }
        self.write_times.floor = 1;
        self.write_times.chunks.fill(1);
    }

    /// Writes the deferred appends (`Tail::pending`) into the tail's run and the counts. Every
    /// update that is not `defer_tail` calls it first.
    #[inline]
    fn flush_tail(&mut self) {
        let t = &mut self.tail;
        let pending = t.pending();
        if pending == 0 {
            return;
        }
        let first_lpn = t.flushed;
        t.flushed = t.lpn;
        if self.write_times.on && t.off != NO_PPN_OFF {
            // The deferred appends were LPNs `first_lpn..t.lpn`, each at its LPN plus `off`.
            let off = t.off as u32;
            let (first, last) = (first_lpn.wrapping_add(off), (t.lpn - 1).wrapping_add(off));
            let now = self.tick(pending);
            self.write_times.note(first, last, now);
        }
        let t = self.tail;
        let delta = &mut self.deltas[t.d as usize];
        let end = t.lpn - (delta.group << GROUP_SHIFT);
        self.bits_pool
            .set_bits(delta.bits, end - pending, end, true);
        // A delta covers at most GROUP_LPNS offsets, so the counts fit their u16s.
        delta.runs[t.at as usize].len += pending as u16;
        delta.entries += pending as u16;
        self.buffered_entries += u64::from(pending);
    }

    /// Buffers `lpn -> value` if it continues the run group `g`'s last write went to
    /// (`runs::extend_at`, which also handles reaching the next run); false, changing nothing,
    /// otherwise. `last_delta` must be `g`'s.
    fn extend_cursor(&mut self, lpn: u32, value: u32) -> bool {
        let (g, d) = self.last_delta;
        debug_assert_eq!(g, lpn >> GROUP_SHIFT);
        let delta = &mut self.deltas[d as usize];
        let at = usize::from(delta.cursor);
        let off = lpn & OFFSET_MASK;
        let Some(covered) = runs::extend_at(&mut delta.runs, at, off, value) else {
            return false;
        };
        self.bits_pool.set_bit(delta.bits, off, true);
        if !covered {
            delta.entries += 1;
            self.buffered_entries += 1;
        }
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
        true
    }

    /// Points `tail` after the run group `g`'s last write went to (`last_delta` is `g`'s).
    fn set_tail(&mut self) {
        let (g, d) = self.last_delta;
        let delta = &self.deltas[d as usize];
        let at = usize::from(delta.cursor);
        let group_lpn = g << GROUP_SHIFT;
        self.tail = match delta.runs.get(at) {
            Some(r) => Tail {
                lpn: group_lpn + r.start() + r.len(),
                off: tail_off(group_lpn + r.start(), r.ppn),
                // A next run starts after `r`'s start, so at 1 or later.
                bound: group_lpn
                    + delta
                        .runs
                        .get(at + 1)
                        .map_or(GROUP_LPNS as u32, |next| next.start() - 1),
                // No deferred appends until `merge_while_over_bound` gives the room.
                limit: 0,
                flushed: group_lpn + r.start() + r.len(),
                d,
                at: at as u32,
            },
            None => Tail::NONE,
        };
    }

    /// `remove` where its fast path does not apply. Out of line, as `set_slow` is, so that the
    /// fast path stays small enough to inline into every caller whatever the lookup's size (a
    /// change to the blobs' lookups once took it out of `ftlab mapbench`'s loop: 14 % more
    /// instructions on rocksdb).
    #[inline(never)]
    fn remove_slow(&mut self, lpn: u32) -> Option<u32> {
        let (old, buffered) = self.lookup(lpn);
        let old = old?;
        self.remove_mapped(lpn, buffered);
        Some(old)
    }

    /// `set` where its fast path does not apply.
    #[inline(never)]
    fn set_slow(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        self.flush_tail();
        let (old, buffered) = self.lookup_with::<true>(lpn);
        if old == Some(ppn) {
            return old;
        }
        // The lookup said whether the blob could take `ppn` in place (a packed residual, a
        // one-point segment, a one-page run, with room for the value): most updates of a
        // trace's pages split exact runs or lie past a log-structured group's range, and skip
        // the attempt's second search.
        let (hint_lpn, (room_lo, room_hi)) = self.room_hint.get();
        if old.is_some()
            && !buffered
            && hint_lpn == lpn
            && (room_lo..=room_hi).contains(&ppn)
            && self.update_in_place(lpn, ppn)
        {
            return old;
        }
        self.write_delta(lpn, Some(ppn));
        self.live += u64::from(old.is_none());
        self.merge_while_over_bound();
        old
    }

    #[inline(never)]
    fn write_delta_slow(&mut self, lpn: u32, value: Option<u32>) {
        self.settle_tail_run();
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
        let g = lpn >> GROUP_SHIFT;
        let off = lpn & OFFSET_MASK;
        let cached = self.last_delta;
        let d = match if cached.0 == g {
            Some(cached.1)
        } else {
            self.delta_index.get(g)
        } {
            Some(d) => d,
            None => {
                if value.is_none() {
                    return;
                }
                let d = self.deltas.len() as u32;
                let small = self
                    .groups
                    .blob(g)
                    .is_none_or(|b| group::encoded_len(b) < UNBOUNDED_BLOB_BYTES);
                self.small_deltas += usize::from(small);
                self.deltas.push(Delta {
                    group: g,
                    entries: 0,
                    cursor: 0,
                    since: self.buffer_clock,
                    small,
                    bits: NO_BITS,
                    runs: Vec::new(),
                });
                self.delta_index.set(g, d);
                self.note_peak();
                d
            }
        };
        self.last_delta = (g, d);
        // A sequential write (or trim) continues the run the group's last write went to:
        // `write_delta` tried the last buffered write's; here it is the first write after a
        // switch of groups, or one reaching the next buffered run.
        if value.is_some_and(|v| self.extend_cursor(lpn, v)) {
            self.set_tail();
            return;
        }
        let delta = &mut self.deltas[d as usize];
        // `assign` adds at most two runs. Growth by doubling would leave up to half of the
        // buffer's lists spare (counted in the table's bytes); by a quarter it leaves a fifth,
        // amortised O(1) all the same. Short lists grow by `MIN_RUNS_GROWTH` runs: growing by two
        // at a time cost this function 13 % more instructions on files' simulated updates, and
        // 48 more bytes are little beside a delta's record; the first list's 8 runs are as many
        // as a delta without bits holds (`BITS_ABOVE_RUNS`).
        if delta.runs.capacity() - delta.runs.len() < 2 {
            let before = delta.runs.capacity();
            delta
                .runs
                .reserve_exact((delta.runs.len() / 4).max(MIN_RUNS_GROWTH));
            self.run_bytes += (delta.runs.capacity() - before) * std::mem::size_of::<DeltaRun>();
            self.note_peak();
        }
        let delta = &mut self.deltas[d as usize];
        let (old, at) = runs::assign_at(&mut delta.runs, off, value);
        self.bits_pool.set_bit(delta.bits, off, value.is_some());
        let many = delta.bits == NO_BITS && delta.runs.len() > BITS_ABOVE_RUNS;
        // Fewer than GROUP_LPNS runs, so the index fits.
        delta.cursor = at as u16;
        match (old, value) {
            (None, Some(_)) => {
                delta.entries += 1;
                self.buffered_entries += 1;
            }
            (Some(_), None) => {
                delta.entries -= 1;
                self.buffered_entries -= 1;
            }
            _ => {}
        }
        if delta.entries == 0 {
            self.drop_delta(d);
        } else {
            if many {
                self.keep_bits(d);
            }
            self.set_tail();
        }
    }

    /// Counts `heap_bytes` into the peak. Called where the buffer grows (a new delta and its
    /// index chunk, a longer list) and before a delta is freed (`drop_delta`: merges, trims), so
    /// `write_times`, which grows elsewhere and shrinks only in `compact`, is counted before
    /// anything else goes. (The arena's growth within a merge: `merge`.)
    #[inline]
    fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.heap_bytes());
    }

    /// Removes delta `d` from the slab (swap-remove) and returns it; the peak counts it first.
    fn drop_delta(&mut self, d: u32) -> Delta {
        debug_assert_eq!(self.tail.pending(), 0);
        self.note_peak();
        let delta = self.deltas.swap_remove(d as usize);
        self.bits_pool.free(delta.bits);
        self.run_bytes -= delta.runs.capacity() * std::mem::size_of::<DeltaRun>();
        self.last_delta = NO_LAST_DELTA;
        self.tail = Tail::NONE;
        self.delta_index.remove(delta.group);
        if let Some(moved) = self.deltas.get(d as usize) {
            self.delta_index.set(moved.group, d);
        }
        self.buffered_entries -= u64::from(delta.entries);
        self.small_deltas -= usize::from(delta.small);
        delta
    }

    /// GC moves a run's pages one after another, each into the buffer (a page inside a run cannot
    /// go in place alone), as a stream continuing the tail. When a write does not continue it,
    /// and the tail's run covers exactly a run of its group's blob, the blob takes the new PPNs
    /// in place where they fit (`group::move_run_in_place`) and the buffer drops the run: no
    /// merge for it. In the default preset most moves the blobs refused were of such runs (from
    /// the sequential fill). Only bitmap words take a run so (their runs lie within a word), and
    /// only the buffer's runs of two or more pages are tried, once each.
    fn settle_tail_run(&mut self) {
        let t = self.tail;
        debug_assert_eq!(t.pending(), 0);
        let Some(delta) = self.deltas.get(t.d as usize) else {
            return;
        };
        let Some(&r) = delta.runs.get(t.at as usize) else {
            return;
        };
        let g = delta.group;
        // `Tail::NONE`, or a tail that is not this run's end, continues nothing here.
        if r.len < 2
            || r.ppn == TOMBSTONE
            || (g << GROUP_SHIFT) + r.start() + r.len() != t.lpn
            || !words::within_a_word(r.start(), r.len())
        {
            return;
        }
        let Some(blob) = self.groups.blob_mut(g) else {
            return;
        };
        if !group::move_run_in_place(blob, r.start(), r.len(), r.ppn) {
            return;
        }
        let delta = &mut self.deltas[t.d as usize];
        delta.runs.remove(t.at as usize);
        self.bits_pool
            .set_bits(delta.bits, r.start(), r.start() + r.len(), false);
        delta.cursor = delta.cursor.min(delta.runs.len().saturating_sub(1) as u16);
        delta.entries -= r.len;
        self.buffered_entries -= u64::from(r.len);
        // Run indices moved; what the lookup cursor caches did not change.
        self.tail = Tail::NONE;
        self.last_delta = NO_LAST_DELTA;
        self.follow.get_mut().lpn = 0;
        if self.deltas[t.d as usize].entries == 0 {
            self.drop_delta(t.d);
        }
        self.stats.runs_moved_in_place += 1;
    }

    /// Writes `ppn` for mapped, unbuffered `lpn` into its group's blob when it fits there: a
    /// random overwrite then costs one search and a few bits, where the buffer would take an
    /// insertion and its share of a merge that re-encodes the whole group.
    #[inline]
    fn update_in_place(&mut self, lpn: u32, ppn: u32) -> bool {
        let Some(blob) = self.groups.blob_mut(lpn >> GROUP_SHIFT) else {
            return false;
        };
        if !group::update_in_place(blob, lpn & OFFSET_MASK, ppn) {
            return false;
        }
        self.span.get_mut().forget(lpn);
        self.stats.updates_in_place += 1;
        true
    }

    #[inline(never)]
    fn remove_mapped(&mut self, lpn: u32, buffered: bool) {
        self.flush_tail();
        // A tombstone only where the blob still maps the LPN; otherwise forgetting is enough.
        // An answer from the compressed layer says it does, without a second search.
        let blob_maps = !buffered || self.compressed(lpn).is_some();
        self.write_delta(lpn, blob_maps.then_some(TOMBSTONE));
        self.live -= 1;
        self.merge_while_over_bound();
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
