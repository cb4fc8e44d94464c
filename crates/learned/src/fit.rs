//! Error-bounded piecewise-linear fitting over (rank, PPN) points, in exact integer arithmetic.
//!
//! A segment predicts `base + floor(dx * slope_q16 / 2^16)` for the point `dx` ranks after its
//! first; the residual `ppn - prediction` is stored bit-packed at the segment's own width.
//! `base` is the smallest `ppn - floor(dx * slope_q16 / 2^16)` over the segment (the drifting
//! base), so residuals are never negative and need no sign bit.

/// Fixed-point fraction bits of a slope.
pub const SLOPE_FRAC_BITS: u32 = 16;
/// |slope| <= 2^14, in Q16: every slope in [-2^14, 2^14] is representable, 0 and 1 exactly.
pub const SLOPE_MAX_Q16: i64 = 1 << 30;
const ONE_Q16: i64 = 1 << SLOPE_FRAC_BITS;

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Rank of the segment's first point within its group.
    pub first: u32,
    pub len: u32,
    pub slope_q16: i32,
    pub base: i64,
    /// Bits per residual (0: every point is exactly on the line).
    pub width: u8,
}

#[inline]
pub fn predict(base: i64, slope_q16: i32, dx: u32) -> i64 {
    base + ((i64::from(dx) * i64::from(slope_q16)) >> SLOPE_FRAC_BITS)
}

/// Bits needed to store values `0..=v`.
#[inline]
pub fn bits_for(v: u64) -> u8 {
    (64 - v.leading_zeros()) as u8
}

/// Closes the segment over `ys[first..first + len]` with the given slope: computes the drifting
/// base and the residual width.
pub fn close(ys: &[u32], first: usize, len: usize, slope_q16: i32) -> Segment {
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for (dx, &y) in ys[first..first + len].iter().enumerate() {
        let r = i64::from(y) - predict(0, slope_q16, dx as u32);
        lo = lo.min(r);
        hi = hi.max(r);
    }
    Segment {
        first: first as u32,
        len: len as u32,
        slope_q16,
        base: lo,
        width: bits_for((hi - lo) as u64),
    }
}

/// A rational `num / den` with `den > 0`.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
struct Frac {
    num: i64,
    den: i64,
}

impl Frac {
    // Magnitudes: |num| < 2^35, den <= 2^13, so cross products stay below 2^49.
    fn lt(self, o: Frac) -> bool {
        self.num * o.den < o.num * self.den
    }
    fn floor_q16(self) -> i64 {
        (self.num * ONE_Q16).div_euclid(self.den)
    }
    fn ceil_q16(self) -> i64 {
        -((-self.num * ONE_Q16).div_euclid(self.den))
    }
}

/// A Q16 slope inside `[lo, hi]`, an integer slope when one fits (runs get exactly 1), else the
/// midpoint; clamped to the representable range. When no Q16 value lies inside (a very narrow
/// cone) the rounding error lands in the residuals, which stay exact.
fn choose_slope(lo: Frac, hi: Frac) -> i32 {
    let (c, f) = (lo.ceil_q16(), hi.floor_q16());
    let mid = if c <= f { c + (f - c) / 2 } else { f };
    let integer = mid.div_euclid(ONE_Q16) * ONE_Q16;
    let q = [integer, integer + ONE_Q16]
        .into_iter()
        .filter(|&k| c <= k && k <= f)
        .min_by_key(|&k| (k - mid).abs())
        .unwrap_or(mid);
    q.clamp(-SLOPE_MAX_Q16, SLOPE_MAX_Q16) as i32
}

