//! The high parts of a short run list's offsets, Elias-Fano style.
//!
//! A run list of `n` runs (at most `MAX_RUNS`) splits each run's start offset (12 bits) into
//! `low_bits(n)` low bits, kept in the run's packed record beside its length and PPN, and a
//! high part, kept here in unary: run `i` sets bit `high_i + i` of `upper_bits(n)` bits (`n`
//! ones, and one zero closing each of the `GROUP_LPNS >> low_bits(n)` buckets). That is about
//! `log2(GROUP_LPNS / n) + 2` bits an offset where a u16 takes 16: random single pages on a
//! fresh large drive leave groups of a few dozen such runs, and there the offsets were almost
//! half of the run list.
//!
//! Lists are kept short so that the unary part fits in `WORDS` u64s, read whole, and a lookup
//! selects in at most that many words with no index. Longer lists keep u16 offsets
//! (`run_list.rs`); their groups are rarely run lists at all. A lookup here does more than a
//! search of u16 offsets or of a segment blob, so a group takes this form only where it is an
//! eighth smaller than any other (`run_list::ELIAS_FANO_MIN_SAVING`).

use super::GROUP_SHIFT;

/// Run lists of up to this many runs keep their offsets here.
pub(super) const MAX_RUNS: usize = 127;
/// u64 words of the unary part at most: `upper_bits(MAX_RUNS)` = 127 + 128 bits.
const WORDS: usize = 4;

/// Low bits of each offset in a list of `n` (`1..=MAX_RUNS`): `GROUP_SHIFT` less the bits of
/// `n`, so that the buckets (`GROUP_LPNS >> low_bits`, a power of two in `n + 1..=2n`) hold
/// about one offset each. (Within a bit of the textbook `log2(GROUP_LPNS / n)`, which divides.)
#[inline]
pub(super) fn low_bits(n: usize) -> u32 {
    debug_assert!((1..=MAX_RUNS).contains(&n));
    GROUP_SHIFT - (usize::BITS - n.leading_zeros())
}

/// Bits of the unary part of a list of `n`: `n` ones and a zero per bucket.
#[inline]
pub(super) fn upper_bits(n: usize) -> u32 {
    n as u32 + (1 << (GROUP_SHIFT - low_bits(n)))
}

/// The unary part of ascending `offsets` (below `GROUP_LPNS`), as `upper_bits` bits in words.
pub(super) fn upper_words(offsets: impl ExactSizeIterator<Item = u16>) -> [u64; WORDS] {
    let l = low_bits(offsets.len());
    let mut words = [0u64; WORDS];
    for (i, off) in offsets.enumerate() {
        let bit = (usize::from(off) >> l) + i;
        words[bit / 64] |= 1 << (bit % 64);
    }
    words
}

/// Where `Upper::last_le` stopped: the key's bucket, and how many offsets are in it or before.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
pub(super) struct Bucket {
    h: u32,
    through: usize,
}

/// The unary part of a list, read from its blob.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
pub(super) struct Upper {
    words: [u64; WORDS],
}

impl Upper {
    /// The `upper_bits(n)` bits starting at byte `at` of `b` (bits past them, which belong to
    /// the records after, masked off).
    #[inline]
    pub(super) fn read(b: &[u8], at: usize, n: usize) -> Self {
        let bits = upper_bits(n) as usize;
        let mut words = [0u64; WORDS];
        for (k, word) in words.iter_mut().enumerate().take(bits.div_ceil(64)) {
            *word = super::packed::rd64(b, at + 8 * k);
            if bits < 64 * (k + 1) {
                *word &= (1u64 << (bits - 64 * k)) - 1;
            }
        }
        Self { words }
    }

    /// The high part of offset `i` (< n): where its one is, less the ones before it.
    #[inline]
    pub(super) fn high(&self, i: usize) -> u32 {
        let mut k = i as u32;
        for (w, &word) in self.words.iter().enumerate() {
            let ones = word.count_ones();
            if k < ones {
                return (64 * w as u32 + select_in_word(word, k)) - i as u32;
            }
            k -= ones;
        }
        unreachable!("offset {i} past the list")
    }

    /// Where the zero closing bucket `h` (< the number of buckets) is: the offsets with a high
    /// part at most `h` are the ones before it, as many as its position less `h`.
    #[inline]
    fn bucket_end(&self, h: u32, n: usize) -> u32 {
        let bits = upper_bits(n) as usize;
        if bits <= 64 {
            // Lists of up to 31 offsets: one word, no counting.
            return select_in_word(!self.words[0] & ((1u64 << bits) - 1), h);
        }
        let mut k = h;
        for (w, &word) in self.words.iter().enumerate() {
            // The zeros of this word within the list (none past it).
            let valid = bits.saturating_sub(64 * w).min(64);
            let zeros = if valid == 64 {
                !word
            } else {
                !word & ((1u64 << valid) - 1)
            };
            let count = zeros.count_ones();
            if k < count {
                return 64 * w as u32 + select_in_word(zeros, k);
            }
            k -= count;
        }
        unreachable!("bucket {h} past the list")
    }

