//! The segment encoding (the learned one): the group's mapped offsets as intervals, and over
//! their ranks error-bounded piecewise-linear segments (`fit.rs`), each a record (base, slope,
//! residual width and offset) and its residuals bit-packed at its own width. Little endian:
//!
//! ```text
//! 0   u16 live          mapped LPNs in the group (< 2^15; bit 15 clear)
//! 2   u16 n_intervals   runs of mapped LPNs (0: all GROUP_LPNS are mapped)
//! 4   u16 n_segments
//! 6   u8  w_base, u8 w_slope, u8 w_width, u8 w_off   bit widths of the segment record fields
//! 10  i32 slope_min     Q16
//! 14  i48 base_min
//! 20  u16 interval_start[n_intervals]   offset in the group of each run of mapped LPNs
//!     u16 interval_rank[n_intervals]    rank of its first LPN among the mapped ones
//!     u16 segment_rank[n_segments]      first rank of each segment (0 first)
//!     records, bit-packed, n_segments x (w_base + w_slope + w_width + w_off) bits:
//!         base - base_min, slope - slope_min, residual width, residual bit offset
//!     residuals, bit-packed, each segment's at its own width
//! ```
//!
//! A lookup: binary search the intervals (is the LPN mapped, and its rank), binary search the
//! segment ranks, read one record and one residual. Holes cost 4 bytes per run of mapped LPNs;
//! a run of consecutive PPNs costs one segment (2 bytes plus a few bits of base); scattered
//! PPNs cost about log2(their spread) bits each. Which segments a group gets is
//! `group::encode_plain`'s choice; this file reads, updates in place and writes them.

use super::fit::{self, bits_for, predict, Segment};
use super::group::{
    find_run, last_le, push_run, room, run_reached, Finger, GroupRun, Lookup, NO_ROOM,
    SEGMENT_UNKNOWN,
};
use super::packed::{rd16, rd64, rd_bits, wr_bits, BitWriter};
use super::GROUP_LPNS;

pub(super) const HEADER_BYTES: usize = 20;

/// The parsed header of a blob.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
struct Header {
    live: u32,
    n_intervals: usize,
    n_segments: usize,
    w_base: u32,
    w_slope: u32,
    w_width: u32,
    w_off: u32,
    slope_min: i64,
    base_min: i64,
}

impl Header {
    /// Three loads (a blob is at least `HEADER_BYTES` long): field by field, with bounds
    /// checks, this was a tenth of a lookup's instructions.
    #[inline]
    fn read(b: &[u8]) -> Self {
        let (w0, w1) = (rd64(b, 0), rd64(b, 8));
        Header {
            live: w0 as u16 as u32,
            n_intervals: (w0 >> 16) as u16 as usize,
            n_segments: (w0 >> 32) as u16 as usize,
            w_base: (w0 >> 48) as u8 as u32,
            w_slope: (w0 >> 56) as u32,
            w_width: w1 as u8 as u32,
            w_off: (w1 >> 8) as u8 as u32,
            slope_min: i64::from((w1 >> 16) as u32 as i32),
            // i48: sign-extend the six bytes at 14.
            base_min: (rd64(b, 12) as i64) >> 16,
        }
    }
    #[inline]
    fn record_bits(&self) -> u64 {
        u64::from(self.w_base + self.w_slope + self.w_width + self.w_off)
    }
    fn segments_at(&self) -> usize {
        HEADER_BYTES + 4 * self.n_intervals
    }
    fn records_at(&self) -> usize {
        self.segments_at() + 2 * self.n_segments
    }
    fn residuals_at(&self) -> usize {
        self.records_at() + (self.n_segments as u64 * self.record_bits()).div_ceil(8) as usize
    }
    /// (base, slope_q16, width, residual bit offset) of segment `j`.
    #[inline]
    fn record(&self, b: &[u8], j: usize) -> (i64, i32, u32, u64) {
        let at = self.records_at();
        let mut bit = j as u64 * self.record_bits();
        if self.record_bits() <= 56 {
            // The usual case: the whole record from one load.
            let mut word = rd_bits(b, at, bit, self.record_bits() as u32);
            let mut field = |width: u32| {
                let v = word & ((1u64 << width) - 1);
                word >>= width;
                v
            };
            let base = field(self.w_base) as i64 + self.base_min;
            let slope = field(self.w_slope) as i64 + self.slope_min;
            let width = field(self.w_width) as u32;
            let off = field(self.w_off);
            return (base, slope as i32, width, off);
        }
        let base = rd_bits(b, at, bit, self.w_base) as i64 + self.base_min;
        bit += u64::from(self.w_base);
        let slope = rd_bits(b, at, bit, self.w_slope) as i64 + self.slope_min;
        bit += u64::from(self.w_slope);
        let width = rd_bits(b, at, bit, self.w_width) as u32;
        bit += u64::from(self.w_width);
        let off = rd_bits(b, at, bit, self.w_off);
        (base, slope as i32, width, off)
    }
}

