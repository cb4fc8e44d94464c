//! Which offsets of a group its buffered updates hold: one bit per offset, so that a lookup of
//! an offset the buffer does not hold (most of them) tests a bit instead of searching the
//! group's buffered runs, and finds the nearest buffered offsets that bound the span it keeps.

use super::GROUP_LPNS;

/// One bit per offset of a group, set where its delta's runs hold the offset (the tail's deferred
/// appends are set when `flush_tail` writes them). A lookup of an offset the buffer does not hold
/// (most of them) tests a bit instead of searching the runs: on pgbench, whose buffered groups
/// hold about 200 runs each, that search was half the time of a lookup the cursor missed. 512
/// bytes per buffered group.
pub(super) type BufferedBits = [u64; GROUP_LPNS / 64];

/// How far (in 64-offset words, each way) a lookup looks for the nearest buffered offsets, which
/// bound the span it keeps: farther ones are not looked for, and the span ends there.
pub(super) const BOUND_SCAN_WORDS: usize = 16;

/// Whether offset `off`'s bit is set.
#[inline]
pub(super) fn is_buffered_bit(bits: &BufferedBits, off: u32) -> bool {
    bits[(off / 64) as usize] >> (off % 64) & 1 != 0
}

/// Sets (`on`) or clears offset `off`'s bit.
#[inline]
pub(super) fn set_bit(bits: &mut BufferedBits, off: u32, on: bool) {
    let (w, mask) = ((off / 64) as usize, 1u64 << (off % 64));
    if on {
        bits[w] |= mask;
    } else {
        bits[w] &= !mask;
    }
}

/// Sets (`on`) or clears the bits of offsets `lo..hi`.
#[inline]
pub(super) fn set_bits(bits: &mut BufferedBits, lo: u32, hi: u32, on: bool) {
    debug_assert!(lo <= hi && hi as usize <= GROUP_LPNS);
    let mut off = lo;
    while off < hi {
        let (w, i) = ((off / 64) as usize, off % 64);
        let n = (hi - off).min(64 - i);
        let mask = (u64::MAX >> (64 - n)) << i;
        if on {
            bits[w] |= mask;
        } else {
            bits[w] &= !mask;
        }
        off += n;
    }
}

/// Around offset `off`, whose bit is clear: offsets `lo..hi` holding no set bit (`lo` after the
/// nearest set bit below, `hi` the nearest above), looked for in the words from `lim_lo`'s to
/// `lim_hi`'s (and at most `BOUND_SCAN_WORDS` words each way); where none is there, the bound is
/// the edge of the last word looked at.
#[inline]
pub(super) fn clear_around(bits: &BufferedBits, off: u32, lim_lo: u32, lim_hi: u32) -> (u32, u32) {
    let (w, i) = ((off / 64) as usize, off % 64);
    let last_lo = (lim_lo / 64) as usize;
    let last_hi = ((lim_hi / 64) as usize).min(bits.len() - 1);
    let mut k = w;
    let mut word = bits[w] & ((1u64 << i) - 1);
    let lo = loop {
        if word != 0 {
            break 64 * k as u32 + 64 - word.leading_zeros();
        }
        if k <= last_lo || w - k >= BOUND_SCAN_WORDS {
            break 64 * k as u32;
        }
        k -= 1;
        word = bits[k];
    };
    let mut k = w;
    // Bits above `i` (none when `i` is 63: the shift moves every bit out).
    let mut word = bits[w] & !(2u64 << i).wrapping_sub(1);
    let hi = loop {
        if word != 0 {
            break 64 * k as u32 + word.trailing_zeros();
        }
        if k >= last_hi || k - w >= BOUND_SCAN_WORDS {
            break 64 * (k as u32 + 1);
        }
        k += 1;
        word = bits[k];
    };
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// `set_bits` and `clear_around` against a plain set of offsets: the bounds hold no
        /// buffered offset, and end at the nearest one unless the scan stopped first (at the
        /// limits' words, or `BOUND_SCAN_WORDS` words out), and then at a word's edge.
        #[test]
        fn bit_bounds_match_a_scan_of_the_offsets(
            ranges in proptest::collection::vec((0u32..GROUP_LPNS as u32, 1u32..300, proptest::bool::ANY), 0..40),
            off in 0u32..GROUP_LPNS as u32,
            lims in (0u32..GROUP_LPNS as u32, 0u32..=GROUP_LPNS as u32),
        ) {
            let mut bits = [0u64; GROUP_LPNS / 64];
            let mut held = vec![false; GROUP_LPNS];
            for &(lo, len, on) in &ranges {
                let hi = (lo + len).min(GROUP_LPNS as u32);
                set_bits(&mut bits, lo, hi, on);
                held[lo as usize..hi as usize].fill(on);
            }
            for (k, &h) in held.iter().enumerate() {
                proptest::prop_assert_eq!(is_buffered_bit(&bits, k as u32), h);
            }
            // The first clear offset from `off` on, wrapping. Rejecting held offsets instead
            // (`prop_assume!`: about a quarter of those drawn) ran out of rejects at 10,000 cases.
            let clear = (off..GROUP_LPNS as u32).chain(0..off).find(|&k| !held[k as usize]);
            let Some(off) = clear else {
                return Ok(());
            };
            let (lim_lo, lim_hi) = (lims.0.min(off), lims.1.max(off + 1));
            let (lo, hi) = clear_around(&bits, off, lim_lo, lim_hi);
            let true_lo = (0..off).rev().find(|&k| held[k as usize]).map_or(0, |k| k + 1);
            let true_hi = (off + 1..GROUP_LPNS as u32).find(|&k| held[k as usize]).unwrap_or(GROUP_LPNS as u32);
            proptest::prop_assert!(true_lo <= lo && lo <= off && off < hi && hi <= true_hi);
            let scan = 64 * BOUND_SCAN_WORDS as u32;
            if lo != true_lo {
                proptest::prop_assert!(lo % 64 == 0 && (lo <= lim_lo || off - lo >= scan));
            }
            if hi != true_hi {
                proptest::prop_assert!(hi % 64 == 0 && (hi > lim_hi || hi - off > scan));
            }
        }
    }
}
