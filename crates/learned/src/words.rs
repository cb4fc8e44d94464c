//! The third group encoding, for groups of short runs (pgbench's average 2.6 pages): per 64
//! offsets, a bitmap of the mapped ones, a bitmap of where runs of consecutive PPNs start, and a
//! record; one residual per run. A lookup is a bit test, a popcount, two bit scans and one
//! residual, with no search, and its span is the whole run (within the word). The segment encoding needs two
//! searches; a run list one. `group::encode_runs` takes this one when it costs at most
//! `WORDS_MAX_GROWTH` times the smaller of the other two (and never more than the worst case of
//! those; docs/mapping.md).
//!
//! Layout, little endian:
//!
//! ```text
//! 0     u16 WORDS_FLAG
//! 2     u16 live             mapped offsets in the group
//! 4     u32 residual_bytes
//! 8     64 x (u64 mapped, u64 starts, u64 record)   word w covers offsets 64w .. 64w + 64
//!           mapped: bit i set where offset 64w + i is mapped
//!           starts: bit i set where a run of consecutive PPNs starts (a subset of mapped; the
//!                   first mapped offset after a hole or the word's start always is one)
//!           record: base (32 bits) | width (6 bits) << 32 | residual bit offset (26 bits) << 38
//! 1544  residuals, bit-packed, each word's at its own width: the j-th run of word w starts at
//!       PPN base + residual_j
//! ```

use super::fit::bits_for;
use super::group::{room, Finger, GroupRun, Lookup, NO_ROOM};
use super::packed::{rd16, rd64, rd_bits, wr_bits};
use super::GROUP_LPNS;

/// First u16 of a blob in this encoding (segment blobs start with `live` <= 4096, run lists
/// with bit 15 set).
pub const WORDS_FLAG: u32 = 0x4000;
const WORDS: usize = GROUP_LPNS / 64;
const WORDS_AT: usize = 8;
const WORD_BYTES: usize = 24;
const RESIDUALS_AT: usize = WORDS_AT + WORD_BYTES * WORDS;
/// Bytes of a blob besides its residuals.
pub const FIXED_BYTES: usize = RESIDUALS_AT;
const WIDTH_SHIFT: u32 = 32;
const RES_SHIFT: u32 = 38;

/// What encoding a group this way takes: each word's base, width and runs, and the total size.
pub struct Plan {
    base: [u32; WORDS],
    width: [u8; WORDS],
    runs: [u32; WORDS],
    pub bytes: usize,
}

/// Calls `f(word, bit, len, ppn)` for every run cut at word boundaries, in order (`word` is
/// below `WORDS`, so indexing by it needs no bounds check).
#[inline]
fn for_each_piece(runs: &[GroupRun], mut f: impl FnMut(usize, u32, u32, u32)) {
    for &(off, len, ppn) in runs {
        let (mut off, mut len, mut ppn) = (u32::from(off), u32::from(len), ppn);
        debug_assert!((off + len) as usize <= GROUP_LPNS);
        while len > 0 {
            let n = len.min(64 - off % 64);
            f((off / 64) as usize & (WORDS - 1), off % 64, n, ppn);
            (off, len, ppn) = (off + n, len - n, ppn.wrapping_add(n));
        }
    }
}

/// One pass over the runs: the plan, without writing anything.
pub fn plan(runs: &[GroupRun]) -> Plan {
    let mut lo = [u32::MAX; WORDS];
    let mut hi = [0u32; WORDS];
    let mut plan = Plan {
        base: [0; WORDS],
        width: [0; WORDS],
        runs: [0; WORDS],
        bytes: 0,
    };
    for_each_piece(runs, |w, _, _, ppn| {
        lo[w] = lo[w].min(ppn);
        hi[w] = hi[w].max(ppn);
        plan.runs[w] += 1;
    });
    let mut residual_bits = 0u64;
    for w in 0..WORDS {
        if plan.runs[w] > 0 {
            plan.base[w] = lo[w];
            plan.width[w] = bits_for(u64::from(hi[w] - lo[w]));
            residual_bits += u64::from(plan.runs[w]) * u64::from(plan.width[w]);
        }
    }
    plan.bytes = RESIDUALS_AT + residual_bits.div_ceil(8) as usize;
    plan
}