/// `group::lookup_with` in a segment blob. The search is `place`'s, written out: lookups
/// through a shared helper (returning its struct) ran 10-30 % slower on pgbench's short runs, in
/// `ftlab mapbench`.
#[inline]
pub(super) fn lookup<const ROOM: bool>(b: &[u8], off: u32) -> Lookup {
    let h = Header::read(b);
    // The run of mapped offsets holding `off`: [start, start + len), ranks from `rank0`.
    let (i, start, len, rank0) = if h.n_intervals == 0 {
        (0, 0, GROUP_LPNS as u32, 0)
    } else {
        let (i, start, len) = match find_run(b, HEADER_BYTES, h.n_intervals, off, |i| {
            interval_rank(b, &h, i + 1) - interval_rank(b, &h, i)
        }) {
            Ok(found) => found,
            Err(mut hole) => {
                hole.next.rank = interval_rank(b, &h, usize::from(hole.next.run)) as u16;
                return hole;
            }
        };
        (i, start, len, interval_rank(b, &h, i))
    };
    let rank = rank0 + (off - start);
    let j = last_le(b, h.segments_at(), h.n_segments, rank, h.live)
        .expect("segment 0 starts at rank 0");
    segment_answer::<ROOM>(b, &h, i, (start, len), off, rank, j)
}

/// `group::lookup_next` in a segment blob: interval `at.run`, rank `at.rank`, and segment
/// `at.segment` where the span before knew it.
#[inline]
pub(super) fn lookup_next<const ROOM: bool>(b: &[u8], off: u32, at: Finger) -> Lookup {
    let i = usize::from(at.run);
    let h = Header::read(b);
    let (start, len) = if h.n_intervals == 0 {
        (0, GROUP_LPNS as u32)
    } else {
        let start = if i < h.n_intervals {
            rd16(b, HEADER_BYTES + 2 * i)
        } else {
            GROUP_LPNS as u32
        };
        match run_reached(start, off, at) {
            Ok(start) => (start, interval_rank(b, &h, i + 1) - interval_rank(b, &h, i)),
            Err(hole) => return hole,
        }
    };
    let rank = u32::from(at.rank);
    let j = if at.segment == SEGMENT_UNKNOWN {
        last_le(b, h.segments_at(), h.n_segments, rank, h.live).expect("segment 0 starts at rank 0")
    } else {
        usize::from(at.segment)
    };
    debug_assert_eq!(
        Some(j),
        last_le(b, h.segments_at(), h.n_segments, rank, h.live)
    );
    segment_answer::<ROOM>(b, &h, i, (start, len), off, rank, j)
}

/// Rank of the first offset of interval `i` of a segment blob (`live` past the last).
#[inline]
fn interval_rank(b: &[u8], h: &Header, i: usize) -> u32 {
    if i < h.n_intervals {
        rd16(b, HEADER_BYTES + 2 * h.n_intervals + 2 * i)
    } else {
        h.live
    }
}

