//! Sorted, non-overlapping runs in which consecutive keys map to consecutive values: the core of
//! the `extent` table and of the `learned` table's update buffer. One implementation, so that
//! the baseline and the learned table's buffer split and coalesce runs identically.

/// A run of keys `start..start + len` mapping to `value, value + 1, ...` (or to one constant, for
/// run kinds whose `advance` says so: the learned table's tombstones).
#[allow(clippy::len_without_is_empty)] // a run is never empty
pub trait Run: Copy {
    fn start(&self) -> u32;
    fn len(&self) -> u32;
    /// The value at `start`.
    fn value(&self) -> u32;
    fn make(start: u32, len: u32, value: u32) -> Self;
    /// The value `by` keys after a key holding `value`.
    #[inline]
    fn advance(value: u32, by: u32) -> u32 {
        value.wrapping_add(by)
    }
    /// Whether `next` continues a run whose key `by` keys back holds `value` (so that the two
    /// coalesce). A run kind with a sentinel value overrides it: `advance` alone cannot tell a
    /// sentinel from the value after the last one.
    #[inline]
    fn continues(value: u32, by: u32, next: u32) -> bool {
        Self::advance(value, by) == next
    }
}

#[inline]
fn end<R: Run>(r: &R) -> u64 {
    u64::from(r.start()) + u64::from(r.len())
}

/// How many of the first `n` elements satisfy `le` (a prefix: `le` holds, then fails), by
/// halving with a data-dependent select instead of a branch: in lookups at random keys the
/// branch mispredicts half the time and each miss stalls the next load.
#[inline]
pub fn count_le(n: usize, le: impl Fn(usize) -> bool) -> usize {
    if n == 0 {
        return 0;
    }
    let (mut base, mut len) = (0usize, n);
    while len > 1 {
        let half = len / 2;
        base = std::hint::select_unpredictable(le(base + half), base + half, base);
        len -= half;
    }
    base + usize::from(le(base))
}

/// As `count_le`, starting from `guess`, where the boundary probably is: steps of `first_step`,
/// doubling, bracket it, and halving finishes. Where a guess is good (keys spread evenly), this
/// touches a cache line or two near it instead of one per halving step, each waiting on the last.
#[inline]
pub fn count_le_from(
    n: usize,
    guess: usize,
    first_step: usize,
    le: impl Fn(usize) -> bool,
) -> usize {
    debug_assert!(guess < n && first_step > 0);
    // Everything before `lo` satisfies `le`, nothing from `hi` on does.
    let (mut lo, mut hi) = (0, n);
    let mut step = first_step;
    if le(guess) {
        lo = guess + 1;
        while lo + step <= n {
            let probe = lo + step - 1;
            if !le(probe) {
                hi = probe;
                break;
            }
            lo = probe + 1;
            step *= 2;
        }
    } else {
        hi = guess;
        while hi >= step {
            let probe = hi - step;
            if le(probe) {
                lo = probe + 1;
                break;
            }
            hi = probe;
            step *= 2;
        }
    }
    lo + count_le(hi - lo, |i| le(lo + i))
}

/// As `upper`, for runs whose starts spread over `0..span` (a learned group's buffered runs):
/// long lists are searched from the interpolated position.
#[inline]
pub fn upper_spread<R: Run>(runs: &[R], key: u32, span: u32) -> usize {
    let n = runs.len();
    if n <= SPREAD_SEARCH_ABOVE {
        return upper(runs, key);
    }
    if runs[n - 1].start() <= key {
        return n;
    }
    let guess = ((u64::from(key) * n as u64 / u64::from(span)) as usize).min(n - 1);
    count_le_from(n, guess, 4, |i| runs[i].start() <= key)
}

/// Lists up to this long (four cache lines of 8-byte runs) are searched by halving.
const SPREAD_SEARCH_ABOVE: usize = 32;

/// How many runs start at or before `key`. Sequential updates append after the last run, so
/// that case is checked before searching.
#[inline]
pub fn upper<R: Run>(runs: &[R], key: u32) -> usize {
    match runs.last() {
        Some(last) if last.start() <= key => runs.len(),
        _ => count_le(runs.len(), |i| runs[i].start() <= key),
    }
}

/// The value `key` maps to, if a run covers it.
#[inline]
pub fn lookup<R: Run>(runs: &[R], key: u32) -> Option<u32> {
    let i = upper(runs, key);
    let r = runs.get(i.checked_sub(1)?)?;
    let d = key - r.start();
    (d < r.len()).then(|| R::advance(r.value(), d))
}

/// Whether a run covers `key` (`span` bounds the keys, as for `upper_spread`).
#[inline]
pub fn covers<R: Run>(runs: &[R], key: u32, span: u32) -> bool {
    let i = upper_spread(runs, key, span);
    i > 0 && key - runs[i - 1].start() < runs[i - 1].len()
}