    /// How many offsets have a high part at most `h` (< the number of buckets).
    #[cfg(test)]
    fn count_through(&self, h: u32, n: usize) -> usize {
        (self.bucket_end(h, n) - h) as usize
    }

    /// The last offset at most `off`, as its index, value and record (None when every offset
    /// is above it), and where the search stopped, for `value_after`; `record_of(i)` reads
    /// offset `i`'s record, whose low bits come first (so the caller does not read it again).
    #[inline]
    pub(super) fn last_le<R>(
        &self,
        n: usize,
        off: u32,
        record_of: impl Fn(usize) -> (u32, R),
    ) -> (Option<(usize, u32, R)>, Bucket) {
        let l = low_bits(n);
        let h = off >> l;
        let end = self.bucket_end(h, n);
        let bucket = Bucket {
            h,
            through: (end - h) as usize,
        };
        // Bucket `h`'s offsets are the ones right before the zero closing it: offset `i` there
        // sits at bit `h + i`, for `i` down from `through - 1` while that bit is a one.
        let mut i = bucket.through;
        while i > 0 && self.is_one(h as usize + i - 1) {
            let (low, record) = record_of(i - 1);
            let value = h << l | low;
            if value <= off {
                return (Some((i - 1, value, record)), bucket);
            }
            i -= 1;
        }
        // Every offset before the bucket is below it; the last one's is the last one before
        // the zero that closes the bucket before (at bit `h + i - 1`).
        let Some(i) = i.checked_sub(1) else {
            return (None, bucket);
        };
        let high = self.last_one_below(h as usize + i) - i as u32;
        let (low, record) = record_of(i);
        (Some((i, high << l | low, record)), bucket)
    }

    /// Offset `j` (< n) of a search that stopped at `bucket` and found offset `j - 1` (or none,
    /// for `j` = 0) at most its key: `low` is offset `j`'s low bits.
    #[inline]
    pub(super) fn value_after(&self, n: usize, bucket: Bucket, j: usize, low: u32) -> u32 {
        let high = if j < bucket.through {
            bucket.h
        } else {
            // The first one after the zero closing the bucket.
            self.first_one_from(bucket.h as usize + bucket.through + 1) - j as u32
        };
        high << low_bits(n) | low
    }

    /// Offset `i`, whose low bits are `low`.
    #[inline]
    pub(super) fn value(&self, n: usize, i: usize, low: u32) -> u32 {
        self.high(i) << low_bits(n) | low
    }

    #[inline]
    fn is_one(&self, bit: usize) -> bool {
        self.words[bit / 64] >> (bit % 64) & 1 != 0
    }

    /// The last one below bit `end`, which has one before it.
    #[inline]
    fn last_one_below(&self, end: usize) -> u32 {
        let mut w = end / 64;
        let mut word = self.words[w] & ((1u64 << (end % 64)) - 1);
        while word == 0 {
            w -= 1;
            word = self.words[w];
        }
        64 * w as u32 + 63 - word.leading_zeros()
    }

    /// The first one at or after bit `from`, which has one at or after it.
    #[inline]
    fn first_one_from(&self, from: usize) -> u32 {
        let mut w = from / 64;
        let mut word = self.words[w] & (u64::MAX << (from % 64));
        while word == 0 {
            w += 1;
            word = self.words[w];
        }
        64 * w as u32 + word.trailing_zeros()
    }

    /// The high parts of every offset, in order.
    pub(super) fn highs(&self) -> impl Iterator<Item = u32> + '_ {
        let mut w = 0usize;
        let mut word = self.words[0];
        (0u32..).map_while(move |i| {
            while word == 0 {
                w += 1;
                word = *self.words.get(w)?;
            }
            let bit = 64 * w as u32 + word.trailing_zeros();
            word &= word - 1;
            Some(bit - i)
        })
    }
}