/// The answer for mapped offset `off` of a segment blob: in interval `i` (`start, len`), at
/// `rank`, in segment `j`.
#[inline(always)]
fn segment_answer<const ROOM: bool>(
    b: &[u8],
    h: &Header,
    i: usize,
    (start, len): (u32, u32),
    off: u32,
    rank: u32,
    j: usize,
) -> Lookup {
    let seg_at = h.segments_at();
    let seg_first = rd16(b, seg_at + 2 * j);
    let seg_end = if j + 1 < h.n_segments {
        rd16(b, seg_at + 2 * (j + 1))
    } else {
        h.live
    };
    let dx = rank - seg_first;
    let (base, slope, width, res_off) = h.record(b, j);
    let residual = rd_bits(
        b,
        h.residuals_at(),
        res_off + u64::from(dx) * u64::from(width),
        width,
    );
    let ppn = (predict(base, slope, dx) + residual as i64) as u32;
    let (lo, hi) = if slope == 1 << fit::SLOPE_FRAC_BITS && width == 0 {
        (
            start.max(off - dx),
            (start + len).min(off + (seg_end - rank)),
        )
    } else {
        (off, off + 1)
    };
    let room = if !ROOM {
        NO_ROOM
    } else if width > 0 {
        room(predict(base, slope, dx), width)
    } else if seg_end - seg_first == 1 {
        room(h.base_min, h.w_base)
    } else {
        NO_ROOM
    };
    // Ranks are consecutive over mapped offsets, holes or not: `hi`'s (or the next mapped
    // offset's) is `rank + (hi - off)`, in this segment or the next.
    let rank_hi = rank + (hi - off);
    Lookup {
        ppn: Some(ppn),
        lo,
        hi,
        room,
        next: Finger {
            run: (i + usize::from(hi == start + len)) as u16,
            rank: rank_hi as u16,
            segment: (j + usize::from(rank_hi == seg_end)) as u16,
        },
    }
}

/// Where a segment blob keeps one mapped offset's PPN.
struct Place {
    h: Header,
    /// Its segment, the segment's first rank, and its distance from it.
    j: usize,
    seg_first: u32,
    dx: u32,
    base: i64,
    slope: i32,
    width: u32,
    /// Bit position of its residual after the residuals' start.
    res_bit: u64,
}

impl Place {
    fn seg_at(&self) -> usize {
        self.h.segments_at()
    }

    /// The rank after the segment's last.
    fn seg_end(&self, b: &[u8]) -> u32 {
        if self.j + 1 < self.h.n_segments {
            rd16(b, self.seg_at() + 2 * (self.j + 1))
        } else {
            self.h.live
        }
    }

    /// The PPN at distance `dx` from the start of this place's segment: `segment_ppn` without
    /// decoding the segment's record again (the neighbours' checks of `update_in_place`).
    #[inline]
    fn ppn_at(&self, b: &[u8], dx: u32) -> u32 {
        let bit = self.res_bit - u64::from(self.dx) * u64::from(self.width)
            + u64::from(dx) * u64::from(self.width);
        let residual = rd_bits(b, self.h.residuals_at(), bit, self.width);
        (predict(self.base, self.slope, dx) + residual as i64) as u32
    }
}

/// The PPN at distance `dx` from the start of segment `j` of a segment blob.
#[inline]
fn segment_ppn(b: &[u8], h: &Header, j: usize, dx: u32) -> u32 {
    let (base, slope, width, res_off) = h.record(b, j);
    let residual = rd_bits(
        b,
        h.residuals_at(),
        res_off + u64::from(dx) * u64::from(width),
        width,
    );
    (predict(base, slope, dx) + residual as i64) as u32
}

/// Finds mapped offset `off` in a segment blob, or the hole around it: the search `lookup`
/// writes out for itself (see there).
#[inline]
fn place(b: &[u8], off: u32) -> Result<Place, Lookup> {
    let h = Header::read(b);
    // The run of mapped offsets holding `off` starts at `start`, ranks from `rank0`.
    let (start, rank0) = if h.n_intervals == 0 {
        (0, 0)
    } else {
        let (i, start, _) = find_run(b, HEADER_BYTES, h.n_intervals, off, |i| {
            interval_rank(b, &h, i + 1) - interval_rank(b, &h, i)
        })?;
        (start, interval_rank(b, &h, i))
    };
    let rank = rank0 + (off - start);
    let seg_at = h.segments_at();
    let j = last_le(b, seg_at, h.n_segments, rank, h.live).expect("segment 0 starts at rank 0");
    let seg_first = rd16(b, seg_at + 2 * j);
    let dx = rank - seg_first;
    let (base, slope, width, res_off) = h.record(b, j);
    Ok(Place {
        h,
        j,
        seg_first,
        dx,
        base,
        slope,
        width,
        res_bit: res_off + u64::from(dx) * u64::from(width),
    })
}

