//! How fast could another layout answer a trace's lookups? Bounds for design decisions, not
//! tables, timed on the trace-order lookups `ftlab mapbench` times (log-head PPNs; fastest of
//! seven alternating rounds, each layout's pass timed after an untimed one) against the flat u64
//! array, beside the learned table itself:
//!
//! - `bitmap+rank+u32`: one bit per LPN, a rank (u32) per 64-bit word, and a plain u32 per live
//!   mapping (no compression, no update buffer, no cursor; about 5 bytes a mapping).
//! - `starts+rank+u32 per run`: one bit per LPN marking where a run begins (a run of consecutive
//!   PPNs, or of unmapped LPNs), a rank per 64-bit word, and per run a u32 difference between
//!   its first PPN and first LPN (or a mark for unmapped): the same lookup as the previous
//!   layout, keyed by runs, so it pays per run rather than per mapping (static, no buffer, no
//!   cursor).
//! - the same in 4096-LPN groups as an updatable table would hold it: a directory (empty groups
//!   hold nothing), runs cut at groups' edges, and beside each word's run starts a bitmap of the
//!   offsets an update buffer holds, tested by every lookup (none set here); then the same
//!   behind a one-entry cursor keeping the run's part within its word, as the learned table's
//!   bitmap words do. The least such a design's compressed layer would cost, on either side of
//!   the cursor.
//! - `runs+cursor`: the mapping's maximal runs in one sorted array (12 bytes a run, the extent
//!   map's size), with the learned table's one-entry cursor; a lookup the cursor misses is one
//!   branch-free halving search. No groups, no buffer: the least a run-keyed layout with a
//!   cursor does.
//! - `runs+slots+cursor`: the same, but a miss first reads which runs its LPN's
//!   `2^SLOT_SHIFT`-LPN slot spans (4 bytes a slot) and searches only those.
//!
//! Every layout's answers are checked against the trace's final mapping before the timing. Last,
//! the lookups the learned table's cursor missed are timed alone, back to back, through each
//! layout's miss path: where the learned table's miss goes, and what the bounds' cost.
//!
//! ```text
//! cargo build --release --example rank_bound
//! target/release/examples/rank_bound ../shared/traces/pgbench.nbdlog.gz
//! ```
//!
//! The rank is a popcount: x86-64's baseline has no POPCNT instruction, and its software
//! replacement is most of that layout's lookup. `RUSTFLAGS="-C target-feature=+popcnt"` (in
//! another target directory) shows the difference.
use ftlab_core::ftl::mapping::runs::count_le;
use ftlab_core::ftl::mapping::MappingTable;
use ftlab_learned::{LearnedMapping, GROUP_LPNS, GROUP_SHIFT};
use ftlab_mapbench::{ops_from_trace, PpnSource, REMOVE};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Mapped LPNs as a bitmap with a rank per word; their PPNs in LPN order.
struct Rank {
    bits: Vec<u64>,
    before: Vec<u32>,
    vals: Vec<u32>,
}

impl Rank {
    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let w = (lpn / 64) as usize;
        let word = self.bits[w];
        let bit = 1u64 << (lpn % 64);
        if word & bit == 0 {
            return None;
        }
        let r = self.before[w] as usize + (word & (bit - 1)).count_ones() as usize;
        Some(self.vals[r])
    }
}

/// The value a run-keyed layout stores for `lpn` mapped to `v` (or unmapped: `REMOVE`): the PPN
/// less the LPN, the same for every LPN of a run of consecutive PPNs, or `UNMAPPED`.
fn run_diff(lpn: u32, v: u32) -> u32 {
    if v == REMOVE {
        return UNMAPPED;
    }
    let diff = v.wrapping_sub(lpn);
    // A mapping whose diff were UNMAPPED would read as unmapped; not on these traces.
    assert_ne!(diff, UNMAPPED, "lpn {lpn}");
    diff
}