/// Maps `key` to `value` (`None`: uncovers `key`), splitting and coalescing runs so that no two
/// adjacent runs could be one. Returns the previous value.
pub fn assign<R: Run>(runs: &mut Vec<R>, key: u32, value: Option<u32>) -> Option<u32> {
    assign_at(runs, key, value).0
}

/// `assign`, also returning the index of the run that holds `key` afterwards (with `value`
/// `None`: where such a run would go), for `extend_at`'s next try.
pub fn assign_at<R: Run>(runs: &mut Vec<R>, key: u32, value: Option<u32>) -> (Option<u32>, usize) {
    let i = upper(runs, key);
    let mut at = i;
    let mut old = None;
    if i > 0 {
        let r = runs[i - 1];
        let d = key - r.start();
        if d < r.len() {
            let current = R::advance(r.value(), d);
            if value == Some(current) {
                return (Some(current), i - 1);
            }
            old = Some(current);
            let right_len = r.len() - d - 1;
            let right = R::make(key.wrapping_add(1), right_len, R::advance(r.value(), d + 1));
            if d == 0 {
                at = i - 1;
                if right_len == 0 {
                    runs.remove(at);
                } else {
                    runs[at] = right;
                }
            } else {
                runs[i - 1] = R::make(r.start(), d, r.value());
                if right_len > 0 {
                    runs.insert(i, right);
                }
            }
        }
    }
    if let Some(v) = value {
        let joins_left = at > 0 && {
            let l = &runs[at - 1];
            end(l) == u64::from(key) && R::continues(l.value(), l.len(), v)
        };
        let joins_right = at < runs.len() && {
            let r = &runs[at];
            u64::from(r.start()) == u64::from(key) + 1 && R::continues(v, 1, r.value())
        };
        match (joins_left, joins_right) {
            (true, true) => {
                let r = runs.remove(at);
                let l = runs[at - 1];
                runs[at - 1] = R::make(l.start(), l.len() + 1 + r.len(), l.value());
                at -= 1;
            }
            (true, false) => {
                let l = runs[at - 1];
                runs[at - 1] = R::make(l.start(), l.len() + 1, l.value());
                at -= 1;
            }
            (false, true) => {
                let r = runs[at];
                runs[at] = R::make(key, r.len() + 1, v);
            }
            (false, false) => runs.insert(at, R::make(key, 1, v)),
        }
    }
    debug_assert!(runs
        .windows(2)
        .all(|w| end(&w[0]) <= u64::from(w[1].start())));
    (old, at)
}

/// `assign(runs, key, Some(value))` where run `at` ends just before `key` and `value` continues
/// it (a sequential write, also over buffered runs): no search, and a removal only where a
/// one-key run is overwritten. `None` where that is not the case (any `at` is safe to try).
/// Otherwise whether a run held `key` before; run `at` holds it after.
#[inline(always)]
pub fn extend_at<R: Run>(runs: &mut Vec<R>, at: usize, key: u32, value: u32) -> Option<bool> {
    let r = *runs.get(at)?;
    if end(&r) != u64::from(key) || !R::continues(r.value(), r.len(), value) {
        return None;
    }
    // Runs are disjoint, so the next starts at `key` or after it. Only when it starts at `key`
    // (it loses that key) or right after (it may coalesce) is there more to do.
    match runs.get(at + 1) {
        Some(next) if u64::from(next.start()) <= u64::from(key) + 1 => {
            Some(extend_into_next(runs, at, key, value))
        }
        _ => {
            runs[at] = R::make(r.start(), r.len() + 1, r.value());
            Some(false)
        }
    }
}

