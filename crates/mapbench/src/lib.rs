//! `ftlab mapbench`: mapping tables side by side on a trace's update stream.
//!
//! The update stream is what a page-mapping FTL asks of its table: one SET per written page, one
//! REMOVE per trimmed page, in trace order. PPNs come either from a log head (each page write
//! takes the next PPN, the JDB-FTL report's method) or from the simulator itself (its real
//! PPNs, and the garbage collection's relocations where the trace makes it run). With a fill
//! (`--precondition`) every LPN is written once, in order, before the trace, so the drive is full
//! and its garbage collection moves pages. Lookups (GET)
//! are every page the trace reads or writes, in trace order, after the updates. Every table is
//! then read back in full against an oracle and its memory measured twice: its own exact
//! accounting and the allocator's statistics.
//!
//! Must not know: any table's internals (everything goes through `MappingTable`).
//!
//! `updates.rs` reduces the trace to its update stream and lookups; this file times the tables
//! on them and gathers their figures; `clock.rs` times single operations, `memory.rs` reads the
//! allocator's and the kernel's counts, `flat_u64.rs` is the report's baseline table, and
//! `tiled.rs` repeats a trace over a large device.

mod clock;
mod flat_u64;
mod memory;
mod tiled;
mod updates;

pub use clock::Clock;
pub use flat_u64::FlatU64;
pub use memory::{allocator_in_use, peak_resident_bytes};
pub use tiled::{run_tiled, TiledResult};
pub use updates::{
    ops_from_trace, ops_from_trace_with, refused_setting, DriveSetup, MapOps, OpsOptions,
    PpnSource, SimulatorRun, MAX_FILL_PAGES, OWNED_KEYS, SIM_SPARE_FACTOR,
};

use clock::{histogram, ticks};
use ftlab_core::config::ConfigError;
use ftlab_core::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping, MappingTable};
use ftlab_learned::LearnedMapping;
use ftlab_sim::sim::Progress;
use ftlab_sim::sim::SimError;
use ftlab_sim::trace::TraceError;
use memory::allocated_since;
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Why a mapping benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum MapbenchError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The trace at `path` needs more than the tables map (2^32 LPNs or PPNs) or a fill larger
    /// than `--precondition` takes.
    #[error("{}: {why}", path.display())]
    TraceTooLarge {
        path: std::path::PathBuf,
        why: String,
    },
    /// `--tiles` repeats of the trace would not fit 32-bit LPNs and PPNs.
    #[error("{0}")]
    Tiles(String),
    #[error("spare factor {0} is not between 0 and 1")]
    SpareFactor(f64),
    /// A `--sim-set` key mapbench sets itself (the reason given).
    #[error("--sim-set {0}")]
    RefusedSetting(String),
    #[error("--sim-set {setting}: {source}")]
    SimSet {
        setting: String,
        source: ConfigError,
    },
    /// The simulated drive the options describe is not a valid configuration.
    #[error(
        "the simulated drive ({device_bytes} bytes, spare factor {spare_factor}): {source} (here \
         the over-provisioning is --spare-factor; other keys are --sim-set's)"
    )]
    Drive {
        device_bytes: u64,
        spare_factor: f64,
        source: ConfigError,
    },
}

/// An update's value meaning "unmap" (TRIM).
pub const REMOVE: u32 = u32::MAX;

/// The tables `mapbench` knows, in the order it prints them.
pub const TABLE_NAMES: [&str; 5] = ["flat-u64", "flat-u32", "hash", "extent", "learned"];

