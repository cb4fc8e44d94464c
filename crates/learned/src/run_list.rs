//! The run-list encoding, for groups with a few runs (where a segment blob's header would cost
//! more than its model saves) and for sparse groups of scattered pages (where a segment blob's 4
//! bytes an interval would). Little endian:
//!
//! ```text
//! 0   u16 0x8000 | n_runs
//! 2   u8  w_len, u8 w_ppn   bit widths: the longest run's length - 1, the first PPNs' spread
//! 4   u32 ppn_min           the smallest first PPN
//! 8   u16 off[n_runs]       offsets ascending
//!     runs, bit-packed, n_runs x (len - 1 at w_len bits, then first PPN - ppn_min at w_ppn)
//! ```
//!
//! or, with `ELIAS_FANO_FLAG` in the `w_len` byte (at most `elias_fano::MAX_RUNS` runs, where
//! that is an eighth smaller than every other encoding), the offsets as an Elias-Fano list: one
//! bit stream from byte 8, the unary high parts (`elias_fano.rs`), then each run's record with
//! its offset's `l` low bits first (`l` + `w_len` + `w_ppn` bits).
//!
//! A lookup: a halving search of the u16 offsets (or a select in the Elias-Fano list), then one
//! record. Its span is the whole run.

use super::elias_fano;
use super::fit::bits_for;
use super::group::{find_run, push_run, room, run_reached, Finger, GroupRun, Lookup, NO_ROOM};
use super::packed::{rd16, rd64, rd_bits, wr_bits, BitWriter};
use super::GROUP_LPNS;

/// First u16 of a run list: this flag and the count of runs.
pub(super) const RUNS_FLAG: u32 = 0x8000;
/// A run list's header: its flag and count, the two widths and `ppn_min`.
const RUNS_HEADER_BYTES: usize = 8;

/// `group::lookup_with` in a run list.
pub(super) fn lookup(b: &[u8], off: u32) -> Lookup {
    let list = RunList::read(b);
    match list.find(b, off) {
        Ok((i, run)) => run_answer(&list, i, run, off),
        Err(hole) => hole,
    }
}

/// `group::lookup_next` in a run list: run `at.run` is the one after the last span's.
#[inline]
pub(super) fn lookup_next(b: &[u8], off: u32, at: Finger) -> Lookup {
    let i = usize::from(at.run);
    let list = RunList::read(b);
    if i == list.n {
        return run_reached(GROUP_LPNS as u32, off, at).expect_err("offsets are in the group");
    }
    let (start, len, ppn) = list.entry(b, i);
    if let Err(hole) = run_reached(start, off, at) {
        return hole;
    }
    // A run list's spans are whole runs: following on lands on a run's start.
    debug_assert_eq!(off, start);
    run_answer(&list, i, (start, len, ppn), off)
}

/// `group::update_in_place` in a run list: only a run of one page, whose new PPN fits the list's
/// PPN field and continues neither neighbour.
pub(super) fn update_in_place(b: &mut [u8], off: u32, ppn: u32) -> bool {
    let list = RunList::read(b);
    let Ok((i, (_, 1, _))) = list.find(b, off) else {
        return false;
    };
    let field = i64::from(ppn) - i64::from(list.ppn_min);
    if field < 0 || field >= 1 << list.w_ppn {
        return false;
    }
    let joins_left = i > 0 && {
        let (s, l, p) = list.entry(b, i - 1);
        s + l == off && p.wrapping_add(l) == ppn
    };
    let joins_right = i + 1 < list.n && {
        let (s, _, p) = list.entry(b, i + 1);
        s == off + 1 && ppn.wrapping_add(1) == p
    };
    if joins_left || joins_right {
        return false;
    }
    let bit = list.record_bit(i) + u64::from(list.w_low + list.w_len);
    wr_bits(b, RUNS_HEADER_BYTES, bit, list.w_ppn, field as u64);
    true
}

/// Bytes the run list at the start of `b` occupies.
pub(super) fn encoded_len(b: &[u8]) -> usize {
    RunList::read(b).bytes()
}

/// Mapped LPNs in the run list (every record read).
pub(super) fn live(b: &[u8]) -> u32 {
    let list = RunList::read(b);
    (0..list.n).map(|i| list.record(b, i).1).sum()
}

/// The list's runs, in offset order, into `out` (cleared by the caller): a run each.
pub(super) fn decode_runs(b: &[u8], out: &mut Vec<GroupRun>) {
    let list = RunList::read(b);
    out.reserve(list.n);
    list.for_each(b, |start, len, ppn| push_run(out, start, len, ppn));
}

