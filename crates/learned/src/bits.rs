//! Which offsets of a group its buffered updates hold. A group whose delta holds more than
//! `BITS_ABOVE_RUNS` runs keeps one bit per offset, so that a lookup of an offset the buffer
//! does not hold (most of them) tests a bit instead of searching the group's buffered runs, and
//! finds the nearest buffered offsets that bound the span it keeps. A delta of fewer runs is
//! scanned instead (`runs_hold`, `runs_clear_around`): its runs fit a cache line, and its 512
//! bytes of bits were most of what a lightly buffered group cost (the buffer's peak on streams
//! and sparse traces: notes/mapping-log.md).

use super::GROUP_LPNS;
use ftlab_core::ftl::mapping::runs::Run;

/// A delta keeps bits once it holds more runs than this (its first run list's capacity); until
/// then its runs are scanned.
pub(super) const BITS_ABOVE_RUNS: usize = super::MIN_RUNS_GROWTH;

/// `Delta::bits` of a delta that has none.
pub(super) const NO_BITS: u32 = u32::MAX;

/// One bit per offset of a group, set where its delta's runs hold the offset (the tail's deferred
/// appends are set when `flush_tail` writes them). A lookup of an offset the buffer does not hold
/// (most of them) tests a bit instead of searching the runs: on pgbench, whose buffered groups
/// hold about 200 runs each, that search was half the time of a lookup the cursor missed. 512
/// bytes per delta of more than `BITS_ABOVE_RUNS` runs.
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

/// The bits of the deltas that keep them, each in a slot (`Delta::bits`); slots freed by merged
/// deltas are reused, so the pool holds as many as were ever kept at once.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
pub(super) struct BitsPool {
    #[serde(with = "ftlab_core::serde_state::vec_inline")]
    slots: Vec<BufferedBits>,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    free: Vec<u32>,
}

impl BitsPool {
    /// A slot with every bit clear.
    pub fn take(&mut self) -> u32 {
        if let Some(slot) = self.free.pop() {
            self.slots[slot as usize] = [0; GROUP_LPNS / 64];
            return slot;
        }
        // By a quarter, as the deltas' run lists grow: doubling would leave up to half the
        // pool's 512-byte slots spare.
        if self.slots.len() == self.slots.capacity() {
            self.slots.reserve_exact((self.slots.len() / 4).max(4));
        }
        self.slots.push([0; GROUP_LPNS / 64]);
        (self.slots.len() - 1) as u32
    }

    /// Frees `slot` for reuse; nothing for `NO_BITS`.
    pub fn free(&mut self, slot: u32) {
        if slot != NO_BITS {
            debug_assert!((slot as usize) < self.slots.len());
            self.free.push(slot);
        }
    }

    #[inline]
    pub fn get(&self, slot: u32) -> &BufferedBits {
        &self.slots[slot as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut BufferedBits {
        &mut self.slots[slot as usize]
    }

    /// `set_bit` in `slot`'s bits; nothing for `NO_BITS` (a delta whose runs are scanned).
    #[inline]
    pub fn set_bit(&mut self, slot: u32, off: u32, on: bool) {
        if slot != NO_BITS {
            set_bit(self.get_mut(slot), off, on);
        }
    }

    /// `set_bits` in `slot`'s bits; nothing for `NO_BITS`.
    #[inline]
    pub fn set_bits(&mut self, slot: u32, lo: u32, hi: u32, on: bool) {
        if slot != NO_BITS {
            set_bits(self.get_mut(slot), lo, hi, on);
        }
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Frees the pool's memory; no slot may be in use.
    pub fn clear(&mut self) {
        debug_assert_eq!(self.in_use(), 0);
        *self = Self::default();
    }

    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<BufferedBits>() + self.free.capacity() * 4
    }
}

/// Whether `runs` (sorted, disjoint) hold offset `off`: a scan, for deltas without bits.
#[inline]
pub(super) fn runs_hold<R: Run>(runs: &[R], off: u32) -> bool {
    runs.iter().any(|r| off.wrapping_sub(r.start()) < r.len())
}

/// Around offset `off`, which no run of `runs` (sorted, disjoint) holds: offsets `lo..hi`
/// holding none (`lo` the end of the nearest run below, `hi` the start of the nearest above).
/// Exact, where `clear_around` may stop short.
#[inline]
pub(super) fn runs_clear_around<R: Run>(runs: &[R], off: u32) -> (u32, u32) {
    let (mut lo, mut hi) = (0, GROUP_LPNS as u32);
    for r in runs {
        let end = r.start() + r.len();
        if end <= off {
            lo = end;
        } else if r.start() > off {
            hi = hi.min(r.start());
        }
    }
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

        /// The scans of a delta without bits against a plain set of offsets: `runs_hold` says
        /// which offsets the runs hold, and `runs_clear_around` gives the exact bounds.
        #[test]
        fn run_scans_match_a_set_of_offsets(
            cuts in proptest::collection::btree_set(0u32..=GROUP_LPNS as u32, 0..20),
            off in 0u32..GROUP_LPNS as u32,
        ) {
            // Sorted cut points, paired: each pair a run (its PPN does not matter here).
            let cuts: Vec<u32> = cuts.into_iter().collect();
            let runs: Vec<crate::DeltaRun> = cuts
                .chunks_exact(2)
                .map(|c| Run::make(c[0], c[1] - c[0], 7))
                .collect();
            let mut held = vec![false; GROUP_LPNS];
            for r in &runs {
                held[r.start() as usize..(r.start() + r.len()) as usize].fill(true);
            }
            for (k, &h) in held.iter().enumerate() {
                proptest::prop_assert_eq!(runs_hold(&runs, k as u32), h);
            }
            if held[off as usize] {
                return Ok(());
            }
            let true_lo = (0..off).rev().find(|&k| held[k as usize]).map_or(0, |k| k + 1);
            let true_hi = (off + 1..GROUP_LPNS as u32).find(|&k| held[k as usize]).unwrap_or(GROUP_LPNS as u32);
            proptest::prop_assert_eq!(runs_clear_around(&runs, off), (true_lo, true_hi));
        }
    }
}