/// The PPN a run-keyed layout answers for `lpn` from its run's `run_diff`.
#[inline(always)]
fn ppn_from(lpn: u32, diff: u32) -> Option<u32> {
    (diff != UNMAPPED).then(|| lpn.wrapping_add(diff))
}

/// Whether a group's LPNs map nothing (a directory would hold no words for it).
fn maps_nothing(lpns: &[u32]) -> bool {
    lpns.iter().all(|&v| v == REMOVE)
}

/// Where each maximal run begins, one bit per LPN with a rank per word, and per run the
/// difference between its first PPN and first LPN (`UNMAPPED` for a run of unmapped LPNs).
struct RunRank {
    /// (bits, runs begun before the word) for each 64 LPNs, side by side: one line per lookup.
    words: Vec<(u64, u32)>,
    /// Per run, its first PPN less its first LPN (wrapping), which is `ppn - lpn` for each of
    /// its LPNs; `UNMAPPED` for a run of unmapped LPNs.
    diffs: Vec<u32>,
}

impl RunRank {
    fn new(oracle: &[u32]) -> Self {
        let mut words = vec![(0u64, 0u32); oracle.len().div_ceil(64)];
        let mut diffs: Vec<u32> = Vec::new();
        let mut last = None;
        for (lpn, &v) in oracle.iter().enumerate() {
            let diff = run_diff(lpn as u32, v);
            if last != Some(diff) {
                words[lpn / 64].0 |= 1 << (lpn % 64);
                diffs.push(diff);
                last = Some(diff);
            }
        }
        let mut before = 0u32;
        for w in &mut words {
            w.1 = before;
            before += w.0.count_ones();
        }
        RunRank { words, diffs }
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let (word, before) = self.words[(lpn / 64) as usize];
        // Run starts at or below the LPN's bit; LPN 0 begins a run, so the count is at least 1.
        let r = before as usize + (word << (63 - lpn % 64)).count_ones() as usize - 1;
        ppn_from(lpn, self.diffs[r])
    }

    fn bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<(u64, u32)>() + self.diffs.len() * 4
    }

    /// `bytes` counting only the groups (of the learned table's size) that map a page (their words and the runs
    /// beginning in them), as a table whose directory skips empty groups would hold.
    fn bytes_in_mapped_groups(&self, oracle: &[u32]) -> usize {
        let mut bytes = 0;
        let words_per_group = GROUP_LPNS / 64;
        for (g, lpns) in oracle.chunks(GROUP_LPNS).enumerate() {
            if maps_nothing(lpns) {
                continue;
            }
            let first = g * words_per_group;
            let words = &self.words[first..(first + words_per_group).min(self.words.len())];
            let runs: u32 = words.iter().map(|w| w.0.count_ones()).sum();
            bytes += std::mem::size_of_val(words) + runs as usize * 4;
        }
        bytes
    }
}

/// `RunRank` as an updatable table would have to hold it: the learned table's groups behind a directory
/// (empty groups hold nothing), runs cut at groups' edges, and beside each word's run starts a
/// bitmap of the offsets an update buffer holds, which every lookup tests first (here none is
/// set: the bound is for the compressed layer's answer).
struct GroupedRunRank {
    /// Per group, its first word in `words`, or `u32::MAX` where it maps nothing.
    dir: Vec<u32>,
    words: Vec<LeanWord>,
    diffs: Vec<u32>,
    /// (first LPN, length, diff) of the run part the last `get_cursor` miss found, within its
    /// word, as the learned table's bitmap words keep it.
    span: std::cell::Cell<(u32, u32, u32)>,
}

#[derive(Clone, Copy)]
struct LeanWord {
    starts: u64,
    buffered: u64,
    /// Runs begun in earlier words.
    before: u32,
}