/// The position of the `k`-th (from 0) set bit of `x`, which has more than `k`.
///
/// Broadword: the bytes' running popcounts say which byte holds it, and a table finds it there.
/// Written out because neither the standard library nor this build's baseline instruction set
/// (no BMI2 `pdep`) has a select.
#[inline]
fn select_in_word(x: u64, k: u32) -> u32 {
    debug_assert!(k < x.count_ones());
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut s = x - ((x >> 1) & 0x5555_5555_5555_5555);
    s = (s & 0x3333_3333_3333_3333) + ((s >> 2) & 0x3333_3333_3333_3333);
    s = (s + (s >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // Byte j: the set bits of bytes 0..=j (at most 64, so no byte carries into the next).
    let sums = s.wrapping_mul(ONES);
    // A byte's high bit is set where its running sum is <= k: those bytes come first.
    let below = (((u64::from(k) * ONES) | HIGHS) - sums) & HIGHS;
    let byte = ((below >> 7).wrapping_mul(ONES) >> 56) as u32;
    let before = if byte == 0 {
        0
    } else {
        (sums >> (8 * (byte - 1))) as u32 & 0xff
    };
    let bits = (x >> (8 * byte)) as usize & 0xff;
    8 * byte + u32::from(SELECT_IN_BYTE[bits][(k - before) as usize])
}

/// `SELECT_IN_BYTE[x][k]`: the position of the `k`-th set bit of byte `x` (8 where it has none).
/// A loop over the byte's bits mispredicted its exits (2 KiB, in cache on the lookups that use it).
static SELECT_IN_BYTE: [[u8; 8]; 256] = {
    let mut table = [[8u8; 8]; 256];
    let mut x = 0;
    while x < 256 {
        let (mut bit, mut k) = (0, 0);
        while bit < 8 {
            if x >> bit & 1 != 0 {
                table[x][k] = bit as u8;
                k += 1;
            }
            bit += 1;
        }
        x += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GROUP_LPNS;

    #[test]
    fn select_in_word_finds_each_set_bit() {
        let mut rng = ftlab_core::rng::SplitMix64::new(5);
        for _ in 0..2000 {
            let x = rng.next_u64() & rng.next_u64() | 1 << rng.bounded(64);
            let positions: Vec<u32> = (0..64).filter(|&b| x >> b & 1 != 0).collect();
            for (k, &p) in positions.iter().enumerate() {
                assert_eq!(select_in_word(x, k as u32), p, "{x:#x} k={k}");
            }
        }
        assert_eq!(select_in_word(u64::MAX, 63), 63);
        assert_eq!(select_in_word(1 << 63, 0), 63);
    }

    #[test]
    fn the_unary_part_gives_back_every_high_part_and_bucket() {
        let mut rng = ftlab_core::rng::SplitMix64::new(9);
        for n in (1..=MAX_RUNS).chain([1, 2, 3, 64, 127, 127]) {
            // Distinct ascending offsets, sometimes bunched at the group's ends.
            let mut offsets: Vec<u16> = Vec::new();
            while offsets.len() < n {
                let o = match rng.bounded(3) {
                    0 => rng.bounded(n as u64 + 1),
                    1 => GROUP_LPNS as u64 - 1 - rng.bounded(n as u64 + 1),
                    _ => rng.bounded(GROUP_LPNS as u64),
                } as u16;
                if !offsets.contains(&o) {
                    offsets.push(o);
                }
            }
            offsets.sort_unstable();
            let l = low_bits(n);
            assert!(upper_bits(n) as usize <= 64 * WORDS);
            let buckets = 1u32 << (GROUP_SHIFT - l);
            assert!((n as u32) < buckets && buckets <= 2 * n as u32);
            let words = upper_words(offsets.iter().copied());
            let mut blob: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            // Bits past the unary part (the records') must not be read as its own.
            let bits = upper_bits(n) as usize;
            for bit in bits..blob.len() * 8 {
                blob[bit / 8] |= 1 << (bit % 8);
            }
            blob.extend_from_slice(&[0xff; 8]);
            let upper = Upper::read(&blob, 0, n);
            let highs: Vec<u32> = offsets.iter().map(|&o| u32::from(o) >> l).collect();
            assert_eq!(upper.highs().collect::<Vec<_>>(), highs);
            let low_of = |i: usize| u32::from(offsets[i]) & ((1 << l) - 1);
            for (i, &h) in highs.iter().enumerate() {
                assert_eq!(upper.high(i), h);
                assert_eq!(upper.value(n, i, low_of(i)), u32::from(offsets[i]));
            }
            for h in 0..buckets {
                let through = highs.iter().filter(|&&x| x <= h).count();
                assert_eq!(upper.count_through(h, n), through, "n={n} h={h}");
            }
            for off in 0..GROUP_LPNS as u32 {
                let expected = offsets
                    .iter()
                    .rposition(|&o| u32::from(o) <= off)
                    .map(|i| (i, u32::from(offsets[i])));
                let (found, bucket) = upper.last_le(n, off, |i| (low_of(i), i));
                let found = found.map(|(i, value, record)| {
                    assert_eq!(record, i, "the record of the offset found");
                    (i, value)
                });
                assert_eq!(found, expected, "n={n} off={off}");
                let j = found.map_or(0, |(i, _)| i + 1);
                if j < n {
                    let next = upper.value_after(n, bucket, j, low_of(j));
                    assert_eq!(next, u32::from(offsets[j]), "n={n} off={off}");
                }
            }
        }
    }
}