/// One table's figures. `bytes` is measured after `compact()` (update buffers merged, spare
/// capacity returned); `allocator_bytes` is what glibc's own statistics say the same table holds.
#[derive(Clone, Debug, Serialize)]
pub struct TableResult {
    pub name: String,
    pub bytes: u64,
    pub bytes_per_live_mapping: f64,
    /// Bytes before `compact()`: update buffer and spare capacity included.
    pub bytes_before_compact: u64,
    /// The most the table held during the run (`MappingTable::peak_heap_bytes`): its buffer at
    /// its fullest, its arena's garbage and growth room included.
    pub bytes_peak: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_bytes: Option<u64>,
    pub total_ms: f64,
    /// Throughputs; `None` (JSON `null`) for a phase with no operations.
    pub get_mops: Option<f64>,
    pub set_mops: Option<f64>,
    /// Lookups of every live LPN in random order, after the trace-order lookups.
    pub get_random_mops: Option<f64>,
    /// Percentiles; `None` (JSON `null`) for a phase with no operations.
    pub get_p50_ns: Option<f64>,
    pub get_p99_ns: Option<f64>,
    pub set_p50_ns: Option<f64>,
    pub set_p99_ns: Option<f64>,
    /// One update in 10,000 waits longer: for the learned table, on a trace with enough merges,
    /// what one merge (a group re-encoded) costs the update that triggers it.
    pub set_p9999_ns: Option<f64>,
    /// Percentiles of the random lookups (every live LPN once, in random order, after the
    /// trace-order lookups): the worst case of a table that keeps a position between lookups,
    /// where the trace-order percentiles show its common case.
    pub get_random_p50_ns: Option<f64>,
    pub get_random_p99_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compressed_get_fraction: Option<f64>,
    /// The learned table's: the fraction of the trace-order lookups its cursor answered with no
    /// search (the span of consecutive PPNs the last lookup or update found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor_get_fraction: Option<f64>,
    pub lossless_verified: bool,
    /// Throughputs divided by the flat u64 array's in the same run (when it ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_flat_u64: Option<Ratios>,
}

/// A table's throughputs as multiples of another's (`get`: trace-order GET); `None` (JSON
/// `null`) where the phase had no operations (a trace without writes has no SET rate).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ratios {
    pub get: Option<f64>,
    pub set: Option<f64>,
    pub get_random: Option<f64>,
}

impl Ratios {
    fn of(t: &TableResult, base: &TableResult) -> Ratios {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(ftlab_sim::report::round6(a / b)),
            _ => None,
        };
        Ratios {
            get: ratio(t.get_mops, base.get_mops),
            set: ratio(t.set_mops, base.set_mops),
            get_random: ratio(t.get_random_mops, base.get_random_mops),
        }
    }
}

/// The whole comparison, as `--json` writes it.
#[derive(Clone, Debug, Serialize)]
pub struct MapBench {
    pub trace: String,
    pub ppns: String,
    pub logical_pages: u64,
    pub updates: u64,
    /// How many of the updates are the fill's (`--precondition`), which come first.
    pub fill_updates: u64,
    pub gets: u64,
    pub live_mappings: u64,
    /// With `--ppns simulator`: the drive's WAF, erases and the pages its GC moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulator: Option<SimulatorRun>,
    /// The learned table's figure (the only table with a compressed layer).
    pub compressed_get_fraction: Option<f64>,
    /// The learned table's: lookups its cursor answered with no search.
    pub cursor_get_fraction: Option<f64>,
    /// The learned table's update buffer holds up to one in this many live mappings (at least
    /// 256 LPNs; `--learned-buffer-divisor`).
    pub learned_buffer_divisor: u64,
    pub latency_method: String,
    pub tables: Vec<TableResult>,
}

#[inline]
fn apply<M: MappingTable>(table: &mut M, (lpn, v): (u32, u32)) -> Option<u32> {
    if v == REMOVE {
        table.remove(lpn)
    } else {
        table.set(lpn, v)
    }
}

/// Times each lookup phase takes over in a round, on the same table (the fastest counts). The
/// flat array's pass over one of the shipped traces lasts under a millisecond, and its time moved
/// 2x from one round to the next on the project's shared VM; lookups change no mapping, so later
/// passes measure the same work.
pub const LOOKUP_PASSES: usize = 3;

/// Seconds for the update phase, the trace-order lookups and the random lookups (each the
/// fastest of `LOOKUP_PASSES`), and of the first trace-order pass, the fractions of lookups the
/// compressed layer and the lookup cursor answered (tables with them).
fn timed_phases<M: MappingTable>(
    table: &mut M,
    ops: &MapOps,
) -> (f64, f64, f64, Option<f64>, Option<f64>) {
    let t0 = Instant::now();
    for &u in &ops.updates {
        black_box(apply(table, u));
    }
    let set_s = t0.elapsed().as_secs_f64();
    let pass = |lpns: &[u32]| {
        let t = Instant::now();
        for &lpn in lpns {
            black_box(table.get(black_box(lpn)));
        }
        let s = t.elapsed().as_secs_f64();
        table.note_gets(lpns.len() as u64);
        s
    };
    let mut get_s = pass(&ops.gets);
    let fraction = table.compressed_get_fraction();
    let cursor = table.activity().and_then(|a| a.cursor_get_fraction());
    for _ in 1..LOOKUP_PASSES {
        get_s = get_s.min(pass(&ops.gets));
    }
    let random_s = (0..LOOKUP_PASSES)
        .map(|_| pass(&ops.random_gets))
        .fold(f64::MAX, f64::min);
    (set_s, get_s, random_s, fraction, cursor)
}