/// Writes the blob `plan` was made for (from the same runs) to `out`.
pub fn write(runs: &[GroupRun], plan: &Plan, out: &mut Vec<u8>) {
    let live: u32 = runs.iter().map(|r| u32::from(r.1)).sum();
    out.clear();
    out.resize(plan.bytes, 0);
    out[0..2].copy_from_slice(&(WORDS_FLAG as u16).to_le_bytes());
    out[2..4].copy_from_slice(&(live as u16).to_le_bytes());
    let residual_bytes = (plan.bytes - RESIDUALS_AT) as u32;
    out[4..8].copy_from_slice(&residual_bytes.to_le_bytes());
    let mut res_bit = [0u64; WORDS];
    let mut next = 0u64;
    for (w, at) in res_bit.iter_mut().enumerate() {
        *at = next;
        next += u64::from(plan.runs[w]) * u64::from(plan.width[w]);
    }
    debug_assert!(next < 1 << (64 - RES_SHIFT));
    let (mut mapped, mut starts) = ([0u64; WORDS], [0u64; WORDS]);
    // The residuals go into zeroed words by OR (no bit writer needed), copied out at the end.
    let mut residuals = vec![0u64; (next as usize).div_ceil(64) + 1];
    // The pieces come in offset order, so one word's are consecutive: its bitmaps, base, width
    // and next residual position stay in locals until the next word's begin (indexing the
    // per-word arrays for each piece cost this function 9 % more instructions on pgbench).
    let (mut cur, mut cur_mapped, mut cur_starts) = (usize::MAX, 0u64, 0u64);
    let (mut base, mut width, mut at) = (0u32, 0u64, 0u64);
    for_each_piece(runs, |w, i, len, ppn| {
        if w != cur {
            if cur != usize::MAX {
                (mapped[cur], starts[cur]) = (cur_mapped, cur_starts);
            }
            (cur, cur_mapped, cur_starts) = (w, 0, 0);
            (base, width, at) = (plan.base[w], u64::from(plan.width[w]), res_bit[w]);
        }
        cur_mapped |= (u64::MAX >> (64 - len)) << i;
        cur_starts |= 1 << i;
        if width > 0 {
            let r = u64::from(ppn - base);
            residuals[(at / 64) as usize] |= r << (at % 64);
            if at % 64 + width > 64 {
                residuals[(at / 64) as usize + 1] |= r >> (64 - at % 64);
            }
            at += width;
        }
    });
    if cur != usize::MAX {
        (mapped[cur], starts[cur]) = (cur_mapped, cur_starts);
    }
    for w in 0..WORDS {
        let at = WORDS_AT + WORD_BYTES * w;
        out[at..at + 8].copy_from_slice(&mapped[w].to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&starts[w].to_le_bytes());
        let record = u64::from(plan.base[w])
            | u64::from(plan.width[w]) << WIDTH_SHIFT
            | res_bit[w] << RES_SHIFT;
        out[at + 16..at + 24].copy_from_slice(&record.to_le_bytes());
    }
    for (i, word) in residuals.iter().enumerate() {
        let at = RESIDUALS_AT + 8 * i;
        if at >= plan.bytes {
            break;
        }
        let n = (plan.bytes - at).min(8);
        out[at..at + n].copy_from_slice(&word.to_le_bytes()[..n]);
    }
}

/// One word of a blob: its bitmaps and decoded record.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
struct Word {
    mapped: u64,
    starts: u64,
    /// Run j of the word starts at PPN `base + residual(j)`.
    base: u32,
    width: u32,
    res_bit: u64,
}

impl Word {
    #[inline]
    fn read(b: &[u8], w: usize) -> Word {
        let at = WORDS_AT + WORD_BYTES * w;
        let record = rd64(b, at + 16);
        Word {
            mapped: rd64(b, at),
            starts: rd64(b, at + 8),
            base: record as u32,
            width: ((record >> WIDTH_SHIFT) & 63) as u32,
            res_bit: record >> RES_SHIFT,
        }
    }

