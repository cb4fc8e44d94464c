//! Configuration: TOML presets, a TOML file, and `--set key=value` overrides, merged in that order
//! into one [`Config`], then validated into a [`Geometry`](crate::geometry::Geometry).
//!
//! Every key lives in a table named after the layer that reads it (`flash.*`, `capacity.*`,
//! `ftl.*`, `workload.*`, `report.*`); docs/config.md lists them all.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// A preset: a name, the TOML text, and where its numbers come from.
pub struct Preset {
    pub name: &'static str,
    pub toml: &'static str,
    pub summary: &'static str,
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "femu",
        toml: include_str!("../presets/femu.toml"),
        summary: "FEMU bbssd defaults: 8x8 dies, 256 blocks/die, 256 pages/block, 4 KiB, 40/200/2000 us, 12 of 16 GiB, GC 75/95",
    },
    Preset {
        name: "hexa",
        toml: include_str!("../presets/hexa.toml"),
        summary: "The Hexa-SSD paper's evaluation: 8x8 dies, 8 KiB pages, 256 pages/block, read 60 us, program 700 us, 64 MiB buffer",
    },
    Preset {
        name: "femu-fdp",
        toml: include_str!("../presets/femu-fdp.toml"),
        summary: "NVMe FDP (TP4146) on FEMU bbssd as the FDP Ethereum Benchmark runs it: 8 persistently isolated handles, GC at 60 %, the LSM workload placed by tier",
    },
    Preset {
        name: "validation-uniform",
        toml: include_str!("../presets/validation-uniform.toml"),
        summary: "WAF reference check: 2 Mi pages, 256-page blocks, rho 7 %, greedy, GC below 2 free blocks, uniform 4 KiB",
    },
];

pub const DEFAULT_PRESET: &str = "femu";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown preset `{0}` (known: femu, femu-fdp, hexa, validation-uniform)")]
    UnknownPreset(String),
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("--set `{0}`: expected key=value, e.g. flash.channels=4")]
    BadOverride(String),
    #[error("config key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error(
        "--set {key}={value}: out of range: an integer must be between -9223372036854775808 \
         and 9223372036854775807 (2^63 - 1, TOML's range)"
    )]
    OutOfRange { key: String, value: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub flash: FlashConfig,
    pub capacity: CapacityConfig,
    pub ftl: FtlConfig,
    pub workload: WorkloadConfig,
    #[serde(default)]
    pub report: ReportConfig,
    #[serde(default)]
    pub fdp: FdpConfig,
}

/// NVMe Flexible Data Placement (TP4146, NVMe 2.0 base specification 5.x "Flexible Data
/// Placement"): reclaim groups, reclaim unit handles and their isolation, and where a write's
/// placement comes from (docs/config.md, "fdp").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FdpConfig {
    /// Reclaim groups (RG): the die groups (`flash.superblock_dies` dies each) split evenly among
    /// them; a write names its RG, and GC of an RG stays inside it.
    #[serde(default = "one")]
    pub reclaim_groups: u32,
    /// One entry per reclaim unit handle (RUH), its isolation type. Empty: `ftl.streams`
    /// persistently isolated handles (a stream is a persistently isolated handle).
    #[serde(default)]
    pub handles: Vec<HandleType>,
    /// Which superblocks GC may pick when a write needs room.
    #[serde(default)]
    pub gc_scope: GcScope,
    /// Where a host write's handle comes from.
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// A reclaim unit open longer than this (simulated ns) is closed unfilled at its handle's
    /// next write (an "RU time limit exceeded" event); 0 = no limit.
    #[serde(default)]
    pub ru_time_limit_ns: u64,
}

impl Default for FdpConfig {
    fn default() -> Self {
        Self {
            reclaim_groups: 1,
            handles: Vec::new(),
            gc_scope: GcScope::default(),
            placement: PlacementPolicy::default(),
            ru_time_limit_ns: 0,
        }
    }
}