/// `group::update_in_place` in a segment blob: a residual of a packed segment that stays
/// within its width, or the base of a one-point segment that stays within the base field, where
/// the new PPN continues neither neighbour.
pub(super) fn update_in_place(b: &mut [u8], off: u32, ppn: u32) -> bool {
    let Ok(p) = place(b, off) else {
        return false;
    };
    // Where the new value goes: the residual of a packed segment, or the base of a segment of
    // one point (any slope predicts its base there).
    let (at, bit, width, value) = if p.width > 0 {
        let residual = i64::from(ppn) - predict(p.base, p.slope, p.dx);
        if residual < 0 || residual >= 1 << p.width {
            return false;
        }
        (p.h.residuals_at(), p.res_bit, p.width, residual as u64)
    } else if p.seg_end(b) - p.seg_first == 1 {
        let field = i64::from(ppn) - p.h.base_min;
        if field < 0 || field >= 1 << p.h.w_base {
            return false;
        }
        let bit = p.j as u64 * p.h.record_bits();
        (p.h.records_at(), bit, p.h.w_base, field as u64)
    } else {
        return false;
    };
    // The ranks before and after: in this segment, or at the end of the one before and the
    // start of the one after.
    let seg_end = p.seg_end(b);
    let left = match (p.dx, p.j) {
        (0, 0) => None,
        (0, j) => {
            let first = rd16(b, p.seg_at() + 2 * (j - 1));
            Some(segment_ppn(b, &p.h, j - 1, p.seg_first - 1 - first))
        }
        (dx, _) => Some(p.ppn_at(b, dx - 1)),
    };
    let right = if p.seg_first + p.dx + 1 < seg_end {
        Some(p.ppn_at(b, p.dx + 1))
    } else {
        (p.j + 1 < p.h.n_segments).then(|| segment_ppn(b, &p.h, p.j + 1, 0))
    };
    let joins_left = left.is_some_and(|l| l.wrapping_add(1) == ppn);
    let joins_right = right.is_some_and(|r| r == ppn.wrapping_add(1));
    if joins_left || joins_right {
        return false;
    }
    wr_bits(b, at, bit, width, value);
    true
}

/// Bytes the segment blob at the start of `b` occupies.
pub(super) fn encoded_len(b: &[u8]) -> usize {
    let h = Header::read(b);
    let residual_bits = if h.w_off == 0 {
        0
    } else {
        let last = h.n_segments - 1;
        let first_rank = rd16(b, h.segments_at() + 2 * last);
        let (_, _, width, res_off) = h.record(b, last);
        res_off + u64::from(h.live - first_rank) * u64::from(width)
    };
    h.residuals_at() + residual_bits.div_ceil(8) as usize
}

/// The blob's mappings as runs, in offset order, into `out` (cleared and sized by the caller):
/// O(runs) for exact segments, one step per point elsewhere.
pub(super) fn decode_runs(b: &[u8], out: &mut Vec<GroupRun>) {
    let h = Header::read(b);
    let seg_at = h.segments_at();
    let ranks_at = HEADER_BYTES + 2 * h.n_intervals;
    let res_at = h.residuals_at();
    let mut interval = 0usize;
    let mut off = 0u32;
    let mut left = if h.n_intervals == 0 { h.live } else { 0 };
    for j in 0..h.n_segments {
        let seg_first = rd16(b, seg_at + 2 * j);
        let seg_end = if j + 1 < h.n_segments {
            rd16(b, seg_at + 2 * (j + 1))
        } else {
            h.live
        };
        let (base, slope, width, res_off) = h.record(b, j);
        let exact = slope == 1 << fit::SLOPE_FRAC_BITS && width == 0;
        let mut dx = 0u32;
        while dx < seg_end - seg_first {
            while left == 0 {
                off = rd16(b, HEADER_BYTES + 2 * interval);
                let next_rank = if interval + 1 < h.n_intervals {
                    rd16(b, ranks_at + 2 * (interval + 1))
                } else {
                    h.live
                };
                left = next_rank - rd16(b, ranks_at + 2 * interval);
                interval += 1;
            }
            let n = left.min(seg_end - seg_first - dx);
            if exact {
                push_run(out, off, n, (base + i64::from(dx)) as u32);
            } else {
                for k in 0..n {
                    let at = res_off + u64::from(dx + k) * u64::from(width);
                    let residual = rd_bits(b, res_at, at, width);
                    let ppn = (predict(base, slope, dx + k) + residual as i64) as u32;
                    push_run(out, off + k, 1, ppn);
                }
            }
            off += n;
            left -= n;
            dx += n;
        }
    }
}

