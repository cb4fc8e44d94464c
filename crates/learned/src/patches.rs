//! Outliers: a group whose PPNs follow a line except at a few scattered offsets keeps the line
//! and lists those offsets apart. This is what a sequentially written range looks like after
//! some of its pages were written again (each took the log head's PPN, far from the line) or
//! moved by garbage collection: without patches every such page cuts the line in three
//! segments or runs (9-15 bytes a page, `examples/outliers.rs`); with them it costs its offset
//! and its PPN's bits above the group's smallest patch PPN (4-5 bytes).
//!
//! A patched blob wraps one of the other encodings, little endian:
//!
//! ```text
//! 0     u16 PATCH_FLAG | n     patched offsets (1..=4096)
//! 2     u8  width              bits of each patch's PPN above ppn_min
//! 3     u8  0
//! 4     u32 ppn_min
//! 8     u16 offset[n]          ascending; every one is mapped
//!       n x width bits         PPN - ppn_min of each, LSB first
//!       inner blob             the group with each patched offset mapped to the value the line
//!                              gives it (segments, a run list or bitmap words; never patched)
//! ```
//!
//! A lookup searches the patched offsets first; elsewhere the inner blob answers, its span cut
//! at the patches on either side. `group::encode_runs` takes this form only when it is smaller
//! than the group's plain encoding, so the worst case (docs/mapping.md) does not change.

use super::fit::bits_for;
use super::group::{self, last_le, push_run, room, Finger, GroupRun, Lookup, NO_ROOM};
use super::packed::{rd16, rd_bits, wr_bits, BitWriter};
use super::GROUP_LPNS;

/// First u16 of a patched blob: segment blobs start with `live` <= 4096 and run lists and
/// bitmap words with bit 15 or 14 set, so bit 13 is free in all three.
pub const PATCH_FLAG: u32 = 0x2000;
// A full segment blob's `live` (`GROUP_LPNS`) must stay below every flag, or it would read as
// one (groups of 8192 LPNs would); `group::lookup_with` tells them apart with one compare.
const _: () = assert!(GROUP_LPNS < PATCH_FLAG as usize);
const OFFSETS_AT: usize = 8;
/// Bytes of a patched blob besides its offsets, patch bits and inner blob.
pub const FIXED_BYTES: usize = OFFSETS_AT;
/// The longest stretch of consecutive ranks (mapped offsets, holes skipped) that is patched
/// rather than cut out of the line: one 4 KiB page or one 8 KiB database page. Longer stretches
/// stay runs of their own, where they cost a segment (or run) and no bits per page.
pub const MAX_PATCH_RANKS: u32 = 2;

#[inline]
fn count(b: &[u8]) -> usize {
    (rd16(b, 0) & !PATCH_FLAG) as usize
}

#[inline]
fn width(b: &[u8]) -> u32 {
    rd16(b, 2) & 0xff
}

#[inline]
fn ppn_min(b: &[u8]) -> u32 {
    rd_bits(b, 4, 0, 32) as u32
}

/// Bytes before the inner blob.
#[inline]
fn inner_at(b: &[u8]) -> usize {
    header_bytes(count(b), width(b))
}

fn header_bytes(n: usize, width: u32) -> usize {
    OFFSETS_AT + 2 * n + (n * width as usize).div_ceil(8)
}

/// The blob the patches wrap.
#[inline]
pub fn inner(b: &[u8]) -> &[u8] {
    &b[inner_at(b)..]
}

#[inline]
fn patch_ppn(b: &[u8], n: usize, k: usize) -> u32 {
    let w = width(b);
    ppn_min(b) + rd_bits(b, OFFSETS_AT + 2 * n, k as u64 * u64::from(w), w) as u32
}

/// `group::lookup_with` for a patched blob. Out of line: only groups with outliers pay for it.
#[inline(never)]
pub fn lookup_with<const ROOM: bool>(b: &[u8], off: u32) -> Lookup {
    let n = count(b);
    let found = last_le(b, OFFSETS_AT, n, off, GROUP_LPNS as u32);
    let mut lo = 0;
    if let Some(k) = found {
        let patched = rd16(b, OFFSETS_AT + 2 * k);
        if patched == off {
            return Lookup {
                ppn: Some(patch_ppn(b, n, k)),
                lo: off,
                hi: off + 1,
                room: if ROOM {
                    room(i64::from(ppn_min(b)), width(b))
                } else {
                    NO_ROOM
                },
                // `group::lookup_next` searches a patched blob again.
                next: Finger::NONE,
            };
        }
        lo = patched + 1;
    }
    let next = found.map_or(0, |k| k + 1);
    let hi = if next < n {
        rd16(b, OFFSETS_AT + 2 * next)
    } else {
        GROUP_LPNS as u32
    };
    let mut l = group::lookup_unpatched::<ROOM>(inner(b), off);
    // The inner blob's line runs through the patched offsets; its spans must not.
    l.lo = l.lo.max(lo);
    l.hi = l.hi.min(hi);
    l
}

