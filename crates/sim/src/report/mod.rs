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

mod record;
mod sections;

pub use record::*;
pub use sections::*;

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