/// A reclaim unit handle's isolation type (NVMe FDP's RUH Type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandleType {
    /// Persistently isolated: GC moves the handle's data only into reclaim units of the same
    /// handle, so its data never shares an erase unit with another handle's.
    #[serde(alias = "persistently_isolated")]
    Persistent,
    /// Initially isolated: host writes fill the handle's own reclaim units, but GC may move its
    /// data into a reclaim unit shared with the other initially isolated handles.
    #[serde(alias = "initially_isolated")]
    Initial,
}

/// GC's victim scope (`fdp.gc_scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GcScope {
    /// Any used superblock of the reclaim group (today's GC).
    #[default]
    Device,
    /// A write of a persistently isolated handle that needs room collects that handle's own
    /// superblocks first (a scan), and the whole group only when it has none to give: a handle
    /// of cold data is not made to pay for a hot one's invalidations.
    Handle,
}

/// Where a host write's placement handle comes from (`fdp.placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementPolicy {
    /// The placement ID the host gave (trace column, range file, generator, export).
    #[default]
    Host,
    /// The device guesses: a page rewritten within a short interval (in host page writes) goes
    /// to a hotter handle; host placement IDs are ignored (docs/config.md, "fdp").
    Auto,
    /// Each page by its true lifetime (until it is next overwritten or trimmed), known offline
    /// from the whole request sequence: ideal separation, a reference no device can reach.
    Ideal,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FlashConfig {
    pub channels: u32,
    pub dies_per_channel: u32,
    #[serde(default = "one")]
    pub planes_per_die: u32,
    pub blocks_per_die: u32,
    pub pages_per_block: u32,
    pub page_size_bytes: u32,
    pub read_latency_ns: u64,
    pub program_latency_ns: u64,
    pub erase_latency_ns: u64,
    /// Channel (NAND bus) transfer rate; 0 = transfers take no time.
    #[serde(default)]
    pub channel_mb_per_s: u64,
    /// Dies one superblock (the GC and allocation unit) spans; 0 = all dies.
    #[serde(default)]
    pub superblock_dies: u32,
}

/// Exactly one of the three says how much of the flash the host sees.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapacityConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_bytes: Option<u64>,
    /// rho = (physical - logical) / logical, as FEMU and most papers use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_provisioning: Option<f64>,
    /// (physical - logical) / physical, as MQSim's `Overprovisioning_Ratio` uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_factor: Option<f64>,
}

/// The logical-to-physical mapping table (`ftl.mapping`): every table maps the same, and
/// differs in DRAM and speed (docs/mapping.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MappingKind {
    /// One u32 per logical page.
    #[default]
    Flat,
    /// A hash map of the live mappings.
    Hash,
    /// Sorted runs of consecutive PPNs.
    Extent,
    /// Learned segments over groups of LPNs, with an update buffer.
    Learned,
}

impl std::fmt::Display for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Open => "open",
            Self::Closed => "closed",
        })
    }
}

impl MappingKind {
    pub const ALL: [MappingKind; 4] = [Self::Flat, Self::Hash, Self::Extent, Self::Learned];

    /// The name `ftl.mapping` takes (and the report gives).
    pub fn name(self) -> &'static str {
        match self {
            Self::Flat => "flat",
            Self::Hash => "hash",
            Self::Extent => "extent",
            Self::Learned => "learned",
        }
    }
}

/// The synthetic generator (`workload.kind`). Held as its name in the configuration and read
/// through `WorkloadConfig::generator`, so that a device served over NBD, which runs no
/// generator, is not refused for the workload section it ignores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeneratorKind {
    Sequential,
    Uniform,
    Zipf,
    HotCold,
    Jesd219,
    Lsm,
}

impl GeneratorKind {
    pub fn parse(name: &str) -> Result<Self, crate::units::UnknownChoice> {
        Ok(match name {
            "sequential" | "seq" => Self::Sequential,
            "uniform" | "random" => Self::Uniform,
            "zipf" => Self::Zipf,
            "hotcold" => Self::HotCold,
            "jesd219" => Self::Jesd219,
            "lsm" => Self::Lsm,
            other => {
                return Err(crate::units::UnknownChoice::new(
                    other,
                    "the workload",
                    "sequential, uniform, zipf, hotcold, jesd219 or lsm",
                ))
            }
        })
    }
}

