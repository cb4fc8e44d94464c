//! What a run records while it goes: the time series' rows and the latency histograms, and
//! their summaries (percentiles, CDFs).

use super::*;

pub(crate) fn histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// One interval of the time series.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SeriesRow {
    /// End of the interval, simulated ns since the measured phase began.
    pub end_ns: u64,
    pub host_write_pages: u64,
    pub nand_write_pages: u64,
    /// WAF within this interval (0 when the host wrote nothing).
    pub waf: f64,
    /// WAF since the measured phase began (0 before the host wrote anything).
    pub waf_cumulative: f64,
    /// Requests arriving per simulated second in this interval.
    pub iops: f64,
    pub free_superblocks: u32,
    /// The mapping table's DRAM at the interval's end (`MappingTable::heap_bytes`): how a
    /// table with a buffer or garbage to collect breathes over the run.
    #[serde(default)]
    pub mapping_bytes: u64,
    /// The interval's traffic, split as the report's `traffic` is: `nand_write_pages` is
    /// UD + MD + GUD + GMD.
    #[serde(default)]
    pub traffic: Traffic,
    /// With more than one handle: each placement's programs in this interval (those with
    /// any), host data and all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<SeriesPlacement>,
}

/// One placement's programs in one interval of the series.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct SeriesPlacement {
    pub placement: u8,
    pub host_pages: u64,
    pub media_pages: u64,
}

/// One latency histogram per operation (1 ns .. 1 hour, 3 significant digits). Saved as each
/// histogram's (value, count) pairs: recording each pair's value again lands in the same
/// bucket, so a restored histogram reports what the saved one did.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "SavedHistograms", try_from = "SavedHistograms")]
pub struct OpHistograms {
    pub(crate) read: Histogram<u64>,
    pub(crate) write: Histogram<u64>,
    pub(crate) trim: Histogram<u64>,
    pub(crate) flush: Histogram<u64>,
}

#[derive(Serialize, Deserialize)]
struct SavedHistograms([Vec<(u64, u64)>; 4]);

impl From<OpHistograms> for SavedHistograms {
    fn from(h: OpHistograms) -> Self {
        let pairs = |h: &Histogram<u64>| {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        };
        SavedHistograms([
            pairs(&h.read),
            pairs(&h.write),
            pairs(&h.trim),
            pairs(&h.flush),
        ])
    }
}

impl TryFrom<SavedHistograms> for OpHistograms {
    type Error = String;
    fn try_from(s: SavedHistograms) -> Result<Self, String> {
        let mut out = OpHistograms::default();
        let [r, w, t, f] = s.0;
        for (h, pairs) in [
            (&mut out.read, r),
            (&mut out.write, w),
            (&mut out.trim, t),
            (&mut out.flush, f),
        ] {
            for (value, count) in pairs {
                h.record_n(value, count)
                    .map_err(|e| format!("a latency of {value} ns: {e:?}"))?;
            }
        }
        Ok(out)
    }
}

impl Default for OpHistograms {
    fn default() -> Self {
        Self {
            read: histogram(),
            write: histogram(),
            trim: histogram(),
            flush: histogram(),
        }
    }
}

impl OpHistograms {
    #[inline]
    pub fn record(&mut self, op: Op, latency_ns: u64) {
        let h = match op {
            Op::Read => &mut self.read,
            Op::Write => &mut self.write,
            Op::Trim => &mut self.trim,
            Op::Flush => &mut self.flush,
        };
        h.saturating_record(latency_ns.max(ZERO_LATENCY_NS));
    }

