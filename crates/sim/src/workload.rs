//! Synthetic workload generators: sequential, uniform, zipf, hot/cold, JESD219 enterprise, and
//! an LSM store's files ([`crate::lsm`]).
//!
//! Each draws from one [`SplitMix64`] seeded by `workload.seed`, so a seed reproduces a run.
//! Offsets of page-sized and larger requests are aligned to the request size (as fio's `bs`
//! alignment); JESD219's sub-4 KiB transfers are 512-byte aligned and become read-modify-writes.

use ftlab_core::config::{ConfigError, GeneratorKind, WorkloadConfig};
use ftlab_core::request::{Op, Request};
use ftlab_core::rng::{Range, SplitMix64};

/// JESD219A enterprise transfer sizes (bytes) and their weights in percent.
pub const JESD219_SIZES: [(u64, u32); 12] = [
    (512, 4),
    (1024, 1),
    (1536, 1),
    (2048, 1),
    (2560, 1),
    (3072, 1),
    (3584, 1),
    (4096, 67),
    (8192, 10),
    (16384, 7),
    (32768, 3),
    (65536, 3),
];

/// Zipf ranks by Gray et al.'s closed form ("Quickly generating billion-record synthetic
/// databases", SIGMOD 1994), as YCSB uses; ranks are scattered over the space by an affine
/// bijection so that hot items are not adjacent.
#[derive(Clone, Debug)]
struct Zipf {
    n: u64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
    half_pow_theta: f64,
    scatter_mul: u64,
}

/// Sum_{i=1..n} i^-theta: exact for the first million terms, Euler-Maclaurin integral beyond.
fn zeta(n: u64, theta: f64) -> f64 {
    let exact = n.min(1 << 20);
    let mut sum = 0.0;
    for i in 1..=exact {
        sum += (i as f64).powf(-theta);
    }
    if n > exact {
        let one = 1.0 - theta;
        sum += ((n as f64 + 0.5).powf(one) - (exact as f64 + 0.5).powf(one)) / one;
    }
    sum
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Self {
        let zeta_n = zeta(n, theta);
        let zeta_2 = 1.0 + 2f64.powf(-theta);
        let mut scatter_mul = (0x9E37_79B9_7F4A_7C15u64 % n.max(2)) | 1;
        while gcd(scatter_mul, n) != 1 {
            scatter_mul += 2;
        }
        Self {
            n,
            alpha: 1.0 / (1.0 - theta),
            zeta_n,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n),
            half_pow_theta: 0.5f64.powf(theta),
            scatter_mul,
        }
    }

    fn rank(&self, u: f64) -> u64 {
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1;
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }

    fn item(&self, u: f64) -> u64 {
        let r = self.rank(u);
        ((u128::from(r) * u128::from(self.scatter_mul)) % u128::from(self.n)) as u64
    }
}

pub struct Generator {
    kind: GeneratorKind,
    rng: SplitMix64,
    span_bytes: u64,
    request_size_bytes: u64,
    /// Request-sized slots in the span.
    all_slots: Range,
    cold_slots: Range,
    read_fraction: f64,
    hot_fraction: f64,
    hot_slots: u64,
    hot_range: Range,
    stream_by_temperature: bool,
    zipf: Option<Zipf>,
    cursor_bytes: u64,
    lsm: Option<Box<crate::lsm::Lsm>>,
}

impl Generator {
    pub fn new(w: &WorkloadConfig, logical_bytes: u64) -> Result<Self, ConfigError> {
        let kind = w.generator()?;
        let span_bytes = if w.span_bytes == 0 {
            logical_bytes
        } else {
            w.span_bytes
        };
        let slots = (span_bytes / w.request_size_bytes).max(1);
        let hot_slots =
            ((slots as f64 * w.hot_space_pcent / 100.0) as u64).clamp(1, slots.max(2) - 1);
        Ok(Self {
            kind,
            rng: SplitMix64::new(w.seed),
            span_bytes,
            request_size_bytes: w.request_size_bytes,
            all_slots: Range::new(slots),
            cold_slots: Range::new((slots - hot_slots).max(1)),
            hot_range: Range::new(hot_slots),
            read_fraction: w.read_pcent / 100.0,
            hot_fraction: w.hot_access_pcent / 100.0,
            hot_slots,
            stream_by_temperature: w.stream_by_temperature,
            zipf: (kind == GeneratorKind::Zipf).then(|| Zipf::new(slots, w.zipf_theta)),
            cursor_bytes: 0,
            lsm: match kind {
                GeneratorKind::Lsm => Some(Box::new(crate::lsm::Lsm::new(w, span_bytes)?)),
                _ => None,
            },
        })
    }

    /// A uniform random page-sized writer over the whole span, for preconditioning.
    pub fn uniform_writer(seed: u64, span_bytes: u64, page_bytes: u64) -> Self {
        let slots = span_bytes / page_bytes;
        Self {
            kind: GeneratorKind::Uniform,
            rng: SplitMix64::new(seed),
            span_bytes,
            request_size_bytes: page_bytes,
            all_slots: Range::new(slots),
            cold_slots: Range::new(1),
            read_fraction: 0.0,
            hot_fraction: 0.0,
            hot_slots: 1,
            hot_range: Range::new(1),
            stream_by_temperature: false,
            zipf: None,
            cursor_bytes: 0,
            lsm: None,
        }
    }

