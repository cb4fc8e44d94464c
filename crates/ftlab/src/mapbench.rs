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

use crate::config::ConfigBuilder;
use crate::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping, LearnedMapping, MappingTable};
use crate::request::Op;
use crate::sim::Progress;
use crate::trace::{TraceFormat, TraceReader};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::hint::black_box;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

/// An update's value meaning "unmap" (TRIM).
pub const REMOVE: u32 = u32::MAX;

/// The tables `mapbench` knows, in the order it prints them.
pub const TABLE_NAMES: [&str; 5] = ["flat-u64", "flat-u32", "hash", "extent", "learned"];

/// A trace reduced to what a mapping table sees.
#[derive(Clone, Debug, Default)]
pub struct MapOps {
    /// (lpn, ppn) or (lpn, REMOVE), in order.
    pub updates: Vec<(u32, u32)>,
    /// LPNs looked up, in order.
    pub gets: Vec<u32>,
    /// Every live LPN once, in a fixed random order (lookups no cache or span can predict).
    pub random_gets: Vec<u32>,
    pub logical_pages: u64,
    /// Page writes (SETs) among the updates.
    pub writes: u64,
    /// How many of the first updates are the fill's (`--precondition`; with the simulator's
    /// PPNs, the moves its GC made during the fill included). 0 without a fill.
    pub fill_updates: u64,
    /// What the simulator did, for `PpnSource::Simulator`.
    pub simulator: Option<SimulatorRun>,
}

/// The simulated drive behind `--ppns simulator`. A page write takes the next page of the open
/// block, as a log head does, so its PPNs differ from a log head's only where the garbage
/// collection moved pages or erased blocks were written again: the header says what it did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimulatorRun {
    /// The drive's spare fraction, (physical - logical) / physical (`DriveSetup`).
    pub spare_factor: f64,
    /// The settings given over the default preset (`DriveSetup::settings`), as given.
    pub settings: Vec<String>,
    /// Write amplification: 1.0 when the GC moved nothing.
    pub waf: f64,
    /// Pages the garbage collection moved (each a table update).
    pub gc_write_pages: u64,
    /// Blocks erased: the GC also reclaims blocks whose pages were all overwritten or trimmed,
    /// moving nothing.
    pub erases: u64,
}

impl MapOps {
    /// The final mapping, computed independently of every table: the oracle.
    pub fn oracle(&self) -> Vec<u32> {
        let mut map = vec![REMOVE; self.logical_pages as usize];
        for &(lpn, v) in &self.updates {
            map[lpn as usize] = v;
        }
        map
    }
}

/// Which PPNs the updates carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PpnSource {
    /// Each page write takes the next PPN (a log head), as the JDB-FTL report assigns them.
    LogHead,
    /// The simulator's PPNs (default preset sized to the device), GC relocations included
    /// (where the trace makes the GC run; `SimulatorRun` says).
    Simulator,
}

const PAGE_BYTES: u64 = 4096;

/// The largest device a fill writes whole: 2 GiB of updates.
pub const MAX_FILL_PAGES: u64 = 1 << 28;

/// Reads `path` into page-level updates and lookups. `device_bytes`: the LPN space (None: the
/// highest address the trace touches, rounded up to a GiB).
pub fn ops_from_trace(
    path: &Path,
    format: Option<TraceFormat>,
    device_bytes: Option<u64>,
    source: PpnSource,
) -> anyhow::Result<MapOps> {
    ops_from_trace_with(
        path,
        format,
        device_bytes,
        source,
        &OpsOptions::default(),
        &mut |_| {},
    )
}

/// What `ops_from_trace_with` does besides reading the trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpsOptions {
    /// Every LPN is first written once, in order (as `ftlab sim`'s preconditioning fills a
    /// drive, without its random overwrites), so that the trace runs on a full drive. Then the
    /// simulator's garbage collection has to move pages to make room, and those moves are
    /// updates too. A trace that begins by discarding the whole device (mkfs, in the nbdkit
    /// logs) frees the fill again.
    pub fill: bool,
    /// The drive behind `PpnSource::Simulator` (unused with log-head PPNs).
    pub drive: DriveSetup,
}