/// Field widths and encoded size of a segmentation.
pub(super) struct Layout {
    w_base: u32,
    w_slope: u32,
    w_width: u32,
    w_off: u32,
    base_min: i64,
    slope_min: i64,
    residual_bits: u64,
    pub(super) bytes: usize,
}

pub(super) fn layout(n_intervals: usize, segs: &[Segment]) -> Layout {
    // One pass (each merge sizes several candidate segmentations).
    let (mut base_min, mut base_max) = (i64::MAX, i64::MIN);
    let (mut slope_min, mut slope_max) = (i64::MAX, i64::MIN);
    let (mut width_max, mut residual_bits) = (0u8, 0u64);
    for seg in segs {
        base_min = base_min.min(seg.base);
        base_max = base_max.max(seg.base);
        slope_min = slope_min.min(i64::from(seg.slope_q16));
        slope_max = slope_max.max(i64::from(seg.slope_q16));
        width_max = width_max.max(seg.width);
        residual_bits += u64::from(seg.len) * u64::from(seg.width);
    }
    if segs.is_empty() {
        (base_min, base_max, slope_min, slope_max) = (0, 0, 0, 0);
    }
    let w_base = u32::from(bits_for((base_max - base_min) as u64));
    let w_slope = u32::from(bits_for((slope_max - slope_min) as u64));
    let w_width = u32::from(bits_for(u64::from(width_max)));
    let w_off = if width_max == 0 {
        0
    } else {
        u32::from(bits_for(residual_bits))
    };
    let record_bits = u64::from(w_base + w_slope + w_width + w_off);
    let bytes = HEADER_BYTES
        + 4 * n_intervals
        + 2 * segs.len()
        + (segs.len() as u64 * record_bits).div_ceil(8) as usize
        + residual_bits.div_ceil(8) as usize;
    Layout {
        w_base,
        w_slope,
        w_width,
        w_off,
        base_min,
        slope_min,
        residual_bits,
        bytes,
    }
}

/// Appends the segment blob of a group to `out`: `live` mapped offsets, in `n_intervals`
/// intervals (0 when all `GROUP_LPNS` are mapped) starting at `starts` with first ranks
/// `ranks`, segmented as `segs`; `ys` holds every rank's PPN where a segment has residuals.
pub(super) fn write(
    live: u32,
    n_intervals: usize,
    (starts, ranks): (&[u16], &[u16]),
    segs: &[Segment],
    ys: &[u32],
    out: &mut Vec<u8>,
) {
    let l = layout(n_intervals, segs);
    let at = out.len();
    out.extend_from_slice(&(live as u16).to_le_bytes());
    out.extend_from_slice(&(n_intervals as u16).to_le_bytes());
    out.extend_from_slice(&(segs.len() as u16).to_le_bytes());
    out.extend_from_slice(&[
        l.w_base as u8,
        l.w_slope as u8,
        l.w_width as u8,
        l.w_off as u8,
    ]);
    out.extend_from_slice(&(l.slope_min as i32).to_le_bytes());
    debug_assert!(l.base_min.unsigned_abs() < 1 << 47);
    out.extend_from_slice(&l.base_min.to_le_bytes()[..6]);
    if n_intervals > 0 {
        for v in starts {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in ranks {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for seg in segs {
        out.extend_from_slice(&(seg.first as u16).to_le_bytes());
    }
    let mut w = BitWriter::new(out);
    let mut res_off = 0u64;
    for seg in segs {
        w.put((seg.base - l.base_min) as u64, l.w_base);
        w.put((i64::from(seg.slope_q16) - l.slope_min) as u64, l.w_slope);
        w.put(u64::from(seg.width), l.w_width);
        w.put(if l.w_off == 0 { 0 } else { res_off }, l.w_off);
        res_off += u64::from(seg.len) * u64::from(seg.width);
    }
    w.finish();
    debug_assert_eq!(res_off, l.residual_bits);
    let mut w = BitWriter::new(out);
    for seg in segs.iter().filter(|seg| seg.width > 0) {
        let width = u32::from(seg.width);
        for dx in 0..seg.len {
            let y = i64::from(ys[(seg.first + dx) as usize]);
            w.put((y - predict(seg.base, seg.slope_q16, dx)) as u64, width);
        }
    }
    w.finish();
    debug_assert_eq!(out.len() - at, l.bytes);
}
