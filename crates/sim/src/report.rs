//! Results: latency histograms and the time series while a run goes, then the [`Report`]:
//! a human summary, the JSON document (schema in docs/report-schema.md) and CSV.
//!
//! The JSON holds only simulated quantities, so the same config and seed give the same bytes;
//! wall-clock speed appears in the human summary alone.

use ftlab_core::config::Config;
use ftlab_core::flash::Cause;
use ftlab_core::ftl::mapping::MappingTable;
use ftlab_core::ftl::mapping::TableActivity;
use ftlab_core::ftl::{FdpEventKind, Ftl, FtlStats};
use ftlab_core::request::{Op, Request};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

fn histogram() -> Histogram<u64> {
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

/// One latency histogram per operation (1 ns .. 1 hour, 3 significant digits).
#[derive(Clone, Debug)]
pub struct OpHistograms {
    read: Histogram<u64>,
    write: Histogram<u64>,
    trim: Histogram<u64>,
    flush: Histogram<u64>,
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

    pub fn summaries(&self) -> OpLatencies {
        OpLatencies {
            read: summarize(&self.read),
            write: summarize(&self.write),
            trim: summarize(&self.trim),
            flush: summarize(&self.flush),
        }
    }
}

pub struct Recorder {
    latency: OpHistograms,
    read_bytes: u64,
    write_bytes: u64,
    interval_ns: u64,
    start_ns: u64,
    next_boundary_ns: u64,
    last_host: u64,
    last_nand: u64,
    last_traffic: Traffic,
    /// Per placement, (host, media) programs at the last interval's end.
    last_placements: Vec<(u64, u64)>,
    requests_in_interval: u64,
    series: Vec<SeriesRow>,
}

impl Recorder {
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

    fn close_interval<M: MappingTable>(&mut self, end_ns: u64, width_ns: u64, ftl: &Ftl<M>) {
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

const CDF_QUANTILES: [f64; 22] = [
    0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999,
    0.9995, 0.9999, 0.99995, 0.99999, 1.0,
];

fn summarize(h: &Histogram<u64>) -> LatencySummary {
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
fn at_zero(h: &Histogram<u64>) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    round6(h.count_between(0, ZERO_LATENCY_NS) as f64 / h.len() as f64)
}

/// What a request that took no simulated time is recorded as (`OpHistograms::record`).
pub const ZERO_LATENCY_NS: u64 = 1;

fn cdf(h: &Histogram<u64>) -> Cdf {
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

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TraceInfo {
    pub path: String,
    pub format: String,
    pub requests: u64,
    pub bad_lines_skipped: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub physical_bytes: u64,
    pub logical_bytes: u64,
    pub over_provisioning: f64,
    pub spare_factor: f64,
    pub dies: u32,
    pub superblocks: u32,
    pub pages_per_superblock: u32,
    pub free_superblocks_end: u32,
    pub erase_count_min: u32,
    pub erase_count_max: u32,
    pub erase_count_mean: f64,
    /// Fraction of die-time the dies were busy during the measured phase.
    pub die_utilization: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MappingInfo {
    pub table: String,
    /// As the run ended: the table's buffer and spare capacity included.
    pub bytes: u64,
    /// The most the table held at any point of the run, preconditioning included: the DRAM it
    /// needs (`MappingTable::peak_heap_bytes`; a merge's scratch vectors aside).
    #[serde(default)]
    pub bytes_peak: u64,
    /// After folding its buffer and returning spare capacity (`MappingTable::compact`;
    /// what `ftlab mapbench` reports): unlike `bytes`, it does not depend on where the run
    /// stopped in the table's cycles of merging and collecting garbage.
    #[serde(default)]
    pub bytes_compacted: u64,
    pub live_mappings: u64,
    pub bytes_per_live_mapping: f64,
    /// All FTL DRAM: mapping, reverse map, block metadata, buffer index.
    pub ftl_metadata_bytes: u64,
    /// Tables with an update buffer (`learned`): the fraction of lookups its compressed layer
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_get_fraction: Option<f64>,
    /// What the table did beyond mapping, under its name (`learned`: what its buffer did, merges
    /// and updates in place, and its groups' encodings).
    #[serde(flatten)]
    pub activity: Option<TableActivity>,
}

impl MappingInfo {
    /// The table's figures as they stand (`bytes_compacted` as `bytes`: compacting is the
    /// caller's choice, since it changes the table).
    fn of<M: MappingTable>(ftl: &Ftl<M>) -> MappingInfo {
        let live = ftl.mapping().live_mappings();
        let bytes = ftl.mapping_bytes() as u64;
        MappingInfo {
            table: ftl.mapping().name().to_string(),
            bytes,
            bytes_peak: ftl.mapping().peak_heap_bytes() as u64,
            bytes_compacted: bytes,
            live_mappings: live,
            bytes_per_live_mapping: bytes_per_mapping(bytes, live),
            ftl_metadata_bytes: ftl.metadata_bytes() as u64,
            compressed_get_fraction: ftl.mapping().compressed_get_fraction().map(round6),
            activity: ftl.mapping().activity(),
        }
    }

    /// The learned table's activity, when the table is `learned`.
    pub fn learned(&self) -> Option<&ftlab_learned::LearnedActivity> {
        match &self.activity {
            Some(TableActivity::Learned(a)) => Some(a),
            None => None,
        }
    }
}

/// Flash page writes by what they carry, as the Hexa-SSD paper splits them, and the mapping
/// table's reads. `nand_write_pages` is their sum.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Traffic {
    /// Host data (UD).
    pub user_pages: u64,
    /// Translation pages written back (MD).
    pub mapping_pages: u64,
    /// GC moving user data (GUD).
    pub gc_user_pages: u64,
    /// GC moving translation pages (GMD).
    pub gc_mapping_pages: u64,
    /// Translation pages read because the cached table missed (0: the table is all cached).
    pub map_read_pages: u64,
}

impl Traffic {
    pub fn of(s: &FtlStats) -> Traffic {
        Traffic {
            user_pages: s.host_program_pages(),
            mapping_pages: s.mapping_write_pages(),
            gc_user_pages: s.gc_user_write_pages(),
            gc_mapping_pages: s.gc_mapping_write_pages(),
            map_read_pages: s.flash.read_pages(ftlab_core::flash::Cause::Mapping),
        }
    }

    /// The traffic since `earlier`.
    fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            user_pages: self.user_pages - earlier.user_pages,
            mapping_pages: self.mapping_pages - earlier.mapping_pages,
            gc_user_pages: self.gc_user_pages - earlier.gc_user_pages,
            gc_mapping_pages: self.gc_mapping_pages - earlier.gc_mapping_pages,
            map_read_pages: self.map_read_pages - earlier.map_read_pages,
        }
    }
}

/// What power-loss protection must cover, when the mapping is persisted in translation pages
/// (`ftl.protected_ratio` below 1).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PowerLoss {
    pub translation_pages: u32,
    /// How many may be dirty at once (`protected_ratio` of them).
    pub protected_translation_pages: u32,
    /// The most that were dirty at once in the measured phase.
    pub max_dirty_translation_pages: u32,
    /// The time to program that many pages over every die from idle: what the capacitors must
    /// keep the drive powered for (the write buffer's pages aside).
    pub capacitor_flush_ns: u64,
    /// Translation pages the mapping cache holds (`ftl.mapping_cache_bytes`); null: all.
    #[serde(default)]
    pub cached_translation_pages: Option<u32>,
}

/// NVMe Flexible Data Placement statistics, as `nvme fdp stats` names them, and per placement
/// (stream / reclaim unit handle; 255 holds the translation pages).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Fdp {
    /// Host bytes with metadata written (HBMW): host page writes x page bytes.
    pub host_bytes_with_metadata_written: u64,
    /// Media bytes with metadata written (MBMW): flash programs, every cause, x page bytes.
    pub media_bytes_with_metadata_written: u64,
    /// Media bytes erased (MBE): physical blocks erased x block bytes.
    pub media_bytes_erased: u64,
    #[serde(default)]
    pub reclaim_groups: u32,
    pub placements: Vec<PlacementStats>,
    /// The latest events (at most 64, oldest first), as `nvme fdp events` lists them.
    #[serde(default)]
    pub events: Vec<FdpEventInfo>,
}