/// `ops_from_trace` with `options` (a fill, the simulated drive). `progress` hears the
/// simulator's phases.
pub fn ops_from_trace_with(
    path: &Path,
    format: Option<TraceFormat>,
    device_bytes: Option<u64>,
    source: PpnSource,
    options: &OpsOptions,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<MapOps> {
    let fill = options.fill;
    let mut reader = TraceReader::open(path, format, false)?;
    let mut requests = Vec::new();
    let mut end_bytes = 0u64;
    while let Some(r) = reader.next_request()? {
        end_bytes = end_bytes.max(r.offset_bytes + r.length_bytes);
        requests.push(r);
    }
    let device_bytes = device_bytes.unwrap_or(end_bytes.div_ceil(1 << 30).max(1) << 30);
    let logical_pages = device_bytes / PAGE_BYTES;
    anyhow::ensure!(
        logical_pages <= 1 << 32,
        "{}: device of {device_bytes} bytes has more than 2^32 pages",
        path.display()
    );
    anyhow::ensure!(
        end_bytes <= device_bytes,
        "{}: requests reach byte {end_bytes}, beyond the device's {device_bytes} (--device-bytes)",
        path.display()
    );
    // The fill's updates are held like the trace's, 8 bytes each.
    anyhow::ensure!(
        !fill || logical_pages <= MAX_FILL_PAGES,
        "{}: a fill of a {device_bytes}-byte device would be {logical_pages} updates; \
         --precondition takes devices of up to {} pages (1 TiB)",
        path.display(),
        MAX_FILL_PAGES
    );
    let mut ops = MapOps {
        logical_pages,
        ..MapOps::default()
    };
    for r in &requests {
        let first = r.offset_bytes / PAGE_BYTES;
        let end = (r.offset_bytes + r.length_bytes).div_ceil(PAGE_BYTES);
        if matches!(r.op, Op::Read | Op::Write) {
            ops.gets.extend((first..end).map(|l| l as u32));
        }
    }
    match source {
        PpnSource::LogHead => {
            let mut head = 0u32;
            if fill {
                // At most MAX_FILL_PAGES LPNs (checked above).
                let lpns = logical_pages as u32;
                ops.updates.extend((0..lpns).map(|lpn| (lpn, lpn)));
                ops.fill_updates = u64::from(lpns);
                head = lpns;
            }
            for r in &requests {
                match r.op {
                    Op::Write => {
                        let first = r.offset_bytes / PAGE_BYTES;
                        let end = (r.offset_bytes + r.length_bytes).div_ceil(PAGE_BYTES);
                        for lpn in first..end {
                            ops.updates.push((lpn as u32, head));
                            head =
                                head.checked_add(1)
                                    .filter(|&h| h != REMOVE)
                                    .ok_or_else(|| {
                                        anyhow::anyhow!(
                                            "{}: more than 2^32 page writes",
                                            path.display()
                                        )
                                    })?;
                        }
                    }
                    Op::Trim => {
                        // Only whole pages are deallocated, as the FTL does.
                        let first = r.offset_bytes.div_ceil(PAGE_BYTES);
                        let end = (r.offset_bytes + r.length_bytes) / PAGE_BYTES;
                        ops.updates
                            .extend((first..end).map(|lpn| (lpn as u32, REMOVE)));
                    }
                    Op::Read | Op::Flush => {}
                }
            }
        }
        PpnSource::Simulator => {
            let sim =
                simulator_updates(path, format, device_bytes, fill, &options.drive, progress)?;
            (ops.updates, ops.fill_updates, ops.simulator) =
                (sim.updates, sim.fill_updates, Some(sim.run));
        }
    }
    ops.writes = ops.updates.iter().filter(|u| u.1 != REMOVE).count() as u64;
    ops.random_gets = shuffled_live(&ops.oracle());
    Ok(ops)
}

/// The mapped LPNs of `oracle`, shuffled (Fisher-Yates, fixed seed).
fn shuffled_live(oracle: &[u32]) -> Vec<u32> {
    let mut lpns: Vec<u32> = (0..oracle.len() as u32)
        .filter(|&l| oracle[l as usize] != REMOVE)
        .collect();
    let mut rng = crate::rng::SplitMix64::new(0x6d61_7062);
    for i in (1..lpns.len()).rev() {
        let j = rng.bounded(i as u64 + 1) as usize;
        lpns.swap(i, j);
    }
    lpns
}

/// A table that records every update the FTL makes to it.
struct Recording {
    inner: FlatMapping,
    log: Rc<RefCell<Vec<(u32, u32)>>>,
    /// The log's length when the simulator started measuring (after its preconditioning).
    measured_from: Rc<Cell<usize>>,
}

impl MappingTable for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn get(&self, lpn: u32) -> Option<u32> {
        self.inner.get(lpn)
    }
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        self.log.borrow_mut().push((lpn, ppn));
        self.inner.set(lpn, ppn)
    }
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        let old = self.inner.remove(lpn);
        if old.is_some() {
            self.log.borrow_mut().push((lpn, REMOVE));
        }
        old
    }
    fn live_mappings(&self) -> u64 {
        self.inner.live_mappings()
    }
    fn heap_bytes(&self) -> usize {
        self.inner.heap_bytes()
    }
    fn reset_activity(&mut self) {
        self.measured_from.set(self.log.borrow().len());
    }
}