/// `group::update_in_place` for a patched blob: a patched offset takes any PPN within the
/// patches' width above `ppn_min`; the others go to the inner blob.
pub fn update_in_place(b: &mut [u8], off: u32, ppn: u32) -> bool {
    let n = count(b);
    let k = match last_le(b, OFFSETS_AT, n, off, GROUP_LPNS as u32) {
        Some(k) if rd16(b, OFFSETS_AT + 2 * k) == off => k,
        _ => {
            let at = inner_at(b);
            return group::update_in_place(&mut b[at..], off, ppn);
        }
    };
    let (min, w) = (ppn_min(b), width(b));
    let Some(v) = ppn.checked_sub(min).filter(|&v| u64::from(v) < 1u64 << w) else {
        return false;
    };
    // As in the other encodings: a value continuing a neighbour waits for a merge, which
    // joins them.
    let left = off.checked_sub(1).and_then(|o| group::lookup(b, o).ppn);
    let right = (off + 1 < GROUP_LPNS as u32)
        .then(|| group::lookup(b, off + 1).ppn)
        .flatten();
    if left.is_some_and(|l| l.wrapping_add(1) == ppn)
        || right.is_some_and(|r| r == ppn.wrapping_add(1))
    {
        return false;
    }
    wr_bits(
        b,
        OFFSETS_AT + 2 * n,
        k as u64 * u64::from(w),
        w,
        u64::from(v),
    );
    true
}

/// Bytes the patched blob at the start of `b` occupies.
pub fn encoded_len(b: &[u8]) -> usize {
    inner_at(b) + group::encoded_len(inner(b))
}

/// Mapped offsets (the inner blob maps the patched ones too).
pub fn live(b: &[u8]) -> u32 {
    group::live(inner(b))
}

/// The blob's mappings as runs: the inner blob's, with the patches laid over them.
pub fn decode_runs(b: &[u8], out: &mut Vec<GroupRun>) {
    let n = count(b);
    let mut line = Vec::new();
    group::decode_runs(inner(b), &mut line);
    let patches: Vec<(u32, u32)> = (0..n)
        .map(|k| (rd16(b, OFFSETS_AT + 2 * k), patch_ppn(b, n, k)))
        .collect();
    group::overlay(&line, &patches, |(off, ppn)| (off, 1, Some(ppn)), out);
}

/// Finds the outliers of `runs` (a group's runs in offset order): stretches of at most
/// `MAX_PATCH_RANKS` ranks whose PPNs leave an exact line (PPN = rank + constant) that resumes
/// right after them. Fills `line` with the runs the group would have if they followed the line,
/// and `patches` with their (offset, PPN); both empty when there are none.
pub fn find(runs: &[GroupRun], line: &mut Vec<GroupRun>, patches: &mut Vec<(u16, u32)>) {
    line.clear();
    patches.clear();
    // The PPN the line gives the next rank.
    let mut expect: Option<u32> = None;
    let mut i = 0;
    while i < runs.len() {
        let (off, len, ppn) = runs[i];
        if let Some(e) = expect.filter(|&e| e != ppn) {
            // Does the line resume within MAX_PATCH_RANKS ranks?
            let (mut ranks, mut k) = (0u32, i);
            let mut resumes = false;
            while k < runs.len() && ranks + u32::from(runs[k].1) <= MAX_PATCH_RANKS {
                ranks += u32::from(runs[k].1);
                k += 1;
                if k < runs.len() && e.checked_add(ranks) == Some(runs[k].2) {
                    resumes = true;
                    break;
                }
            }
            if resumes {
                let mut value = e;
                for &(o, l, p) in &runs[i..k] {
                    for d in 0..l {
                        patches.push((o + d, p + u32::from(d)));
                    }
                    push_run(line, u32::from(o), u32::from(l), value);
                    value += u32::from(l);
                }
                expect = Some(value);
                i = k;
                continue;
            }
        }
        push_run(line, u32::from(off), u32::from(len), ppn);
        expect = ppn.checked_add(u32::from(len));
        i += 1;
    }
    if patches.is_empty() {
        line.clear();
    }
}