/// The fastest time seen of each timed phase, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    pub set_s: f64,
    pub get_s: f64,
    pub random_s: f64,
}

impl Phases {
    pub const NONE: Phases = Phases {
        set_s: f64::MAX,
        get_s: f64::MAX,
        random_s: f64::MAX,
    };

    fn keep_fastest(&mut self, (set_s, get_s, random_s): (f64, f64, f64)) {
        self.set_s = self.set_s.min(set_s);
        self.get_s = self.get_s.min(get_s);
        self.random_s = self.random_s.min(random_s);
    }
}

/// One throughput round of the named table, on a fresh table.
fn throughput_round(name: &str, pages: u64, ops: &MapOps, divisor: u64) -> (f64, f64, f64) {
    let (s, g, r, _, _) = match name {
        "flat-u64" => timed_phases(&mut FlatU64::new(pages), ops),
        "flat-u32" => timed_phases(&mut FlatMapping::new(pages), ops),
        "hash" => timed_phases(&mut HashMapping::new(), ops),
        "extent" => timed_phases(&mut ExtentMapping::new(), ops),
        "learned" => timed_phases(
            &mut LearnedMapping::new(pages).buffer_live_divisor(divisor),
            ops,
        ),
        other => panic!("unknown table {other}; the command line checks names"),
    };
    (s, g, r)
}

