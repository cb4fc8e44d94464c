//! One group's compressed form: a byte blob that answers a lookup without decoding the rest.
//! Each group takes the smaller of the segments (`segments.rs`, the learned encoding) and a run
//! list (`run_list.rs`), or the bitmap words of `words.rs` where those cost little more; and
//! where a few pages leave a line that resumes after them (outliers), whichever of those the
//! group without them takes, with the outliers listed apart (`patches.rs`), if that is smaller
//! (docs/mapping.md draws all four). A blob's first u16 says which: a segment blob's `live`
//! (at most `GROUP_LPNS`), or a flag above any `live` (`PATCH_FLAG`, `WORDS_FLAG`, `RUNS_FLAG`).
//!
//! This file holds what the encodings share (the answer a lookup gives, the position it leaves
//! for the next, the searches of sorted u16 offsets), dispatches each operation on a blob to
//! its encoding, and chooses the encoding of a group (`encode_runs`, `encode_plain`).
//!
//! Every field is read with one unaligned u64 load (`packed.rs`), so the caller keeps `TAIL_PAD`
//! readable bytes after a blob (the arena pads its end once, not every blob).

use super::elias_fano;
use super::fit::{self, bits_for, Segment};
use super::packed::rd16;
use super::patches::{self, PATCH_FLAG};
use super::run_list::{self, RUNS_FLAG};
use super::segments::{self, HEADER_BYTES};
use super::words::{self, WORDS_FLAG};
use super::GROUP_LPNS;

/// A group takes the bitmap-word encoding (`words.rs`) when it costs at most this fraction
/// (numerator, denominator) of the smaller of the other two...
pub const WORDS_MAX_GROWTH: (usize, usize) = (3, 2);
/// ...and at most 4 bytes per mapping plus this: a full group of random PPNs packed in one
/// segment (docs/mapping.md, "Worst case"), so the bound there holds for every encoding.
const WORST_CASE_GROUP_BYTES: usize = HEADER_BYTES + 2 + 3;
/// Readable bytes the caller keeps after every blob.
pub const TAIL_PAD: usize = 8;
pub const UNMAPPED: u32 = u32::MAX;

/// Index of the last element of the ascending u16 array at `at` (length `n`, values below
/// `span`) that is <= `key`, or None when all are greater.
///
/// Interpolation first: the arrays (run starts over a group's offsets, segment starts over its
/// ranks) are spread fairly evenly, so the element is usually within a few of
/// `key * n / span`. From the guess, steps of 16, 32, ... bracket it, and halving finishes. A
/// plain halving search over a few hundred starts reads a new cache line at each of its first
/// steps, each waiting for the last: on pgbench's groups that was most of a lookup.
#[inline]
pub(super) fn last_le(b: &[u8], at: usize, n: usize, key: u32, span: u32) -> Option<usize> {
    let value = |i: usize| rd16(b, at + 2 * i);
    use ftlab_core::ftl::mapping::runs::{count_le, count_le_from};
    if n <= INTERPOLATE_ABOVE {
        return count_le(n, |i| value(i) <= key).checked_sub(1);
    }
    debug_assert!(span > 0 && value(n - 1) < span);
    let guess = ((u64::from(key) * n as u64 / u64::from(span)) as usize).min(n - 1);
    count_le_from(n, guess, 16, |i| value(i) <= key).checked_sub(1)
}

/// Arrays up to this long are searched by plain halving (they span a line or two).
const INTERPOLATE_ABOVE: usize = 128;

/// The run holding `off` among `n` runs whose starts are sorted u16s at `at` and whose lengths
/// `len_of` gives: `Ok((index, start, len))`, or `Err` with the hole around `off` (segment blobs
/// and run lists with u16 offsets keep their mapped offsets this way).
#[inline]
pub(super) fn find_run(
    b: &[u8],
    at: usize,
    n: usize,
    off: u32,
    len_of: impl Fn(usize) -> u32,
) -> Result<(usize, u32, u32), Lookup> {
    let start_of = |i: usize| {
        if i < n {
            rd16(b, at + 2 * i)
        } else {
            GROUP_LPNS as u32
        }
    };
    let Some(i) = last_le(b, at, n, off, GROUP_LPNS as u32) else {
        return Err(Lookup {
            ppn: None,
            lo: 0,
            hi: start_of(0),
            room: NO_ROOM,
            next: Finger::before_run(0),
        });
    };
    let (start, len) = (start_of(i), len_of(i));
    if off - start >= len {
        return Err(Lookup {
            ppn: None,
            lo: start + len,
            hi: start_of(i + 1),
            room: NO_ROOM,
            next: Finger::before_run(i + 1),
        });
    }
    Ok((i, start, len))
}

/// What a lookup learns: the PPN of the offset asked for, and the range `lo..hi` of offsets
/// around it that continue it (consecutive PPNs, or all unmapped), so that a caller can answer
/// neighbours without another search.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub ppn: Option<u32>,
    pub lo: u32,
    pub hi: u32,
    /// PPNs `room.0..=room.1` that `update_in_place` could write in place of this one (bits
    /// permitting; it still refuses a value that continues a neighbour), or `NO_ROOM`.
    pub room: (u32, u32),
    /// Where offset `hi` sits in the blob: `lookup_next` answers it from here without a search.
    pub next: Finger,
}

/// A position in a blob, for `lookup_next`: sequential lookups that leave one span enter the
/// next, and on short runs (pgbench's average 2.6 pages) that was half of all searches.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finger {
    /// The run of mapped offsets (interval of a segment blob, run of a run list) holding the
    /// offset, or the first one after it.
    pub(super) run: u16,
    /// Segment blobs: the rank of the first mapped offset at or after the offset...
    pub(super) rank: u16,
    /// ...and the segment holding that rank (`n_segments` past the last), or `SEGMENT_UNKNOWN`.
    pub(super) segment: u16,
}