/// How a trace is replayed (`workload.replay`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Replay {
    /// Requests arrive at the trace's timestamps (times `time_scale`).
    #[default]
    Open,
    /// `queue_depth` requests outstanding, each issued as one completes.
    Closed,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FtlConfig {
    #[serde(default)]
    pub mapping: MappingKind,
    /// `learned` only: its update buffer holds up to one in this many live mappings (a power
    /// of two; docs/mapping.md, "How large a buffer").
    #[serde(default = "learned_buffer_divisor")]
    pub learned_buffer_divisor: u64,
    #[serde(default = "one")]
    pub streams: u32,
    /// GC relocations go to their own frontier per stream instead of the host's.
    #[serde(default)]
    pub gc_separate_frontier: bool,
    /// Background GC runs while more than this percentage of superblocks is in use.
    pub gc_thres_pcent: f64,
    /// Foreground GC (host writes wait) while more than this percentage is in use.
    pub gc_thres_pcent_high: f64,
    /// Foreground GC whenever fewer than this many superblocks are free, whatever the percentages.
    #[serde(default = "two")]
    pub gc_free_superblocks_min: u32,
    /// Device write buffer in MiB (FIFO, coalescing; fractions allowed); 0 = writes go straight
    /// to flash.
    #[serde(default)]
    pub write_buffer_mib: f64,
    /// Host interface (PCIe) rate added to every page a request moves; 0 = free.
    #[serde(default)]
    pub host_interface_mb_per_s: u64,
    /// The share of the translation pages (the mapping table as stored on flash, `page size /
    /// mapping_entry_bytes` entries each) that power-loss protection covers: at most this share
    /// may be dirty (changed in DRAM, not yet on flash) at once; one more is first written back.
    /// 1 = all of them: nothing is ever written back, and the model is off (docs/persistence.md).
    #[serde(default = "one_f64")]
    pub protected_ratio: f64,
    /// Bytes of one mapping entry in a translation page.
    #[serde(default = "four_u32")]
    pub mapping_entry_bytes: u32,
    /// Which dirty translation page is written back when the protected budget is full.
    #[serde(default)]
    pub dirty_victim: DirtyVictim,
    /// DRAM for the mapping table, a DFTL-style cache of translation pages: a lookup whose page
    /// is not cached reads it from flash first (a map read), evicting the least recently used
    /// (written back if dirty). 0 = the whole table is cached (the default).
    #[serde(default)]
    pub mapping_cache_bytes: u64,
    /// The order the write buffer's pages leave in (docs/persistence.md).
    #[serde(default)]
    pub buffer_policy: BufferPolicy,
    /// How garbage collection picks its victim.
    #[serde(default)]
    pub gc_policy: GcPolicy,
}

/// GC's victim choice (`ftl.gc_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GcPolicy {
    /// The used superblock with the fewest valid pages (O(1), intrusive buckets).
    #[default]
    Greedy,
    /// The one with the highest age x (1 - u) / 2u, u its valid share (Rosenblum and Ousterhout's
    /// log-structured file system): an old, fairly full superblock of cold data goes before a
    /// young, emptier one of hot data that is still emptying by itself. Age is counted in
    /// superblocks closed since it was. A scan of the used superblocks per victim.
    CostBenefit,
}

/// The write buffer's eviction order (`ftl.buffer_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferPolicy {
    /// Pages leave in the order they first entered.
    #[default]
    Fifo,
    /// Pages leave a translation page's worth at a time: the group of the oldest page once it
    /// has waited two buffers' worth of writes, else the dirty translation page with the most
    /// buffered pages, else the largest group (the Hexa-SSD paper's reordering).
    Hexa,
}