    /// For a Prometheus histogram of `op`: how many took at most each of `bounds_ns`
    /// (cumulative), how many in all, and their sum in ns (from the histogram's mean).
    pub fn buckets(&self, op: Op, bounds_ns: &[u64]) -> (Vec<u64>, u64, f64) {
        let h = match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Trim => &self.trim,
            Op::Flush => &self.flush,
        };
        let counts = bounds_ns.iter().map(|&b| h.count_between(0, b)).collect();
        (counts, h.len(), h.mean() * h.len() as f64)
    }

    /// What was recorded after `earlier` was taken (`earlier` a clone of these histograms
    /// then): a phase's latencies out of a running device's.
    pub fn since(&self, earlier: &OpHistograms) -> OpHistograms {
        let delta = |now: &Histogram<u64>, then: &Histogram<u64>| {
            let mut d = now.clone();
            // Same bounds, and every count then is still there now.
            d.subtract(then)
                .expect("an earlier copy of the same histogram");
            d
        };
        OpHistograms {
            read: delta(&self.read, &earlier.read),
            write: delta(&self.write, &earlier.write),
            trim: delta(&self.trim, &earlier.trim),
            flush: delta(&self.flush, &earlier.flush),
        }
    }

    pub fn summaries(&self) -> OpLatencies {
        OpLatencies {
            read: summarize(&self.read),
            write: summarize(&self.write),
            trim: summarize(&self.trim),
            flush: summarize(&self.flush),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub struct Recorder {
    pub(crate) latency: OpHistograms,
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
    pub(crate) interval_ns: u64,
    pub(crate) start_ns: u64,
    pub(crate) next_boundary_ns: u64,
    pub(crate) last_host: u64,
    pub(crate) last_nand: u64,
    pub(crate) last_traffic: Traffic,
    /// Per placement, (host, media) programs at the last interval's end.
    pub(crate) last_placements: Vec<(u64, u64)>,
    pub(crate) requests_in_interval: u64,
    pub(crate) series: Vec<SeriesRow>,
}

impl Recorder {
    /// The latency histograms of every request recorded so far.
    pub fn latency(&self) -> &OpHistograms {
        &self.latency
    }

    /// A recorder that keeps latencies and byte counts but no time series (a live device, whose
    /// series would grow for as long as it runs).
    pub fn without_series() -> Self {
        Self::new(u64::MAX, 0)
    }

    pub fn new(interval_ns: u64, start_ns: u64) -> Self {
        Self {
            latency: OpHistograms::default(),
            read_bytes: 0,
            write_bytes: 0,
            interval_ns,
            start_ns,
            next_boundary_ns: start_ns + interval_ns,
            last_host: 0,
            last_nand: 0,
            last_traffic: Traffic::default(),
            last_placements: vec![(0, 0); 256],
            requests_in_interval: 0,
            series: Vec::new(),
        }
    }

    /// Closes every interval that ends at or before `now_ns`.
    #[inline]
    pub fn advance<M: MappingTable>(&mut self, now_ns: u64, ftl: &Ftl<M>) {
        while now_ns >= self.next_boundary_ns {
            self.close_interval(self.next_boundary_ns, self.interval_ns, ftl);
            self.next_boundary_ns += self.interval_ns;
        }
    }

    pub(crate) fn close_interval<M: MappingTable>(
        &mut self,
        end_ns: u64,
        width_ns: u64,
        ftl: &Ftl<M>,
    ) {
        let s = ftl.stats();
        let traffic = Traffic::of(s);
        let host = s.host_write_pages - self.last_host;
        let nand = s.nand_write_pages() - self.last_nand;
        let mut placements = Vec::new();
        if ftl.geometry().handles > 1 {
            for (p, c) in s.flash.placements().iter().enumerate() {
                let now = (
                    c.program_pages[Cause::Host as usize],
                    c.program_pages.iter().sum::<u64>(),
                );
                let last = std::mem::replace(&mut self.last_placements[p], now);
                if now != last {
                    placements.push(SeriesPlacement {
                        placement: p as u8,
                        host_pages: now.0 - last.0,
                        media_pages: now.1 - last.1,
                    });
                }
            }
        }
        self.series.push(SeriesRow {
            end_ns: end_ns - self.start_ns,
            host_write_pages: host,
            nand_write_pages: nand,
            waf: if host == 0 {
                0.0
            } else {
                nand as f64 / host as f64
            },
            waf_cumulative: s.waf().unwrap_or(0.0),
            iops: self.requests_in_interval as f64 * 1e9 / width_ns.max(1) as f64,
            free_superblocks: ftl.free_superblocks(),
            mapping_bytes: ftl.mapping_bytes() as u64,
            traffic: traffic.since(&self.last_traffic),
            placements,
        });
        self.last_host = s.host_write_pages;
        self.last_nand = s.nand_write_pages();
        self.last_traffic = traffic;
        self.requests_in_interval = 0;
    }

    #[inline]
    pub fn record(&mut self, request: &Request, arrival_ns: u64, completion_ns: u64) {
        match request.op {
            Op::Read => self.read_bytes += request.length_bytes,
            Op::Write => self.write_bytes += request.length_bytes,
            Op::Trim | Op::Flush => {}
        }
        self.latency.record(request.op, completion_ns - arrival_ns);
        self.requests_in_interval += 1;
    }

    pub fn finish<M: MappingTable>(&mut self, end_ns: u64, ftl: &Ftl<M>) {
        let start = self.next_boundary_ns - self.interval_ns;
        if end_ns > start || self.series.is_empty() {
            self.close_interval(end_ns, end_ns.saturating_sub(start), ftl);
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// The latency CDF of one operation: (latency_ns, fraction of requests at or below it).
pub type Cdf = Vec<(u64, f64)>;

pub(crate) const CDF_QUANTILES: [f64; 22] = [
    0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999,
    0.9995, 0.9999, 0.99995, 0.99999, 1.0,
];

pub(crate) fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        count: h.len(),
        mean: (h.mean() * 10.0).round() / 10.0,
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

/// The fraction of samples that took no time (recorded as 1 ns, the histogram's floor: no
/// flash operation takes a nanosecond), rounded to 6 decimals; 0 for no samples.
pub(crate) fn at_zero(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    round6(h.count_between(0, ZERO_LATENCY_NS) as f64 / h.len() as f64)
}

/// What a request that took no simulated time is recorded as (`OpHistograms::record`).
pub const ZERO_LATENCY_NS: u64 = 1;

pub(crate) fn cdf(h: &Histogram<u64>) -> Cdf {
    if h.is_empty() {
        return Vec::new();
    }
    CDF_QUANTILES
        .iter()
        .map(|&q| (h.value_at_quantile(q), q))
        .collect()
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OpLatencies {
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub trim: LatencySummary,
    pub flush: LatencySummary,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyCdfs {
    pub read: Cdf,
    pub write: Cdf,
    /// The fraction of reads that took no simulated time (write-buffer hits, pages never
    /// written): a log-scale axis cannot show them, so plots say it apart.
    #[serde(default)]
    pub read_at_zero: f64,
    #[serde(default)]
    pub write_at_zero: f64,
}