pub(super) const SEGMENT_UNKNOWN: u16 = u16::MAX;

impl Finger {
    pub const NONE: Finger = Finger::before_run(0);

    /// In the hole before run `i` (its rank and segment still to be found).
    pub(super) const fn before_run(i: usize) -> Finger {
        Finger {
            run: i as u16,
            rank: 0,
            segment: SEGMENT_UNKNOWN,
        }
    }
}

/// A `Lookup::room` no PPN is in.
pub const NO_ROOM: (u32, u32) = (1, 0);

/// The values `lo + 0..2^width` clipped to PPNs.
#[inline]
pub(super) fn room(lo: i64, width: u32) -> (u32, u32) {
    let hi = lo + (1i64 << width) - 1;
    (
        lo.clamp(0, i64::from(u32::MAX)) as u32,
        hi.clamp(0, i64::from(u32::MAX)) as u32,
    )
}
/// The PPN of group offset `off`, if mapped.
#[inline]
pub fn get(b: &[u8], off: u32) -> Option<u32> {
    lookup(b, off).ppn
}

#[inline]
pub fn lookup(b: &[u8], off: u32) -> Lookup {
    lookup_with::<false>(b, off)
}

/// `lookup`, filling `Lookup::room` only when `ROOM` (updates use it; plain reads do not pay
/// for it).
#[inline]
pub fn lookup_with<const ROOM: bool>(b: &[u8], off: u32) -> Lookup {
    let first = rd16(b, 0);
    // One compare for the segments (every flag is above their `live`).
    if first >= PATCH_FLAG {
        if first & RUNS_FLAG != 0 {
            return run_list::lookup(b, off);
        }
        if first & WORDS_FLAG != 0 {
            return words::lookup_with::<ROOM>(b, off);
        }
        return patches::lookup_with::<ROOM>(b, off);
    }
    segments::lookup::<ROOM>(b, off)
}

/// `lookup_with` for a blob that is not patched (a patched blob's inner one): without the call
/// back into `patches.rs`, which would make `lookup_with` recursive and keep it out of line.
#[inline]
pub(super) fn lookup_unpatched<const ROOM: bool>(b: &[u8], off: u32) -> Lookup {
    let first = rd16(b, 0);
    debug_assert_eq!(first & PATCH_FLAG, 0);
    if first & RUNS_FLAG != 0 {
        return run_list::lookup(b, off);
    }
    if first & WORDS_FLAG != 0 {
        return words::lookup_with::<ROOM>(b, off);
    }
    segments::lookup::<ROOM>(b, off)
}

/// `lookup_with(b, off)` for the offset where an earlier lookup's span ended (`off` is its
/// `hi`, `at` its `next`, the blob unchanged since): the run and segment are known, so no search.
#[inline]
pub fn lookup_next<const ROOM: bool>(b: &[u8], off: u32, at: Finger) -> Lookup {
    if rd16(b, 0) & WORDS_FLAG != 0 {
        return words::lookup_with::<ROOM>(b, off);
    }
    if rd16(b, 0) & PATCH_FLAG != 0 {
        return patches::lookup_with::<ROOM>(b, off);
    }
    if rd16(b, 0) & RUNS_FLAG != 0 {
        return run_list::lookup_next(b, off, at);
    }
    segments::lookup_next::<ROOM>(b, off, at)
}

/// Following on at `off` (`at` from the span before): `start`, the start of run `at.run` (past
/// the last, the group's end), when `off` has reached it, or the hole from `off` up to it.
#[inline]
pub(super) fn run_reached(start: u32, off: u32, at: Finger) -> Result<u32, Lookup> {
    if off < start {
        return Err(Lookup {
            ppn: None,
            lo: off,
            hi: start,
            room: NO_ROOM,
            next: at,
        });
    }
    Ok(start)
}

/// Maps offsets `off..off + len` (`len` >= 2) to `ppn, ppn + 1, ...` inside the blob, where they
/// are exactly one run of it and its new first PPN fits where the old one was (a run rewritten
/// whole through the buffer: `LearnedMapping::settle_tail_run`). Bitmap words only, for now; false (the
/// blob untouched) in the other encodings, and where `update_in_place` would refuse.
pub fn move_run_in_place(b: &mut [u8], off: u32, len: u32, ppn: u32) -> bool {
    debug_assert!(len >= 2);
    rd16(b, 0) & WORDS_FLAG != 0 && words::move_run_in_place(b, off, len, ppn)
}

/// Changes mapped offset `off` to `ppn` inside the blob, when the blob can hold the new value in
/// the bits the old one took: a residual of a packed segment that stays within its width, the
/// base of a one-point segment that stays within the base field, or the PPN of a one-page run
/// in a run list that stays within the list's PPN field. False (the blob untouched) otherwise,
/// and also when
/// the new PPN would continue a neighbour's: a merge then re-encodes the group, so that a group
/// that turns sequential shrinks instead of keeping its random layout.
pub fn update_in_place(b: &mut [u8], off: u32, ppn: u32) -> bool {
    if rd16(b, 0) & WORDS_FLAG != 0 {
        return words::update_in_place(b, off, ppn);
    }
    if rd16(b, 0) & PATCH_FLAG != 0 {
        return patches::update_in_place(b, off, ppn);
    }
    if rd16(b, 0) & RUNS_FLAG != 0 {
        return run_list::update_in_place(b, off, ppn);
    }
    segments::update_in_place(b, off, ppn)
}

/// Bytes the blob at the start of `b` occupies (`b` keeps the `TAIL_PAD` bytes after it, as for
/// every read of a blob).
pub fn encoded_len(b: &[u8]) -> usize {
    let first = rd16(b, 0);
    if first & RUNS_FLAG != 0 {
        return run_list::encoded_len(b);
    }
    if first & WORDS_FLAG != 0 {
        return words::encoded_len(b);
    }
    if first & PATCH_FLAG != 0 {
        return patches::encoded_len(b);
    }
    segments::encoded_len(b)
}

