//! A trace reduced to what a mapping table sees (`MapOps`): its updates, with PPNs from a log
//! head or from the simulator (`DriveSetup`, the drive behind `--ppns simulator`), and its
//! lookups.

use super::REMOVE;
use crate::MapbenchError;
use ftlab_core::config::ConfigBuilder;
use ftlab_core::ftl::mapping::{FlatMapping, MappingTable};
use ftlab_core::request::Op;
use ftlab_sim::sim::Progress;
use ftlab_sim::trace::{TraceFormat, TraceReader};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;

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
    /// Write amplification: 1.0 when the GC moved nothing; `None` (JSON `null`) when the trace
    /// wrote nothing.
    pub waf: Option<f64>,
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

pub(super) const PAGE_BYTES: u64 = 4096;

/// The largest device a fill writes whole: 2 GiB of updates.
pub const MAX_FILL_PAGES: u64 = 1 << 28;

/// Reads `path` into page-level updates and lookups. `device_bytes`: the LPN space (None: the
/// highest address the trace touches, rounded up to a GiB).
pub fn ops_from_trace(
    path: &Path,
    format: Option<TraceFormat>,
    device_bytes: Option<u64>,
    source: PpnSource,
) -> Result<MapOps, MapbenchError> {
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
) -> Result<MapOps, MapbenchError> {
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
    let too_large = |why: String| MapbenchError::TraceTooLarge {
        path: path.to_path_buf(),
        why,
    };
    if logical_pages > 1 << 32 {
        return Err(too_large(format!(
            "device of {device_bytes} bytes has more than 2^32 pages"
        )));
    }
    if end_bytes > device_bytes {
        return Err(too_large(format!(
            "requests reach byte {end_bytes}, beyond the device's {device_bytes} (--device-bytes)"
        )));
    }
    // The fill's updates are held like the trace's, 8 bytes each.
    if fill && logical_pages > MAX_FILL_PAGES {
        return Err(too_large(format!(
            "a fill of a {device_bytes}-byte device would be {logical_pages} updates; \
             --precondition takes devices of up to {MAX_FILL_PAGES} pages (1 TiB)"
        )));
    }
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
                            head = head
                                .checked_add(1)
                                .filter(|&h| h != REMOVE)
                                .ok_or_else(|| too_large("more than 2^32 page writes".into()))?;
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
    let mut rng = ftlab_core::rng::SplitMix64::new(0x6d61_7062);
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
) -> Result<SimulatedUpdates, MapbenchError> {
    // The default preset's flash, with just enough blocks per die for the device plus the
    // spare and per-die superblocks, so that garbage collection relocates pages as in a real
    // drive, once the trace has written more than the free space.
    // (A fill does not make it run sooner on traces that begin with mkfs: its discard of the
    // whole device frees everything again.)
    if !(drive.spare_factor > 0.0 && drive.spare_factor < 1.0) {
        return Err(MapbenchError::SpareFactor(drive.spare_factor));
    }
    let mut builder = ConfigBuilder::from_preset(ftlab_core::config::DEFAULT_PRESET)?;
    // Superblocks of one die's block: with few blocks per die, whole-device stripes would
    // leave GC too few units to work with.
    builder.set("flash.superblock_dies=1")?;
    builder.set("workload.precondition_overwrites=0")?;
    for setting in &drive.settings {
        if let Some(why) = refused_setting(setting) {
            return Err(MapbenchError::RefusedSetting(why));
        }
        builder
            .set(setting)
            .map_err(|source| MapbenchError::SimSet {
                setting: setting.clone(),
                source,
            })?;
    }
    let f = builder
        .clone()
        .build()
        .map_err(|source| MapbenchError::SimSet {
            setting: drive.settings.join(" "),
            source,
        })?
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
    let config = builder.build().map_err(|source| MapbenchError::Drive {
        device_bytes,
        spare_factor: drive.spare_factor,
        source,
    })?;
    let log = Rc::new(RefCell::new(Vec::new()));
    let measured_from = Rc::new(Cell::new(0));
    let geometry = config.geometry()?;
    let table = Recording {
        inner: FlatMapping::new(geometry.logical_pages),
        log: log.clone(),
        measured_from: measured_from.clone(),
    };
    let ftl = ftlab_core::ftl::Ftl::new(&config, geometry, table);
    let report = ftlab_sim::sim::run_with(&config, ftl, progress)?;
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