/// Bytes of the patched blob wrapping an inner blob of `inner_bytes` bytes.
pub fn bytes(patches: &[(u16, u32)], inner_bytes: usize) -> usize {
    header_bytes(patches.len(), patch_width(patches)) + inner_bytes
}

fn patch_width(patches: &[(u16, u32)]) -> u32 {
    let min = patches.iter().map(|p| p.1).min().unwrap_or(0);
    let max = patches.iter().map(|p| p.1).max().unwrap_or(0);
    u32::from(bits_for(u64::from(max - min)))
}

/// Appends the patched blob: `patches` (ascending offsets, at least one) around `inner`.
pub fn write(patches: &[(u16, u32)], inner: &[u8], out: &mut Vec<u8>) {
    let n = patches.len();
    debug_assert!((1..=GROUP_LPNS).contains(&n));
    let width = patch_width(patches);
    let min = patches.iter().map(|p| p.1).min().unwrap_or(0);
    out.extend_from_slice(&(PATCH_FLAG as u16 | n as u16).to_le_bytes());
    out.extend_from_slice(&[width as u8, 0]);
    out.extend_from_slice(&min.to_le_bytes());
    for &(off, _) in patches {
        out.extend_from_slice(&off.to_le_bytes());
    }
    let mut w = BitWriter::new(out);
    for &(_, ppn) in patches {
        w.put(u64::from(ppn - min), width);
    }
    w.finish();
    out.extend_from_slice(inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{
        check_encodings, encode, encode_patched, encoding, Encoding, Scratch, UNMAPPED,
    };
    use ftlab_core::rng::SplitMix64;

    /// A group written sequentially (with a hole every 700 offsets), then `k` of its pages
    /// written again, one or two at a time, each taking the next PPN of a log head far above.
    fn aged(k: usize, rng: &mut SplitMix64) -> Vec<u32> {
        let g = GROUP_LPNS as u32;
        let mut dense: Vec<u32> = (0..g)
            .map(|i| if i % 700 == 350 { UNMAPPED } else { 10_000 + i })
            .collect();
        let mut head = 5_000_000;
        for _ in 0..k {
            let off = rng.bounded(u64::from(g - 1)) as usize;
            let pages = 1 + (rng.bounded(3) == 0) as usize;
            for ppn in dense[off..off + pages].iter_mut() {
                if *ppn != UNMAPPED {
                    *ppn = head;
                    head += 1;
                }
            }
        }
        dense
    }

    #[test]
    fn find_patches_short_stretches_where_the_line_resumes() {
        let find_in = |runs: &[GroupRun]| {
            let (mut line, mut found) = (Vec::new(), Vec::new());
            find(runs, &mut line, &mut found);
            (line, found)
        };
        // One page, then two (as one run or two), off the line that resumes after them.
        assert_eq!(
            find_in(&[(0, 10, 100), (10, 1, 999), (11, 5, 111)]),
            (vec![(0, 16, 100)], vec![(10, 999)])
        );
        assert_eq!(
            find_in(&[(0, 10, 100), (10, 1, 999), (11, 1, 5), (12, 5, 112)]),
            (vec![(0, 17, 100)], vec![(10, 999), (11, 5)])
        );
        // Ranks, not offsets: the hole at 10..20 is not part of the line.
        assert_eq!(
            find_in(&[(0, 10, 100), (20, 1, 999), (30, 5, 111)]),
            (
                vec![(0, 10, 100), (20, 1, 110), (30, 5, 111)],
                vec![(20, 999)]
            )
        );
        // Three pages are a run of their own; so is a last page that no line follows, and a
        // page where the line does not resume.
        for runs in [
            &[(0, 10, 100), (10, 3, 999), (13, 5, 113)][..],
            &[(0, 10, 100), (10, 1, 999)],
            &[(0, 10, 100), (10, 1, 999), (11, 5, 112)],
        ] {
            assert_eq!(find_in(runs), (vec![], vec![]), "{runs:?}");
        }
    }

    #[test]
    fn outliers_read_back_and_cost_a_few_bytes_each() {
        let mut rng = SplitMix64::new(17);
        let mut s = Scratch::default();
        for k in [1, 3, 20, 150, 600] {
            let dense = aged(k, &mut rng);
            // Updates: patched pages to other PPNs of the log head (some fit in place), to
            // their neighbour's next PPN (refused), and anywhere.
            let updates: Vec<(u32, u32)> = (0..400)
                .map(|i| {
                    let off = rng.bounded(GROUP_LPNS as u64) as u32;
                    let ppn = match i % 3 {
                        0 => 5_000_000 + rng.bounded(2 * k as u64 + 2) as u32,
                        1 => dense[off.saturating_sub(1) as usize].wrapping_add(1),
                        _ => rng.bounded(1 << 24) as u32,
                    };
                    (off, ppn)
                })
                .collect();
            check_encodings(&dense, &updates);

            let mut chosen = encode(&dense, &mut s).expect("mapped").to_vec();
            let len = chosen.len();
            chosen.extend_from_slice(&[0xA5; group::TAIL_PAD]);
            let mut runs = Vec::new();
            group::dense_runs(&dense, &mut runs);
            let (mut line, mut found) = (Vec::new(), Vec::new());
            find(&runs, &mut line, &mut found);
            assert!(!found.is_empty(), "k {k}");
            // Without patches: the same encoder on the runs as they are.
            let mut plain = Scratch::default();
            group::encode_plain(&runs, &mut plain);
            if encoding(&chosen) == Encoding::Runs {
                // A few pages off a line of 7 runs: the plain run list of a dozen runs (about
                // 6 bytes each) is smaller than a patched blob.
                assert!(k <= 3 && len == plain.out.len(), "k {k}: {len} bytes");
                continue;
            }
            assert_eq!(encoding(&chosen), Encoding::Patched, "k {k}");
            assert!(len < plain.out.len(), "k {k}: {len} >= {}", plain.out.len());
            // Each outlier: its offset and its PPN's bits above the smallest (23 bits here at
            // most), besides the line's blob and 8 bytes.
            let (line_len, n) = (group::encoded_len(inner(&chosen)), found.len());
            assert!(
                len - line_len <= 8 + 2 * n + (23 * n).div_ceil(8),
                "k {k}: {} bytes for {n} pages",
                len - line_len
            );
        }
    }

    #[test]
    fn bitmap_words_of_short_runs_keep_their_outliers() {
        // pgbench's shape: runs of one to four pages at scattered PPNs, some of them with a
        // page written elsewhere in the middle (an outlier: the run resumes after it). Bitmap
        // words store a run in its residual's bits, about what listing the page would cost, so
        // no second encoding is tried (trying it cost a GC-heavy simulation 19 % more
        // instructions for a table 0.02 % smaller at the end: notes/mapping-log.md).
        let mut rng = SplitMix64::new(5);
        let mut dense = vec![UNMAPPED; GROUP_LPNS];
        let mut off = 0;
        while off + 4 <= GROUP_LPNS {
            let len = 1 + rng.bounded(4) as usize;
            let ppn = rng.bounded(1 << 22) as u32;
            for (i, p) in dense[off..off + len].iter_mut().enumerate() {
                *p = ppn + i as u32;
            }
            if len == 4 {
                dense[off + 1] = rng.bounded(1 << 22) as u32;
            }
            off += len + 1;
        }
        let mut runs = Vec::new();
        group::dense_runs(&dense, &mut runs);
        let (mut line, mut found) = (Vec::new(), Vec::new());
        find(&runs, &mut line, &mut found);
        assert!(found.len() > 100, "{} outliers", found.len());
        let mut s = Scratch::default();
        let chosen = encode(&dense, &mut s).expect("mapped");
        assert_eq!(encoding(chosen), Encoding::Words);
        check_encodings(&dense, &[]);
    }

    #[test]
    fn a_patched_page_is_rewritten_in_place_within_its_width() {
        let mut rng = SplitMix64::new(3);
        let dense = aged(40, &mut rng);
        let mut blob = encode_patched(&dense).expect("outliers");
        let n = count(&blob);
        let (min, w) = (ppn_min(&blob), width(&blob));
        let at = |b: &[u8], k: usize| rd16(b, OFFSETS_AT + 2 * k);
        let mut dense = dense;
        for k in 0..n {
            let off = at(&blob, k);
            let left = dense[off as usize - 1];
            let len = encoded_len(&blob);
            // Out of the width, or continuing the left neighbour: refused, untouched.
            for ppn in [min + (1 << w), left.wrapping_add(1)] {
                let before = blob.clone();
                assert!(
                    !update_in_place(&mut blob, off, ppn),
                    "offset {off} to {ppn}"
                );
                assert_eq!(blob, before);
            }
            let ppn = min + (k as u32 * 7919) % (1 << w);
            if ppn == dense[off as usize]
                || left.wrapping_add(1) == ppn
                || dense.get(off as usize + 1) == Some(&ppn.wrapping_add(1))
            {
                continue;
            }
            assert!(
                update_in_place(&mut blob, off, ppn),
                "offset {off} to {ppn}"
            );
            dense[off as usize] = ppn;
            assert_eq!(encoded_len(&blob), len);
        }
        group::check_blob(&blob, &dense);
    }
}