/// One placement's share of the flash work, and what it holds as the run ends.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PlacementStats {
    pub placement: u8,
    /// `persistent` or `initial` (a handle's isolation), `shared_gc` (the reclaim units GC
    /// fills with initially isolated handles' data), `mapping` (translation pages).
    #[serde(default)]
    pub kind: String,
    /// Programs of host data into the placement's reclaim units.
    pub host_pages: u64,
    /// Every program into them (host, GC, mapping).
    pub media_pages: u64,
    /// media_pages / host_pages (null without host pages).
    #[serde(default)]
    pub waf: Option<f64>,
    /// Reclaim units (superblocks) opened for its writes.
    pub reclaim_units_written: u64,
    /// Reclaim unit available media writes (RUAMW): bytes still writable in its open
    /// reclaim units (all reclaim groups) as the run ended.
    #[serde(default)]
    pub ru_available_media_writes_bytes: u64,
    pub erased_blocks: u64,
    /// Valid pages in its reclaim units as the run ended.
    pub valid_pages: u64,
    /// Events: reclaim units closed unfilled past `fdp.ru_time_limit_ns`; GC victims of
    /// this placement whose data was moved ("media relocated"), and the pages moved.
    #[serde(default)]
    pub ru_time_limit_exceeded: u64,
    #[serde(default)]
    pub media_relocated: u64,
    #[serde(default)]
    pub relocated_pages: u64,
}