/// The answer for offset `off` of run `i` of a run list, `(start, len, ppn)`.
#[inline]
fn run_answer(list: &RunList, i: usize, (start, len, ppn): (u32, u32, u32), off: u32) -> Lookup {
    Lookup {
        ppn: Some(ppn + (off - start)),
        lo: start,
        hi: start + len,
        room: if len == 1 {
            room(i64::from(list.ppn_min), list.w_ppn)
        } else {
            NO_ROOM
        },
        next: Finger::before_run(i + 1),
    }
}

/// The parsed header of a run list.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
struct RunList {
    n: usize,
    w_len: u32,
    w_ppn: u32,
    ppn_min: u32,
    /// Each offset's low bits in its record: an Elias-Fano list's (`elias_fano.rs`), or 0 where
    /// the offsets are u16s (more than `elias_fano::MAX_RUNS` runs).
    w_low: u32,
    /// The first record's bit, counted from the end of the header: past the unary part of an
    /// Elias-Fano list, or past the u16 offsets.
    records_bit: u64,
}

impl RunList {
    #[inline]
    fn read(b: &[u8]) -> Self {
        let head = rd64(b, 0);
        debug_assert!(head as u32 & RUNS_FLAG != 0);
        let n = (head as u32 & 0xffff & !RUNS_FLAG) as usize;
        let (w_low, records_bit) = if head >> 16 & ELIAS_FANO_FLAG != 0 {
            (
                elias_fano::low_bits(n),
                u64::from(elias_fano::upper_bits(n)),
            )
        } else {
            (0, 16 * n as u64)
        };
        Self {
            n,
            w_len: (head >> 16) as u32 & 0xff & !(ELIAS_FANO_FLAG as u32),
            w_ppn: (head >> 24) as u32 & 0xff,
            ppn_min: (head >> 32) as u32,
            w_low,
            records_bit,
        }
    }
    /// Where record `i` starts, in bits from the end of the header.
    #[inline]
    fn record_bit(&self, i: usize) -> u64 {
        self.records_bit + i as u64 * u64::from(self.w_low + self.w_len + self.w_ppn)
    }
    /// Run `i`'s record: its offset's low bits (Elias-Fano lists), length and first PPN.
    #[inline]
    fn record(&self, b: &[u8], i: usize) -> (u32, u32, u32) {
        let width = self.w_low + self.w_len + self.w_ppn;
        let v = rd_bits(b, RUNS_HEADER_BYTES, self.record_bit(i), width);
        (
            (v & ((1 << self.w_low) - 1)) as u32,
            1 + (v >> self.w_low & ((1 << self.w_len) - 1)) as u32,
            self.ppn_min + (v >> (self.w_low + self.w_len)) as u32,
        )
    }
    #[inline]
    fn upper(&self, b: &[u8]) -> elias_fano::Upper {
        elias_fano::Upper::read(b, RUNS_HEADER_BYTES, self.n)
    }
    /// Run `i`'s start, length and first PPN.
    #[inline]
    fn entry(&self, b: &[u8], i: usize) -> (u32, u32, u32) {
        if self.w_low > 0 {
            return self.entry_elias_fano(b, i);
        }
        let (_, len, ppn) = self.record(b, i);
        (rd16(b, RUNS_HEADER_BYTES + 2 * i), len, ppn)
    }
    /// `entry` in a list with Elias-Fano offsets. Out of line, as `find_elias_fano` is.
    #[inline(never)]
    fn entry_elias_fano(&self, b: &[u8], i: usize) -> (u32, u32, u32) {
        let (low, len, ppn) = self.record(b, i);
        (self.upper(b).value(self.n, i, low), len, ppn)
    }
    /// The run holding `off`: its index and `(start, len, ppn)`, or `Err` with the hole around
    /// `off`.
    #[inline]
    fn find(&self, b: &[u8], off: u32) -> Result<(usize, (u32, u32, u32)), Lookup> {
        if self.w_low == 0 {
            let (i, start, len) =
                find_run(b, RUNS_HEADER_BYTES, self.n, off, |i| self.record(b, i).1)?;
            return Ok((i, (start, len, self.record(b, i).2)));
        }
        self.find_elias_fano(b, off)
    }
    /// `find` in a list with Elias-Fano offsets. Out of line: few groups take them (scattered
    /// pages), and the lookups of the others keep the code they inlined before.
    #[inline(never)]
    fn find_elias_fano(&self, b: &[u8], off: u32) -> Result<(usize, (u32, u32, u32)), Lookup> {
        let upper = self.upper(b);
        let (found, bucket) = upper.last_le(self.n, off, |i| {
            let (low, len, ppn) = self.record(b, i);
            (low, (len, ppn))
        });
        let Some((i, start, (len, ppn))) = found else {
            return Err(Lookup {
                ppn: None,
                lo: 0,
                hi: upper.value_after(self.n, bucket, 0, self.record(b, 0).0),
                room: NO_ROOM,
                next: Finger::before_run(0),
            });
        };
        if off - start >= len {
            let hi = if i + 1 < self.n {
                upper.value_after(self.n, bucket, i + 1, self.record(b, i + 1).0)
            } else {
                GROUP_LPNS as u32
            };
            return Err(Lookup {
                ppn: None,
                lo: start + len,
                hi,
                room: NO_ROOM,
                next: Finger::before_run(i + 1),
            });
        }
        Ok((i, (start, len, ppn)))
    }
    /// Every run's start, length and first PPN, in order.
    fn for_each(&self, b: &[u8], mut f: impl FnMut(u32, u32, u32)) {
        if self.w_low == 0 {
            for i in 0..self.n {
                let (start, len, ppn) = self.entry(b, i);
                f(start, len, ppn);
            }
            return;
        }
        for (i, high) in self.upper(b).highs().enumerate() {
            let (low, len, ppn) = self.record(b, i);
            f(high << self.w_low | low, len, ppn);
        }
    }
    fn bytes(&self) -> usize {
        RUNS_HEADER_BYTES + self.record_bit(self.n).div_ceil(8) as usize
    }
}