/// Working memory for encoding, allocated per merge (it is not part of the table at rest).
#[derive(Default)]
pub struct Scratch {
    /// `encode`'s runs, built from its dense input.
    input: Vec<GroupRun>,
    ys: Vec<u32>,
    /// (offset, length, first PPN) of each run of consecutive PPNs.
    runs: Vec<GroupRun>,
    starts: Vec<u16>,
    ranks: Vec<u16>,
    best: Vec<Segment>,
    trial: Vec<Segment>,
    pub(super) out: Vec<u8>,
    /// The group's runs with its outliers put back on the line, and the outliers
    /// (`patches::find`).
    line: Vec<GroupRun>,
    patches: Vec<(u16, u32)>,
    /// What listing the outliers apart would save, as `encode_plain` counted them: (runs the
    /// line would not need, pages listed).
    outliers: (usize, usize),
    /// The line's encoding, and the patched blob around it.
    inner: Vec<u8>,
    patched: Vec<u8>,
}

/// Candidates tried after the exact segments, the smallest encoding winning: one packed segment
/// (slope 0), one line through the endpoints, and the cone fit with `CONE_EPS`, which trades 8
/// residual bits for fewer segments (tried only when it beats packing and the best so far on
/// the first `CONE_PROBE_POINTS`). On pgbench they beat the exact segments in about 1 % of the
/// groups.
const CANDIDATES: usize = 3;
const CONE_EPS: i64 = 127;
const CONE_PROBE_POINTS: usize = 256;

/// Encodes `dense` (one PPN or `UNMAPPED` per group offset) into the scratch's buffer and
/// returns it; None when nothing is mapped.
pub fn encode<'s>(dense: &[u32], s: &'s mut Scratch) -> Option<&'s [u8]> {
    debug_assert!(dense.len() <= GROUP_LPNS);
    let mut runs = std::mem::take(&mut s.input);
    dense_runs(dense, &mut runs);
    let encoded = encode_runs(&runs, s).is_some();
    s.input = runs;
    encoded.then_some(s.out.as_slice())
}

/// (offset, length, first PPN): a run of consecutive offsets mapping to consecutive PPNs.
pub type GroupRun = (u16, u16, u32);

/// The runs of `dense` (one PPN or `UNMAPPED` per group offset), into `runs`.
pub(super) fn dense_runs(dense: &[u32], runs: &mut Vec<GroupRun>) {
    runs.clear();
    for (off, &ppn) in dense.iter().enumerate() {
        if ppn != UNMAPPED {
            push_run(runs, off as u32, 1, ppn);
        }
    }
}

/// Appends a run, joining it to the last one when it continues it.
#[inline]
pub fn push_run(runs: &mut Vec<GroupRun>, off: u32, len: u32, ppn: u32) {
    if let Some((o, l, p)) = runs.last_mut() {
        if u32::from(*o) + u32::from(*l) == off && p.wrapping_add(u32::from(*l)) == ppn {
            *l += len as u16;
            return;
        }
    }
    runs.push((off as u16, len as u16, ppn));
}

/// The blob's mappings as runs, in offset order: O(runs) for exact segments and run lists, one
/// step per point elsewhere.
/// The blob's mappings as runs, in offset order: O(runs) for exact segments and run lists, one
/// step per point elsewhere.
pub fn decode_runs(b: &[u8], out: &mut Vec<GroupRun>) {
    out.clear();
    let first = rd16(b, 0);
    if first & RUNS_FLAG != 0 {
        // A run each (`live` would read every record to count their pages).
        return run_list::decode_runs(b, out);
    }
    // Merges start with empty working vectors: sized once here, not grown by doubling (their
    // copies were a tenth of pgbench's update time).
    out.reserve(live(b) as usize);
    if first & WORDS_FLAG != 0 {
        return words::decode_runs(b, out);
    }
    if first & PATCH_FLAG != 0 {
        return patches::decode_runs(b, out);
    }
    segments::decode_runs(b, out)
}

/// `base` with `updates` laid over it (both sorted, non-overlapping): an update run replaces
/// whatever `base` maps in its range, or unmaps it when `value_of` says None (a tombstone).
pub fn overlay<U: Copy>(
    base: &[GroupRun],
    updates: &[U],
    range_of: impl Fn(U) -> (u32, u32, Option<u32>),
    out: &mut Vec<GroupRun>,
) {
    out.clear();
    // An update adds at most itself and splits one base run.
    out.reserve(base.len() + 2 * updates.len());
    let mut rest = base
        .iter()
        .map(|&(o, l, p)| (u32::from(o), u32::from(l), p));
    let mut cur = rest.next();
    for &u in updates {
        let (start, len, ppn) = range_of(u);
        let end = start + len;
        // Base pieces before the update.
        while let Some((o, l, p)) = cur {
            if o >= start {
                break;
            }
            if o + l <= start {
                push_run(out, o, l, p);
                cur = rest.next();
            } else {
                push_run(out, o, start - o, p);
                cur = Some((start, o + l - start, p + (start - o)));
                break;
            }
        }
        // Base pieces the update covers.
        while let Some((o, l, p)) = cur {
            if o >= end {
                break;
            }
            if o + l <= end {
                cur = rest.next();
            } else {
                cur = Some((end, o + l - end, p + (end - o)));
                break;
            }
        }
        if let Some(ppn) = ppn {
            push_run(out, start, len, ppn);
        }
    }
    while let Some((o, l, p)) = cur {
        push_run(out, o, l, p);
        cur = rest.next();
    }
}