/// The dirty translation page written back when one more must become dirty
/// (`ftl.dirty_victim`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirtyVictim {
    /// The one least recently changed.
    #[default]
    Lru,
    /// The one dirty the longest (first dirtied, first written).
    Fifo,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// sequential | uniform | zipf | hotcold | jesd219 (ignored when `trace` is set).
    pub kind: String,
    /// Requests to issue; or give `overwrites` (multiples of the logical capacity written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrites: Option<f64>,
    #[serde(default = "four_kib")]
    pub request_size_bytes: u64,
    /// Percentage of requests that are reads.
    #[serde(default)]
    pub read_pcent: f64,
    #[serde(default = "theta")]
    pub zipf_theta: f64,
    #[serde(default = "eighty")]
    pub hot_access_pcent: f64,
    #[serde(default = "twenty")]
    pub hot_space_pcent: f64,
    /// hotcold only: hot-region writes go to stream 1, cold to stream 0 (needs two handles).
    #[serde(default)]
    pub stream_by_temperature: bool,
    /// lsm: the bytes of unique keys (the last level's size); 0 = 40 % of the span.
    #[serde(default)]
    pub lsm_key_space_bytes: u64,
    /// lsm: the memtable, and so the WAL and each flushed L0 SST.
    #[serde(default = "sixteen_mib")]
    pub lsm_memtable_bytes: u64,
    /// lsm: L0 files that trigger an L0 -> Lbase compaction.
    #[serde(default = "four_u32")]
    pub lsm_l0_files: u32,
    /// lsm: each level's target is this many times the one above.
    #[serde(default = "ten_u32")]
    pub lsm_fanout: u32,
    /// lsm: the largest SST a compaction writes.
    #[serde(default = "sixteen_mib")]
    pub lsm_sst_bytes: u64,
    /// lsm: writes tagged with the FDP Ethereum Benchmark's tiers as placement handles, or all with handle 0.
    #[serde(default)]
    pub lsm_placement: LsmPlacement,
    /// Bytes of the logical space the generator touches; 0 = all of it.
    #[serde(default)]
    pub span_bytes: u64,
    #[serde(default = "one")]
    pub queue_depth: u32,
    #[serde(default = "seed")]
    pub seed: u64,
    /// Sequential fill, then `precondition_overwrites` x capacity of uniform random writes, unmeasured.
    #[serde(default)]
    pub precondition: bool,
    #[serde(default = "two_f")]
    pub precondition_overwrites: f64,
    /// The share of the logical space preconditioning fills (from LBA 0) and overwrites: 0.75
    /// leaves a device three quarters full.
    #[serde(default = "one_f64")]
    pub precondition_fill: f64,
    /// A trace file to replay instead of a generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// A file giving LBA ranges their placement IDs (`START, END, PID` lines, as fio's
    /// `dp_scheme`): every write takes the PID of the range its offset lies in, whatever the
    /// trace or generator said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_ranges: Option<String>,
    /// msr | nbdkit | disksim | blkparse | fio; guessed from the content when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TraceFormat>,
    /// open: requests arrive at trace timestamps x time_scale; closed: queue_depth outstanding.
    #[serde(default)]
    pub replay: Replay,
    #[serde(default = "one_f")]
    pub time_scale: f64,
    /// Addresses beyond the logical capacity wrap around instead of being an error.
    #[serde(default)]
    pub wrap: bool,
    /// Malformed trace lines are counted and skipped instead of being an error.
    #[serde(default)]
    pub skip_bad_lines: bool,
    /// Power fails this many simulated ns into the measured phase: the run stops there, the
    /// write buffer and the dirty translation pages are programmed on capacitor power, and the
    /// durable state is checked against the table (the report's `power_cut`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_cut_at_ns: Option<u64>,
}

/// How the LSM generator tags its writes (`workload.lsm_placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LsmPlacement {
    /// By tier, as the FDP Ethereum Benchmark: 0 WAL, 1 flush, 2 L0 -> Lbase, 3 into a middle
    /// level, 4 into the last (capped at the device's last handle).
    #[default]
    Tiers,
    /// All on handle 0 (the one-PID baseline).
    One,
}