/// Spare fraction of the simulated device behind `--ppns simulator`: 7 %, a common consumer
/// drive's.
pub const SIM_SPARE_FACTOR: f64 = 0.07;

/// The drive behind `PpnSource::Simulator`: the default preset, these settings over it, and
/// flash sized to the device plus `spare_factor`. Which drive wrote the PPNs is what a
/// researcher varies (spare, GC frontiers and thresholds, streams, an aged drive), so both are
/// the user's (`ftlab mapbench --spare-factor`, `--sim-set`).
#[derive(Clone, Debug, PartialEq)]
pub struct DriveSetup {
    /// (physical - logical) / physical, as MQSim's `Overprovisioning_Ratio`.
    pub spare_factor: f64,
    /// `KEY=VALUE` assignments as `ftlab sim --set` takes them (docs/config.md), applied after
    /// mapbench's own defaults (`flash.superblock_dies=1`, `workload.precondition_overwrites=0`)
    /// and before the flash is sized, so a geometry key sizes it too. `OWNED_KEYS` are refused.
    pub settings: Vec<String>,
}

impl Default for DriveSetup {
    fn default() -> Self {
        DriveSetup {
            spare_factor: SIM_SPARE_FACTOR,
            settings: Vec::new(),
        }
    }
}

/// Keys (or whole tables) `DriveSetup::settings` may not set: mapbench sets them from the trace
/// and `--precondition`, its LPNs are 4 KiB pages, or they do not apply (the updates are
/// recorded through mapbench's own table, whatever `ftl.mapping` says).
pub const OWNED_KEYS: [&str; 8] = [
    "capacity",
    "flash.blocks_per_die",
    "flash.page_size_bytes",
    "workload.trace",
    "workload.format",
    "workload.precondition",
    "ftl.mapping",
    "ftl.learned_buffer_divisor",
];

/// Why `setting` (`KEY=VALUE`) cannot be part of a `DriveSetup`, if it cannot.
pub fn refused_setting(setting: &str) -> Option<String> {
    let Some((key, _)) = setting.split_once('=') else {
        return Some(format!("`{setting}` is not KEY=VALUE"));
    };
    let key = key.trim();
    let owned = OWNED_KEYS.iter().find(|&&k| {
        key == k || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}."))
    })?;
    Some(match *owned {
        "capacity" | "flash.blocks_per_die" => format!(
            "`{key}`: mapbench sizes the flash to the device (--device-bytes) plus the spare \
             (--spare-factor)"
        ),
        "flash.page_size_bytes" => format!(
            "`{key}`: mapbench's pages are {PAGE_BYTES} bytes, its LPNs and the simulator's alike"
        ),
        "workload.precondition" => format!("`{key}`: use --precondition"),
        "workload.trace" | "workload.format" => {
            format!("`{key}`: the trace is the one benchmarked (and --format its format)")
        }
        _ => format!(
            "`{key}`: the simulator's updates are recorded through mapbench's own table; \
             --tables and --learned-buffer-divisor choose what is compared"
        ),
    })
}