/// In a run list's `w_len` byte: its offsets are an Elias-Fano list (`w_len` is at most 12).
const ELIAS_FANO_FLAG: u64 = 0x80;

/// A group takes a run list with Elias-Fano offsets only where that is at least this fraction
/// (numerator, denominator) smaller than every other encoding of it: a lookup there selects in
/// up to four words, where a u16 list takes a halving search and a segment blob two. With every
/// short list in this form, most of rocksdb's groups left their segment blobs for it, and its
/// random lookups took 1.4x as long (`examples/mapprof`). Scattered single pages save about a
/// fifth, groups of a few long runs a few bytes (notes/mapping-log.md, "Elias-Fano offsets").
pub(super) const ELIAS_FANO_MIN_SAVING: (usize, usize) = (1, 8);

/// Bytes of a run list of `n` runs at these widths with u16 offsets, and with Elias-Fano offsets
/// where the list is short enough for them.
pub(super) fn bytes(n: usize, w_len: u32, w_ppn: u32) -> (usize, Option<usize>) {
    let plain = RUNS_HEADER_BYTES + (n as u64 * u64::from(16 + w_len + w_ppn)).div_ceil(8) as usize;
    if !(1..=elias_fano::MAX_RUNS).contains(&n) {
        return (plain, None);
    }
    let bits = u64::from(elias_fano::upper_bits(n))
        + n as u64 * u64::from(elias_fano::low_bits(n) + w_len + w_ppn);
    (plain, Some(RUNS_HEADER_BYTES + bits.div_ceil(8) as usize))
}

/// The fields' widths of a run list of `runs`: `(w_len, w_ppn, ppn_min)`.
pub(super) fn widths(runs: &[GroupRun]) -> (u32, u32, u32) {
    let len_max = runs.iter().map(|r| r.1).max().unwrap_or(1);
    let ppn_min = runs.iter().map(|r| r.2).min().unwrap_or(0);
    let ppn_max = runs.iter().map(|r| r.2).max().unwrap_or(0);
    (
        u32::from(bits_for(u64::from(len_max) - 1)),
        u32::from(bits_for(u64::from(ppn_max - ppn_min))),
        ppn_min,
    )
}