/// Encodes a group given as runs (offset order, as `push_run` builds them) into the scratch's
/// buffer; None when there are none. Where some stretches of a page or two leave a line that
/// resumes after them (outliers), the line without them is encoded too, and the smaller of
/// the two taken (the line with the outliers listed apart: `patches.rs`).
pub fn encode_runs<'s>(runs: &[GroupRun], s: &'s mut Scratch) -> Option<&'s [u8]> {
    encode_plain(runs, s)?;
    // Worth a second encoding only where the runs the outliers cost, at the plain blob's bytes
    // per run, come to more than listing them would (about 5 bytes a page): a few among many
    // short runs, as on pgbench, do not. Bitmap words cost mostly their fixed 1.5 KiB, and a run
    // there only its residual (about 20 bits of log-structured spread), about what listing an
    // outlier costs: patches pay over them only where the line left is so short that it takes
    // another encoding, which its run list bounds (a sequentially written range with many pages
    // rewritten). Trying wherever outliers showed patched a tenth off most of a GC-heavy
    // simulation's words groups at each merge, which its random writes soon undid: 0.02 % of the
    // table at the end, for 19 % more instructions (notes/mapping-log.md, "Outliers").
    let (runs_saved, pages) = s.outliers;
    let worth_trying = if encoding(&s.out) == Encoding::Words {
        let line_runs = runs.len().saturating_sub(runs_saved);
        // (A run list of the line's runs at the widest fields bounds what the line takes.)
        patches::FIXED_BYTES + 5 * pages + run_list::bytes(line_runs, super::GROUP_SHIFT, 32).0
            < s.out.len()
    } else {
        s.out.len() * runs_saved / runs.len() > patches::FIXED_BYTES + 5 * pages
    };
    if pages > 0 && worth_trying {
        let mut line = std::mem::take(&mut s.line);
        let mut found = std::mem::take(&mut s.patches);
        patches::find(runs, &mut line, &mut found);
        std::mem::swap(&mut s.out, &mut s.inner);
        encode_plain(&line, s).expect("the line maps the same offsets");
        std::mem::swap(&mut s.out, &mut s.inner);
        let bytes = patches::bytes(&found, s.inner.len());
        if bytes < s.out.len() {
            s.patched.clear();
            s.patched.reserve(bytes + TAIL_PAD);
            patches::write(&found, &s.inner, &mut s.patched);
            std::mem::swap(&mut s.out, &mut s.patched);
        }
        s.line = line;
        s.patches = found;
    }
    Some(s.out.as_slice())
}