impl GroupedRunRank {
    fn new(oracle: &[u32]) -> Self {
        let mut t = GroupedRunRank {
            dir: Vec::new(),
            words: Vec::new(),
            diffs: Vec::new(),
            span: std::cell::Cell::new((0, 0, 0)),
        };
        for (g, lpns) in oracle.chunks(GROUP_LPNS).enumerate() {
            if maps_nothing(lpns) {
                t.dir.push(u32::MAX);
                continue;
            }
            t.dir.push(t.words.len() as u32);
            let first = t.words.len();
            t.words.resize(
                first + GROUP_LPNS / 64,
                LeanWord {
                    starts: 0,
                    buffered: 0,
                    before: 0,
                },
            );
            let mut last = None;
            for (i, &v) in lpns.iter().enumerate() {
                let diff = run_diff((g * GROUP_LPNS + i) as u32, v);
                if last != Some(diff) {
                    t.words[first + i / 64].starts |= 1 << (i % 64);
                    t.diffs.push(diff);
                    last = Some(diff);
                }
            }
        }
        let mut before = 0u32;
        for w in &mut t.words {
            w.before = before;
            before += w.starts.count_ones();
        }
        t
    }

    /// `lpn`'s word and its run starts at or below the LPN's bit, shifted to the top; `None`
    /// where its group maps nothing.
    #[inline(always)]
    fn word_of(&self, lpn: u32) -> Option<(LeanWord, u64)> {
        let first = self.dir[(lpn >> GROUP_SHIFT) as usize];
        if first == u32::MAX {
            return None;
        }
        let w = self.words[first as usize + (lpn as usize % GROUP_LPNS) / 64];
        Some((w, w.starts << (63 - lpn % 64)))
    }

    /// The diff of the run holding the LPN whose run starts at or below its bit are `upto` in
    /// word `w`.
    #[inline(always)]
    fn diff_of(&self, w: LeanWord, upto: u64) -> u32 {
        self.diffs[w.before as usize + upto.count_ones() as usize - 1]
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let (w, upto) = self.word_of(lpn)?;
        if w.buffered >> (lpn % 64) & 1 != 0 {
            return buffered_lookup(lpn);
        }
        ppn_from(lpn, self.diff_of(w, upto))
    }

    /// `get` behind a one-entry cursor: a miss keeps the run's part within the word (a bit scan
    /// each way) for the next lookup.
    #[inline]
    fn get_cursor(&self, lpn: u32) -> Option<u32> {
        let (lo, len, diff) = self.span.get();
        if lpn.wrapping_sub(lo) < len {
            return ppn_from(lpn, diff);
        }
        self.miss_cursor(lpn)
    }

    #[inline(never)]
    fn miss_cursor(&self, lpn: u32) -> Option<u32> {
        let Some((w, upto)) = self.word_of(lpn) else {
            let group_lpns = GROUP_LPNS as u32;
            self.span
                .set((lpn / group_lpns * group_lpns, group_lpns, UNMAPPED));
            return None;
        };
        let i = lpn % 64;
        if w.buffered >> i & 1 != 0 {
            return buffered_lookup(lpn);
        }
        let diff = self.diff_of(w, upto);
        // The run's part in this word: from its start (or the word's) to the next start.
        let lo = if upto == 0 {
            0
        } else {
            i - upto.leading_zeros()
        };
        let after = w.starts & (u64::MAX << i << 1);
        let hi = if after == 0 {
            64
        } else {
            after.trailing_zeros()
        };
        self.span.set((lpn - i + lo, hi - lo, diff));
        ppn_from(lpn, diff)
    }

    fn bytes(&self) -> usize {
        self.dir.len() * 4
            + self.words.len() * std::mem::size_of::<LeanWord>()
            + self.diffs.len() * 4
    }
}

/// Where a buffered offset's lookup would go (never taken here).
#[inline(never)]
fn buffered_lookup(lpn: u32) -> Option<u32> {
    black_box(Some(lpn))
}

