//! How a device is set up: its options, its exports as configured, and the limits a front
//! end works within.

use crate::{Placement, PlacementRanges, RecordFormat};
use ftlab_core::units::UnknownChoice;
use ftlab_store::codec::Codec;

/// The largest request the device takes (a read's data or a write's payload): 32 MiB, as the
/// NBD server advertises it. Trims and zeroes carry no payload and may be longer.
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

/// Eight requests of the largest size at once.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 256 << 20;

/// Whole pages from which a request alone in flight goes to the store as one parallel batch.
pub const BATCH_PAGES: usize = 8;

/// A device log segment is closed and a new one started past this size: a sixteenth of the
/// device, within [1 MiB, 32 MiB], so that a small device's log is cleaned finely enough to stay
/// near its size and a large one's keeps few files.
pub(crate) fn log_segment_bytes(device_bytes: u64) -> usize {
    ((device_bytes / 16).clamp(1 << 20, 32 << 20) as usize).next_multiple_of(1 << 20)
}

/// How replies are timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Reply as soon as the request is done in RAM; simulated latency is only accounted.
    None,
    /// Hold each reply until the request's simulated completion (FEMU-style).
    Real,
    /// Hold each reply for the simulated latency times this factor.
    Scaled(f64),
}

impl Latency {
    pub fn parse(s: &str) -> Result<Latency, UnknownChoice> {
        match s {
            "none" => Ok(Latency::None),
            "real" => Ok(Latency::Real),
            _ => s
                .strip_prefix("scaled:")
                .and_then(|x| x.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Latency::Scaled)
                .ok_or_else(|| UnknownChoice::new(s, "latency", "none, real or scaled:FACTOR")),
        }
    }
}

pub struct DeviceOptions {
    /// The export's name when `exports` is empty; clients asking for another name are refused
    /// ("" is the default).
    pub export_name: String,
    /// Several exports (NVMe namespaces) sharing the device's flash and FTL, each a range of its
    /// logical space in order; empty: one export of the whole device, `export_name`.
    pub exports: Vec<ExportSpec>,
    pub latency: Latency,
    pub codec: Codec,
    /// Write every request the FTL model sees here, so that `ftlab sim --trace` replays what
    /// the server simulated.
    pub record: Option<std::path::PathBuf>,
    pub record_format: RecordFormat,
    /// The page store's memory limit (zram's `mem_limit`): writes needing more get ENOSPC.
    pub mem_limit_bytes: Option<u64>,
    /// Bytes of requests in flight beyond each connection's own allowance, for all of a front
    /// end's connections together (`budget`); at least `budget::MIN_INFLIGHT_BYTES`.
    pub max_inflight_bytes: u64,
    /// Export read-only (`NBD_FLAG_READ_ONLY`): writes, trims and zeroes are refused with EPERM.
    pub read_only: bool,
    /// Keep the device in this directory's log (docs/serve.md, "A durable device"): recovered
    /// at start, every write and trim appended, FLUSH and FUA made durable per `durability`.
    pub data: Option<std::path::PathBuf>,
    pub durability: Durability,
    /// With `data`: a checkpoint once this many bytes were logged since the last (and at a
    /// clean shutdown); the cleaner runs after each. `None`: by the device's size
    /// (`default_checkpoint_every_bytes`).
    pub checkpoint_every_bytes: Option<u64>,
    /// With `data`, writable: who runs the checkpoints and the cleaner.
    pub maintenance: Maintenance,
    /// With `data`: the cache of decompressed pages in front of snapshot and clone reads.
    pub cache_bytes: u64,
    pub cache_policy: ftlab_store::cache::CachePolicy,
}

/// Who keeps a writable durable device's directory bounded: checkpoints and the cleaner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Maintenance {
    /// A thread of the device's own looks every 200 ms (`Device::maintain`): every user of a
    /// durable device, the server, the SQLite VFS or the library, gets them without asking. It
    /// prints what it did (`log_done`) and always what failed, to stderr, prefixed `ftlab: `.
    Background { log_done: bool },
    /// Only when the owner calls `Device::maintain` (tests that count checkpoints).
    Manual,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance::Background { log_done: false }
    }
}

/// A checkpoint once a quarter of the device's size was logged, within [16 MiB, 256 MiB]: a
/// small device's log stays near its size, a large one's checkpoints stay infrequent.
pub fn default_checkpoint_every_bytes(device_bytes: u64) -> u64 {
    (device_bytes / 4).clamp(16 << 20, 256 << 20)
}

/// When the device log is made durable (`fdatasync`), with `data`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// At each FLUSH and FUA write, before it is answered (concurrent flushes share one sync).
    #[default]
    Flush,
    /// After every write, trim and flush, before it is answered.
    Always,
    /// Never: FLUSH is answered at once; a crash loses what the OS had not written back.
    Never,
}

impl Durability {
    pub fn parse(s: &str) -> Result<Self, UnknownChoice> {
        match s {
            "flush" => Ok(Self::Flush),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(UnknownChoice::new(
                other,
                "durability",
                "flush, always or never",
            )),
        }
    }
}

/// and where its writes are placed.
#[derive(Clone, Debug, Default)]
pub struct ExportSpec {
    pub name: String,
    /// None: what the exports before it leave of the device.
    pub size_bytes: Option<u64>,
    /// The placement ID of its writes (reclaim group and placement handle), unless `ranges`
    /// says otherwise.
    pub placement: Placement,
    /// LBA ranges (offsets within the export) and their placement IDs.
    pub ranges: Option<PlacementRanges>,
    /// Its placement handle list (NVMe's, per namespace): placement handle `i` of a placement ID
    /// is the device's reclaim unit handle `handles[i]`. Empty: handle `i` is the device's
    /// handle `i`.
    pub read_only: bool,
    pub handles: Vec<u8>,
}