/// `encode_runs` without looking for outliers: the smallest of segments, a run list and bitmap
/// words (within `WORDS_MAX_GROWTH`), into `s.out`.
pub(super) fn encode_plain(runs: &[GroupRun], s: &mut Scratch) -> Option<()> {
    s.ys.clear();
    s.starts.clear();
    s.ranks.clear();
    s.runs.clear();
    s.runs.extend_from_slice(runs);
    s.starts.reserve(runs.len());
    s.ranks.reserve(runs.len());
    s.best.reserve(runs.len());
    let mut live = 0u32;
    let mut previous_end = None;
    let (mut len_max, mut ppn_min, mut ppn_max) = (0u16, u32::MAX, 0u32);
    for &(off, len, ppn) in runs {
        if previous_end != Some(u32::from(off)) {
            s.starts.push(off);
            s.ranks.push(live as u16);
        }
        live += u32::from(len);
        previous_end = Some(u32::from(off) + u32::from(len));
        len_max = len_max.max(len);
        ppn_min = ppn_min.min(ppn);
        ppn_max = ppn_max.max(ppn);
    }
    if live == 0 {
        return None;
    }
    let w_len = u32::from(bits_for(u64::from(len_max) - 1));
    let w_ppn = u32::from(bits_for(u64::from(ppn_max - ppn_min)));
    let (plain_runs_bytes, elias_fano_bytes) = run_list::bytes(s.runs.len(), w_len, w_ppn);
    // The smaller run list, for the bounds on the other encodings below.
    let runs_bytes = elias_fano_bytes.map_or(plain_runs_bytes, |b| b.min(plain_runs_bytes));
    let n_intervals = if live as usize == GROUP_LPNS {
        0
    } else {
        s.starts.len()
    };

    // Exact segments (eps = 0, slope 1) straight from the runs: O(runs), where the cone fit
    // would visit every point. A run continues the previous segment when its first PPN follows
    // the previous run's last, across any hole in the offsets (ranks have no holes).
    s.best.clear();
    let mut rank = 0u32;
    let (mut outlier_runs, mut outlier_pages) = (0, 0);
    for &(_, len, ppn) in &s.runs {
        let len = u32::from(len);
        match s.best.last_mut() {
            Some(seg)
                if seg.slope_q16 == 1 << fit::SLOPE_FRAC_BITS
                    && (seg.base + i64::from(seg.len)) == i64::from(ppn) =>
            {
                seg.len += len;
            }
            _ => {
                // Outliers (`patches.rs`): the last segment, or the last two of a page each,
                // at most `MAX_PATCH_RANKS` ranks, left a line this run resumes. Counted here,
                // where every break of a line is seen anyway, so that `encode_runs` looks for
                // them only where listing them may pay (a walk of its own over every merge's
                // runs cost pgbench's updates 8 % more instructions).
                let resumes = |a: &Segment, ranks: u32| {
                    ranks <= patches::MAX_PATCH_RANKS
                        && a.base + i64::from(a.len + ranks) == i64::from(ppn)
                };
                match s.best.as_slice() {
                    [.., a, x] if resumes(a, x.len) => {
                        outlier_runs += 2;
                        outlier_pages += x.len as usize;
                    }
                    [.., a, x, y] if x.len == 1 && y.len == 1 && resumes(a, 2) => {
                        outlier_runs += 3;
                        outlier_pages += 2;
                    }
                    _ => {}
                }
                s.best.push(Segment {
                    first: rank,
                    len,
                    slope_q16: 1 << fit::SLOPE_FRAC_BITS,
                    base: i64::from(ppn),
                    width: 0,
                })
            }
        }
        rank += len;
    }
    s.outliers = (outlier_runs, outlier_pages);
    let needs_points = (live as usize) < 64 * s.best.len();
    // The points (PPNs by rank) are made lazily: the probes below need the first
    // `CONE_PROBE_POINTS`, and only a full cone fit that is really tried, or the residuals of the
    // segments taken, need all of them (making all of a full group's 4096 and fitting the single
    // segments over them was most of a merge on files; those now come from the runs' ends).
    let all = live as usize;
    if needs_points {
        points(&s.runs, CONE_PROBE_POINTS.min(all), &mut s.ys);
    }
    if s.best.len() * 2 > all {
        // Mostly single points: the cone fit also finds exact lines of other slopes (descending,
        // strided), if the first points show any (any two points make a line, so lines of
        // four or more are what count). With no error allowed, a segment takes a third point
        // only where the three lie on one line, so without three such consecutive points every
        // segment has at most two, at least n / 2 segments for the n (>= 1) points, and the fit
        // cannot pass: random PPNs skip it (it was a seventh of a fresh drive's simulated random
        // writes, notes/mapping-log.md).
        debug_assert!(!s.ys.is_empty());
        if fit::has_three_on_a_line(&s.ys) && {
            fit::fit_cone(&s.ys, 0, &mut s.trial);
            4 * s.trial.len() <= s.ys.len()
        } {
            points(&s.runs, all, &mut s.ys);
            fit::fit_cone(&s.ys, 0, &mut s.best);
        }
    }
    let mut best_bytes = segments::layout(n_intervals, &s.best).bytes;
    // Bitmap words are sized in one pass. Where they are taken already (within the cap) and no
    // larger than the exact segments, the candidates below (each one or more passes over the
    // points) would have to beat them by a third to change that: skip those.
    let cap = words_cap(runs_bytes.min(best_bytes), live);
    let words_plan = (words::FIXED_BYTES <= cap).then(|| words::plan(&s.runs));
    let words_first = words_plan
        .as_ref()
        .is_some_and(|p| p.bytes <= best_bytes && p.bytes <= cap);
    // A single segment that is not an exact line stores at least a bit per point: where the
    // best so far is smaller than that, packing and the endpoint line cannot win.
    let single_floor = HEADER_BYTES + 4 * n_intervals + 2 + all.div_ceil(8);
    // Long exact runs cannot be beaten by much: a segment's few bytes are spread over them.
    if needs_points && !words_first {
        for trial in 0..CANDIDATES {
            match trial {
                0 | 1 if best_bytes <= single_floor => continue,
                // The single segments come from the runs' ends, not from the points.
                0 => fit::fit_single_runs(run_points(&s.runs), 0, &mut s.trial),
                1 => {
                    let (first, last) = (s.runs[0], s.runs[s.runs.len() - 1]);
                    let last_ppn = last.2 + u32::from(last.1) - 1;
                    let slope = match all {
                        1 => 0,
                        n => fit::line_slope(first.2, last_ppn, n),
                    };
                    fit::fit_single_runs(run_points(&s.runs), slope, &mut s.trial)
                }
                _ => {
                    // The cone fit costs several passes; first see whether it pays on a prefix,
                    // against both packing and the best so far (cut to the prefix): it used to
                    // be tried whenever it beat packing there, and on pgbench then lost to the
                    // exact segments in 99 % of the groups, at a fifth of all update time.
                    let n = s.ys.len().min(CONE_PROBE_POINTS);
                    s.trial.clear();
                    s.trial.extend(
                        s.best
                            .iter()
                            .take_while(|seg| (seg.first as usize) < n)
                            .map(|&seg| Segment {
                                len: seg.len.min(n as u32 - seg.first),
                                ..seg
                            }),
                    );
                    let best_so_far = segments::layout(0, &s.trial).bytes;
                    // A few long exact runs (what file systems write): joining some of them
                    // into a segment with residuals would cost at least a bit per point of it,
                    // more than the records it saves.
                    if best_so_far <= HEADER_BYTES + 2 + n.div_ceil(8) {
                        continue;
                    }
                    let prefix = &s.ys[..n];
                    fit::fit_single(prefix, 0, &mut s.trial);
                    let packed = segments::layout(0, &s.trial).bytes;
                    fit::fit_cone(prefix, CONE_EPS, &mut s.trial);
                    if segments::layout(0, &s.trial).bytes >= packed.min(best_so_far) {
                        continue;
                    }
                    points(&s.runs, all, &mut s.ys);
                    fit::fit_cone(&s.ys, CONE_EPS, &mut s.trial)
                }
            }
            let bytes = segments::layout(n_intervals, &s.trial).bytes;
            if bytes < best_bytes {
                best_bytes = bytes;
                std::mem::swap(&mut s.best, &mut s.trial);
            }
        }
    }

    // Elias-Fano offsets only where they save an eighth of the smallest other encoding; bitmap
    // words are weighed against what would be written without them.
    let others = plain_runs_bytes.min(best_bytes);
    let (num, den) = run_list::ELIAS_FANO_MIN_SAVING;
    let elias_fano =
        elias_fano_bytes.is_some_and(|b| b < others && (others - b) * den >= others * num);
    let written = if elias_fano { runs_bytes } else { others };
    if let Some(plan) = words_plan {
        if plan.bytes <= words_cap(written, live) {
            words::write(&s.runs, &plan, &mut s.out);
            return Some(());
        }
    }
    let out = &mut s.out;
    out.clear();
    out.reserve(written + TAIL_PAD);
    if elias_fano || plain_runs_bytes <= best_bytes {
        run_list::write(&s.runs, (w_len, w_ppn, ppn_min), elias_fano, out);
        debug_assert_eq!(out.len(), written);
        return Some(());
    }
    // Residuals need every point; a single segment fitted from the runs' ends has not made them.
    if s.best.iter().any(|seg| seg.width > 0) {
        points(&s.runs, all, &mut s.ys);
    }
    segments::write(
        live,
        n_intervals,
        (&s.starts, &s.ranks),
        &s.best,
        &s.ys,
        out,
    );
    debug_assert_eq!(out.len(), best_bytes);
    Some(())
}