/// `extend_at` where the next run starts at `key` or `key + 1`.
#[cold]
#[inline(never)]
fn extend_into_next<R: Run>(runs: &mut Vec<R>, at: usize, key: u32, value: u32) -> bool {
    let r = runs[at];
    let mut len = r.len() + 1;
    let next = runs[at + 1];
    let covered = next.start() == key;
    if covered {
        if next.len() == 1 {
            runs.remove(at + 1);
        } else {
            runs[at + 1] = R::make(key + 1, next.len() - 1, R::advance(next.value(), 1));
        }
    }
    // What follows may now continue the run: coalesce, as `assign` would.
    if let Some(&next) = runs.get(at + 1) {
        if next.start() == key + 1 && R::continues(value, 1, next.value()) {
            len += next.len();
            runs.remove(at + 1);
        }
    }
    runs[at] = R::make(r.start(), len, r.value());
    debug_assert!(runs
        .windows(2)
        .all(|w| end(&w[0]) <= u64::from(w[1].start())));
    covered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use std::collections::BTreeMap;

    #[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq)]
    struct R(u32, u32, u32);
    impl Run for R {
        fn start(&self) -> u32 {
            self.0
        }
        fn len(&self) -> u32 {
            self.1
        }
        fn value(&self) -> u32 {
            self.2
        }
        fn make(start: u32, len: u32, value: u32) -> Self {
            R(start, len, value)
        }
    }

    #[test]
    fn searches_from_a_guess_agree_with_halving() {
        let mut rng = SplitMix64::new(3);
        let mut next = |m: u64| rng.bounded(m);
        for n in [1usize, 2, 5, 33, 100, 700] {
            // Ascending starts below 4096, spread or bunched.
            let mut starts: Vec<u32> = (0..n)
                .map(|i| {
                    if i % 3 == 0 {
                        next(64) as u32
                    } else {
                        next(4096) as u32
                    }
                })
                .collect();
            starts.sort_unstable();
            starts.dedup();
            let runs: Vec<R> = starts.iter().map(|&s| R(s, 1, s)).collect();
            for key in 0..4100u32 {
                let want = runs.iter().filter(|r| r.0 <= key).count();
                assert_eq!(upper_spread(&runs, key, 4096), want, "n {n} key {key}");
                for guess in [0, runs.len() / 2, runs.len() - 1] {
                    for step in [1, 4, 16] {
                        let got = count_le_from(runs.len(), guess, step, |i| runs[i].0 <= key);
                        assert_eq!(got, want, "n {n} key {key} guess {guess} step {step}");
                    }
                }
            }
        }
    }

    #[test]
    fn extending_at_the_last_run_written_is_what_assign_does() {
        // Runs that stay minimal have one form per mapping, so the lists must be equal.
        let (mut plain, mut fast): (Vec<R>, Vec<R>) = (Vec::new(), Vec::new());
        let (mut cursor, mut key, mut value) = (0usize, 0u32, 0u32);
        let mut rng = SplitMix64::new(5);
        let (mut extended, mut overwrote) = (0, 0);
        for step in 0..50_000u32 {
            let x = rng.next_u64();
            // Mostly a stream writing on (over runs laid by earlier streams), sometimes a jump,
            // a value that breaks the stream, or a removal.
            let (k, v) = match (x >> 40) % 16 {
                0..=10 => ((key + 1) % 64, Some(value.wrapping_add(1))),
                11 | 12 => (((x >> 20) % 64) as u32, Some(step % 8 * 100)),
                13 => ((key + 1) % 64, Some(step)),
                _ => (((x >> 20) % 64) as u32, None),
            };
            let old = assign(&mut plain, k, v);
            let fast_try = v.and_then(|v| extend_at(&mut fast, cursor, k, v));
            match fast_try {
                Some(covered) => {
                    extended += 1;
                    overwrote += usize::from(covered);
                    assert_eq!(covered, old.is_some(), "step {step}");
                }
                None => {
                    let (fast_old, at) = assign_at(&mut fast, k, v);
                    assert_eq!(fast_old, old, "step {step}");
                    cursor = at;
                }
            }
            if v.is_some() {
                let r = fast[cursor];
                assert!(
                    r.0 <= k && k < r.0 + r.1,
                    "step {step}: run {cursor} lacks {k}"
                );
            }
            assert_eq!(fast, plain, "step {step}");
            (key, value) = (k, v.unwrap_or(value));
        }
        // Both paths ran, and the fast one also over runs already holding the key.
        assert!(
            extended > 10_000 && overwrote > 1_000,
            "{extended} {overwrote}"
        );
    }

    #[test]
    fn matches_a_map_and_stays_minimal() {
        let mut runs: Vec<R> = Vec::new();
        let mut oracle = BTreeMap::new();
        let mut rng = SplitMix64::new(7);
        for step in 0..20_000u32 {
            let x = rng.next_u64();
            let key = ((x >> 33) % 64) as u32;
            // Mostly values that continue a neighbour, so runs form and split.
            let value = match (x >> 20) % 4 {
                0 => None,
                1 => Some(key + 1000),
                2 => Some(key + 2000),
                _ => Some(step),
            };
            let old = assign(&mut runs, key, value);
            let expected = match value {
                Some(v) => oracle.insert(key, v),
                None => oracle.remove(&key),
            };
            assert_eq!(old, expected, "step {step}");
            for k in 0..64 {
                assert_eq!(lookup(&runs, k), oracle.get(&k).copied());
            }
            for w in runs.windows(2) {
                let (a, b) = (w[0], w[1]);
                assert!(
                    !(a.0 + a.1 == b.0 && a.2 + a.1 == b.2),
                    "runs {a:?} {b:?} should have coalesced"
                );
            }
        }
    }
}