/// Runs one table through `ops`: a last throughput pass (whole phases timed; `best` holds the
/// fastest phases of the earlier rounds), a latency pass on a fresh table (each op timed), a full
/// read-back against `oracle`, and the memory figures.
pub fn run_table<M: MappingTable>(
    make: impl Fn() -> M,
    ops: &MapOps,
    oracle: &[u32],
    best: Phases,
    repeat: u32,
    clock: &Clock,
) -> TableResult {
    let Phases {
        mut set_s,
        mut get_s,
        mut random_s,
    } = best;
    let before = allocator_in_use();
    let mut table = make();
    let (s, g, r, compressed_get_fraction, cursor_get_fraction) = timed_phases(&mut table, ops);
    (set_s, get_s, random_s) = (set_s.min(s), get_s.min(g), random_s.min(r));
    let total_ms = (set_s + get_s) * 1e3;

    let mut ok = table.live_mappings() == oracle.iter().filter(|&&v| v != REMOVE).count() as u64;
    for (lpn, &v) in oracle.iter().enumerate() {
        ok &= table.get(lpn as u32) == (v != REMOVE).then_some(v);
    }
    let bytes_before_compact = table.heap_bytes() as u64;
    let bytes_peak = table.peak_heap_bytes() as u64;
    table.compact();
    for (lpn, &v) in oracle.iter().enumerate() {
        ok &= table.get(lpn as u32) == (v != REMOVE).then_some(v);
    }
    let bytes = table.heap_bytes() as u64;
    let allocator_bytes = allocated_since(before);
    let live = table.live_mappings();
    let name = table.name().to_string();
    drop(table);

    // Latency passes: the same sequence on a fresh table, one timestamp pair per op. Each
    // quantile is the median over `repeat` passes: one pass's p99 moves by 2x with this
    // machine's neighbours, and the median neither hides nor picks the disturbed passes.
    let to_ns = |d: u64| {
        ((d.saturating_sub(clock.overhead_ticks)) as f64 / clock.ticks_per_ns).max(1.0) as u64
    };
    let q = |h: &hdrhistogram::Histogram<u64>, p: f64| {
        (!h.is_empty()).then(|| h.value_at_quantile(p) as f64)
    };
    // Per pass, in `TableResult`'s order: GET p50, p99; SET p50, p99, p99.99; random GET p50,
    // p99 (`None` for an empty phase: every pass alike).
    let mut passes: Vec<[Option<f64>; 7]> = Vec::new();
    for _ in 0..repeat.max(1) {
        let mut table = make();
        let (mut set_h, mut get_h, mut random_h) = (histogram(), histogram(), histogram());
        for &u in &ops.updates {
            let a = ticks();
            black_box(apply(&mut table, u));
            let b = ticks();
            set_h.saturating_record(to_ns(b - a));
        }
        // Each lookup list timed op by op, then noted as the throughput passes note theirs.
        let timed_gets = |lpns: &[u32], h: &mut hdrhistogram::Histogram<u64>| {
            for &lpn in lpns {
                let a = ticks();
                black_box(table.get(black_box(lpn)));
                let b = ticks();
                h.saturating_record(to_ns(b - a));
            }
            table.note_gets(lpns.len() as u64);
        };
        timed_gets(&ops.gets, &mut get_h);
        timed_gets(&ops.random_gets, &mut random_h);
        passes.push([
            q(&get_h, 0.5),
            q(&get_h, 0.99),
            q(&set_h, 0.5),
            q(&set_h, 0.99),
            q(&set_h, 0.9999),
            q(&random_h, 0.5),
            q(&random_h, 0.99),
        ]);
    }
    let median = |k: usize| {
        let mut v: Vec<f64> = passes.iter().filter_map(|p| p[k]).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let mops = |n: usize, s: f64| {
        (n > 0 && s > 0.0).then(|| ftlab_sim::report::round6(n as f64 / s / 1e6))
    };
    TableResult {
        name,
        bytes,
        bytes_per_live_mapping: ftlab_sim::report::bytes_per_mapping(bytes, live),
        bytes_before_compact,
        bytes_peak,
        allocator_bytes,
        total_ms: ftlab_sim::report::round6(total_ms),
        get_mops: mops(ops.gets.len(), get_s),
        set_mops: mops(ops.updates.len(), set_s),
        get_random_mops: mops(ops.random_gets.len(), random_s),
        get_p50_ns: median(0),
        get_p99_ns: median(1),
        set_p50_ns: median(2),
        set_p99_ns: median(3),
        set_p9999_ns: median(4),
        get_random_p50_ns: median(5),
        get_random_p99_ns: median(6),
        compressed_get_fraction: compressed_get_fraction.map(ftlab_sim::report::round6),
        cursor_get_fraction: cursor_get_fraction.map(ftlab_sim::report::round6),
        lossless_verified: ok,
        vs_flat_u64: None,
    }
}

/// Runs the named tables over `ops`; the learned table's buffer holds up to one in
/// `learned_buffer_divisor` live mappings (a power of two; `BUFFER_LIVE_DIVISOR` by default).
/// `progress` counts the tables' runs (`repeat` each).
pub fn run(
    trace: &str,
    ppns: PpnSource,
    ops: &MapOps,
    tables: &[String],
    repeat: u32,
    learned_buffer_divisor: u64,
    progress: &mut dyn FnMut(Progress),
) -> MapBench {
    let oracle = ops.oracle();
    let pages = ops.logical_pages;
    let clock = Clock::calibrate();
    // Throughput rounds go table after table, `repeat - 1` times over (the last round is
    // `run_table`'s own): a neighbour that slows this shared machine for a few seconds then
    // slows one round of every table, not all the rounds of one, and the ratios to the flat
    // array stay fair.
    let mut best = vec![Phases::NONE; tables.len()];
    let total = Some(u64::from(repeat.max(1)) * tables.len() as u64);
    let mut done = 0;
    let mut step = || {
        progress(Progress {
            phase: "timing the tables",
            done,
            total,
        });
        done += 1;
    };
    for _ in 1..repeat.max(1) {
        for (name, best) in tables.iter().zip(&mut best) {
            step();
            best.keep_fastest(throughput_round(name, pages, ops, learned_buffer_divisor));
        }
    }
    let mut results = Vec::new();
    for (name, &best) in tables.iter().zip(&best) {
        step();
        let r = match name.as_str() {
            "flat-u64" => run_table(|| FlatU64::new(pages), ops, &oracle, best, repeat, &clock),
            "flat-u32" => {
                let mut r = run_table(
                    || FlatMapping::new(pages),
                    ops,
                    &oracle,
                    best,
                    repeat,
                    &clock,
                );
                r.name = "flat-u32".into();
                r
            }
            "hash" => run_table(HashMapping::new, ops, &oracle, best, repeat, &clock),
            "extent" => run_table(ExtentMapping::new, ops, &oracle, best, repeat, &clock),
            "learned" => run_table(
                || LearnedMapping::new(pages).buffer_live_divisor(learned_buffer_divisor),
                ops,
                &oracle,
                best,
                repeat,
                &clock,
            ),
            other => panic!("unknown table {other}; the command line checks names"),
        };
        results.push(r);
    }
    if let Some(flat) = results.iter().find(|r| r.name == "flat-u64").cloned() {
        for r in &mut results {
            r.vs_flat_u64 = Some(Ratios::of(r, &flat));
        }
    }
    MapBench {
        trace: trace.to_string(),
        ppns: match ppns {
            PpnSource::LogHead => "log-head",
            PpnSource::Simulator => "simulator",
        }
        .into(),
        logical_pages: pages,
        updates: ops.updates.len() as u64,
        fill_updates: ops.fill_updates,
        gets: ops.gets.len() as u64,
        live_mappings: oracle.iter().filter(|&&v| v != REMOVE).count() as u64,
        simulator: ops.simulator.clone(),
        compressed_get_fraction: results.iter().find_map(|r| r.compressed_get_fraction),
        cursor_get_fraction: results.iter().find_map(|r| r.cursor_get_fraction),
        learned_buffer_divisor,
        latency_method: format!(
            "{}; quantiles are the median over {} passes",
            clock.method(),
            repeat.max(1)
        ),
        tables: results,
    }
}

/// `MapBench` as a Markdown table.
pub fn markdown(b: &MapBench) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let fill = if b.fill_updates > 0 {
        format!(" ({} of them the fill's, first)", b.fill_updates)
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "{} ({} PPNs): {} LPNs, {} updates{fill}, {} lookups, {} live mappings",
        b.trace, b.ppns, b.logical_pages, b.updates, b.gets, b.live_mappings
    );
    if let Some(sim) = &b.simulator {
        let settings: String = sim.settings.iter().map(|s| format!(", {s}")).collect();
        let _ = writeln!(
            o,
            "simulated drive (spare factor {}{settings}): WAF {}, {} blocks erased, {} pages moved by GC",
            sim.spare_factor, ftlab_sim::report::waf_text(sim.waf), sim.erases, sim.gc_write_pages
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "| table | total ms | GET Mops/s | SET Mops/s | random GET Mops/s | GET p50/p99 ns | SET p50/p99/p99.99 ns | random GET p50/p99 ns | bytes | allocator bytes | B/live mapping | peak bytes | lossless |"
    );
    let _ = writeln!(
        o,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    // A figure to `digits` decimals and `unit`, or `-` where its phase had no operations.
    let cell = |v: Option<f64>, digits: usize, unit: &str| {
        v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}{unit}"))
    };
    for t in &b.tables {
        let _ = writeln!(
            o,
            "| {} | {:.1} | {} | {} | {} | {} / {} | {} / {} / {} | {} / {} | {} | {} | {} | {} | {} |",
            t.name,
            t.total_ms,
            cell(t.get_mops, 1, ""),
            cell(t.set_mops, 1, ""),
            cell(t.get_random_mops, 1, ""),
            cell(t.get_p50_ns, 0, ""),
            cell(t.get_p99_ns, 0, ""),
            cell(t.set_p50_ns, 0, ""),
            cell(t.set_p99_ns, 0, ""),
            cell(t.set_p9999_ns, 0, ""),
            cell(t.get_random_p50_ns, 0, ""),
            cell(t.get_random_p99_ns, 0, ""),
            t.bytes,
            t.allocator_bytes
                .map_or_else(|| "-".into(), |a| a.to_string()),
            // A table's fixed bytes over no mappings is no figure (the JSON keeps 0).
            cell(
                (b.live_mappings != 0).then_some(t.bytes_per_live_mapping),
                3,
                ""
            ),
            t.bytes_peak,
            if t.lossless_verified { "yes" } else { "NO" }
        );
    }
    if b.tables
        .iter()
        .any(|t| t.name != "flat-u64" && t.vs_flat_u64.is_some())
    {
        let _ = writeln!(
            o,
            "\n| throughput / flat-u64's | GET | SET | random GET |\n|---|---:|---:|---:|"
        );
        for t in b.tables.iter().filter(|t| t.name != "flat-u64") {
            if let Some(r) = t.vs_flat_u64 {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} |",
                    t.name,
                    cell(r.get, 2, "x"),
                    cell(r.set, 2, "x"),
                    cell(r.get_random, 2, "x")
                );
            }
        }
    }
    if let Some(f) = b.compressed_get_fraction {
        let _ = writeln!(
            o,
            "\nlearned: {:.1} % of lookups answered by the compressed layer (buffer: up to 1/{} of the live mappings){}",
            100.0 * f,
            b.learned_buffer_divisor,
            b.cursor_get_fraction.map_or(String::new(), |c| format!(
                "; {:.1} % by its lookup cursor, with no search",
                100.0 * c
            ))
        );
    }
    let _ = writeln!(o, "latency: {}", b.latency_method);
    o
}