/// The mapping as its maximal runs (consecutive LPNs to consecutive PPNs, or all unmapped) in one
/// sorted array, with a one-entry cursor as the learned table keeps (`Span`): a lookup the
/// cursor misses is a branch-free halving search and a store, the least a run-keyed layout with
/// a cursor can do (12 bytes a run, the extent map's size, no buffer).
struct RunsCursor {
    starts: Vec<u32>,
    /// (first PPN or `UNMAPPED`, length) of each run.
    runs: Vec<(u32, u32)>,
    /// (first LPN, length, first PPN or `UNMAPPED`) of the last run a miss found; `get` and
    /// `get_slotted` share it, as both find the same runs.
    span: std::cell::Cell<(u32, u32, u32)>,
    /// For each `2^SLOT_SHIFT` LPNs, the run holding the first; after the last slot, the last
    /// run. A slot's LPNs lie in runs `slots[k]..=slots[k + 1]`.
    slots: Vec<u32>,
}

const UNMAPPED: u32 = u32::MAX;

/// LPNs per slot of `RunsCursor::slots`.
const SLOT_SHIFT: u32 = 8;

impl RunsCursor {
    fn new(oracle: &[u32]) -> Self {
        let (mut starts, mut runs) = (Vec::new(), Vec::<(u32, u32)>::new());
        for (lpn, &v) in oracle.iter().enumerate() {
            let v = if v == REMOVE { UNMAPPED } else { v };
            if let Some(last) = runs.last_mut() {
                let next = if last.0 == UNMAPPED {
                    UNMAPPED
                } else {
                    last.0.wrapping_add(last.1)
                };
                if next == v {
                    last.1 += 1;
                    continue;
                }
            }
            starts.push(lpn as u32);
            runs.push((v, 1));
        }
        let n_slots = oracle.len().div_ceil(1 << SLOT_SHIFT);
        let mut slots = Vec::with_capacity(n_slots + 1);
        let mut i = 0;
        for slot in 0..n_slots {
            let lpn = (slot << SLOT_SHIFT) as u32;
            while i + 1 < starts.len() && starts[i + 1] <= lpn {
                i += 1;
            }
            slots.push(i as u32);
        }
        slots.push(starts.len() as u32 - 1);
        RunsCursor {
            starts,
            runs,
            span: std::cell::Cell::new((0, 0, 0)),
            slots,
        }
    }

    /// The cursor's answer, if its span holds `lpn` (`Some(None)`: unmapped).
    #[inline]
    fn cursor(&self, lpn: u32) -> Option<Option<u32>> {
        let (lo, len, ppn) = self.span.get();
        let d = lpn.wrapping_sub(lo);
        (d < len).then(|| (ppn != UNMAPPED).then(|| ppn + d))
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        self.cursor(lpn).unwrap_or_else(|| self.miss(lpn))
    }

    #[inline]
    fn get_slotted(&self, lpn: u32) -> Option<u32> {
        self.cursor(lpn).unwrap_or_else(|| self.miss_slotted(lpn))
    }

    #[inline(never)]
    fn miss(&self, lpn: u32) -> Option<u32> {
        // Branch-free halving, the learned table's own (`runs::count_le`).
        self.found(
            count_le(self.starts.len(), |i| self.starts[i] <= lpn) - 1,
            lpn,
        )
    }

    /// `miss` with the search narrowed to the runs of `lpn`'s slot.
    #[inline(never)]
    fn miss_slotted(&self, lpn: u32) -> Option<u32> {
        let slot = (lpn >> SLOT_SHIFT) as usize;
        let (a, b) = (self.slots[slot] as usize, self.slots[slot + 1] as usize);
        self.found(
            a + count_le(b + 1 - a, |i| self.starts[a + i] <= lpn) - 1,
            lpn,
        )
    }

    /// Keeps run `i`, which holds `lpn`, as the span, and answers from it.
    #[inline(always)]
    fn found(&self, i: usize, lpn: u32) -> Option<u32> {
        let (ppn, len) = self.runs[i];
        let lo = self.starts[i];
        self.span.set((lo, len, ppn));
        (ppn != UNMAPPED).then(|| ppn + (lpn - lo))
    }
}