/// One FDP event.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FdpEventInfo {
    pub time_ns: u64,
    /// `ru_time_limit_exceeded` or `media_relocated`.
    pub kind: String,
    pub reclaim_group: u8,
    pub placement: u8,
    /// The reclaim unit (superblock number).
    pub reclaim_unit: u32,
    /// Pages moved (media relocated) or left unwritten (time limit).
    pub pages: u32,
}

impl Fdp {
    fn of<M: MappingTable>(ftl: &Ftl<M>) -> Fdp {
        let s = ftl.stats();
        let g = ftl.geometry();
        let page = u64::from(g.page_size_bytes);
        let mut valid = [0u64; 256];
        for sb in 0..g.superblocks {
            valid[usize::from(ftl.blocks().stream_of(sb))] +=
                u64::from(ftl.blocks().valid_count(sb));
        }
        let available = ftl.available_media_writes();
        let kind = |p: u8| match p {
            ftlab_core::flash::MAPPING_PLACEMENT => "mapping",
            ftlab_core::flash::SHARED_GC_PLACEMENT => "shared_gc",
            h if g.is_persistent(h) => "persistent",
            _ => "initial",
        };
        let placements = s
            .flash
            .placements()
            .iter()
            .enumerate()
            .map(|(p, c)| {
                let host_pages = c.program_pages[Cause::Host as usize];
                let media_pages: u64 = c.program_pages.iter().sum();
                PlacementStats {
                    placement: p as u8,
                    kind: kind(p as u8).to_string(),
                    host_pages,
                    media_pages,
                    waf: (host_pages > 0).then(|| media_pages as f64 / host_pages as f64),
                    reclaim_units_written: c.units_opened,
                    ru_available_media_writes_bytes: available.get(p).copied().unwrap_or(0) * page,
                    erased_blocks: c.erased_blocks.iter().sum(),
                    valid_pages: valid[p],
                    ru_time_limit_exceeded: c.units_closed_unfilled,
                    media_relocated: c.relocations,
                    relocated_pages: c.relocated_pages,
                }
            })
            // Every handle, and the other placements that did anything.
            .filter(|p| {
                u32::from(p.placement) < g.handles
                    || *p
                        != PlacementStats {
                            placement: p.placement,
                            kind: p.kind.clone(),
                            ..Default::default()
                        }
            })
            .collect();
        let events = s
            .fdp_events
            .iter()
            .map(|e| FdpEventInfo {
                time_ns: e.time_ns,
                kind: match e.kind {
                    FdpEventKind::RuTimeLimitExceeded => "ru_time_limit_exceeded",
                    FdpEventKind::MediaRelocated => "media_relocated",
                }
                .to_string(),
                reclaim_group: e.reclaim_group,
                placement: e.placement,
                reclaim_unit: e.reclaim_unit,
                pages: e.pages,
            })
            .collect();
        Fdp {
            host_bytes_with_metadata_written: s.host_write_pages * page,
            media_bytes_with_metadata_written: s.nand_write_pages() * page,
            media_bytes_erased: s.erases() * u64::from(g.pages_per_block) * page,
            reclaim_groups: g.reclaim_groups,
            placements,
            events,
        }
    }
}