/// Greedy shrinking cone (as in FITing-tree and PGM's streaming fit): a segment grows while some
/// line through its first point stays within `eps` of every point. O(n).
pub fn fit_cone(ys: &[u32], eps: i64, out: &mut Vec<Segment>) {
    out.clear();
    let n = ys.len();
    let mut i = 0;
    while i < n {
        let y0 = i64::from(ys[i]);
        let mut bounds: Option<(Frac, Frac)> = None;
        let mut j = i + 1;
        while j < n {
            let dx = (j - i) as i64;
            let dy = i64::from(ys[j]) - y0;
            let l = Frac {
                num: dy - eps,
                den: dx,
            };
            let h = Frac {
                num: dy + eps,
                den: dx,
            };
            let next = match bounds {
                None => (l, h),
                Some((lo, hi)) => {
                    let lo = if lo.lt(l) { l } else { lo };
                    let hi = if h.lt(hi) { h } else { hi };
                    if hi.lt(lo) {
                        break;
                    }
                    (lo, hi)
                }
            };
            bounds = Some(next);
            j += 1;
        }
        let slope = bounds.map_or(0, |(lo, hi)| choose_slope(lo, hi));
        out.push(close(ys, i, j - i, slope));
        i = j;
    }
}

/// Whether some three consecutive points lie on one line (a zero second difference), which
/// `fit_cone` with no error allowed needs to make a segment of more than two points.
pub fn has_three_on_a_line(ys: &[u32]) -> bool {
    ys.windows(3).any(|w| {
        let [a, b, c] = [w[0], w[1], w[2]].map(i64::from);
        a - 2 * b + c == 0
    })
}

/// One segment over all points with the given slope (0: plain bit packing above the minimum).
pub fn fit_single(ys: &[u32], slope_q16: i32, out: &mut Vec<Segment>) {
    out.clear();
    if !ys.is_empty() {
        out.push(close(ys, 0, ys.len(), slope_q16));
    }
}

/// The Q16 slope of the line through the first and last points.
pub fn endpoint_slope(ys: &[u32]) -> i32 {
    match ys {
        [first, .., last] => line_slope(*first, *last, ys.len()),
        _ => 0,
    }
}

/// The Q16 slope of the line from `first` to `last`, over `n` >= 2 points counting both.
pub fn line_slope(first: u32, last: u32, n: usize) -> i32 {
    let dy = i64::from(last) - i64::from(first);
    let dx = (n - 1) as i64;
    (dy * ONE_Q16 / dx).clamp(-SLOPE_MAX_Q16, SLOPE_MAX_Q16) as i32
}