/// What `simulator_updates` recorded.
struct SimulatedUpdates {
    updates: Vec<(u32, u32)>,
    /// How many of the first updates are the fill's.
    fill_updates: u64,
    /// What the drive did during the trace.
    run: SimulatorRun,
}

/// The simulator's table updates for the trace (after a fill, with `fill`).
fn simulator_updates(
    path: &Path,
    format: Option<TraceFormat>,
    device_bytes: u64,
    fill: bool,
    drive: &DriveSetup,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<SimulatedUpdates> {
    // The default preset's flash, with just enough blocks per die for the device plus the
    // spare and per-die superblocks, so that garbage collection relocates pages as in a real
    // drive, once the trace has written more than the free space.
    // (A fill does not make it run sooner on traces that begin with mkfs: its discard of the
    // whole device frees everything again.)
    anyhow::ensure!(
        drive.spare_factor > 0.0 && drive.spare_factor < 1.0,
        "spare factor {} is not between 0 and 1",
        drive.spare_factor
    );
    let mut builder = ConfigBuilder::from_preset(crate::config::DEFAULT_PRESET)?;
    // Superblocks of one die's block: with few blocks per die, whole-device stripes would
    // leave GC too few units to work with.
    builder.set("flash.superblock_dies=1")?;
    builder.set("workload.precondition_overwrites=0")?;
    for setting in &drive.settings {
        if let Some(why) = refused_setting(setting) {
            anyhow::bail!("--sim-set {why}");
        }
        builder
            .set(setting)
            .map_err(|e| anyhow::anyhow!("--sim-set {setting}: {e}"))?;
    }
    let f = builder
        .clone()
        .build()
        .map_err(|e| anyhow::anyhow!("--sim-set {}: {e}", drive.settings.join(" ")))?
        .flash;
    let block_row_bytes = u64::from(f.channels)
        * u64::from(f.dies_per_channel)
        * u64::from(f.planes_per_die)
        * u64::from(f.pages_per_block)
        * u64::from(f.page_size_bytes);
    let physical_bytes = (device_bytes as f64 / (1.0 - drive.spare_factor)).ceil() as u64;
    let blocks_per_die = physical_bytes.div_ceil(block_row_bytes).max(8);
    builder.set(&format!("flash.blocks_per_die={blocks_per_die}"))?;
    builder.set(&format!("workload.precondition={fill}"))?;
    builder.set(&format!("capacity.logical_bytes={device_bytes}"))?;
    builder.set(&format!(
        "workload.trace={}",
        toml::Value::String(path.display().to_string())
    ))?;
    if let Some(f) = format {
        builder.set(&format!("workload.format=\"{}\"", f.name()))?;
    }
    let config = builder.build().map_err(|e| {
        anyhow::anyhow!(
            "the simulated drive ({} bytes, spare factor {}): {e} (here the over-provisioning \
             is --spare-factor; other keys are --sim-set's)",
            device_bytes,
            drive.spare_factor
        )
    })?;
    let log = Rc::new(RefCell::new(Vec::new()));
    let measured_from = Rc::new(Cell::new(0));
    let table = Recording {
        inner: FlatMapping::new(config.geometry()?.logical_pages),
        log: log.clone(),
        measured_from: measured_from.clone(),
    };
    let report = crate::sim::run_with(&config, table, progress)?;
    let fill_updates = measured_from.get() as u64;
    Ok(SimulatedUpdates {
        updates: log.take(),
        fill_updates,
        run: SimulatorRun {
            spare_factor: drive.spare_factor,
            settings: drive.settings.clone(),
            waf: report.waf,
            gc_write_pages: report.gc_write_pages,
            erases: report.erases,
        },
    })
}

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
            (Some(a), Some(b)) if b > 0.0 => Some(crate::report::round6(a / b)),
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

/// One u64 per logical page, the JDB-FTL report's baseline.
pub struct FlatU64 {
    ppn_of_lpn: Vec<u64>,
    live: u64,
}

impl FlatU64 {
    pub fn new(logical_pages: u64) -> Self {
        Self {
            ppn_of_lpn: crate::table::filled(logical_pages as usize, u64::MAX),
            live: 0,
        }
    }
}

impl MappingTable for FlatU64 {
    fn name(&self) -> &'static str {
        "flat-u64"
    }
    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let v = self.ppn_of_lpn[lpn as usize];
        (v != u64::MAX).then_some(v as u32)
    }
    #[inline]
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], u64::from(ppn));
        self.live += u64::from(old == u64::MAX);
        (old != u64::MAX).then_some(old as u32)
    }
    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], u64::MAX);
        self.live -= u64::from(old != u64::MAX);
        (old != u64::MAX).then_some(old as u32)
    }
    fn live_mappings(&self) -> u64 {
        self.live
    }
    fn heap_bytes(&self) -> usize {
        self.ppn_of_lpn.capacity() * 8
    }
}

