//! The one PRNG of a simulation: SplitMix64.
//!
//! Written by hand (not `rand`) because the exact sequence is part of ftlab's contract:
//! `../shared/tools/gen_disksim_trace.py` documents the same generator and `bounded()` rejection
//! rule, so a trace it writes can be regenerated natively bit for bit, and a seed printed in a
//! report reproduces the run on any platform and any crate version.

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` without modulo bias (rejection, as the Python generator does).
    #[inline]
    pub fn bounded(&mut self, n: u64) -> u64 {
        self.below(Range::new(n))
    }

    /// [`bounded`](Self::bounded) with the rejection limit computed once, for hot loops.
    #[inline]
    pub fn below(&mut self, range: Range) -> u64 {
        loop {
            let x = self.next_u64();
            if range.limit == 0 || x < range.limit {
                return x % range.n;
            }
        }
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// `0..n` with its rejection limit 2^64 - (2^64 mod n) precomputed (0 when n divides 2^64, so
/// every draw is accepted).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub struct Range {
    n: u64,
    limit: u64,
}

impl Range {
    pub fn new(n: u64) -> Self {
        assert!(n > 0, "empty range");
        let rem = (u64::MAX % n + 1) % n;
        Self {
            n,
            limit: 0u64.wrapping_sub(rem),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_splitmix64() {
        // First outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn bounded_stays_in_range() {
        let mut rng = SplitMix64::new(7);
        for n in [1u64, 2, 3, 7, 1 << 20, 1_000_003] {
            for _ in 0..1000 {
                assert!(rng.bounded(n) < n);
            }
        }
    }
}