/// A power cut (`workload.power_cut_at_ns`): what was programmed on capacitor power, and the
/// durable state checked against the table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PowerCutInfo {
    /// Into the measured phase.
    pub at_ns: u64,
    pub buffered_pages: u64,
    pub dirty_translation_pages: u64,
    /// From the cut (or, when requests that arrived before it were still completing, from the
    /// last completion) until the last page programmed on capacitor power was durable.
    pub flush_ns: u64,
    /// LPNs whose durable entry (translation pages on flash) was compared with the table: every
    /// one when the mapping is persisted, none otherwise.
    pub lpns_checked: u64,
    /// Those that differed (a lost write): 0 unless the model is wrong.
    pub lpns_not_durable: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GcInfo {
    pub background: u64,
    pub foreground: u64,
    pub read_pages: u64,
    pub write_pages: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Requests {
    pub read: u64,
    pub write: u64,
    pub trim: u64,
    pub flush: u64,
}

/// The JSON report. Field order and names are the documented schema (docs/report-schema.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub ftlab_version: String,
    /// `None` (JSON `null`) when the measured phase had no host write.
    pub waf: Option<f64>,
    pub host_write_pages: u64,
    pub nand_write_pages: u64,
    pub gc_write_pages: u64,
    pub mapping_write_pages: u64,
    pub host_program_pages: u64,
    pub host_read_pages: u64,
    pub host_trim_pages: u64,
    pub erases: u64,
    pub sim_time_ns: u64,
    pub requests: Requests,
    pub iops: f64,
    pub read_mb_per_s: f64,
    pub write_mb_per_s: f64,
    pub latency_ns: OpLatencies,
    pub gc: GcInfo,
    #[serde(default)]
    pub traffic: Traffic,
    /// `null` when every mapping change is protected (`ftl.protected_ratio = 1`).
    #[serde(default)]
    pub power_loss: Option<PowerLoss>,
    /// NVMe FDP statistics and the work per placement.
    #[serde(default)]
    pub fdp: Fdp,
    /// Only for a run cut short by `workload.power_cut_at_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_cut: Option<PowerCutInfo>,
    pub mapping: MappingInfo,
    pub device: DeviceInfo,
    pub counters: Counters,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub trace: Option<TraceInfo>,
    pub series: Vec<SeriesRow>,
    pub latency_cdf: LatencyCdfs,
    pub config: Config,
    /// Not serialised: wall-clock figures for the human summary only.
    #[serde(skip)]
    pub wall_seconds: f64,
}

/// The FTL counters not already at the top level of the report.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    pub host_flash_read_pages: u64,
    pub gc_read_pages: u64,
    pub rmw_read_pages: u64,
    pub buffer_coalesced_pages: u64,
    pub buffer_read_hits: u64,
    pub flushes: u64,
}

impl From<&FtlStats> for Counters {
    fn from(s: &FtlStats) -> Self {
        Self {
            host_flash_read_pages: s.host_flash_read_pages(),
            gc_read_pages: s.gc_read_pages(),
            rmw_read_pages: s.rmw_read_pages(),
            buffer_coalesced_pages: s.buffer_coalesced_pages,
            buffer_read_hits: s.buffer_read_hits,
            flushes: s.flushes,
        }
    }
}

/// `bytes / live`, rounded as every report figure; 0 for an empty table.
pub fn bytes_per_mapping(bytes: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        round6(bytes as f64 / live as f64)
    }
}

pub use ftlab_core::memory::binary_size;

/// A WAF as the summaries print it: three decimals, or `n/a` when the host wrote nothing.
pub fn waf_text(waf: Option<f64>) -> String {
    waf.map_or_else(|| "n/a (no host writes)".into(), |w| format!("{w:.3}"))
}