/// The largest bitmap-word blob a group of `live` mappings takes, where the smaller of the other
/// two encodings takes `smallest` bytes: a little more than that (a lookup there takes no
/// search), and never above the others' worst case (a flat u32 array plus a constant).
fn words_cap(smallest: usize, live: u32) -> usize {
    (smallest * WORDS_MAX_GROWTH.0 / WORDS_MAX_GROWTH.1)
        .min(4 * live as usize + WORST_CASE_GROUP_BYTES)
}

/// The runs as `fit::fit_single_runs` takes them: (length, first PPN).
fn run_points(runs: &[GroupRun]) -> impl Iterator<Item = (u32, u32)> + '_ {
    runs.iter().map(|&(_, len, ppn)| (u32::from(len), ppn))
}

/// The PPNs of the first `n` ranks of `runs` (`n` at most their count), into `ys`; nothing to
/// do when `ys` already holds them.
fn points(runs: &[GroupRun], n: usize, ys: &mut Vec<u32>) {
    if ys.len() == n {
        return;
    }
    ys.clear();
    ys.reserve(n);
    for &(_, len, ppn) in runs {
        let take = usize::from(len).min(n - ys.len());
        ys.extend((0..take as u32).map(|k| ppn + k));
        if ys.len() == n {
            break;
        }
    }
}

/// The encodings a blob may take.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Runs,
    Segments,
    Words,
    /// Outliers listed apart from the line of one of the others (`patches.rs`).
    Patched,
}

/// A hint that offset `off` of blob `b` will be read soon: its first line, where every lookup
/// starts, and the lines bitmap words would keep `off`'s word in, without reading the blob to
/// learn whether it is bitmap words (its first line is itself likely a miss, and a branch on it
/// held the caller: notes/mapping-log.md, "Prefetches that do not read the blob").
#[inline]
pub fn prefetch(b: &[u8], off: u32) {
    ftlab_core::ftl::mapping::prefetch_line(b.as_ptr());
    words::prefetch(b, off);
}

/// The second stage of `prefetch`, once its lines are in: in bitmap words, the line of the
/// offset's residual.
#[inline]
pub fn prefetch_near(b: &[u8], off: u32) {
    match encoding(b) {
        Encoding::Words => words::prefetch_residual(b, off),
        // The patches' header is in now: start on the inner blob.
        Encoding::Patched => prefetch(patches::inner(b), off),
        Encoding::Runs | Encoding::Segments => {}
    }
}

/// Which encoding the blob at the start of `b` uses.
#[inline]
pub fn encoding(b: &[u8]) -> Encoding {
    let first = rd16(b, 0);
    if first & RUNS_FLAG != 0 {
        Encoding::Runs
    } else if first & WORDS_FLAG != 0 {
        Encoding::Words
    } else if first & PATCH_FLAG != 0 {
        Encoding::Patched
    } else {
        Encoding::Segments
    }
}

/// Mapped LPNs in the blob.
pub fn live(b: &[u8]) -> u32 {
    let first = rd16(b, 0);
    if first & WORDS_FLAG != 0 {
        return words::live(b);
    }
    if first & PATCH_FLAG != 0 {
        return patches::live(b);
    }
    if first & RUNS_FLAG == 0 {
        return first;
    }
    run_list::live(b)
}

/// Checks that every lookup and the decoded runs of `blob` (padded) agree with `dense` (one PPN
/// or `UNMAPPED` per offset); panics otherwise. For the tests and the fuzz target.
#[doc(hidden)]
pub fn check_blob(blob: &[u8], dense: &[u32]) {
    // The widest range around each offset whose offsets continue it (consecutive PPNs, or all
    // unmapped), in one pass each way: every span must lie within its offset's.
    let n = dense.len();
    let continues = |o: usize| match (dense[o], dense[o + 1]) {
        (UNMAPPED, b) => b == UNMAPPED,
        (a, b) => b != UNMAPPED && a.wrapping_add(1) == b,
    };
    let mut widest_lo = vec![0u32; n];
    for o in 1..n {
        widest_lo[o] = if continues(o - 1) {
            widest_lo[o - 1]
        } else {
            o as u32
        };
    }
    let mut widest_hi = vec![n as u32; n];
    for o in (0..n.saturating_sub(1)).rev() {
        widest_hi[o] = if continues(o) {
            widest_hi[o + 1]
        } else {
            o as u32 + 1
        };
    }
    for (off, &ppn) in dense.iter().enumerate() {
        let expect = (ppn != UNMAPPED).then_some(ppn);
        let l = lookup(blob, off as u32);
        assert_eq!(l.ppn, expect, "offset {off}");
        assert!(l.lo <= off as u32 && (off as u32) < l.hi && l.hi as usize <= GROUP_LPNS);
        // Every offset of the span (within the array) continues the answer.
        assert!(
            widest_lo[off] <= l.lo && l.hi.min(n as u32) <= widest_hi[off],
            "offset {off}: span {}..{} leaves {}..{}",
            l.lo,
            l.hi,
            widest_lo[off],
            widest_hi[off]
        );
        // The offset after the span, found from where the search ended, is answered as a
        // search finds it (room included: updates follow on too).
        let l = lookup_with::<true>(blob, off as u32);
        if (l.hi as usize) < GROUP_LPNS {
            let next = lookup_next::<true>(blob, l.hi, l.next);
            let searched = lookup_with::<true>(blob, l.hi);
            assert_eq!(
                (next.ppn, next.lo, next.hi, next.room),
                (searched.ppn, searched.lo, searched.hi, searched.room),
                "offset {off}, then {}",
                l.hi
            );
        }
    }
    let mut runs = Vec::new();
    decode_runs(blob, &mut runs);
    let mut from_runs = vec![UNMAPPED; dense.len()];
    for &(o, l, p) in &runs {
        for k in 0..u32::from(l) {
            from_runs[(u32::from(o) + k) as usize] = p + k;
        }
    }
    assert_eq!(from_runs, dense);
    // Runs come back maximal: none continues the one before it.
    for w in runs.windows(2) {
        let ((o, l, p), (o2, _, p2)) = (w[0], w[1]);
        assert!(!(u32::from(o) + u32::from(l) == u32::from(o2) && p + u32::from(l) == p2));
    }
    assert_eq!(
        live(blob) as usize,
        dense.iter().filter(|&&p| p != UNMAPPED).count()
    );
}