impl WorkloadConfig {
    /// The generator `kind` names.
    pub fn generator(&self) -> Result<GeneratorKind, ConfigError> {
        GeneratorKind::parse(&self.kind)
            .map_err(|reason| invalid("workload.kind", reason.to_string()))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// Width of one time-series interval in simulated nanoseconds.
    #[serde(default = "interval")]
    pub series_interval_ns: u64,
}

impl Default for ReportConfig {
    fn default() -> Self {
        Self {
            series_interval_ns: interval(),
        }
    }
}

fn one_f64() -> f64 {
    1.0
}
fn four_u32() -> u32 {
    4
}
fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}
fn one_f() -> f64 {
    1.0
}
fn two_f() -> f64 {
    2.0
}
/// `ftl.learned_buffer_divisor`'s default: the configuration's own choice (one in 16 live
/// mappings, docs/mapping.md "How large a buffer"), the same as the learned table's default for
/// its other users (a test keeps the two equal).
pub const DEFAULT_LEARNED_BUFFER_DIVISOR: u64 = 16;

fn learned_buffer_divisor() -> u64 {
    DEFAULT_LEARNED_BUFFER_DIVISOR
}
fn sixteen_mib() -> u64 {
    16 << 20
}
fn ten_u32() -> u32 {
    10
}
fn four_kib() -> u64 {
    4096
}
fn theta() -> f64 {
    0.99
}
fn eighty() -> f64 {
    80.0
}
fn twenty() -> f64 {
    20.0
}
fn seed() -> u64 {
    42
}
fn interval() -> u64 {
    100_000_000
}

/// Keys that are alternatives to each other: a layer setting one drops the others from the layers
/// below, so `--set capacity.spare_factor=0.07` over a preset giving `logical_bytes` just works.
const ALTERNATIVES: [(&str, &[&str]); 2] = [
    (
        "capacity",
        &["logical_bytes", "over_provisioning", "spare_factor"],
    ),
    ("workload", &["requests", "overwrites"]),
];

/// Builds a configuration layer by layer: preset, then files, then `key=value` overrides.
#[derive(Clone)]
pub struct ConfigBuilder {
    table: toml::Table,
}

impl ConfigBuilder {
    pub fn from_preset(name: &str) -> Result<Self, ConfigError> {
        let preset = PRESETS
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ConfigError::UnknownPreset(name.to_string()))?;
        let table = parse_toml(preset.toml, &format!("preset {name}"))?;
        Ok(Self { table })
    }

    pub fn merge_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Io {
            path: path.display().to_string(),
            cause,
        })?;
        let layer = parse_toml(&text, &path.display().to_string())?;
        merge(&mut self.table, layer);
        Ok(())
    }

    pub fn merge_str(&mut self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let layer = parse_toml(text, origin)?;
        merge(&mut self.table, layer);
        Ok(())
    }

    /// A complete configuration's TOML (what [`Config::to_toml`] writes) as the only layer.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            table: parse_toml(text, origin)?,
        })
    }

    /// One dotted key set to a TOML value (a sweep's axis value), as `set` does with text.
    pub fn set_value(&mut self, key: &str, value: toml::Value) -> Result<(), ConfigError> {
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::BadOverride(key.to_string()));
        }
        let mut layer = toml::Table::new();
        let mut cursor = &mut layer;
        for part in &parts[..parts.len() - 1] {
            cursor = cursor
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .expect("fresh table");
        }
        cursor.insert(parts[parts.len() - 1].to_string(), value);
        merge(&mut self.table, layer);
        Ok(())
    }

    /// `flash.channels=4`, `workload.kind=zipf`, `capacity.over_provisioning=0.28`. The value is
    /// read as TOML (number, bool, string) and taken as a bare string when that fails.
    pub fn set(&mut self, assignment: &str) -> Result<(), ConfigError> {
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| ConfigError::BadOverride(assignment.to_string()))?;
        let key = key.trim();
        let value = value.trim();
        let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"));
        // An integer TOML cannot hold would otherwise become a string, and be refused as "a
        // string where an integer was expected", which hides the real reason.
        let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
        if parsed.is_none()
            && !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        {
            return Err(ConfigError::OutOfRange {
                key: key.to_string(),
                value: value.to_string(),
            });
        }
        let parsed = parsed.unwrap_or_else(|| toml::Value::String(value.to_string()));
        self.set_value(key, parsed)
            .map_err(|_| ConfigError::BadOverride(assignment.to_string()))
    }

    pub fn build(self) -> Result<Config, ConfigError> {
        self.build_checking(true)
    }

    fn build_checking(self, workload: bool) -> Result<Config, ConfigError> {
        // Deserialise from text so that an error carries a span, which names the key.
        let text = toml::to_string(&self.table).expect("a TOML table serialises");
        let config: Config = toml::from_str(&text).map_err(|e| {
            let key = e
                .span()
                .map(|span| key_at(&text, span.start))
                .unwrap_or_default();
            ConfigError::Parse {
                origin: if key.is_empty() {
                    "configuration".into()
                } else {
                    format!("config key `{key}`")
                },
                message: e.message().to_string(),
            }
        })?;
        config.geometry()?;
        if config.report.series_interval_ns == 0 {
            return Err(invalid("report.series_interval_ns", "must be > 0"));
        }
        if workload {
            config.validate_workload()?;
        }
        Ok(config)
    }

    /// As `build`, for a device that hosts drive (`ftlab serve`): nothing there reads the
    /// `workload` section, so it is not checked (a preset's 4 GiB workload span is no error on
    /// a 1 GiB export).
    pub fn build_device(self) -> Result<Config, ConfigError> {
        self.build_checking(false)
    }
}