/// `fit_single` over the points of runs of consecutive PPNs (`(length, first PPN)`, one rank
/// after another), without making the points: O(runs), where `close` visits every point (on the
/// files trace, the two single-segment candidates over a full group's 4096 points were a tenth
/// of all update instructions). Within a run the residual `ppn + t - floor((dx + t) * slope /
/// 2^16)` changes by `1 - k` a step, where the floor's step `k` is 0 or 1 for slopes in [0, 1],
/// at least 1 for steeper ones and at most 0 for descending ones: the residual is monotone
/// along the run, so its extremes lie at the run's two ends.
pub fn fit_single_runs(
    runs: impl Iterator<Item = (u32, u32)>,
    slope_q16: i32,
    out: &mut Vec<Segment>,
) {
    out.clear();
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    let mut dx = 0u32;
    for (len, ppn) in runs {
        debug_assert!(len > 0);
        let first = i64::from(ppn) - predict(0, slope_q16, dx);
        let last = i64::from(ppn) + i64::from(len - 1) - predict(0, slope_q16, dx + len - 1);
        lo = lo.min(first.min(last));
        hi = hi.max(first.max(last));
        dx += len;
    }
    if dx > 0 {
        out.push(Segment {
            first: 0,
            len: dx,
            slope_q16,
            base: lo,
            width: bits_for((hi - lo) as u64),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ys: &[u32], segs: &[Segment]) {
        let mut next = 0;
        for s in segs {
            assert_eq!(s.first as usize, next);
            for dx in 0..s.len {
                let y = i64::from(ys[(s.first + dx) as usize]);
                let r = y - predict(s.base, s.slope_q16, dx);
                assert!(
                    r >= 0 && (r as u64) < (1u64 << s.width).max(1),
                    "{s:?} dx {dx}"
                );
            }
            next += s.len as usize;
        }
        assert_eq!(next, ys.len());
    }

    #[test]
    fn a_run_is_one_segment_of_slope_exactly_one() {
        let ys: Vec<u32> = (1000..5096).collect();
        let mut segs = Vec::new();
        fit_cone(&ys, 0, &mut segs);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].slope_q16, 1 << 16);
        assert_eq!(segs[0].width, 0);
        check(&ys, &segs);
    }

    #[test]
    fn constant_and_descending_lines_fit_exactly() {
        let flat = vec![7u32; 100];
        let down: Vec<u32> = (0..100).map(|i| 10_000 - 3 * i).collect();
        let mut segs = Vec::new();
        for ys in [&flat, &down] {
            fit_cone(ys, 0, &mut segs);
            assert_eq!(segs.len(), 1, "{ys:?}");
            assert_eq!(segs[0].width, 0);
            check(ys, &segs);
        }
        assert_eq!(segs[0].slope_q16, -3 << 16);
    }

    #[test]
    fn residuals_stay_within_the_error_bound_and_extremes_stay_exact() {
        let mut x = 1u64;
        let ys: Vec<u32> = (0..4096)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                match i % 3 {
                    0 => (x >> 32) as u32,
                    1 => u32::MAX - 1,
                    _ => (i * 5 + (x >> 60) as usize) as u32,
                }
            })
            .collect();
        let mut segs = Vec::new();
        for eps in [0, 3, 100, 1 << 20, 1 << 33] {
            fit_cone(&ys, eps, &mut segs);
            check(&ys, &segs);
        }
        fit_single(&ys, 0, &mut segs);
        check(&ys, &segs);
        fit_single(&ys, endpoint_slope(&ys), &mut segs);
        check(&ys, &segs);
    }

    proptest::proptest! {
        /// The single segment over runs is the one `close` finds over their points, whatever
        /// the slope (descending, flat, between 0 and 1, steeper).
        #[test]
        fn a_single_segment_over_runs_is_the_one_over_their_points(
            runs in proptest::collection::vec((1u32..40, 0u32..1 << 30), 1..60),
            slope_pick in 0usize..6,
            slope_any in -(1i32 << 30)..=(1i32 << 30),
        ) {
            let ys: Vec<u32> = runs.iter().flat_map(|&(len, ppn)| ppn..ppn + len).collect();
            let slope = [0, 1 << 16, -(1 << 16), 1 << 15, 3 << 16, slope_any][slope_pick];
            let (mut over_points, mut over_runs) = (Vec::new(), Vec::new());
            fit_single(&ys, slope, &mut over_points);
            fit_single_runs(runs.iter().copied(), slope, &mut over_runs);
            proptest::prop_assert_eq!(&over_points, &over_runs);
            // The endpoint line as `encode_plain` takes it from the runs.
            let (&(_, first), &(len, ppn)) = (runs.first().unwrap(), runs.last().unwrap());
            if ys.len() >= 2 {
                proptest::prop_assert_eq!(
                    endpoint_slope(&ys),
                    line_slope(first, ppn + len - 1, ys.len())
                );
            }
        }

        /// The cone fit with no error allowed makes a segment of three points or more only
        /// where `has_three_on_a_line` says so: over small values (lines are frequent), over
        /// the whole u32 range (never a line but by chance), and with lines of any slope,
        /// descending included, laid over them. (Not the converse: three on a line across two
        /// segments' boundary are not one segment.)
        #[test]
        fn the_exact_cone_fit_takes_three_only_on_a_line(
            mut ys in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..80),
            small in proptest::prelude::any::<bool>(),
            line in proptest::option::of((0usize..80, 3usize..8, 0u32..1 << 31, -1000i64..1000)),
        ) {
            if small {
                ys.iter_mut().for_each(|y| *y %= 5);
            }
            if let Some((at, len, y0, step)) = line {
                for (k, y) in ys.iter_mut().skip(at).take(len).enumerate() {
                    *y = (i64::from(y0) + step * k as i64).clamp(0, i64::from(u32::MAX)) as u32;
                }
            }
            let mut segs = Vec::new();
            fit_cone(&ys, 0, &mut segs);
            if segs.iter().any(|seg| seg.len > 2) {
                proptest::prop_assert!(has_three_on_a_line(&ys));
            }
        }
    }
}