/// `dense` (mapping something) in the bitmap-word encoding, whatever `encode_runs` would
/// choose, padded. For the tests and the fuzz target.
#[doc(hidden)]
pub fn encode_words(dense: &[u32]) -> Vec<u8> {
    let mut runs = Vec::new();
    dense_runs(dense, &mut runs);
    let plan = words::plan(&runs);
    let mut blob = Vec::new();
    words::write(&runs, &plan, &mut blob);
    assert_eq!(blob.len(), plan.bytes);
    // Blobs are read with 8-byte loads: pad before reading anything.
    blob.extend_from_slice(&[0xA5; TAIL_PAD]);
    assert_eq!(encoded_len(&blob), plan.bytes);
    blob
}

/// `dense` as a run list, with Elias-Fano offsets or u16s, whatever `encode_runs` would choose,
/// padded; None when it maps nothing, or when it has too many runs for Elias-Fano offsets. For
/// the tests and the fuzz target.
#[doc(hidden)]
pub fn encode_run_list(dense: &[u32], elias_fano: bool) -> Option<Vec<u8>> {
    let mut runs = Vec::new();
    dense_runs(dense, &mut runs);
    if runs.is_empty() || (elias_fano && runs.len() > elias_fano::MAX_RUNS) {
        return None;
    }
    let mut blob = Vec::new();
    let widths = run_list::widths(&runs);
    run_list::write(&runs, widths, elias_fano, &mut blob);
    let (plain, packed) = run_list::bytes(runs.len(), widths.0, widths.1);
    assert_eq!(
        blob.len(),
        if elias_fano {
            packed.expect("short")
        } else {
            plain
        }
    );
    blob.extend_from_slice(&[0xA5; TAIL_PAD]);
    assert_eq!(encoded_len(&blob), blob.len() - TAIL_PAD);
    Some(blob)
}

/// `dense` with its outliers listed apart (`patches.rs`), whatever `encode_runs` would choose,
/// padded; None when it has none. For the tests and the fuzz target.
#[doc(hidden)]
pub fn encode_patched(dense: &[u32]) -> Option<Vec<u8>> {
    let mut runs = Vec::new();
    dense_runs(dense, &mut runs);
    let (mut line, mut found) = (Vec::new(), Vec::new());
    patches::find(&runs, &mut line, &mut found);
    if found.is_empty() {
        return None;
    }
    let mut s = Scratch::default();
    encode_plain(&line, &mut s).expect("the line maps the same offsets");
    let mut blob = Vec::new();
    patches::write(&found, &s.out, &mut blob);
    assert_eq!(blob.len(), patches::bytes(&found, s.out.len()));
    blob.extend_from_slice(&[0xA5; TAIL_PAD]);
    assert_eq!(encoded_len(&blob), blob.len() - TAIL_PAD);
    Some(blob)
}