    /// First PPN of run `j`.
    #[inline]
    fn run_ppn(&self, b: &[u8], j: u32) -> u32 {
        let at = self.res_bit + u64::from(j) * u64::from(self.width);
        self.base
            .wrapping_add(rd_bits(b, RESIDUALS_AT, at, self.width) as u32)
    }

    /// For mapped bit `i`: the index of its run, the run's first bit, and the bit after it.
    #[inline]
    fn run_of(&self, i: u32) -> (u32, u32, u32) {
        let upto = self.starts & at_or_below(i);
        let j = upto.count_ones() - 1;
        let first = 63 - upto.leading_zeros();
        let ends = (self.starts | !self.mapped) & above(i);
        let end = if ends == 0 { 64 } else { ends.trailing_zeros() };
        (j, first, end)
    }
}

/// Bits 0..=i.
#[inline]
fn at_or_below(i: u32) -> u64 {
    (2u64 << i).wrapping_sub(1)
}

/// Bits above bit `i`.
#[inline]
fn above(i: u32) -> u64 {
    !at_or_below(i)
}

/// `group::lookup_with` for a blob of this encoding. Spans stay within the offset's word; the
/// follow-on position is not needed (a lookup has no search to skip).
#[inline]
pub fn lookup_with<const ROOM: bool>(b: &[u8], off: u32) -> Lookup {
    let word = Word::read(b, (off / 64) as usize);
    let i = off % 64;
    let word_lo = off - i;
    if word.mapped & (1 << i) == 0 {
        // The hole around `off`: from after the mapped offset below to the one above.
        let (below, up) = (word.mapped & (at_or_below(i) >> 1), word.mapped & above(i));
        let lo = match below {
            0 => word_lo,
            x => word_lo + 64 - x.leading_zeros(),
        };
        let hi = match up {
            0 => word_lo + 64,
            x => word_lo + x.trailing_zeros(),
        };
        return Lookup {
            ppn: None,
            lo,
            hi,
            room: NO_ROOM,
            next: Finger::NONE,
        };
    }
    let (j, first, end) = word.run_of(i);
    let run_ppn = word.run_ppn(b, j);
    let room = if ROOM && word.width > 0 && end - first == 1 {
        room(i64::from(word.base), word.width)
    } else {
        NO_ROOM
    };
    Lookup {
        ppn: Some(run_ppn.wrapping_add(i - first)),
        lo: word_lo + first,
        hi: word_lo + end,
        room,
        next: Finger::NONE,
    }
}

/// The PPN of offset `off`, if mapped.
#[inline]
fn ppn_of(b: &[u8], off: u32) -> Option<u32> {
    let word = Word::read(b, (off / 64) as usize);
    let i = off % 64;
    if word.mapped & (1 << i) == 0 {
        return None;
    }
    let (j, first, _) = word.run_of(i);
    Some(word.run_ppn(b, j).wrapping_add(i - first))
}

/// `group::update_in_place` for this encoding: a run of one offset takes the new PPN in place
/// when it fits the word's width, unless it continues a neighbour's (then a merge shrinks the
/// group).
pub fn update_in_place(b: &mut [u8], off: u32, ppn: u32) -> bool {
    move_run_in_place(b, off, 1, ppn)
}

/// Whether offsets `off..off + len` lie in one word, as every run of this encoding does (a
/// longer stream's run cannot be one: `LearnedMapping::settle_tail_run` asks before reading
/// the blob).
#[inline]
pub fn within_a_word(off: u32, len: u32) -> bool {
    len > 0 && off / 64 == (off + len - 1) / 64
}