/// `x` to six decimals: every fractional figure of a report, so that reports compare byte for
/// byte across machines whose last float digits differ.
pub fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl Report {
    /// The run's report. The run is over, so the mapping table is compacted here (what it maps
    /// stays the same) once the figures that depend on its buffer have been read. It is
    /// compacted in place: a copy would hold the table twice at the run's end.
    pub fn build<M: MappingTable>(
        config: &Config,
        ftl: &mut Ftl<M>,
        recorder: Recorder,
        start_ns: u64,
        end_ns: u64,
        trace: Option<TraceInfo>,
        wall_seconds: f64,
    ) -> Report {
        let mut mapping = MappingInfo::of(ftl);
        ftl.compact_mapping();
        mapping.bytes_compacted = ftl.mapping_bytes() as u64;
        let mut report = Report::assemble(config, ftl, &recorder, mapping, start_ns, end_ns);
        report.series = recorder.series;
        report.trace = trace;
        report.wall_seconds = wall_seconds;
        report
    }

    /// The report of a device still running (`ftlab serve --stats`): the figures so far, from
    /// `start_ns` to `now_ns`, without touching the FTL. Its table is not compacted
    /// (`mapping.bytes_compacted` is `mapping.bytes`), and `series` is what `recorder` kept.
    pub fn snapshot<M: MappingTable>(
        config: &Config,
        ftl: &Ftl<M>,
        recorder: &Recorder,
        start_ns: u64,
        now_ns: u64,
    ) -> Report {
        let mapping = MappingInfo::of(ftl);
        let mut report = Report::assemble(config, ftl, recorder, mapping, start_ns, now_ns);
        report.series = recorder.series.clone();
        report
    }

    /// Every figure but the series, the trace and the wall-clock time.
    fn assemble<M: MappingTable>(
        config: &Config,
        ftl: &Ftl<M>,
        recorder: &Recorder,
        mapping: MappingInfo,
        start_ns: u64,
        end_ns: u64,
    ) -> Report {
        let s = ftl.stats();
        let g = ftl.geometry();
        let sim_time_ns = end_ns - start_ns;
        let secs = sim_time_ns.max(1) as f64 / 1e9;
        let r = recorder;
        let l = &r.latency;
        let requests = Requests {
            read: l.read.len(),
            write: l.write.len(),
            trim: l.trim.len(),
            flush: l.flush.len(),
        };
        let total_requests = requests.read + requests.write + requests.trim + requests.flush;
        // Per superblock; every physical block of a superblock is erased with it.
        let erase_counts = ftl.blocks().erase_counts();
        Report {
            ftlab_version: env!("CARGO_PKG_VERSION").to_string(),
            waf: s.waf().map(round6),
            host_write_pages: s.host_write_pages,
            nand_write_pages: s.nand_write_pages(),
            gc_write_pages: s.gc_write_pages(),
            mapping_write_pages: s.mapping_write_pages(),
            host_program_pages: s.host_program_pages(),
            host_read_pages: s.host_read_pages,
            host_trim_pages: s.host_trim_pages,
            erases: s.erases(),
            sim_time_ns,
            iops: round6(total_requests as f64 / secs),
            read_mb_per_s: round6(r.read_bytes as f64 / 1e6 / secs),
            write_mb_per_s: round6(r.write_bytes as f64 / 1e6 / secs),
            requests,
            latency_ns: l.summaries(),
            gc: GcInfo {
                background: s.gc_background,
                foreground: s.gc_foreground,
                read_pages: s.gc_read_pages(),
                write_pages: s.gc_write_pages(),
            },
            traffic: Traffic::of(s),
            power_loss: ftl.translation().map(|t| PowerLoss {
                translation_pages: g.translation_pages,
                protected_translation_pages: t.budget(),
                max_dirty_translation_pages: t.max_dirty(),
                capacitor_flush_ns: ftl.timing().idle_program_ns(u64::from(t.max_dirty())),
                cached_translation_pages: t.cache_capacity(),
            }),
            power_cut: None,
            fdp: Fdp::of(ftl),
            mapping,
            device: DeviceInfo {
                physical_bytes: g.physical_bytes(),
                logical_bytes: g.logical_bytes(),
                over_provisioning: round6(g.over_provisioning()),
                spare_factor: round6(
                    (g.physical_pages - g.logical_pages) as f64 / g.physical_pages as f64,
                ),
                dies: g.dies,
                superblocks: g.superblocks,
                pages_per_superblock: g.pages_per_superblock,
                free_superblocks_end: ftl.free_superblocks(),
                erase_count_min: erase_counts.iter().copied().min().unwrap_or(0),
                erase_count_max: erase_counts.iter().copied().max().unwrap_or(0),
                erase_count_mean: round6(
                    erase_counts.iter().map(|&c| f64::from(c)).sum::<f64>()
                        / erase_counts.len().max(1) as f64,
                ),
                die_utilization: round6(
                    ftl.timing().die_busy_ns_total() as f64
                        / (sim_time_ns.max(1) as f64 * f64::from(g.dies)),
                ),
            },
            counters: s.into(),
            trace: None,
            latency_cdf: LatencyCdfs {
                read: cdf(&l.read),
                write: cdf(&l.write),
                read_at_zero: at_zero(&l.read),
                write_at_zero: at_zero(&l.write),
            },
            series: Vec::new(),
            config: config.clone(),
            wall_seconds: 0.0,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises") + "\n"
    }

    /// The time series as CSV; with several handles, two columns per placement that wrote
    /// anything (`p{N}_host_pages`, `p{N}_media_pages`).
    pub fn series_csv(&self) -> String {
        let mut seen = [false; 256];
        for r in &self.series {
            for p in &r.placements {
                seen[usize::from(p.placement)] = true;
            }
        }
        let placements: Vec<usize> = (0..256).filter(|&p| seen[p]).collect();
        let mut out = String::from(
            "end_ns,host_write_pages,nand_write_pages,waf,waf_cumulative,iops,free_superblocks,mapping_bytes,user_pages,mapping_pages,gc_user_pages,gc_mapping_pages,map_read_pages",
        );
        for p in &placements {
            let _ = write!(out, ",p{p}_host_pages,p{p}_media_pages");
        }
        out.push('\n');
        for r in &self.series {
            let _ = write!(
                out,
                "{},{},{},{:.4},{:.4},{:.1},{},{},{},{},{},{},{}",
                r.end_ns,
                r.host_write_pages,
                r.nand_write_pages,
                r.waf,
                r.waf_cumulative,
                r.iops,
                r.free_superblocks,
                r.mapping_bytes,
                r.traffic.user_pages,
                r.traffic.mapping_pages,
                r.traffic.gc_user_pages,
                r.traffic.gc_mapping_pages,
                r.traffic.map_read_pages
            );
            for &p in &placements {
                let (host, media) = r
                    .placements
                    .iter()
                    .find(|x| usize::from(x.placement) == p)
                    .map_or((0, 0), |x| (x.host_pages, x.media_pages));
                let _ = write!(out, ",{host},{media}");
            }
            out.push('\n');
        }
        out
    }

    /// The human summary.
    pub fn summary(&self) -> String {
        let mut o = String::new();
        let c = &self.config;
        let d = &self.device;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = writeln!(
            o,
            "device     {:.2} GiB physical, {:.2} GiB logical (rho {:.3}, spare factor {:.3}), {} dies, {} superblocks x {} pages of {} B",
            gib(d.physical_bytes), gib(d.logical_bytes), d.over_provisioning, d.spare_factor, d.dies,
            d.superblocks, d.pages_per_superblock, c.flash.page_size_bytes
        );
        let workload = match &self.trace {
            Some(t) => format!(
                "trace {} ({}, {} requests, {} bad lines skipped), {} loop",
                t.path, t.format, t.requests, t.bad_lines_skipped, c.workload.replay
            ),
            None => format!(
                "{} {} B, {}% reads, queue depth {}, seed {}{}",
                c.workload.kind,
                c.workload.request_size_bytes,
                c.workload.read_pcent,
                c.workload.queue_depth,
                c.workload.seed,
                if c.workload.precondition {
                    ", preconditioned"
                } else {
                    ""
                }
            ),
        };
        let _ = writeln!(o, "workload   {workload}");
        let _ = writeln!(
            o,
            "writes     host {} pages -> flash {} pages (host {}, GC {}, mapping {})",
            self.host_write_pages,
            self.nand_write_pages,
            self.host_program_pages,
            self.gc_write_pages,
            self.mapping_write_pages
        );
        let _ = writeln!(o, "WAF        {}", waf_text(self.waf));
        if let Some(c) = &self.power_cut {
            let _ = writeln!(
                o,
                "power cut  at {:.3} ms: {} buffered pages and {} dirty translation pages programmed on capacitor power in {:.3} ms; durable state: {} LPNs checked against the table, {} not durable",
                c.at_ns as f64 / 1e6,
                c.buffered_pages,
                c.dirty_translation_pages,
                c.flush_ns as f64 / 1e6,
                c.lpns_checked,
                c.lpns_not_durable
            );
        }
        if let Some(p) = &self.power_loss {
            let t = &self.traffic;
            let _ = writeln!(
                o,
                "traffic    UD {} + MD {} + GUD {} + GMD {} pages; {} of {} translation pages protected, at most {} dirty (capacitors: {:.3} ms to write them)",
                t.user_pages,
                t.mapping_pages,
                t.gc_user_pages,
                t.gc_mapping_pages,
                p.protected_translation_pages,
                p.translation_pages,
                p.max_dirty_translation_pages,
                p.capacitor_flush_ns as f64 / 1e6
            );
        }
        let _ = writeln!(
            o,
            "GC         {} background + {} foreground superblocks, {} block erases (per block min {} / mean {:.2} / max {})",
            self.gc.background, self.gc.foreground, self.erases, d.erase_count_min, d.erase_count_mean, d.erase_count_max
        );
        let _ = writeln!(
            o,
            "throughput {:.0} IOPS, read {:.1} MB/s, write {:.1} MB/s over {:.3} s simulated (die utilisation {:.0} %)",
            self.iops,
            self.read_mb_per_s,
            self.write_mb_per_s,
            self.sim_time_ns as f64 / 1e9,
            d.die_utilization * 100.0
        );
        for (name, l) in [
            ("read", &self.latency_ns.read),
            ("write", &self.latency_ns.write),
            ("trim", &self.latency_ns.trim),
            ("flush", &self.latency_ns.flush),
        ] {
            if l.count > 0 {
                let _ = writeln!(
                    o,
                    "{name:<10} {} req, latency us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
                    l.count,
                    l.p50 as f64 / 1e3,
                    l.p99 as f64 / 1e3,
                    l.p999 as f64 / 1e3,
                    l.max as f64 / 1e3
                );
            }
        }
        let m = &self.mapping;
        // The compacted size only where it differs (a flat array has nothing to fold), with its
        // bytes per live mapping: the figure to compare tables by (docs/mapping.md).
        let per_mapping = format!("{:.2} B per live mapping", m.bytes_per_live_mapping);
        let (compacted, per_mapping) = if m.bytes_compacted == m.bytes {
            (String::new(), per_mapping)
        } else {
            (
                format!(", {} compacted", binary_size(m.bytes_compacted)),
                format!(
                    "{per_mapping}, {:.2} compacted",
                    bytes_per_mapping(m.bytes_compacted, m.live_mappings)
                ),
            )
        };
        // The peak only where the table ever held more than at the end.
        let peak = if m.bytes_peak > m.bytes {
            format!(" (peak {})", binary_size(m.bytes_peak))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "mapping    {} table {}{peak}{compacted} ({per_mapping}; {} live); all FTL metadata {}",
            m.table,
            binary_size(m.bytes),
            m.live_mappings,
            binary_size(m.ftl_metadata_bytes)
        );
        if let Some(f) = self.mapping.compressed_get_fraction {
            let cursor = self
                .mapping
                .activity
                .as_ref()
                .and_then(|a| a.cursor_get_fraction());
            let _ = writeln!(
                o,
                "           {:.1} % of lookups answered by the compressed layer, not the buffer{}",
                100.0 * f,
                cursor.map_or(String::new(), |c| format!(
                    "; {:.1} % by the lookup cursor, with no search",
                    100.0 * c
                ))
            );
        }
        if let Some(a) = self.mapping.learned() {
            let (c, g) = (&a.counts, &a.groups);
            let _ = writeln!(
                o,
                "           {} merges of {} buffered LPNs, {} updates and {} runs in place; groups: {} run lists, {} segments, {} bitmap words, {} patched",
                c.merges,
                c.merged_entries,
                c.updates_in_place,
                c.runs_moved_in_place,
                g.runs,
                g.segments,
                g.words,
                g.patched
            );
        }
        if self.wall_seconds > 0.0 {
            let _ = writeln!(
                o,
                "speed      {:.2} M host pages per wall second ({:.3} s wall)",
                (self.host_write_pages + self.host_read_pages) as f64 / self.wall_seconds / 1e6,
                self.wall_seconds
            );
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::binary_size;

    #[test]
    fn binary_sizes_take_the_largest_unit_that_leaves_at_least_one() {
        for (bytes, text) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (21_175, "20.7 KiB"),
            (12 << 20, "12.0 MiB"),
            ((3 << 30) + (1 << 29), "3.5 GiB"),
            (16 << 40, "16.0 TiB"),
            (1 << 60, "1048576.0 TiB"),
        ] {
            assert_eq!(binary_size(bytes), text, "{bytes}");
        }
    }
}