/// The dotted key of the line holding byte `at` of a TOML text written by `toml::to_string`.
fn key_at(text: &str, at: usize) -> String {
    let before = &text[..at.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    // The error is about a table itself (an unknown section): its header names it.
    if let Some(header) = line
        .trim()
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
    {
        return header.trim_matches(|c| c == '[' || c == ']').to_string();
    }
    let section = before[..line_start]
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix('[').and_then(|l| l.strip_suffix(']')))
        .unwrap_or("");
    let key = line.split('=').next().unwrap_or("").trim();
    match (section.is_empty(), key.is_empty() || key.starts_with('[')) {
        (_, true) => section.to_string(),
        (true, false) => key.to_string(),
        (false, false) => format!("{section}.{key}"),
    }
}

fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

/// Deep merge of `layer` over `base`, minding [`ALTERNATIVES`].
fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_sub)), toml::Value::Table(layer_sub)) => {
                for (table, keys) in ALTERNATIVES {
                    if key == table && keys.iter().any(|k| layer_sub.contains_key(*k)) {
                        for k in keys {
                            base_sub.remove(*k);
                        }
                    }
                }
                merge(base_sub, layer_sub);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

impl Config {
    pub fn from_preset(name: &str) -> Result<Config, ConfigError> {
        ConfigBuilder::from_preset(name)?.build()
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serialises")
    }

    fn validate_workload(&self) -> Result<(), ConfigError> {
        let w = &self.workload;
        if w.queue_depth == 0 || w.queue_depth > 65536 {
            return Err(invalid("workload.queue_depth", "must be in 1..=65536"));
        }
        if !(w.precondition_fill > 0.0 && w.precondition_fill <= 1.0) {
            return Err(invalid(
                "workload.precondition_fill",
                format!("{} is not in (0, 1]", w.precondition_fill),
            ));
        }
        if !(w.precondition_overwrites.is_finite() && w.precondition_overwrites >= 0.0) {
            return Err(invalid(
                "workload.precondition_overwrites",
                "must be a number >= 0",
            ));
        }
        if !(w.time_scale.is_finite() && (0.0..=1000.0).contains(&w.time_scale)) {
            return Err(invalid(
                "workload.time_scale",
                "must be a number in 0..=1000",
            ));
        }
        // A trace replaces the generator, whose keys then do not matter (a preset's span may
        // exceed a device sized for the trace).
        if w.trace.is_none() {
            self.validate_generator()?;
        }
        Ok(())
    }

    fn validate_generator(&self) -> Result<(), ConfigError> {
        let w = &self.workload;
        let geometry = self.geometry()?;
        let kind = w.generator()?;
        if w.requests.is_some() && w.overwrites.is_some() {
            return Err(invalid(
                "workload.requests",
                "give either workload.requests or workload.overwrites, not both",
            ));
        }
        if let Some(o) = w.overwrites {
            if !(o.is_finite() && o >= 0.0) {
                return Err(invalid("workload.overwrites", "must be a number >= 0"));
            }
        }
        if w.request_size_bytes == 0 || !w.request_size_bytes.is_multiple_of(512) {
            return Err(invalid(
                "workload.request_size_bytes",
                "must be a positive multiple of 512",
            ));
        }
        if w.request_size_bytes > geometry.logical_bytes() {
            return Err(invalid(
                "workload.request_size_bytes",
                "larger than the logical capacity",
            ));
        }
        for (key, v) in [
            ("workload.read_pcent", w.read_pcent),
            ("workload.hot_access_pcent", w.hot_access_pcent),
            ("workload.hot_space_pcent", w.hot_space_pcent),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(invalid(key, format!("{v} is not a percentage in 0..=100")));
            }
        }
        if !(w.hot_space_pcent > 0.0 && w.hot_space_pcent < 100.0) && kind == GeneratorKind::HotCold
        {
            return Err(invalid(
                "workload.hot_space_pcent",
                "hotcold needs a hot region strictly between 0 and 100 %",
            ));
        }
        if !(w.zipf_theta > 0.0 && w.zipf_theta.is_finite() && (w.zipf_theta - 1.0).abs() > 1e-9) {
            return Err(invalid(
                "workload.zipf_theta",
                "must be > 0 and not exactly 1 (the generator's closed form divides by 1 - theta)",
            ));
        }
        if w.span_bytes > geometry.logical_bytes() {
            return Err(invalid(
                "workload.span_bytes",
                format!(
                    "{} exceeds the logical capacity of {} bytes (0 = the whole device)",
                    w.span_bytes,
                    geometry.logical_bytes()
                ),
            ));
        }
        if w.span_bytes != 0 && w.span_bytes < w.request_size_bytes {
            return Err(invalid("workload.span_bytes", "smaller than one request"));
        }
        if w.stream_by_temperature && geometry.handles < 2 {
            return Err(invalid(
                "workload.stream_by_temperature",
                "needs two handles (ftl.streams >= 2, or fdp.handles)",
            ));
        }
        let span = if w.span_bytes == 0 {
            geometry.logical_bytes()
        } else {
            w.span_bytes
        };
        if kind == GeneratorKind::HotCold && span / w.request_size_bytes < 2 {
            return Err(invalid(
                "workload.span_bytes",
                "hotcold needs room for at least two requests (a hot one and a cold one)",
            ));
        }
        if kind == GeneratorKind::Jesd219 && span < 1 << 20 {
            return Err(invalid(
                "workload.span_bytes",
                "jesd219 needs at least 1 MiB to place its transfers (up to 64 KiB) in its three regions",
            ));
        }
        Ok(())
    }
}

/// A trace format (`--format`, `workload.format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    Msr,
    Nbdkit,
    #[serde(alias = "mqsim", alias = "ascii")]
    Disksim,
    Blkparse,
    Fio,
}

impl TraceFormat {
    pub const ALL: [TraceFormat; 5] = [
        TraceFormat::Msr,
        TraceFormat::Nbdkit,
        TraceFormat::Disksim,
        TraceFormat::Blkparse,
        TraceFormat::Fio,
    ];

    /// A format by name, as `--format` and `workload.format` take it: the names (and aliases)
    /// are the serde ones, so the two cannot drift apart.
    pub fn parse(name: &str) -> Result<Self, crate::units::UnknownChoice> {
        use serde::de::IntoDeserializer;
        use serde::Deserialize;
        Self::deserialize(name.into_deserializer()).map_err(|_: serde::de::value::Error| {
            crate::units::UnknownChoice::new(
                name,
                "the trace format",
                "msr, nbdkit, disksim (or mqsim, ascii), blkparse or fio",
            )
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Msr => "msr",
            Self::Nbdkit => "nbdkit",
            Self::Disksim => "disksim",
            Self::Blkparse => "blkparse",
            Self::Fio => "fio",
        }
    }
}