/// `group::move_run_in_place` for this encoding (and, with `len` 1, `update_in_place`): where
/// offsets `off..off + len` are exactly one run of the blob (within one word), its residual
/// becomes `ppn`'s when that fits the word's width and does not continue a neighbour's PPN.
pub fn move_run_in_place(b: &mut [u8], off: u32, len: u32, ppn: u32) -> bool {
    let word = Word::read(b, (off / 64) as usize);
    let i = off % 64;
    if word.mapped & (1 << i) == 0 || word.width == 0 {
        return false;
    }
    let (j, first, end) = word.run_of(i);
    let residual = i64::from(ppn) - i64::from(word.base);
    if first != i || end - first != len || residual < 0 || residual >= 1 << word.width {
        return false;
    }
    // The neighbours' PPNs. Within the word they come from this word's record: the run is
    // exactly `i..end`, so a mapped bit before it ends run `j - 1`, and one after it starts run
    // `j + 1` (`ppn_of` read the word again and counted its starts for each: a quarter of an
    // in-place move's instructions, 165 -> 125). At the word's edges, the next word holds them.
    let left_by_search = || off > 0 && ppn_of(b, off - 1).is_some_and(|l| l.wrapping_add(1) == ppn);
    let right_by_search = || {
        off + len < GROUP_LPNS as u32
            && ppn_of(b, off + len).is_some_and(|r| r == ppn.wrapping_add(len))
    };
    let joins_left = if i > 0 {
        word.mapped >> (i - 1) & 1 != 0 && {
            let left_first = 63 - (word.starts & (at_or_below(i) >> 1)).leading_zeros();
            let left = word.run_ppn(b, j - 1).wrapping_add(i - 1 - left_first);
            left.wrapping_add(1) == ppn
        }
    } else {
        left_by_search()
    };
    let joins_right = if end < 64 {
        word.mapped >> end & 1 != 0 && word.run_ppn(b, j + 1) == ppn.wrapping_add(len)
    } else {
        right_by_search()
    };
    debug_assert_eq!(joins_left, left_by_search());
    debug_assert_eq!(joins_right, right_by_search());
    if joins_left || joins_right {
        return false;
    }
    let at = word.res_bit + u64::from(j) * u64::from(word.width);
    wr_bits(b, RESIDUALS_AT, at, word.width, residual as u64);
    true
}

/// A hint that offset `off` of blob `b` will be read soon: the lines of its word (24 bytes,
/// which may straddle two). Also called for blobs of other encodings, whose bytes there (or
/// past whose end) are no word: a prefetch is a hint, so the pointers are not bounded by `b`.
#[inline]
pub fn prefetch(b: &[u8], off: u32) {
    let word = b
        .as_ptr()
        .wrapping_add(WORDS_AT + WORD_BYTES * (off as usize / 64));
    ftlab_core::ftl::mapping::prefetch_line(word);
    ftlab_core::ftl::mapping::prefetch_line(word.wrapping_add(WORD_BYTES - 1));
}

/// A hint that offset `off` of blob `b` will be read soon, once `prefetch` brought its word:
/// the line of its run's residual (reading the word).
#[inline]
pub fn prefetch_residual(b: &[u8], off: u32) {
    let word = Word::read(b, (off / 64) as usize);
    let j = (word.starts & at_or_below(off % 64))
        .count_ones()
        .saturating_sub(1);
    let at = word.res_bit + u64::from(j) * u64::from(word.width);
    ftlab_core::ftl::mapping::prefetch_line(b[RESIDUALS_AT + (at / 8) as usize..].as_ptr());
}

/// The blob's mappings as runs, in offset order.
pub fn decode_runs(b: &[u8], out: &mut Vec<GroupRun>) {
    for w in 0..WORDS {
        let word = Word::read(b, w);
        let mut starts = word.starts;
        let mut j = 0u32;
        // A run ends at the next run's start or at the next unmapped offset.
        let ends = word.starts | !word.mapped;
        while starts != 0 {
            let first = starts.trailing_zeros();
            starts &= starts - 1;
            let after = ends & above(first);
            let end = if after == 0 {
                64
            } else {
                after.trailing_zeros()
            };
            super::group::push_run(out, 64 * w as u32 + first, end - first, word.run_ppn(b, j));
            j += 1;
        }
    }
}

/// Bytes the blob at the start of `b` occupies.
pub fn encoded_len(b: &[u8]) -> usize {
    RESIDUALS_AT + rd64(b, 4) as u32 as usize
}

/// Mapped offsets in the blob.
pub fn live(b: &[u8]) -> u32 {
    rd16(b, 2)
}