/// Bytes glibc reports in use (small chunks plus mmapped ones); None on other platforms.
pub fn allocator_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// The process's peak resident set so far, in bytes.
pub fn peak_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `rusage` is plain integers (all zeros is a valid value), and getrusage only
        // writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        // Linux counts `ru_maxrss` in KiB.
        (rc == 0).then(|| usage.ru_maxrss as u64 * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// What the allocator holds now beyond `before` (an `allocator_in_use()` reading).
fn allocated_since(before: Option<u64>) -> Option<u64> {
    before
        .zip(allocator_in_use())
        .map(|(b, a)| a.saturating_sub(b))
}

/// Per-operation timing with the time-stamp counter: `rdtscp` waits for earlier instructions,
/// its own cost (measured) is subtracted, and ticks are converted with a rate calibrated against
/// the OS clock. One op per sample, so a slow op is seen as slow (no averaging inside batches).
pub struct Clock {
    ticks_per_ns: f64,
    overhead_ticks: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    let mut aux = 0u32;
    // SAFETY: rdtscp has no memory effects; every x86_64 CPU this runs on has it.
    unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Clock {
    pub fn calibrate() -> Self {
        let (t0, i0) = (ticks(), Instant::now());
        while i0.elapsed().as_millis() < 20 {
            std::hint::spin_loop();
        }
        let ticks_per_ns = (ticks() - t0) as f64 / i0.elapsed().as_nanos() as f64;
        let mut overhead = u64::MAX;
        for _ in 0..10_000 {
            let a = ticks();
            let b = ticks();
            overhead = overhead.min(b - a);
        }
        Clock {
            ticks_per_ns,
            overhead_ticks: overhead,
        }
    }
    fn method(&self) -> String {
        format!(
            "{}: one sample per operation, timer cost ({} ticks) subtracted, {:.3} ticks/ns",
            if cfg!(target_arch = "x86_64") {
                "rdtscp"
            } else {
                "monotonic clock"
            },
            self.overhead_ticks,
            self.ticks_per_ns
        )
    }
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
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
    let cursor = table
        .learned_activity()
        .and_then(|a| a.cursor_get_fraction());
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
    let mops =
        |n: usize, s: f64| (n > 0 && s > 0.0).then(|| crate::report::round6(n as f64 / s / 1e6));
    TableResult {
        name,
        bytes,
        bytes_per_live_mapping: crate::report::bytes_per_mapping(bytes, live),
        bytes_before_compact,
        bytes_peak,
        allocator_bytes,
        total_ms: crate::report::round6(total_ms),
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
        compressed_get_fraction: compressed_get_fraction.map(crate::report::round6),
        cursor_get_fraction: cursor_get_fraction.map(crate::report::round6),
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
            "simulated drive (spare factor {}{settings}): WAF {:.3}, {} blocks erased, {} pages moved by GC",
            sim.spare_factor, sim.waf, sim.erases, sim.gc_write_pages
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

/// The learned table on a device `tiles` times the trace's: the trace's updates repeated in each
/// slice of the LPN space, PPNs continuing from the log head (tile k's i-th page write takes
/// PPN k x writes + i). Updates are generated on the fly: the sequence itself would not fit in
/// memory at 16 TiB.
#[derive(Clone, Debug, Serialize)]
pub struct TiledResult {
    pub tiles: u64,
    pub logical_pages: u64,
    pub device_bytes: u64,
    pub updates: u64,
    pub live_mappings: u64,
    pub bytes: u64,
    pub allocator_bytes: Option<u64>,
    pub bytes_per_live_mapping: f64,
    /// The most the table held during the run (`MappingTable::peak_heap_bytes`): its buffer at
    /// its fullest and its arena's garbage and growth room included.
    pub bytes_peak: u64,
    pub set_mops: f64,
    pub seconds: f64,
    pub lossless_verified: bool,
    /// The process's peak resident set over the whole run (`getrusage`), the trace's updates
    /// and the read-back's expected values included: a cross-check of `bytes_peak` from above.
    pub peak_resident_bytes: Option<u64>,
    /// What flat arrays would need for the same device.
    pub flat_u32_bytes: u64,
    pub flat_u64_bytes: u64,
}

/// Runs the tiled benchmark; `progress(done_tiles)` is called after each tile.
pub fn run_tiled(
    ops: &MapOps,
    tiles: u64,
    learned_buffer_divisor: u64,
    mut progress: impl FnMut(u64),
) -> anyhow::Result<TiledResult> {
    let tile_lpns = ops.logical_pages;
    let logical_pages = tiles * tile_lpns;
    anyhow::ensure!(
        tiles >= 1,
        "no tile: the device holds none of the trace's {tile_lpns} LPNs"
    );
    anyhow::ensure!(
        logical_pages <= 1 << 32,
        "{tiles} tiles of {tile_lpns} LPNs exceed 2^32 LPNs"
    );
    anyhow::ensure!(
        u128::from(tiles) * u128::from(ops.writes) < u128::from(REMOVE),
        "{tiles} tiles of {} page writes exceed 2^32 PPNs",
        ops.writes
    );
    let oracle = ops.oracle();
    let before = allocator_in_use();
    let mut table = LearnedMapping::new(logical_pages).buffer_live_divisor(learned_buffer_divisor);
    let t0 = Instant::now();
    for k in 0..tiles {
        let lpn_base = (k * tile_lpns) as u32;
        let ppn_base = (k * ops.writes) as u32;
        for &(lpn, v) in &ops.updates {
            let lpn = lpn_base + lpn;
            if v == REMOVE {
                black_box(table.remove(lpn));
            } else {
                black_box(table.set(lpn, ppn_base + v));
            }
        }
        progress(k + 1);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let bytes_peak = table.peak_heap_bytes() as u64;
    table.compact();
    let bytes = table.heap_bytes() as u64;
    let allocator_bytes = allocated_since(before);
    let live_per_tile = oracle.iter().filter(|&&v| v != REMOVE).count() as u64;
    let mut ok = table.live_mappings() == live_per_tile * tiles;
    for k in 0..tiles {
        let lpn_base = (k * tile_lpns) as u32;
        let ppn_base = (k * ops.writes) as u32;
        for (lpn, &v) in oracle.iter().enumerate() {
            let want = (v != REMOVE).then(|| ppn_base + v);
            ok &= table.get(lpn_base + lpn as u32) == want;
        }
    }
    let live = table.live_mappings();
    Ok(TiledResult {
        tiles,
        logical_pages,
        device_bytes: logical_pages * PAGE_BYTES,
        updates: tiles * ops.updates.len() as u64,
        live_mappings: live,
        bytes,
        allocator_bytes,
        bytes_per_live_mapping: crate::report::bytes_per_mapping(bytes, live),
        bytes_peak,
        set_mops: crate::report::round6(
            (tiles * ops.updates.len() as u64) as f64 / seconds.max(1e-9) / 1e6,
        ),
        seconds: crate::report::round6(seconds),
        lossless_verified: ok,
        peak_resident_bytes: peak_resident_bytes(),
        flat_u32_bytes: logical_pages * 4,
        flat_u64_bytes: logical_pages * 8,
    })
}