/// Checks the encoding `encode` chooses for `dense`, its bitmap words, its run lists (u16 and,
/// where it has few enough runs, Elias-Fano offsets) and, where it has outliers, its patched form
/// (`check_blob`), then tries each of `updates` (offset, PPN) in
/// place in each: a blob that takes one must read it back with its length unchanged, one that
/// refuses must stay as it was. For the tests and the fuzz target `group_encodings`.
#[doc(hidden)]
pub fn check_encodings(dense: &[u32], updates: &[(u32, u32)]) {
    let mut s = Scratch::default();
    let Some(chosen) = encode(dense, &mut s) else {
        assert!(dense.iter().all(|&p| p == UNMAPPED));
        return;
    };
    // Blobs are read with 8-byte loads: pad before reading anything.
    let mut chosen = chosen.to_vec();
    let len = chosen.len();
    chosen.extend_from_slice(&[0xA5; TAIL_PAD]);
    assert_eq!(encoded_len(&chosen), len);
    let forms = [
        Some(chosen),
        Some(encode_words(dense)),
        encode_patched(dense),
        encode_run_list(dense, false),
        encode_run_list(dense, true),
    ];
    for mut blob in forms.into_iter().flatten() {
        let mut dense = dense.to_vec();
        check_blob(&blob, &dense);
        let len = encoded_len(&blob);
        for &(off, ppn) in updates {
            let off = off % dense.len() as u32;
            if dense[off as usize] == UNMAPPED || dense[off as usize] == ppn || ppn == UNMAPPED {
                continue;
            }
            let before = blob.clone();
            if update_in_place(&mut blob, off, ppn) {
                dense[off as usize] = ppn;
                assert_eq!(encoded_len(&blob), len);
            } else {
                assert_eq!(blob, before, "a refused update changed the blob");
            }
        }
        check_blob(&blob, &dense);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_le_agrees_with_a_scan_on_even_and_clustered_arrays() {
        let mut rng = ftlab_core::rng::SplitMix64::new(11);
        for n in [1usize, 2, 31, 129, 500, 2000, 4096] {
            for clustered in [false, true] {
                // Ascending u16s below 4096: spread, or bunched at both ends.
                let mut values: Vec<u32> = (0..n)
                    .map(|_| {
                        let v = rng.bounded(4096) as u32;
                        match (clustered, v % 4) {
                            (true, 1) => v / 64,
                            (true, 2 | 3) => 4095 - v / 64,
                            _ => v,
                        }
                    })
                    .collect();
                values.sort_unstable();
                let mut b: Vec<u8> = values
                    .iter()
                    .flat_map(|&v| (v as u16).to_le_bytes())
                    .collect();
                b.extend_from_slice(&[0; 8]);
                for key in 0..4100u32 {
                    let want = values.iter().rposition(|&v| v <= key);
                    assert_eq!(last_le(&b, 0, n, key, 4096), want, "n {n} key {key}");
                }
            }
        }
    }

    /// The size of `dense`'s encoding (padded), after checking it and its bitmap words read
    /// back (`check_encodings`).
    fn roundtrip(dense: &[u32]) -> usize {
        check_encodings(dense, &[]);
        let mut s = Scratch::default();
        encode(dense, &mut s).map_or(0, |blob| blob.len() + TAIL_PAD)
    }

    #[test]
    fn updates_in_place_read_back_and_leave_refused_blobs_untouched() {
        let g = GROUP_LPNS as u32;
        let mut rng = ftlab_core::rng::SplitMix64::new(5);
        let mut next = |m: u64| rng.bounded(m) as u32;
        // Shapes a device's groups take: PPNs scattered over 2^20 pages (packed residuals),
        // short runs with holes (one-point and exact segments), a few single pages (a run list),
        // runs at random places (exact segments only).
        let scattered: Vec<u32> = (0..g).map(|_| next(1 << 20)).collect();
        let short_runs: Vec<u32> = (0..g)
            .map(|i| match i % 7 {
                0 => UNMAPPED,
                3 | 4 => 70_000 + i,
                _ => next(1 << 20),
            })
            .collect();
        let mut few = vec![UNMAPPED; g as usize];
        for k in 0..9 {
            few[(k * 301 + 7) as usize] = next(1 << 20);
        }
        let long_runs: Vec<u32> = (0..g).map(|i| (i / 512) * 100_000 + i).collect();
        let mut s = Scratch::default();
        let shapes = [
            ("scattered", scattered),
            ("short runs", short_runs),
            ("few", few),
            ("long runs", long_runs),
        ];
        // As `encode_runs` chooses, then all in bitmap words.
        for (name, mut dense, forced_words) in shapes
            .iter()
            .map(|(n, d)| (*n, d.clone(), false))
            .chain(shapes.iter().map(|(n, d)| (*n, d.clone(), true)))
        {
            let mut blob = if forced_words {
                encode_words(&dense)
            } else {
                let mut blob = encode(&dense, &mut s).expect("mapped").to_vec();
                blob.extend_from_slice(&[0xA5; TAIL_PAD]);
                blob
            };
            let len = blob.len() - TAIL_PAD;
            let mapped: Vec<u32> = (0..g).filter(|&o| dense[o as usize] != UNMAPPED).collect();
            let (mut done, mut tried) = (0, 0);
            for round in 0..3000 {
                let off = mapped[next(mapped.len() as u64) as usize];
                // Mostly anywhere; sometimes continuing a neighbour, which must be refused.
                let (ppn, joins) = match (round % 5, off.checked_sub(1)) {
                    (0, Some(left)) if dense[left as usize] != UNMAPPED => {
                        (dense[left as usize] + 1, true)
                    }
                    _ => (next(1 << 20), false),
                };
                if ppn == dense[off as usize] {
                    continue;
                }
                tried += 1;
                let before = blob.clone();
                if update_in_place(&mut blob, off, ppn) {
                    assert!(
                        !joins,
                        "{name}: offset {off} joined its left neighbour in place"
                    );
                    dense[off as usize] = ppn;
                    done += 1;
                    assert_eq!(encoded_len(&blob), len);
                    if done % 97 == 0 {
                        check_blob(&blob, &dense);
                    }
                } else {
                    assert_eq!(blob, before, "{name}: a refused update changed the blob");
                }
            }
            check_blob(&blob, &dense);
            // Where values are packed (or single pages), most random updates fit; exact
            // segments take none, nor do bitmap words holding one run (they store no residual).
            match (name, forced_words) {
                ("long runs", _) | ("few", true) => assert_eq!(done, 0, "{name}"),
                _ => assert!(done * 2 > tried, "{name}: {done} of {tried} in place"),
            }
        }
    }

    #[test]
    fn shapes_round_trip_and_runs_are_small() {
        let g = GROUP_LPNS;
        let full_run: Vec<u32> = (0..g as u32).map(|i| 5000 + i).collect();
        assert!(roundtrip(&full_run) < 48);
        let mut holes = full_run.clone();
        for i in (0..g).step_by(100) {
            holes[i] = UNMAPPED;
        }
        roundtrip(&holes);
        let mut x = 3u64;
        let random: Vec<u32> = (0..g)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((x >> 32) as u32).min(u32::MAX - 1)
            })
            .collect();
        // Worst case: 32-bit random PPNs cost at most 4 bytes each plus the header and padding.
        assert!(roundtrip(&random) <= 4 * g + 64);
        let extremes: Vec<u32> = (0..g)
            .map(|i| if i % 2 == 0 { 0 } else { u32::MAX - 1 })
            .collect();
        roundtrip(&extremes);
        let mut sparse = vec![UNMAPPED; g];
        sparse[0] = 1;
        sparse[g - 1] = 0;
        roundtrip(&sparse);
        roundtrip(&vec![UNMAPPED; g]);
        // Short runs at scattered PPNs, with holes: hundreds of segments.
        let mut y = 9u64;
        let short_runs: Vec<u32> = (0..g as u32)
            .map(|i| {
                if i % 3 == 0 {
                    y = y.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                if i % 97 == 5 {
                    UNMAPPED
                } else {
                    ((y >> 44) as u32) * 4 + i % 3
                }
            })
            .collect();
        roundtrip(&short_runs);
        let descending: Vec<u32> = (0..g as u32).map(|i| 1_000_000 - 7 * i).collect();
        assert!(roundtrip(&descending) < 48);
    }
}