/// Seconds for one pass of `f` over `lpns`, timed after an untimed one: each layout is timed
/// with its own data in the caches, as `ftlab mapbench` times a table's passes back to back
/// (timed straight after the other layouts' passes, the flat array ran a third slower).
#[inline(always)]
fn warm_pass(lpns: &[u32], f: impl Fn(u32) -> Option<u32>) -> f64 {
    for &lpn in lpns {
        black_box(f(black_box(lpn)));
    }
    let t = Instant::now();
    for &lpn in lpns {
        black_box(f(black_box(lpn)));
    }
    t.elapsed().as_secs_f64()
}

fn main() -> anyhow::Result<()> {
    let Some(trace) = std::env::args().nth(1) else {
        eprintln!("usage: rank_bound TRACE (any format `ftlab sim` reads)");
        std::process::exit(2);
    };
    let ops = ops_from_trace(Path::new(&trace), None, None, PpnSource::LogHead)?;
    let oracle = ops.oracle();
    let n = oracle.len();
    let mut flat = vec![u64::MAX; n];
    let mut bits = vec![0u64; n.div_ceil(64)];
    let mut vals = Vec::new();
    for (lpn, &v) in oracle.iter().enumerate() {
        if v != REMOVE {
            flat[lpn] = u64::from(v);
            bits[lpn / 64] |= 1 << (lpn % 64);
            vals.push(v);
        }
    }
    let mut before = vec![0u32; bits.len()];
    for w in 1..bits.len() {
        before[w] = before[w - 1] + bits[w - 1].count_ones();
    }
    let rank = Rank { bits, before, vals };
    let runs = RunsCursor::new(&oracle);
    let run_rank = RunRank::new(&oracle);
    let grouped = GroupedRunRank::new(&oracle);
    // The learned table itself, after the trace's updates, as `ftlab mapbench` times it.
    let mut learned = LearnedMapping::new(ops.logical_pages);
    for &(lpn, v) in &ops.updates {
        if v == REMOVE {
            learned.remove(lpn);
        } else {
            learned.set(lpn, v);
        }
    }
    let bytes = rank.bits.len() * 8 + rank.before.len() * 4 + rank.vals.len() * 4;
    // Each layout answers as the trace's final mapping does (before any timing).
    for &lpn in ops.gets.iter().chain(&ops.random_gets) {
        let want = oracle.get(lpn as usize).copied().filter(|&v| v != REMOVE);
        assert_eq!(rank.get(lpn), want, "bitmap+rank, lpn {lpn}");
        assert_eq!(run_rank.get(lpn), want, "starts+rank, lpn {lpn}");
        assert_eq!(grouped.get(lpn), want, "grouped starts+rank, lpn {lpn}");
        assert_eq!(
            grouped.get_cursor(lpn),
            want,
            "grouped starts+rank+cursor, lpn {lpn}"
        );
        assert_eq!(runs.get(lpn), want, "runs+cursor, lpn {lpn}");
        assert_eq!(runs.get_slotted(lpn), want, "runs+slots+cursor, lpn {lpn}");
        assert_eq!(learned.get_uncounted(lpn), want, "learned, lpn {lpn}");
    }
    let (mut tf, mut tr, mut tc, mut tl) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    let (mut ts, mut tq, mut tg, mut tgc) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..7 {
        tf = tf.min(warm_pass(&ops.gets, |lpn| {
            let v = flat[lpn as usize];
            (v != u64::MAX).then_some(v as u32)
        }));
        tr = tr.min(warm_pass(&ops.gets, |lpn| rank.get(lpn)));
        tq = tq.min(warm_pass(&ops.gets, |lpn| run_rank.get(lpn)));
        tg = tg.min(warm_pass(&ops.gets, |lpn| grouped.get(lpn)));
        tgc = tgc.min(warm_pass(&ops.gets, |lpn| grouped.get_cursor(lpn)));
        tc = tc.min(warm_pass(&ops.gets, |lpn| runs.get(lpn)));
        ts = ts.min(warm_pass(&ops.gets, |lpn| runs.get_slotted(lpn)));
        learned.note_gets(2 * ops.gets.len() as u64);
        tl = tl.min(warm_pass(&ops.gets, |lpn| learned.get(lpn)));
    }
    let per = |t: f64| t * 1e9 / ops.gets.len() as f64;
    println!(
        "{trace}: flat {:.2} ns, bitmap+rank+u32 {:.2} ns ({:.2}x), {:.2} B per live mapping",
        per(tf),
        per(tr),
        tf / tr,
        bytes as f64 / rank.vals.len().max(1) as f64
    );
    println!(
        "  starts+rank+u32 per run {:.2} ns ({:.2}x), {:.3} B per live mapping over the whole \
         device ({:.3} over the groups that map a page), {} runs",
        per(tq),
        tf / tq,
        run_rank.bytes() as f64 / rank.vals.len().max(1) as f64,
        run_rank.bytes_in_mapped_groups(&oracle) as f64 / rank.vals.len().max(1) as f64,
        run_rank.diffs.len()
    );
    println!(
        "  the same in groups, with a directory and buffered bits {:.2} ns ({:.2}x), {:.3} B per \
         live mapping",
        per(tg),
        tf / tg,
        grouped.bytes() as f64 / rank.vals.len().max(1) as f64,
    );
    println!(
        "  the same behind a one-entry cursor {:.2} ns ({:.2}x)",
        per(tgc),
        tf / tgc,
    );
    println!(
        "  runs+cursor {:.2} ns ({:.2}x), {} runs ({:.3} B per live mapping at 12 B a run)",
        per(tc),
        tf / tc,
        runs.runs.len(),
        12.0 * runs.runs.len() as f64 / rank.vals.len().max(1) as f64
    );
    println!(
        "  runs+slots+cursor {:.2} ns ({:.2}x), +{:.3} B per live mapping for the slots",
        per(ts),
        tf / ts,
        4.0 * runs.slots.len() as f64 / rank.vals.len().max(1) as f64
    );
    println!("  learned {:.2} ns ({:.2}x)", per(tl), tf / tl);
    // The learned table's cursor misses alone, back to back: what each layout's miss path
    // costs for just those LPNs (the learned table through `get`, where nearly all miss again,
    // and through its compressed layer alone: the directory and the blob, no buffer, no
    // cursor). Each lookup goes through one indirect call; the flat u64 column is about that.
    let mut misses = Vec::new();
    let cursor_misses = |t: &LearnedMapping| t.activity().get_cursor_misses;
    learned.note_gets(ops.gets.len() as u64);
    for &lpn in &ops.gets {
        let before = cursor_misses(&learned);
        learned.get(lpn);
        if cursor_misses(&learned) != before {
            misses.push(lpn);
        }
    }
    let per_miss = |f: &dyn Fn(u32) -> Option<u32>| {
        (0..7)
            .map(|_| {
                let t = Instant::now();
                for &lpn in &misses {
                    black_box(f(black_box(lpn)));
                }
                t.elapsed().as_secs_f64() * 1e9 / misses.len().max(1) as f64
            })
            .fold(f64::MAX, f64::min)
    };
    learned.note_gets(7 * misses.len() as u64);
    println!(
        "  the learned table's {} cursor misses alone, ns each: learned {:.1} (its compressed \
         layer alone {:.1}), runs+cursor's search {:.1}, runs+slots+cursor's {:.1}, starts+rank \
         {:.1}, flat u64 {:.1}",
        misses.len(),
        per_miss(&|lpn| learned.get(lpn)),
        per_miss(&|lpn| learned.compressed(lpn)),
        per_miss(&|lpn| runs.miss(lpn)),
        per_miss(&|lpn| runs.miss_slotted(lpn)),
        per_miss(&|lpn| run_rank.get(lpn)),
        per_miss(&|lpn| {
            let v = flat[lpn as usize];
            (v != u64::MAX).then_some(v as u32)
        }),
    );
    Ok(())
}