/// Appends the run list of `runs` (a group's, in offset order) at these widths (as
/// `widths` gives them) to `out`, its offsets as an Elias-Fano list when `elias_fano`
/// (at most `elias_fano::MAX_RUNS` runs).
pub(super) fn write(
    runs: &[GroupRun],
    (w_len, w_ppn, ppn_min): (u32, u32, u32),
    elias_fano: bool,
    out: &mut Vec<u8>,
) {
    let n = runs.len();
    debug_assert!(!elias_fano || (1..=elias_fano::MAX_RUNS).contains(&n));
    debug_assert_eq!(widths(runs), (w_len, w_ppn, ppn_min));
    out.extend_from_slice(&(RUNS_FLAG as u16 | n as u16).to_le_bytes());
    let flag = if elias_fano { ELIAS_FANO_FLAG as u8 } else { 0 };
    out.extend_from_slice(&[w_len as u8 | flag, w_ppn as u8]);
    out.extend_from_slice(&ppn_min.to_le_bytes());
    let w_low = if elias_fano {
        elias_fano::low_bits(n)
    } else {
        for r in runs {
            out.extend_from_slice(&r.0.to_le_bytes());
        }
        0
    };
    let mut w = BitWriter::new(out);
    if elias_fano {
        let upper = elias_fano::upper_words(runs.iter().map(|r| r.0));
        let mut left = elias_fano::upper_bits(n);
        for word in upper {
            for half in [word as u32, (word >> 32) as u32] {
                let width = left.min(32);
                w.put(u64::from(half) & ((1 << width) - 1), width);
                left -= width;
            }
        }
    }
    for &(off, len, ppn) in runs {
        w.put(
            u64::from(off) & ((1 << w_low) - 1)
                | u64::from(len - 1) << w_low
                | u64::from(ppn - ppn_min) << (w_low + w_len),
            w_low + w_len + w_ppn,
        );
    }
    w.finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{
        check_blob, check_encodings, encode, encoding, Encoding, Scratch, TAIL_PAD, UNMAPPED,
    };

    #[test]
    fn scattered_pages_take_a_packed_run_list() {
        // What random writes leave on a fresh large drive: a few dozen single pages a group,
        // PPNs spread over 2^20 pages. Each costs its offset (2 bytes, or about log2(4096 / n) + 2
        // bits in an Elias-Fano list of n) and 20 bits of PPN, where a segment blob's intervals
        // alone took 4 bytes.
        let mut rng = ftlab_core::rng::SplitMix64::new(17);
        for pages in [1usize, 2, 9, 60, 200] {
            let mut dense = vec![UNMAPPED; GROUP_LPNS];
            for _ in 0..pages {
                // Apart, so that no two join into a run of two.
                let off = 2 * rng.bounded(GROUP_LPNS as u64 / 2) as usize;
                dense[off] = rng.bounded(1 << 20) as u32;
            }
            let live = dense.iter().filter(|&&p| p != UNMAPPED).count();
            let mut s = Scratch::default();
            let blob = encode(&dense, &mut s).expect("mapped").to_vec();
            assert_eq!(encoding(&blob), Encoding::Runs, "{pages} pages");
            assert!(
                blob.len() <= RUNS_HEADER_BYTES + live * 2 + (live * 20).div_ceil(8),
                "{pages} pages: {} bytes",
                blob.len()
            );
            // From about 16 pages at these PPNs, Elias-Fano offsets save an eighth of the list.
            if (16..=elias_fano::MAX_RUNS).contains(&live) {
                let l = elias_fano::low_bits(live) as usize;
                let unary = live + (GROUP_LPNS >> l);
                assert!(
                    blob.len() <= RUNS_HEADER_BYTES + (unary + live * (l + 20)).div_ceil(8),
                    "{pages} pages: {} bytes",
                    blob.len()
                );
            }
            check_encodings(&dense, &[]);
            // A page rewritten within the packed width goes in place; one above it cannot.
            let mut padded = blob.clone();
            padded.extend_from_slice(&[0; TAIL_PAD]);
            let (off, old) = dense
                .iter()
                .enumerate()
                .find(|&(_, &p)| p != UNMAPPED)
                .map(|(o, &p)| (o as u32, p))
                .expect("mapped");
            let list = RunList::read(&padded);
            assert_eq!(
                list.w_low > 0,
                (16..=elias_fano::MAX_RUNS).contains(&live),
                "{pages} pages"
            );
            let above = list.ppn_min + (1 << list.w_ppn);
            assert!(!update_in_place(&mut padded, off, above));
            assert_eq!(&padded[..blob.len()], &blob[..]);
            if list.w_ppn > 0 {
                let within = if old == list.ppn_min {
                    old + 1
                } else {
                    list.ppn_min
                };
                assert!(update_in_place(&mut padded, off, within));
                dense[off as usize] = within;
                check_blob(&padded, &dense);
            }
        }
    }

    #[test]
    fn a_few_long_runs_keep_u16_offsets() {
        // Eight runs of 100 pages: Elias-Fano offsets would save 5 of the list's 51 bytes (its
        // records are most of it), under the eighth that pays for their slower lookups.
        let mut rng = ftlab_core::rng::SplitMix64::new(3);
        let mut dense = vec![UNMAPPED; GROUP_LPNS];
        for r in 0..8 {
            let ppn = rng.bounded(1 << 20) as u32;
            for k in 0..100 {
                dense[r * 500 + k] = ppn + k as u32;
            }
        }
        let mut s = Scratch::default();
        let mut blob = encode(&dense, &mut s).expect("mapped").to_vec();
        assert_eq!((encoding(&blob), blob.len()), (Encoding::Runs, 51));
        blob.extend_from_slice(&[0; TAIL_PAD]);
        assert_eq!(RunList::read(&blob).w_low, 0);
        check_encodings(&dense, &[]);
    }
}