    /// Whether `workload.overwrites` counts written bytes rather than requests: the LSM's
    /// requests have no one size.
    pub fn counts_bytes(&self) -> bool {
        self.lsm.is_some()
    }

    /// The LSM's state, when it is one.
    pub fn lsm(&self) -> Option<&crate::lsm::Lsm> {
        self.lsm.as_deref()
    }

    pub fn request_size_bytes(&self) -> u64 {
        self.request_size_bytes
    }

    #[inline]
    pub fn next_request(&mut self) -> Request {
        if let Some(lsm) = &mut self.lsm {
            return lsm.next_request();
        }
        let op = if self.read_fraction > 0.0 && self.rng.unit_f64() < self.read_fraction {
            Op::Read
        } else {
            Op::Write
        };
        let size = self.request_size_bytes;
        let mut stream = 0;
        let (offset_bytes, length_bytes) = match self.kind {
            GeneratorKind::Sequential => {
                if self.cursor_bytes + size > self.span_bytes {
                    self.cursor_bytes = 0;
                }
                let o = self.cursor_bytes;
                self.cursor_bytes += size;
                (o, size)
            }
            GeneratorKind::Uniform => (self.rng.below(self.all_slots) * size, size),
            GeneratorKind::Zipf => {
                let u = self.rng.unit_f64();
                (self.zipf.as_ref().expect("zipf built").item(u) * size, size)
            }
            GeneratorKind::HotCold => {
                let slot = if self.rng.unit_f64() < self.hot_fraction {
                    stream = 1;
                    self.rng.below(self.hot_range)
                } else {
                    self.hot_slots + self.rng.below(self.cold_slots)
                };
                (slot * size, size)
            }
            GeneratorKind::Jesd219 => self.jesd219(),
            GeneratorKind::Lsm => unreachable!("the LSM generator answered above"),
        };
        Request {
            arrival_ns: 0,
            op,
            offset_bytes,
            length_bytes,
            placement: ftlab_core::request::Placement::handle(if self.stream_by_temperature {
                stream
            } else {
                0
            }),
        }
    }

    fn jesd219(&mut self) -> (u64, u64) {
        let mut pick = self.rng.bounded(100) as u32;
        let mut size = 4096;
        for (bytes, weight) in JESD219_SIZES {
            if pick < weight {
                size = bytes;
                break;
            }
            pick -= weight;
        }
        // 50 % of accesses to the first 5 % of LBAs, 30 % to the next 15 %, 20 % to the last 80 %.
        let span = self.span_bytes;
        let region = self.rng.bounded(100);
        let (start, end) = if region < 50 {
            (0, span / 20)
        } else if region < 80 {
            (span / 20, span / 5)
        } else {
            (span / 5, span)
        };
        let align = if size >= 4096 { 4096 } else { 512 };
        let start = start.div_ceil(align) * align;
        let end = end.max(start + size).min(span);
        let positions = ((end - start).saturating_sub(size)) / align + 1;
        (start + self.rng.bounded(positions) * align, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftlab_core::config::Config;

    fn workload(kind: &str) -> WorkloadConfig {
        let mut c = Config::from_preset("femu").unwrap();
        c.workload.kind = kind.into();
        c.workload
    }

    #[test]
    fn jesd219_sizes_and_regions_follow_the_standard() {
        let span = 1u64 << 30;
        let mut g = Generator::new(&workload("jesd219"), span).unwrap();
        let n = 200_000;
        let mut sizes = std::collections::BTreeMap::new();
        let mut first5 = 0;
        for _ in 0..n {
            let r = g.next_request();
            assert!(r.offset_bytes + r.length_bytes <= span);
            *sizes.entry(r.length_bytes).or_insert(0u32) += 1;
            if r.offset_bytes < span / 20 {
                first5 += 1;
            }
        }
        let share = |b: u64| f64::from(sizes[&b]) / n as f64;
        assert!((share(4096) - 0.67).abs() < 0.01);
        assert!((share(512) - 0.04).abs() < 0.005);
        assert!((share(65536) - 0.03).abs() < 0.005);
        assert!((f64::from(first5) / n as f64 - 0.5).abs() < 0.01);
    }

    #[test]
    fn hotcold_sends_the_configured_share_to_the_hot_region() {
        let span = 1u64 << 30;
        let mut g = Generator::new(&workload("hotcold"), span).unwrap();
        let hot_end = span / 5;
        let n = 100_000;
        let hot = (0..n)
            .filter(|_| g.next_request().offset_bytes < hot_end)
            .count();
        assert!((hot as f64 / n as f64 - 0.8).abs() < 0.01);
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let span = 1u64 << 28;
        let mut g = Generator::new(&workload("zipf"), span).unwrap();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let r = g.next_request();
            assert!(r.offset_bytes + r.length_bytes <= span);
            *counts.entry(r.offset_bytes).or_insert(0u32) += 1;
        }
        let max = *counts.values().max().unwrap();
        // theta 0.99 over 65536 items: the top item takes several percent of accesses.
        assert!(max > 2_000, "top item drew {max}");
    }
}
