//! `ftlab serve`: the emulated SSD as an NBD server. Every request goes through the FTL core (so
//! WAF, GC and latency are accounted as in replay) and its bytes live in the compressed page
//! store. Blocking I/O: a thread per connection does the handshake, then two workers take turns
//! reading a request and execute it (replies may leave out of order, as NBD allows).
//!
//! Owns: sockets, the NBD handshake and transmission phases, wall-clock to simulated-time
//! mapping, latency emulation. Does not know: FTL internals (it calls `Ftl::submit`) or how the
//! store compresses.

pub mod budget;
pub mod dictionary;
pub mod incoming;
pub mod metrics;
pub mod policy;
pub mod protocol;
pub mod tls;

use ftlab_core::config::Config;
pub use ftlab_core::request::Placement;
use ftlab_core::request::{Op, PageSpan, Request as FtlRequest};
pub use ftlab_sim::placement::PlacementRanges;
use ftlab_sim::report::{OpHistograms, Recorder};
use ftlab_sim::ConfiguredFtl;
use ftlab_store::codec::Codec;
use ftlab_store::durable::{DataDir, ModelRequest, VolumeKind};
use ftlab_store::{PageStore, StoreConfig, StoreStats};
pub use incoming::Incoming;
use protocol as p;
use std::io::{BufReader, BufWriter, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    pub fn parse(s: &str) -> Result<Latency, String> {
        match s {
            "none" => Ok(Latency::None),
            "real" => Ok(Latency::Real),
            _ => s
                .strip_prefix("scaled:")
                .and_then(|x| x.parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Latency::Scaled)
                .ok_or_else(|| format!("`{s}`: latency is none, real or scaled:FACTOR")),
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
    /// What a client may hold of the server: memory in flight and time.
    pub limits: ConnectionLimits,
    /// Export read-only (`NBD_FLAG_READ_ONLY`): writes, trims and zeroes are refused with EPERM.
    pub read_only: bool,
    /// Keep the device in this directory's log (docs/serve.md, "A durable device"): recovered
    /// at start, every write and trim appended, FLUSH and FUA made durable per `durability`.
    pub data: Option<std::path::PathBuf>,
    pub durability: Durability,
    /// With `data`: a checkpoint once this many bytes were logged since the last (and at a
    /// clean shutdown); the cleaner runs after each.
    pub checkpoint_every_bytes: u64,
    /// With `data`: the cache of decompressed pages in front of snapshot and clone reads.
    pub cache_bytes: u64,
    pub cache_policy: ftlab_store::cache::CachePolicy,
    /// NBD over TLS (`NBD_OPT_STARTTLS`); None: no TLS (STARTTLS refused).
    pub tls: Option<std::sync::Arc<tls::TlsSetup>>,
}

/// A command of an in-process client (`Device::local`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalCommand {
    Read,
    Write,
    Trim,
    Flush,
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
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "flush" => Ok(Self::Flush),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(format!("`{other}`: durability is flush, always or never")),
        }
    }
}

/// The device directory of a durable device (`ftlab_store::durable`), and what recovery found
/// at start.
struct Durable {
    data: Mutex<DataDir>,
    /// The last record known durable (its sequence number).
    synced_seq: AtomicU64,
    syncs: AtomicU64,
    mode: Durability,
    dir: std::path::PathBuf,
    /// A checkpoint is written once this many bytes were appended since the last.
    checkpoint_every_bytes: u64,
    recovered_records: u64,
    replayed_requests: u64,
    checkpoint_seq: u64,
    dropped_bytes: u64,
    dropped_why: Option<String>,
    /// Decompressed pages of snapshots and clones (read from the log).
    cache: Mutex<ftlab_store::cache::PageCache>,
}

use ftlab_store::durable::model_op;

/// The model's op code in the log.
fn model_code(op: Op) -> u8 {
    match op {
        Op::Read => model_op::READ,
        Op::Write => model_op::WRITE,
        Op::Trim => model_op::TRIM,
        Op::Flush => model_op::FLUSH,
    }
}

impl Durable {
    /// The directory, to append to: a read-only device refuses every change before it gets
    /// here.
    fn lock(&self) -> std::sync::MutexGuard<'_, DataDir> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A failed append is the request's EIO: what was not logged is not acknowledged.
    fn page(data: &mut DataDir, volume: u16, lpn: u64, page: &[u8]) -> Result<(), Errno> {
        data.write_page(volume, lpn, page).map_err(|_| p::EIO)
    }

    fn trim(data: &mut DataDir, volume: u16, lpn: u64, pages: u64) -> Result<(), Errno> {
        data.trim(volume, lpn, pages).map_err(|_| p::EIO)
    }

    /// Durable before a request is answered: a FLUSH, an FUA write, or with `always` any
    /// change.
    fn sync_if_due(&self, command: u16, fua: bool) -> Result<(), Errno> {
        let due = match self.mode {
            Durability::Flush => fua || command == p::CMD_FLUSH,
            Durability::Always => fua || command != p::CMD_READ,
            Durability::Never => false,
        };
        if due {
            self.sync()?;
        }
        Ok(())
    }

    /// Makes every record appended so far durable. A flush that finds its records already
    /// synced by another (group commit) returns at once.
    fn sync(&self) -> Result<(), Errno> {
        let mut data = self.lock();
        if data.read_only() || data.last_seq() <= self.synced_seq.load(Ordering::Acquire) {
            return Ok(());
        }
        let seq = data.commit().map_err(|_| p::EIO)?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced_seq.store(seq, Ordering::Release);
        Ok(())
    }
}

/// One export as configured: like an NVMe namespace, its own LBA space on the shared device,
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

/// An export as served: where it lies on the device, and what its clients did.
struct Export {
    spec: ExportSpec,
    base_bytes: u64,
    size_bytes: u64,
    requests: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    trimmed_bytes: AtomicU64,
}

impl Export {
    /// The device placement of a write at `offset` (within the export): its placement ID, the
    /// handle resolved through the export's placement handle list.
    fn placement_of(&self, offset: u64) -> Placement {
        let pid = match &self.spec.ranges {
            Some(r) => r.placement_of(offset),
            None => self.spec.placement,
        };
        self.spec.resolve(pid)
    }
}

impl ExportSpec {
    /// The device's (reclaim group, handle) for placement ID `pid` (checked at start).
    fn resolve(&self, pid: Placement) -> Placement {
        Placement {
            reclaim_group: pid.reclaim_group,
            handle: match self.handles.get(usize::from(pid.handle)) {
                Some(&h) => h,
                None => pid.handle,
            },
        }
    }
}

/// What the handshake settled for a connection.
#[derive(Clone, Copy, Debug)]
struct Negotiated {
    /// The export it serves.
    export: Target,
    /// The commands the access policy allows on it, decided at negotiation (`policy::IO_*`
    /// bits; all without a policy): a reloaded policy applies to connections made after it.
    io_allowed: u8,
    /// Structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    structured: bool,
    /// The `base:allocation` metadata context (`NBD_OPT_SET_META_CONTEXT`), answered by
    /// `NBD_CMD_BLOCK_STATUS` under `ALLOCATION_CONTEXT_ID`.
    allocation: bool,
}

/// The id ftlab gives `base:allocation` in a connection (the server chooses it).
const ALLOCATION_CONTEXT_ID: u32 = 1;

/// A block status reply describes at most this many extents, and looks at most this far past
/// its offset (the spec lets it describe less than asked; the client asks again from there):
/// bounds the reply's memory and the time a request holds a worker.
const MAX_STATUS_DESCRIPTORS: usize = 4096;
const MAX_STATUS_SCAN_BYTES: u64 = 256 << 20;

/// What one client may hold of the server, so that none can take its memory or its threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnectionLimits {
    /// Bytes of requests in flight beyond each connection's own allowance, for all connections
    /// together (`budget`); at least `budget::MIN_INFLIGHT_BYTES`.
    pub max_inflight_bytes: u64,
    /// A client must finish the handshake within this time of connecting.
    pub handshake_timeout: Duration,
    /// A client that sends nothing for this long (between requests or inside one) is
    /// disconnected; `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
        }
    }
}

/// A device log segment is closed and a new one started past this size.
const LOG_SEGMENT_BYTES: usize = 32 << 20;

/// Eight requests of the largest size at once.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 256 << 20;

/// A client that reads none of its replies for this long, while they wait to be sent, is
/// disconnected (the socket's send timeout, set by whoever accepts it): its requests hold memory
/// until their replies leave.
pub const REPLY_STALL: Duration = Duration::from_secs(60);

/// A worker keeps a write payload buffer up to this size for the next request (1 MiB requests
/// reuse one: a fresh buffer per request would cost the kernel a page clear per 4 KiB); a larger
/// one is freed after its request, so an idle connection holds little.
const KEEP_PAYLOAD_BYTES: usize = (1 << 20) + (64 << 10);

/// A write's payload is read in pieces of this size, its buffer grown as they arrive: a header
/// announcing 32 MiB costs no memory until the bytes come.
const PAYLOAD_PIECE_BYTES: usize = 256 << 10;

pub use ftlab_sim::trace::RecordFormat;

struct State {
    ftl: ConfiguredFtl,
    requests: u64,
    record: Option<BufWriter<std::fs::File>>,
    record_format: RecordFormat,
    record_error: Option<String>,
    recorded: u64,
    /// Simulated latency of each request the model saw (arrival to completion), per op: what a
    /// replay of the record reports as `latency_ns`.
    /// Simulated latency and bytes of the requests the model saw, as a replay records them.
    recorder: Recorder,
}

impl State {
    /// Applies one request to the FTL model (and records it).
    fn submit(&mut self, request: FtlRequest, unix_start_ns: u64) -> Result<u64, Errno> {
        if let Some(w) = &mut self.record {
            self.recorded += 1;
            let unix_ns = unix_start_ns + request.arrival_ns;
            if let Some(line) = self.record_format.line(&request, unix_ns, self.recorded) {
                // A failing record file must not fail the client's I/O: it is reported at
                // shutdown.
                if let Err(e) = writeln!(w, "{line}") {
                    self.record_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        let done_ns = self
            .ftl
            .submit(&request, request.arrival_ns)
            .map_err(|e| ftl_errno(&e, request.op))?;
        self.recorder.record(&request, request.arrival_ns, done_ns);
        Ok(done_ns)
    }
}

/// The emulated SSD: the page store (thread-safe per page; partial-page read-modify-writes
/// serialised by their own lock) and the FTL model behind the device lock, applied in the order
/// requests reach it.
pub struct Device {
    state: Mutex<State>,
    /// Serialises read-modify-writes of partial pages.
    rmw: Mutex<()>,
    /// The same for snapshots' and clones' pages.
    volume_rmw: Mutex<()>,
    store: PageStore,
    size_bytes: u64,
    page_bytes: usize,
    started: Instant,
    /// Wall clock at `started`, for recorded timestamps.
    unix_start_ns: u64,
    options: DeviceOptions,
    /// Set by `begin_shutdown`: requests are answered ESHUTDOWN.
    draining: AtomicBool,
    /// Who may do what (`set_policy`); none: everyone everything.
    policy: std::sync::RwLock<Option<std::sync::Arc<policy::Policy>>>,
    /// The audit log (`set_audit`): a JSON line per connection, denial and volume action.
    audit: Mutex<Option<std::fs::File>>,
    /// Connections admitted (`connected`) and decisions denied, for the metrics.
    connections_total: AtomicU64,
    denied_total: AtomicU64,
    /// Set when executing a request panicked (a bug in ftlab): what panicked, where. From then
    /// on every request read is answered EIO, as a drive whose firmware asserted stays failed,
    /// rather than executed on state the panic may have left half-updated (requests already
    /// executing on other workers finish); and the panicking request is answered too, so its
    /// client does not wait for ever for the reply.
    failure: OnceLock<String>,
    /// Armed by `panic_next_request_for_test`.
    panic_next_request: AtomicBool,
    /// What clients saw, per NBD command: wall-clock time from a request read to its reply
    /// written to the socket (with latency emulation, the hold included).
    client_latency: Mutex<OpHistograms>,
    /// The resolved configuration, for the statistics.
    config: Config,
    exports: Vec<Export>,
    /// With `data`: the device directory.
    durable: Option<Durable>,
    /// The model's clock at start: where the recovered requests left it (0 without `data`).
    clock_base_ns: u64,
    /// Memory of requests in flight, over all connections.
    budget: budget::InflightBudget,
}

fn specs_named(exports: &[Export], name: &str) -> bool {
    exports.iter().any(|e| e.spec.name == name)
}

/// What a connection serves: an export (an index into the device's), on the device itself
/// (volume 0) or on a snapshot or clone of a durable device (`NAME@VOLUME`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub export: usize,
    pub volume: u16,
    /// A snapshot: read-only.
    pub snapshot: bool,
}

/// Why a request failed, as an NBD error code.
type Errno = u32;

/// The NBD error the spec gives for what the FTL refused: a write beyond the end is "no space",
/// any other request out of range or naming no stream is invalid.
fn ftl_errno(e: &ftlab_core::ftl::FtlError, op: Op) -> Errno {
    match (e, op) {
        (ftlab_core::ftl::FtlError::OutOfRange { .. }, Op::Write) => p::ENOSPC,
        (ftlab_core::ftl::FtlError::OutOfRange { .. }, _) => p::EINVAL,
        (
            ftlab_core::ftl::FtlError::NoSuchHandle { .. }
            | ftlab_core::ftl::FtlError::NoSuchReclaimGroup { .. },
            _,
        ) => p::EINVAL,
    }
}

/// The NBD error for a page-store failure: a full store (its memory limit) is "no space left",
/// anything else an I/O error.
fn store_errno(e: ftlab_store::StoreError) -> Errno {
    match e {
        ftlab_store::StoreError::MemLimit { .. } => p::ENOSPC,
        _ => p::EIO,
    }
}

/// Why the device could not start, load, save or finish. Each names the file or option at fault.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Config(#[from] ftlab_core::config::ConfigError),
    #[error("{0}")]
    Export(String),
    #[error("device log: {0}")]
    Log(String),
    #[error(transparent)]
    Memory(#[from] ftlab_core::memory::MemoryError),
    #[error(transparent)]
    Store(#[from] ftlab_store::StoreError),
    #[error(transparent)]
    Ftl(#[from] ftlab_core::ftl::FtlError),
    #[error(
        "--max-inflight-bytes {0}: must be at least {min} bytes (33M): one request of the \
         largest size ({largest} bytes) must fit",
        min = budget::MIN_INFLIGHT_BYTES,
        largest = p::MAX_REQUEST_BYTES
    )]
    InflightBudget(u64),
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    /// A file the device reads or writes (the image, the record file).
    #[error("{}: {cause}", path.display())]
    File {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "{}: {len} bytes, larger than the {export_bytes}-byte export (size the device with --set \
         capacity.logical_bytes={len})",
        path.display()
    )]
    ImageTooLarge {
        path: std::path::PathBuf,
        len: u64,
        export_bytes: u64,
    },
    #[error(
        "{}: {len} bytes, smaller than the {export_bytes}-byte export (a truncated image?); \
         give --grow-image to take it with the rest read as zeros{}",
        path.display(),
        if *len > 0 {
            format!(", or size the device with --set capacity.logical_bytes={len}")
        } else {
            String::new()
        }
    )]
    ImageTooSmall {
        path: std::path::PathBuf,
        len: u64,
        export_bytes: u64,
    },
    #[error("{}: {len} bytes, not a whole number of {page_bytes}-byte pages", path.display())]
    ImageNotWholePages {
        path: std::path::PathBuf,
        len: u64,
        page_bytes: usize,
    },
    #[error(
        "--image: this process may write files of at most {limit_bytes} bytes (ulimit -f), and \
         the image of this device takes {image_bytes} bytes"
    )]
    FileSizeLimit { limit_bytes: u64, image_bytes: u64 },
    #[error("--image: cannot create {}: {cause}", tmp.display())]
    CannotCreate {
        tmp: std::path::PathBuf,
        cause: std::io::Error,
    },
    /// The save could not write its temporary file: `path` keeps what it held.
    #[error(
        "{}: the device was not saved ({} left as it was{}): {what} {}: {cause}",
        path.display(),
        path.display(),
        if *removed { format!(", the incomplete {} removed", tmp.display()) } else { String::new() },
        tmp.display()
    )]
    NotSaved {
        path: std::path::PathBuf,
        tmp: std::path::PathBuf,
        /// "creating" or "writing".
        what: &'static str,
        /// The incomplete temporary file was removed.
        removed: bool,
        cause: std::io::Error,
    },
    /// Pages that failed their checksums are zeros in the image, left at `tmp`.
    #[error(
        "{}: {} page(s) could not be read and are zeros in the image saved as {} ({} left as it \
         was): {}",
        path.display(),
        unreadable.len(),
        tmp.display(),
        path.display(),
        name_some(unreadable)
    )]
    Unreadable {
        path: std::path::PathBuf,
        tmp: std::path::PathBuf,
        unreadable: Vec<ftlab_store::StoreError>,
    },
    #[error("record file: {0}")]
    Record(String),
    /// A request's execution panicked (a bug in ftlab): the model was left as it was.
    #[error("the device failed: {why}{}", record.as_ref().map(|e| format!("; {e}")).unwrap_or_default())]
    Failed {
        why: String,
        record: Option<Box<DeviceError>>,
    },
}

/// The first 16 errors, and how many more.
fn name_some(errors: &[ftlab_store::StoreError]) -> String {
    const NAMED: usize = 16;
    let mut named: Vec<String> = errors.iter().take(NAMED).map(|e| e.to_string()).collect();
    if errors.len() > NAMED {
        named.push(format!("and {} more", errors.len() - NAMED));
    }
    named.join("; ")
}

impl Device {
    pub fn new(config: &Config, options: DeviceOptions) -> Result<Device, DeviceError> {
        let geometry = config.geometry()?;
        ftlab_core::memory::MemoryEstimate::of(config, &geometry)
            .check(ftlab_core::memory::available().as_ref())?;
        let page_bytes = geometry.page_size_bytes as usize;
        if options.limits.max_inflight_bytes < budget::MIN_INFLIGHT_BYTES {
            return Err(DeviceError::InflightBudget(
                options.limits.max_inflight_bytes,
            ));
        }
        let inflight = budget::InflightBudget::new(options.limits.max_inflight_bytes);
        let exports = Self::lay_out_exports(&options, &geometry)?;
        let mut store_config = StoreConfig::new(page_bytes, options.codec);
        store_config.mem_limit_bytes = options.mem_limit_bytes;
        let store = PageStore::new(store_config)?;
        let record = match &options.record {
            Some(path) => Some(BufWriter::new(std::fs::File::create(path).map_err(
                |cause| DeviceError::File {
                    path: path.clone(),
                    cause,
                },
            )?)),
            None => None,
        };
        let mut state = State {
            ftl: ConfiguredFtl::new(config, &geometry),
            requests: 0,
            record: None,
            record_format: options.record_format,
            record_error: None,
            recorded: 0,
            recorder: Recorder::without_series(),
        };
        let (durable, clock_base_ns) = match &options.data {
            Some(dir) => {
                let (d, clock) = Self::recover(dir, &mut state, &geometry, &options)?;
                (Some(d), clock)
            }
            None => (None, 0),
        };
        // After the replay: the record file holds what this run's clients send.
        state.record = record;
        Ok(Device {
            durable,
            clock_base_ns,
            rmw: Mutex::new(()),
            volume_rmw: Mutex::new(()),
            state: Mutex::new(state),
            unix_start_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            store,
            size_bytes: geometry.logical_bytes(),
            page_bytes,
            started: Instant::now(),
            options,
            draining: AtomicBool::new(false),
            failure: OnceLock::new(),
            policy: std::sync::RwLock::new(None),
            audit: Mutex::new(None),
            connections_total: AtomicU64::new(0),
            denied_total: AtomicU64::new(0),
            panic_next_request: AtomicBool::new(false),
            client_latency: Mutex::new(OpHistograms::default()),
            config: config.clone(),
            budget: inflight,
            exports,
        })
    }

    /// Opens the device directory `dir` (created when absent; its pages stay in the log, read
    /// through the cache), and replays every request the FTL model saw, in order and at its
    /// arrival time, so the model is what it was (the same report as without a crash).
    /// Returns the directory and the model's clock.
    fn recover(
        dir: &std::path::Path,
        state: &mut State,
        geometry: &ftlab_core::geometry::Geometry,
        options: &DeviceOptions,
    ) -> Result<(Durable, u64), DeviceError> {
        let log_error = |e: ftlab_store::log::LogError| DeviceError::Log(e.to_string());
        let page_bytes = geometry.page_size_bytes as usize;
        let (data, opened) = DataDir::open(
            dir,
            geometry.logical_pages,
            page_bytes,
            options.read_only,
            LOG_SEGMENT_BYTES,
        )
        .map_err(log_error)?;
        let mut clock_ns = 0;
        for (k, r) in opened.requests.iter().enumerate() {
            let op = match r.op {
                model_op::READ => Op::Read,
                model_op::WRITE => Op::Write,
                model_op::TRIM => Op::Trim,
                model_op::FLUSH => Op::Flush,
                model_op::DRAIN => {
                    state.ftl.flush(r.arrival_ns);
                    clock_ns = r.arrival_ns;
                    continue;
                }
                other => {
                    return Err(DeviceError::Log(format!(
                        "{}: request {k} of the model has op {other}",
                        dir.display()
                    )))
                }
            };
            let request = FtlRequest {
                arrival_ns: r.arrival_ns,
                op,
                offset_bytes: r.offset_bytes,
                length_bytes: u64::from(r.length_bytes),
                placement: Placement {
                    reclaim_group: r.reclaim_group,
                    handle: r.handle,
                },
            };
            // It was applied once without error, so it is again (the model is deterministic).
            state
                .submit(request, 0)
                .map_err(|errno| DeviceError::Log(format!(
                    "{}: request {k} of the model ({op:?} at byte {}) fails its replay (errno {errno}): \
                     another configuration than the one it ran with?",
                    dir.display(),
                    r.offset_bytes
                )))?;
            clock_ns = r.arrival_ns;
        }
        let synced = data.last_seq();
        Ok((
            Durable {
                data: Mutex::new(data),
                synced_seq: AtomicU64::new(synced),
                syncs: AtomicU64::new(0),
                mode: options.durability,
                dir: dir.to_path_buf(),
                checkpoint_every_bytes: options.checkpoint_every_bytes,
                recovered_records: opened.replayed_records,
                replayed_requests: opened.requests.len() as u64,
                checkpoint_seq: opened.checkpoint_seq,
                dropped_bytes: opened.dropped_bytes,
                dropped_why: opened.dropped_why,
                cache: Mutex::new(ftlab_store::cache::PageCache::new(
                    options.cache_policy,
                    (options.cache_bytes / page_bytes as u64) as usize,
                )),
            },
            clock_ns,
        ))
    }

    /// With a writable durable device: a checkpoint when `checkpoint_every_bytes` were logged
    /// since the last, then the cleaner (segments at most half live). Call from a thread of its
    /// own: it holds the directory's lock while it works. Returns a line for the log when it
    /// did something, or an error line.
    pub fn maintain(&self) -> Option<String> {
        let d = self.durable.as_ref().filter(|_| !self.options.read_only)?;
        if d.lock().since_checkpoint_bytes() < d.checkpoint_every_bytes {
            return None;
        }
        let started = Instant::now();
        let mut data = d.lock();
        let result = data.checkpoint().and_then(|()| data.clean(0.5));
        // Everything before the checkpoint is durable now.
        let seq = data.last_seq();
        d.synced_seq.fetch_max(seq, Ordering::AcqRel);
        Some(match result {
            Ok(cleaned) => format!(
                "{}: checkpoint at record {seq}, {cleaned} segment(s) cleaned, in {:.0} ms",
                d.dir.display(),
                started.elapsed().as_secs_f64() * 1e3
            ),
            Err(e) => format!("{}: checkpoint failed: {e}", d.dir.display()),
        })
    }

    /// What recovery found, for the log at start: records replayed, and bytes dropped from a
    /// torn tail (none of them acknowledged by a FLUSH) with the reason.
    pub fn recovery_summary(&self) -> Option<String> {
        let d = self.durable.as_ref()?;
        Some(match &d.dropped_why {
            Some(why) => format!(
                "{}: replayed {} log records after the checkpoint (sequence {}) and {} model \
                 requests; dropped a {}-byte tail no FLUSH had acknowledged ({why})",
                d.dir.display(),
                d.recovered_records,
                d.checkpoint_seq,
                d.replayed_requests,
                d.dropped_bytes
            ),
            None => format!(
                "{}: replayed {} log records after the checkpoint (sequence {}) and {} model \
                 requests",
                d.dir.display(),
                d.recovered_records,
                d.checkpoint_seq,
                d.replayed_requests
            ),
        })
    }

    /// The exports in order on the device's logical space, each checked: a known name, whole
    /// pages, room on the device, a placement the device has.
    fn lay_out_exports(
        options: &DeviceOptions,
        geometry: &ftlab_core::geometry::Geometry,
    ) -> Result<Vec<Export>, DeviceError> {
        let device_bytes = geometry.logical_bytes();
        let specs = if options.exports.is_empty() {
            vec![ExportSpec {
                name: options.export_name.clone(),
                ..Default::default()
            }]
        } else {
            options.exports.clone()
        };
        let page = u64::from(geometry.page_size_bytes);
        let mut base = 0u64;
        let mut exports = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let bad = |why: String| DeviceError::Export(format!("export `{}`: {why}", spec.name));
            if specs_named(&exports, &spec.name) {
                return Err(bad("named twice".into()));
            }
            if spec.name.is_empty() && i > 0 {
                return Err(bad("only the first export may have the empty name".into()));
            }
            let left = device_bytes - base;
            let size = spec.size_bytes.unwrap_or(left);
            if size == 0 || size % page != 0 {
                return Err(bad(format!(
                    "{size} bytes: an export is a positive number of whole {page}-byte pages"
                )));
            }
            if size > left {
                return Err(bad(format!(
                    "{size} bytes do not fit: the exports before it leave {left} of the device's {device_bytes} (size the device with --set capacity.logical_bytes=BYTES)"
                )));
            }
            let pids: Vec<Placement> = spec
                .ranges
                .iter()
                .flat_map(|r| r.ranges().iter().map(|r| r.placement))
                .chain([spec.placement])
                .collect();
            for pid in pids {
                if !spec.handles.is_empty() && usize::from(pid.handle) >= spec.handles.len() {
                    return Err(bad(format!(
                        "placement handle {} is beyond its list of {} (handles=)",
                        pid.handle,
                        spec.handles.len()
                    )));
                }
                let p = spec.resolve(pid);
                if u32::from(p.handle) >= geometry.handles
                    || u32::from(p.reclaim_group) >= geometry.reclaim_groups
                {
                    return Err(bad(format!(
                        "placement {}:{} is not on the device ({} reclaim group(s) of {} handle(s): fdp.reclaim_groups, fdp.handles or ftl.streams)",
                        p.reclaim_group, p.handle, geometry.reclaim_groups, geometry.handles
                    )));
                }
            }
            exports.push(Export {
                spec,
                base_bytes: base,
                size_bytes: size,
                requests: AtomicU64::new(0),
                read_bytes: AtomicU64::new(0),
                written_bytes: AtomicU64::new(0),
                trimmed_bytes: AtomicU64::new(0),
            });
            base += size;
        }
        Ok(exports)
    }

    /// Each export's name and size, in order on the device.
    pub fn export_sizes(&self) -> Vec<(String, u64)> {
        self.exports
            .iter()
            .map(|e| (e.spec.name.clone(), e.size_bytes))
            .collect()
    }

    /// The export a client names: "" is the first.
    /// The export `name` names: an export's name ("" the first), or `EXPORT@VOLUME` for a
    /// snapshot or clone of a durable device (`@VOLUME` alone: of the first export).
    fn export_named(&self, name: &str) -> Option<Target> {
        let (export, volume) = match name.split_once('@') {
            Some((e, v)) => (e, Some(v)),
            None => (name, None),
        };
        let export = if export.is_empty() {
            0
        } else {
            self.exports.iter().position(|e| e.spec.name == export)?
        };
        match volume {
            None => Some(Target {
                export,
                ..Target::default()
            }),
            Some(v) => {
                let (volume, kind) = self.durable.as_ref()?.lock().volume_named(v)?;
                Some(Target {
                    export,
                    volume,
                    snapshot: kind == VolumeKind::Snapshot,
                })
            }
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// With a `zstd-dict` store: (re)trains its dictionary when `schedule` says it is due (it
    /// takes seconds; call from a thread of its own). Returns a line for the log when it tried.
    pub fn train_dictionary_if_due(
        &self,
        schedule: &mut dictionary::DictionarySchedule,
    ) -> Option<String> {
        if !matches!(self.store.config().codec, Codec::ZstdDict { .. }) {
            return None;
        }
        let compressed = self.store.stats().compressed_pages();
        if !schedule.due(compressed) {
            return None;
        }
        let started = Instant::now();
        Some(match self.store.train_dictionary() {
            Ok(bytes) => format!(
                "trained zstd dictionaries ({bytes} bytes, one per class of page: text, binary) \
                 from a sample of the {compressed} pages stored compressed, in {:.1} s; pages \
                 written from now on use them",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => format!("dictionary training failed: {e}"),
        })
    }

    /// Loads a raw image (as `save_image` writes it) into the store, and into the FTL model as
    /// writes whose counters are then cleared: the session's figures cover client I/O only.
    /// All-zero pages are not stored. Returns the pages loaded.
    ///
    /// The image must be the export's size; with `grow` a smaller one (an empty file included)
    /// is taken and the pages past its end read as zeros. A truncated image is otherwise
    /// refused: its missing part would read as zeros and the next save would make that loss
    /// permanent.
    pub fn load_image(&self, path: &std::path::Path, grow: bool) -> Result<u64, DeviceError> {
        let in_file = |cause| DeviceError::File {
            path: path.to_path_buf(),
            cause,
        };
        let mut file = std::fs::File::open(path).map_err(in_file)?;
        let len = file.metadata().map_err(in_file)?.len();
        let path = path.to_path_buf();
        let export_bytes = self.size_bytes;
        if len > export_bytes {
            return Err(DeviceError::ImageTooLarge {
                path,
                len,
                export_bytes,
            });
        }
        if len < export_bytes && !grow {
            return Err(DeviceError::ImageTooSmall {
                path,
                len,
                export_bytes,
            });
        }
        if len % self.page_bytes as u64 != 0 {
            return Err(DeviceError::ImageNotWholePages {
                path,
                len,
                page_bytes: self.page_bytes,
            });
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let chunk_pages = 256;
        let mut buf = vec![0u8; chunk_pages * self.page_bytes];
        let mut loaded = 0u64;
        let mut lpn = 0u64;
        let total = len / self.page_bytes as u64;
        while lpn < total {
            let n = (total - lpn).min(chunk_pages as u64) as usize;
            let bytes = &mut buf[..n * self.page_bytes];
            file.read_exact(bytes).map_err(|cause| DeviceError::File {
                path: path.clone(),
                cause,
            })?;
            for (i, page) in bytes.chunks(self.page_bytes).enumerate() {
                if page.iter().all(|&b| b == 0) {
                    continue;
                }
                let l = lpn + i as u64;
                self.store.write(l, page)?;
                let request = FtlRequest {
                    arrival_ns: 0,
                    op: Op::Write,
                    offset_bytes: l * self.page_bytes as u64,
                    length_bytes: self.page_bytes as u64,
                    placement: ftlab_core::request::Placement::default(),
                };
                state.ftl.submit(&request, 0)?;
                loaded += 1;
            }
            lpn += n as u64;
        }
        state.ftl.flush(0);
        state.ftl.reset_stats();
        Ok(loaded)
    }

    /// `base:allocation` extents from the request's offset: pages never written or trimmed are
    /// holes reading as zeros, pages stored as zeros read as zeros, the rest is data. Adjacent
    /// pages of one kind make one extent; with `NBD_CMD_FLAG_REQ_ONE` the first extent alone is
    /// given. At most `MAX_STATUS_DESCRIPTORS` extents over `MAX_STATUS_SCAN_BYTES`.
    fn block_status(&self, r: &p::Request, target: Target) -> Result<Vec<(u32, u32)>, Errno> {
        let e = &self.exports[target.export];
        let end = r
            .offset
            .checked_add(u64::from(r.length))
            .filter(|&end| end <= e.size_bytes && r.length > 0)
            .ok_or(p::EINVAL)?;
        // On the device: the export's base added.
        let end = e.base_bytes + end.min(r.offset + MAX_STATUS_SCAN_BYTES);
        let one = r.flags & p::CMD_FLAG_REQ_ONE != 0;
        let ps = self.page_bytes as u64;
        let mut descriptors: Vec<(u32, u32)> = Vec::new();
        let mut at = e.base_bytes + r.offset;
        while at < end {
            let lpn = at / ps;
            let len = ((lpn + 1) * ps).min(end) - at;
            let state = match (target.volume, &self.durable) {
                (_, None) => self.store.page_state(lpn),
                (v, Some(d)) => match d.lock().locate(v, lpn) {
                    Ok(None) => ftlab_store::PageState::Absent,
                    _ => ftlab_store::PageState::Data,
                },
            };
            let flags = match state {
                ftlab_store::PageState::Absent => p::STATE_HOLE | p::STATE_ZERO,
                ftlab_store::PageState::Zeros => p::STATE_ZERO,
                ftlab_store::PageState::Data => 0,
            };
            let full = one || descriptors.len() == MAX_STATUS_DESCRIPTORS;
            match descriptors.last_mut() {
                // Within u32: the scan covers at most MAX_STATUS_SCAN_BYTES.
                Some(last) if last.1 == flags => last.0 += len as u32,
                Some(_) if full => break,
                _ => descriptors.push((len as u32, flags)),
            }
            at += len;
        }
        Ok(descriptors)
    }

    /// Fails unless `save_image(path)` will be able to create its file and make it the export's
    /// size (the process's file-size limit, `ulimit -f`, allows it): checked at start, so a
    /// mistyped directory or a low limit is reported before clients write data that could not
    /// be saved.
    pub fn check_image_writable(&self, path: &std::path::Path) -> Result<(), DeviceError> {
        #[cfg(target_os = "linux")]
        {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit(2) writes the struct it is given.
            let ok = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } == 0;
            if ok && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < self.size_bytes {
                return Err(DeviceError::FileSizeLimit {
                    limit_bytes: limit.rlim_cur,
                    image_bytes: self.size_bytes,
                });
            }
        }
        let tmp = tmp_path_beside(path);
        let existed = tmp.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&tmp)
            .map_err(|cause| DeviceError::CannotCreate {
                tmp: tmp.clone(),
                cause,
            })?;
        if !existed {
            let _ = std::fs::remove_file(&tmp);
        }
        Ok(())
    }

    /// Writes every page to `path` as a raw image the size of the export (zero pages as holes).
    ///
    /// A page that fails its checksum does not stop the save (the other pages are the clients'
    /// data): the image is written whole with that page as zeros, left beside `path` as
    /// `PATH.tmp` (an earlier image at `path` is kept), and the error names such LPNs (the first 16).
    ///
    /// A write that fails (a full disk) removes the incomplete `PATH.tmp` and says so; `path`
    /// keeps what it held.
    pub fn save_image(&self, path: &std::path::Path) -> Result<(), DeviceError> {
        let _state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let tmp = tmp_path_beside(path);
        let not_saved = |what, removed, cause| DeviceError::NotSaved {
            path: path.to_path_buf(),
            tmp: tmp.clone(),
            what,
            removed,
            cause,
        };
        // Only a file this save created is removed when it fails.
        let file = std::fs::File::create(&tmp).map_err(|e| not_saved("creating", false, e))?;
        let mut unreadable = Vec::new();
        if let Err(e) = self.write_image(file, &mut unreadable) {
            let _ = std::fs::remove_file(&tmp);
            return Err(not_saved("writing", true, e));
        }
        if !unreadable.is_empty() {
            return Err(DeviceError::Unreadable {
                path: path.to_path_buf(),
                tmp,
                unreadable,
            });
        }
        std::fs::rename(&tmp, path).map_err(|cause| DeviceError::File {
            path: path.to_path_buf(),
            cause,
        })
    }

    /// Writes every readable page to `file` (at `tmp`); pages that fail their checksum are collected in
    /// `unreadable` and left as holes.
    fn write_image(
        &self,
        mut file: std::fs::File,
        unreadable: &mut Vec<ftlab_store::StoreError>,
    ) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        file.set_len(self.size_bytes)?;
        let mut page = vec![0u8; self.page_bytes];
        for lpn in 0..self.size_bytes / self.page_bytes as u64 {
            if let Err(e) = self.store.read(lpn, &mut page) {
                // The error names the LPN.
                unreadable.push(e);
                continue;
            }
            if page.iter().any(|&b| b != 0) {
                file.seek(SeekFrom::Start(lpn * self.page_bytes as u64))
                    .and_then(|_| file.write_all(&page))?;
            }
        }
        file.sync_all()
    }

    /// Flips a bit of page `lpn`'s stored bytes, to test how corruption is handled. Returns
    /// false when the page has no stored bytes.
    #[doc(hidden)]
    pub fn corrupt_page_for_test(&self, lpn: u64) -> bool {
        self.store.corrupt_for_test(lpn)
    }

    /// Makes the next request executed panic, to test what a bug in the FTL or the store does
    /// to the server and its clients.
    #[doc(hidden)]
    pub fn panic_next_request_for_test(&self) {
        self.panic_next_request.store(true, Ordering::SeqCst);
    }

    /// Why the device failed (a request's execution panicked), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Marks the device failed: executing `r` panicked with `panic`. Returns the request's
    /// answer, EIO.
    fn fail(&self, r: &p::Request, panic: &(dyn std::any::Any + Send)) -> Errno {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        let _ = self.failure.set(format!(
            "internal error (a bug in ftlab) executing {} at offset {} length {}: {why}",
            p::command_name(r.command),
            r.offset,
            r.length
        ));
        p::EIO
    }

    /// The live statistics: the simulator's report of the model so far (the same schema as
    /// `ftlab sim --json`; the model's clock is the wall clock since start), and what only a live
    /// device has: uptime, failure, the NBD requests applied, client latency, the store's
    /// mm_stat fields and the memory of requests in flight.
    pub fn stats_json(&self) -> serde_json::Value {
        let now_ns = self.now_ns();
        let (report, nbd_requests) = {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (
                s.ftl.report(&self.config, &s.recorder, 0, now_ns),
                s.requests,
            )
        };
        let mut stats = serde_json::to_value(&report).expect("a report serialises");
        let live = serde_json::json!({
            "uptime_ns": now_ns,
            "failure": self.failure(),
            "nbd_requests": nbd_requests,
            "client_latency_ns": self.client_latency(),
            "store": self.store.stats(),
            "inflight_bytes": self.budget.used_bytes(),
            "durable": self.durable.as_ref().map(|d| {
                let (records, disk, volumes) = {
                    let mut data = d.lock();
                    (data.last_seq(), data.disk_stats(), data.volumes())
                };
                serde_json::json!({
                    "dir": d.dir.display().to_string(),
                    "durability": format!("{:?}", d.mode).to_lowercase(),
                    "records": records,
                    "synced_records": d.synced_seq.load(Ordering::Relaxed),
                    "syncs": d.syncs.load(Ordering::Relaxed),
                    "recovered_records": d.recovered_records,
                    "recovered_requests": d.replayed_requests,
                    "recovery_checkpoint_seq": d.checkpoint_seq,
                    "recovery_dropped_bytes": d.dropped_bytes,
                    "disk": disk,
                    "volumes": volumes,
                    "cache": d.cache.lock().unwrap_or_else(|p| p.into_inner()).stats(),
                })
            }),
            "exports": self.exports.iter().map(|e| serde_json::json!({
                "name": e.spec.name,
                "base_bytes": e.base_bytes,
                "size_bytes": e.size_bytes,
                "placement": e.spec.ranges.is_none().then(|| serde_json::json!({
                    "reclaim_group": e.spec.placement.reclaim_group,
                    "handle": e.spec.placement.handle,
                })),
                "placement_ranges": e.spec.ranges.as_ref().map_or(0, |r| r.ranges().len()),
                "placement_handles": e.spec.handles,
                "read_only": e.spec.read_only || self.options.read_only,
                "requests": e.requests.load(Ordering::Relaxed),
                "read_bytes": e.read_bytes.load(Ordering::Relaxed),
                "written_bytes": e.written_bytes.load(Ordering::Relaxed),
                "trimmed_bytes": e.trimmed_bytes.load(Ordering::Relaxed),
            })).collect::<Vec<_>>(),
        });
        let object = stats.as_object_mut().expect("a report is an object");
        for (key, value) in live.as_object().expect("an object") {
            debug_assert!(!object.contains_key(key), "`{key}` is a report key too");
            object.insert(key.clone(), value.clone());
        }
        stats
    }

    /// The model's report (`ftlab sim --json`'s schema) as of model time `now_ns`: what a
    /// replay after a crash must reproduce exactly.
    pub fn model_report_json(&self, now_ns: u64) -> serde_json::Value {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::to_value(s.ftl.report(&self.config, &s.recorder, 0, now_ns))
            .expect("a report serialises")
    }

    /// Counts the client latency of replies just written to the socket.
    fn replied(&self, timings: impl Iterator<Item = Timing>) {
        let now = Instant::now();
        let mut h = self
            .client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for t in timings {
            if let Some(op) = t.op {
                h.record(op, now.duration_since(t.read_at).as_nanos() as u64);
            }
        }
    }

    /// Per NBD command: wall-clock ns from a request read to its reply written.
    pub fn client_latency(&self) -> ftlab_sim::report::OpLatencies {
        self.client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .summaries()
    }

    /// Requests served so far and the FTL model's counters.
    pub fn ftl_stats(&self) -> (u64, ftlab_core::ftl::FtlStats) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.requests, s.ftl.stats().clone())
    }

    /// From now on, requests read are answered `ESHUTDOWN` (the spec's error for a server
    /// shutting down, after which a client disconnects) instead of executed; requests already
    /// executing finish. With the sockets' reading side then shut (which wakes a blocked read),
    /// each connection ends once it has answered what it read: every write acknowledged before
    /// is in the saved image.
    pub fn begin_shutdown(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Drains the FTL's write buffer (as a replay's end does) and flushes the record file; call
    /// before exiting.
    ///
    /// After a failure (`failure`) the model is left as the panic left it, not drained, and
    /// the failure is the error.
    pub fn finish(&self) -> Result<(), DeviceError> {
        let now = self.now_ns();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.failure().is_none() {
            s.ftl.flush(now);
            // A clean shutdown logs the drain, and leaves a checkpoint (the whole log durable).
            if let Some(d) = self.durable.as_ref().filter(|_| !self.options.read_only) {
                let failed = |e: ftlab_store::log::LogError| {
                    DeviceError::Log(format!(
                        "{}: the final checkpoint failed: {e}",
                        d.dir.display()
                    ))
                };
                let mut data = d.lock();
                data.request(ModelRequest {
                    op: model_op::DRAIN,
                    offset_bytes: 0,
                    length_bytes: 0,
                    arrival_ns: now,
                    reclaim_group: 0,
                    handle: 0,
                })
                .map_err(failed)?;
                data.checkpoint().map_err(failed)?;
            }
        }
        let s = &mut *s;
        let record = match (&s.record_error, &mut s.record) {
            (Some(e), _) => Err(DeviceError::Record(e.clone())),
            (None, Some(w)) => w.flush().map_err(|e| DeviceError::Record(e.to_string())),
            (None, None) => Ok(()),
        };
        match (self.failure(), record) {
            (Some(why), record) => Err(DeviceError::Failed {
                why: why.to_string(),
                record: record.err().map(Box::new),
            }),
            (None, record) => record,
        }
    }

    /// The model's clock: wall-clock time since start, after the recovered requests' last.
    fn now_ns(&self) -> u64 {
        self.clock_base_ns + self.started.elapsed().as_nanos() as u64
    }

    /// Puts `policy` in force for connections made from now on (None: no policy).
    pub fn set_policy(&self, policy: Option<policy::Policy>) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = policy.map(std::sync::Arc::new);
    }

    /// The policy in force now (it may be replaced at any moment: a reload).
    fn current_policy(&self) -> Option<std::sync::Arc<policy::Policy>> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts a connection admitted (for the metrics) and audits it.
    pub fn connected(&self, principal: &policy::Principal, address: &str) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        self.audit(
            "connect",
            serde_json::json!({"principal": principal.describe(), "address": address, "tls": false}),
        );
    }

    /// The Prometheus text exposition of the device (`metrics`), `open` connections served now.
    pub fn metrics(&self, open: usize) -> String {
        let latency = self
            .client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        metrics::exposition(
            &self.stats_json(),
            &latency,
            metrics::Counts {
                connections_total: self.connections_total.load(Ordering::Relaxed),
                connections_open: open as u64,
                denied_total: self.denied_total.load(Ordering::Relaxed),
            },
        )
    }

    /// Appends the audit log's lines to `file` from now on.
    pub fn set_audit(&self, file: std::fs::File) {
        *self.audit.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
    }

    /// Writes one audit line: `event` and `fields`, with the wall-clock time. An audit log that
    /// cannot be written is reported once on stderr and no longer written (the device goes on).
    pub fn audit(&self, event: &str, fields: serde_json::Value) {
        let mut guard = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = guard.as_mut() else {
            return;
        };
        let mut line = serde_json::json!({
            "time_unix_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            "event": event,
        });
        if let (Some(l), serde_json::Value::Object(f)) = (line.as_object_mut(), fields) {
            l.extend(f);
        }
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("ftlab serve: the audit log: {e}; no longer written");
            *guard = None;
        }
    }

    /// May `principal` do `action` on `export`? Yes for everyone without a policy; a denial is
    /// written to the audit log with the statement (or default) that decided it.
    pub fn allows(&self, principal: &policy::Principal, action: &str, export: &str) -> bool {
        let policy = self.current_policy();
        let Some(policy) = policy else {
            return true;
        };
        let d = policy.decide(principal, action, export);
        if !d.allowed {
            self.denied_total.fetch_add(1, Ordering::Relaxed);
            self.audit(
                "denied",
                serde_json::json!({
                    "principal": principal.describe(),
                    "action": action,
                    "export": export,
                    "reason": d.explain(&policy),
                }),
            );
        }
        d.allowed
    }

    /// The `policy::IO_*` bits `principal` is allowed on `target`, decided once at
    /// negotiation (a denial is audited when a command meets it, or when none is allowed).
    fn io_allowed(&self, principal: &policy::Principal, target: Target) -> u8 {
        let policy = self.current_policy();
        let Some(policy) = policy else {
            return policy::IO_ALL;
        };
        let name = self.target_name(target);
        let bits = policy::IO_ACTIONS
            .iter()
            .filter(|(action, _)| policy.decide(principal, action, &name).allowed)
            .fold(0, |bits, (_, bit)| bits | bit);
        if bits == 0 {
            self.allows(principal, "read", &name);
        }
        bits
    }

    /// The name a policy decides snapshot actions on: the first export's `NAME@VOLUME` (a
    /// snapshot or clone is of the whole device, served on every export).
    pub fn volume_export_name(&self, volume: &str) -> String {
        format!("{}@{volume}", self.exports[0].spec.name)
    }

    /// Applies one command of a client in this process (the SQLite VFS) to the first export,
    /// as a connection's request: the FTL model, the store or the durable log, FLUSH per the
    /// durability. A read's bytes are appended to `out`. `Err` is the NBD errno.
    pub fn local(
        &self,
        command: LocalCommand,
        offset: u64,
        data: &[u8],
        length: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), u32> {
        let (command, length) = match command {
            LocalCommand::Read => (p::CMD_READ, length),
            LocalCommand::Write => (p::CMD_WRITE, data.len() as u32),
            LocalCommand::Trim => (p::CMD_TRIM, length),
            LocalCommand::Flush => (p::CMD_FLUSH, 0),
        };
        let request = p::Request {
            flags: 0,
            command,
            cookie: 0,
            offset,
            length,
        };
        // Not `alone`: the caller's thread does the pages (a hand-off to the store's pool and
        // back costs more than the pages of a SQLite write).
        self.execute(&request, data, out, false, Target::default())
            .map(|_latency_ns| ())
    }

    /// The name a policy knows an export by: `NAME`, or `NAME@VOLUME` for a snapshot or clone
    /// (the default export's name when the client asked for "").
    fn target_name(&self, target: Target) -> String {
        let export = &self.exports[target.export].spec.name;
        if target.volume == 0 {
            return export.clone();
        }
        let volume = self
            .durable
            .as_ref()
            .and_then(|d| {
                d.lock()
                    .volumes()
                    .into_iter()
                    .find(|v| v.id == target.volume)
                    .map(|v| v.name)
            })
            .unwrap_or_default();
        format!("{export}@{volume}")
    }

    /// With structured replies, DF ("don't fragment") is advertised: a read is always answered
    /// in one chunk anyway.
    fn transmission_flags(&self, structured: bool, target: Target) -> u16 {
        let read_only = if self.options.read_only
            || self.exports[target.export].spec.read_only
            || target.snapshot
        {
            p::TF_READ_ONLY
        } else {
            0
        };
        // Multi-conn is safe: every completed write is visible to every connection at once
        // (one store, one lock), and a flush drains the one write buffer all share.
        p::TF_HAS_FLAGS
            | p::TF_SEND_FLUSH
            | p::TF_SEND_FUA
            | p::TF_SEND_TRIM
            | p::TF_SEND_WRITE_ZEROES
            | p::TF_SEND_FAST_ZERO
            | p::TF_CAN_MULTI_CONN
            | p::TF_SEND_CACHE
            | read_only
            | if structured { p::TF_SEND_DF } else { 0 }
    }

    /// Applies one command; fills `out` for reads. Returns the simulated latency in ns.
    ///
    /// The data phase runs without the device lock (the store is thread-safe per page), so
    /// requests in flight compress and decompress in parallel; only partial pages take the
    /// read-modify-write lock. As NBD allows, overlapping requests in flight at the same time
    /// are not ordered. The model phase (FTL and record) runs under the device lock. `alone`:
    /// no other request of this connection is in flight or already waiting to be read, nor was
    /// for the last `QUIET_REQUESTS` requests.
    fn execute(
        &self,
        r: &p::Request,
        payload: &[u8],
        out: &mut Vec<u8>,
        alone: bool,
        target: Target,
    ) -> Result<u64, Errno> {
        let e = &self.exports[target.export];
        // A load first: a swap on every request would be a locked instruction each.
        if self.panic_next_request.load(Ordering::Relaxed)
            && self.panic_next_request.swap(false, Ordering::SeqCst)
        {
            panic!("panic_next_request_for_test");
        }
        let ps = self.page_bytes as u64;
        // A flush names no range (clients send zeros; the spec asks nothing of a server that
        // gets more), so whatever it carries is ignored rather than added up: a large offset
        // overflowed the page arithmetic below (found by the `nbd_connection` fuzz target).
        let (offset, length) = if r.command == p::CMD_FLUSH {
            (0, 0)
        } else {
            (r.offset, u64::from(r.length))
        };
        let in_range = offset
            .checked_add(length)
            .is_some_and(|end| end <= e.size_bytes);
        let read_only = self.options.read_only || e.spec.read_only || target.snapshot;
        match r.command {
            p::CMD_WRITE | p::CMD_WRITE_ZEROES | p::CMD_TRIM if read_only => return Err(p::EPERM),
            // A hint to bring data near: there is no nearer than RAM, so nothing to do.
            p::CMD_CACHE if in_range => return Ok(0),
            p::CMD_READ | p::CMD_TRIM | p::CMD_CACHE if !in_range => return Err(p::EINVAL),
            p::CMD_WRITE | p::CMD_WRITE_ZEROES if !in_range => return Err(p::ENOSPC),
            p::CMD_READ | p::CMD_TRIM | p::CMD_WRITE | p::CMD_WRITE_ZEROES | p::CMD_FLUSH => {}
            _ => return Err(p::EINVAL),
        }
        e.requests.fetch_add(1, Ordering::Relaxed);
        let counter = match r.command {
            p::CMD_READ => Some(&e.read_bytes),
            p::CMD_WRITE | p::CMD_WRITE_ZEROES => Some(&e.written_bytes),
            p::CMD_TRIM => Some(&e.trimmed_bytes),
            _ => None,
        };
        if let Some(c) = counter {
            c.fetch_add(length, Ordering::Relaxed);
        }
        if target.volume != 0 {
            return self.execute_volume(r, payload, out, target, offset, length);
        }
        // The export's placement, then its offset on the device.
        let placement = e.placement_of(offset);
        let offset = e.base_bytes + offset;
        let span = PageSpan::new(offset, length, ps);
        let touched = span.touched();
        let std::ops::Range {
            start: whole_first,
            end: whole_end,
        } = span.whole();
        // A request alone in flight hands its whole pages to the store as one batch, which the
        // store's thread pool compresses in parallel. When the client keeps more requests in
        // flight, the connection's workers already keep the cores busy and the hand-off to the
        // pool and back (two thread switches per request) costs more than it saves. Measured
        // with fio, 1 MiB sequential writes: at QD 32, ~680 us of server CPU per MiB through
        // the pool and ~580 without; at QD 1, 1.5-1.8 GB/s through the pool, 1.1-1.4 without.
        // At QD 8 a request was often alone for a moment; requiring `QUIET_REQUESTS` alone in a
        // row took 16 runs (8 each, in ABBA order) from a mean 2.82 to 2.96 GB/s, server CPU
        // 320-392 -> 309-348 us/MiB; QD 1 stayed at 2.1-2.4 GB/s, QD 32 within its noise.
        let batched = alone && whole_end - whole_first >= BATCH_PAGES as u64;
        // Only partial pages need it: most requests don't pay for a page of zeros.
        let mut page = Vec::new();
        // Data phase: a durable device's pages are in its log (the host's page cache and the
        // cache of decompressed pages serve reads), not in the page store.
        if let Some(d) = &self.durable {
            self.volume_data(d, r, payload, out, 0, &span)?;
        } else {
            match r.command {
                p::CMD_READ => {
                    // Behind the reply header `answer` left room for, reserved already.
                    for lpn in touched {
                        if batched && lpn == whole_first {
                            // Whole pages in one parallel batch, straight into the reply.
                            let lpns: Vec<u64> = (whole_first..whole_end).collect();
                            let at = out.len();
                            out.resize(at + lpns.len() * self.page_bytes, 0);
                            self.store
                                .read_batch(&lpns, &mut out[at..])
                                .map_err(store_errno)?;
                        } else if !batched || lpn < whole_first || lpn >= whole_end {
                            let (a, b) = span.covered(lpn);
                            if b - a == self.page_bytes {
                                let at = out.len();
                                out.resize(at + self.page_bytes, 0);
                                self.store.read(lpn, &mut out[at..]).map_err(store_errno)?;
                            } else {
                                page.resize(self.page_bytes, 0);
                                self.store.read(lpn, &mut page).map_err(store_errno)?;
                                out.extend_from_slice(&page[a..b]);
                            }
                        }
                    }
                }
                p::CMD_WRITE | p::CMD_WRITE_ZEROES => {
                    let zeroes = r.command == p::CMD_WRITE_ZEROES;
                    let mut at = 0usize;
                    for lpn in touched {
                        let (a, b) = span.covered(lpn);
                        if b - a == self.page_bytes {
                            if zeroes {
                                self.store.trim(lpn);
                            } else if !batched {
                                let bytes = &payload[at..at + self.page_bytes];
                                self.store.write(lpn, bytes).map_err(store_errno)?;
                            } else if lpn == whole_first {
                                // The whole pages go as one batch, compressed in parallel.
                                let lpns: Vec<u64> = (whole_first..whole_end).collect();
                                let bytes = lpns.len() * self.page_bytes;
                                let pages = &payload[at..at + bytes];
                                self.store.write_batch(&lpns, pages).map_err(store_errno)?;
                            }
                        } else {
                            let _rmw = self.rmw.lock().unwrap_or_else(|p| p.into_inner());
                            page.resize(self.page_bytes, 0);
                            self.store.read(lpn, &mut page).map_err(store_errno)?;
                            if zeroes {
                                page[a..b].fill(0);
                            } else {
                                page[a..b].copy_from_slice(&payload[at..at + (b - a)]);
                            }
                            self.store.write(lpn, &page).map_err(store_errno)?;
                        }
                        at += b - a;
                    }
                }
                p::CMD_TRIM => {
                    for lpn in whole_first..whole_end {
                        self.store.trim(lpn);
                    }
                }
                _ => {}
            }
        }

        // Model phase.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests += 1;
        let now = self.now_ns();
        let piece = |op: Op, offset: u64, length: u64| FtlRequest {
            arrival_ns: now,
            op,
            offset_bytes: offset,
            length_bytes: length,
            placement,
        };
        let pieces = match r.command {
            p::CMD_READ => vec![piece(Op::Read, offset, length)],
            p::CMD_TRIM => vec![piece(Op::Trim, offset, length)],
            p::CMD_FLUSH => vec![piece(Op::Flush, 0, 0)],
            // Zeroes deallocate whole pages in the FTL (as TRIM) unless NO_HOLE asks for them
            // to be written; partial pages at the ends are written either way.
            p::CMD_WRITE_ZEROES
                if r.flags & p::CMD_FLAG_NO_HOLE == 0 && whole_first < whole_end =>
            {
                let (a, b) = (whole_first * ps, whole_end * ps);
                vec![
                    piece(Op::Write, offset, a - offset),
                    piece(Op::Trim, a, b - a),
                    piece(Op::Write, b, offset + length - b),
                ]
            }
            _ => vec![piece(Op::Write, offset, length)],
        };
        let mut done = now;
        let writes = matches!(r.command, p::CMD_WRITE | p::CMD_WRITE_ZEROES);
        let fua = writes && r.flags & p::CMD_FLAG_FUA != 0;
        for request in pieces
            .into_iter()
            .filter(|q| q.op == Op::Flush || q.length_bytes > 0)
            .chain(fua.then(|| piece(Op::Flush, 0, 0)))
        {
            done = done.max(state.submit(request, self.unix_start_ns)?);
            // The model's input, logged in the order the model took it (under its lock), so
            // that a replay rebuilds it exactly.
            if let Some(d) = self.durable.as_ref().filter(|_| !self.options.read_only) {
                d.lock()
                    .request(ModelRequest {
                        op: model_code(request.op),
                        offset_bytes: request.offset_bytes,
                        // Within u32: a request is at most MAX_REQUEST_BYTES.
                        length_bytes: request.length_bytes as u32,
                        arrival_ns: request.arrival_ns,
                        reclaim_group: request.placement.reclaim_group,
                        handle: request.placement.handle,
                    })
                    .map_err(|_| p::EIO)?;
            }
        }
        drop(state);
        if let Some(d) = &self.durable {
            d.sync_if_due(r.command, fua)?;
        }
        Ok(done - now)
    }
}

impl Device {
    /// A page of a snapshot or clone: from the cache of decompressed records, or read from the
    /// log (its record found under the directory's lock, read outside it). Records never
    /// change once written, so the cache is keyed by where they are and is never stale.
    fn volume_page(&self, d: &Durable, volume: u16, lpn: u64, out: &mut [u8]) -> Result<(), Errno> {
        let located = d.lock().locate(volume, lpn).map_err(|_| p::EIO)?;
        let Some(located) = located else {
            out.fill(0);
            return Ok(());
        };
        let key = located.loc().0;
        if let Some(page) = d.cache.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            out.copy_from_slice(page);
            return Ok(());
        }
        located.read_page(out).map_err(|_| p::EIO)?;
        d.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, out);
        Ok(())
    }

    /// A request on a snapshot or clone (checked, in range, writable when it writes). These
    /// are the host's copies, as qcow2's are: they live in the log and the cache, not in the
    /// page store, and the FTL model does not see them (docs/serve.md).
    fn execute_volume(
        &self,
        r: &p::Request,
        payload: &[u8],
        out: &mut Vec<u8>,
        target: Target,
        offset: u64,
        length: u64,
    ) -> Result<u64, Errno> {
        let d = self.durable.as_ref().ok_or(p::EINVAL)?;
        let e = &self.exports[target.export];
        let span = PageSpan::new(e.base_bytes + offset, length, self.page_bytes as u64);
        self.volume_data(d, r, payload, out, target.volume, &span)?;
        d.sync_if_due(r.command, r.flags & p::CMD_FLAG_FUA != 0)?;
        Ok(0)
    }

    /// The data phase of a request on a durable device's volume (the device itself: 0): pages
    /// read from the log through the cache, written to it (packed before the directory's lock
    /// is taken, then appended under it with the map updated in the same hold: the log's order
    /// is the volume's).
    fn volume_data(
        &self,
        d: &Durable,
        r: &p::Request,
        payload: &[u8],
        out: &mut Vec<u8>,
        volume: u16,
        span: &PageSpan,
    ) -> Result<(), Errno> {
        let ps = self.page_bytes;
        let mut page = vec![0u8; ps];
        let whole = span.whole();
        match r.command {
            p::CMD_READ => {
                for lpn in span.touched() {
                    let (a, b) = span.covered(lpn);
                    self.volume_page(d, volume, lpn, &mut page)?;
                    out.extend_from_slice(&page[a..b]);
                }
            }
            p::CMD_WRITE | p::CMD_WRITE_ZEROES => {
                let zeroes = r.command == p::CMD_WRITE_ZEROES;
                // The whole pages first: packed outside the lock, appended in one hold.
                if whole.start < whole.end && zeroes {
                    Durable::trim(&mut d.lock(), volume, whole.start, whole.end - whole.start)?;
                } else if whole.start < whole.end {
                    let first = span.touched().start;
                    let skip = if whole.start > first {
                        let (a, b) = span.covered(first);
                        b - a
                    } else {
                        0
                    };
                    let pages = &payload[skip..skip + (whole.end - whole.start) as usize * ps];
                    let packed: Vec<(u8, std::borrow::Cow<'_, [u8]>)> =
                        pages.chunks(ps).map(ftlab_store::log::pack_page).collect();
                    let mut data = d.lock();
                    for (lpn, (codec, bytes)) in whole.clone().zip(&packed) {
                        data.write_packed(volume, lpn, ps, *codec, bytes)
                            .map_err(|_| p::EIO)?;
                    }
                }
                // Then the partial pages at the ends: read, modified and written under the
                // read-modify-write lock (taken outside the directory's).
                let mut at = 0usize;
                for lpn in span.touched() {
                    let (a, b) = span.covered(lpn);
                    if b - a != ps {
                        let _rmw = self.volume_rmw.lock().unwrap_or_else(|p| p.into_inner());
                        self.volume_page(d, volume, lpn, &mut page)?;
                        if zeroes {
                            page[a..b].fill(0);
                        } else {
                            page[a..b].copy_from_slice(&payload[at..at + (b - a)]);
                        }
                        Durable::page(&mut d.lock(), volume, lpn, &page)?;
                    }
                    at += b - a;
                }
            }
            p::CMD_TRIM if whole.start < whole.end => {
                Durable::trim(&mut d.lock(), volume, whole.start, whole.end - whole.start)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Makes a snapshot (read-only) or clone (writable) of the device or of snapshot or
    /// clone `from`, named `name`: no data copied (docs/serve.md, "Snapshots and clones").
    pub fn create_volume(
        &self,
        from: Option<&str>,
        name: &str,
        clone: bool,
    ) -> Result<u16, String> {
        let d = self.writable_durable()?;
        let kind = if clone {
            VolumeKind::Clone
        } else {
            VolumeKind::Snapshot
        };
        let id = d.lock().create_volume(from, name, kind)?;
        d.synced_seq
            .fetch_max(d.lock().last_seq(), Ordering::AcqRel);
        Ok(id)
    }

    /// Deletes a snapshot or clone; the cleaner frees the records only it held.
    pub fn delete_volume(&self, name: &str) -> Result<(), String> {
        let d = self.writable_durable()?;
        d.lock().delete_volume(name)?;
        d.synced_seq
            .fetch_max(d.lock().last_seq(), Ordering::AcqRel);
        Ok(())
    }

    /// The device's snapshots and clones (and the device itself, first).
    pub fn volumes(&self) -> Vec<ftlab_store::durable::VolumeInfo> {
        self.durable
            .as_ref()
            .map(|d| d.lock().volumes())
            .unwrap_or_default()
    }

    fn writable_durable(&self) -> Result<&Durable, String> {
        match &self.durable {
            None => Err("snapshots need a durable device (serve --data DIR)".into()),
            Some(_) if self.options.read_only => Err("the device is read-only".into()),
            Some(d) => Ok(d),
        }
    }
}

/// Why a connection ended other than in order (a client's fault, or its socket's). The server
/// logs it and closes the connection; the device is not harmed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Protocol(#[from] p::ProtocolError),
    #[error("client does not speak fixed newstyle")]
    NotFixedNewstyle,
    #[error("option {option} of {length} bytes (at most {max})", max = p::MAX_OPTION_BYTES)]
    OptionTooLong { option: u32, length: u32 },
    #[error("unknown export `{0}`")]
    UnknownExport(String),
    #[error("the access policy allows this client nothing on `{0}`")]
    Denied(String),
    /// NBD_OPT_EXPORT_NAME before STARTTLS under `--tls require` (it has no error reply).
    #[error("export `{0}` asked for before TLS, which this server requires")]
    TlsRequired(String),
    #[error("TLS handshake: {0}")]
    Tls(String),
    #[error("write of {0} bytes (at most {max}): cannot stay in sync", max = p::MAX_REQUEST_BYTES)]
    WriteTooLong(u32),
    #[error(
        "the client sent no {what} in the time allowed (the handshake deadline, or --idle-timeout)"
    )]
    ReadTimeout { what: &'static str },
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    #[error("reading {what}: {cause}")]
    Read {
        what: &'static str,
        cause: std::io::Error,
    },
    #[error("the client read none of its replies for {} s; disconnected", REPLY_STALL.as_secs())]
    ReplyStall,
    #[error("writing: {cause}")]
    Write { cause: std::io::Error },
    #[error("handshake not finished within {seconds} s: {cause}")]
    HandshakeDeadline {
        seconds: f64,
        cause: Box<ConnectionError>,
    },
    #[error("setting the idle timeout: {0}")]
    IdleTimeout(std::io::Error),
    /// The thread that writes delayed replies (latency emulation) stopped or panicked.
    #[error("reply writer {0}")]
    ReplyWriter(&'static str),
}

fn read_exact<R: Read>(
    r: &mut R,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), ConnectionError> {
    r.read_exact(buf).map_err(|e| read_error(e, what))
}

/// Whether a socket operation failed on its timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` give EAGAIN).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn read_error(cause: std::io::Error, what: &'static str) -> ConnectionError {
    if timed_out(&cause) {
        ConnectionError::ReadTimeout { what }
    } else {
        ConnectionError::Read { what, cause }
    }
}

fn write_error(cause: std::io::Error) -> ConnectionError {
    if timed_out(&cause) {
        ConnectionError::ReplyStall
    } else {
        ConnectionError::Write { cause }
    }
}

fn send<W: Write>(w: &mut W, bytes: &[u8]) -> Result<(), ConnectionError> {
    w.write_all(bytes).map_err(write_error)
}

/// Serves one client from handshake to disconnect. `Ok` for an orderly end (ABORT, DISC or
/// end of stream between requests); `Err` with the reason when the connection had to be closed
/// for a protocol violation.
pub fn serve_connection<R: Incoming + Send, W: Write + Send>(
    device: &Device,
    reader: R,
    writer: W,
) -> Result<(), ConnectionError> {
    let peer = Peer {
        principal: policy::Principal::anonymous(),
        address: String::new(),
    };
    serve_connection_as(device, &peer, reader, writer)
}

/// Who is at the other end of a connection, as its listener saw it.
pub struct Peer {
    /// Its Unix credentials (a Unix socket) or anonymous (TCP); the names of its TLS
    /// certificate are added if it starts TLS. What the access policy decides by.
    pub principal: policy::Principal,
    /// Its address, for the audit log.
    pub address: String,
}

/// [`serve_connection`] for a client known as `peer`.
pub fn serve_connection_as<R: Incoming + Send, W: Write + Send>(
    device: &Device,
    peer: &Peer,
    reader: R,
    writer: W,
) -> Result<(), ConnectionError> {
    let limits = device.options.limits;
    // Both halves see the TLS session once STARTTLS has made one.
    let slot = tls::Slot::default();
    // Every read of the handshake waits at most until its deadline: a client that connects and
    // sends nothing, or half an option, holds a thread only that long.
    let mut r = BufReader::with_capacity(
        256 << 10,
        Deadlined {
            inner: tls::TlsReader::new(reader, slot.clone()),
            deadline: Some(Instant::now() + limits.handshake_timeout),
        },
    );
    let mut w = BufWriter::with_capacity(256 << 10, tls::TlsWriter::new(writer, slot));
    let share = budget::ConnectionShare::default();
    let handshake = handshake(device, peer, &mut r, &mut w).map_err(|e| {
        if r.get_ref().deadline.is_some_and(|d| Instant::now() >= d) {
            ConnectionError::HandshakeDeadline {
                seconds: limits.handshake_timeout.as_secs_f64(),
                cause: Box::new(e),
            }
        } else {
            e
        }
    })?;
    let Some((negotiated, principal)) = handshake else {
        tls::close(w.get_mut());
        return Ok(());
    };
    let principal = &principal;
    // Transmission: no deadline, and reads wait for ever or for the idle timeout (set once
    // here: a system call per read would cost the hot path).
    r.get_mut().deadline = None;
    r.get_ref()
        .inner
        .set_read_timeout(limits.idle_timeout)
        .map_err(ConnectionError::IdleTimeout)?;
    // Transmission: replies leave at once, or (latency emulation) when their simulated
    // completion is due, from a writer thread, so requests in flight overlap as on a device.
    if device.options.latency == Latency::None {
        // The writer and the replies in it not yet flushed (their clients still wait).
        let w = Mutex::new((w, Vec::new()));
        let result = transmission(
            device,
            &share,
            principal,
            negotiated,
            &mut r,
            |reply, _, timing, in_flight, charge| {
                let mut guard = w.lock().unwrap_or_else(|p| p.into_inner());
                let (w, unflushed) = &mut *guard;
                send(w, &reply)?;
                drop((reply, charge));
                unflushed.push(timing);
                // The last request in flight flushes for all: a reply queued behind one still
                // executing leaves with that one's (a send wakes the client: one per burst, not
                // per reply). Counted under the writer's lock, so no reply is left unflushed.
                if in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                    w.flush().map_err(write_error)?;
                    device.replied(unflushed.drain(..));
                }
                Ok(())
            },
        );
        if result.is_ok() {
            let (mut w, _) = w.into_inner().unwrap_or_else(|p| p.into_inner());
            if w.flush().is_ok() {
                tls::close(w.get_mut());
            }
        }
        result
    } else {
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<Due>();
            let writer = scope.spawn(move || deliver_when_due(device, rx, w));
            let result = transmission(
                device,
                &share,
                principal,
                negotiated,
                &mut r,
                |reply, hold, timing, in_flight, charge| {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    tx.send(Due {
                        at: Instant::now() + hold,
                        seq: 0,
                        reply,
                        timing,
                        _charge: charge,
                    })
                    .map_err(|_| ConnectionError::ReplyWriter("stopped"))
                },
            );
            drop(tx);
            let written = writer
                .join()
                .unwrap_or(Err(ConnectionError::ReplyWriter("panicked")))
                .map(|mut w| tls::close(w.get_mut()));
            result.and(written)
        })
    }
}

/// The handshake, from the greeting to the option that starts transmission: what was negotiated
/// and the client's principal (its TLS certificate's names added), or None when the client
/// ended it in order (`NBD_OPT_ABORT`).
fn handshake<R: Incoming, W: Write>(
    device: &Device,
    peer: &Peer,
    r: &mut BufReader<Deadlined<tls::TlsReader<R>>>,
    w: &mut BufWriter<tls::TlsWriter<W>>,
) -> Result<Option<(Negotiated, policy::Principal)>, ConnectionError> {
    let mut principal = peer.principal.clone();
    let principal = &mut principal;
    let tls_mode = device
        .options
        .tls
        .as_ref()
        .map_or(tls::TlsMode::Off, |t| t.mode);
    let mut tls_on = false;
    send(w, &p::greeting())?;
    w.flush().map_err(write_error)?;
    let mut flags = [0u8; 4];
    read_exact(r, &mut flags, "client flags")?;
    let client_flags = u32::from_be_bytes(flags);
    if client_flags & p::CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(ConnectionError::NotFixedNewstyle);
    }
    let no_zeroes = client_flags & p::CLIENT_NO_ZEROES != 0;
    let mut structured = false;
    let mut allocation = false;
    let name_ok = |name: &str| device.export_named(name).is_some();
    // The export chosen by OPT_EXPORT_NAME or OPT_GO, either of which ends the haggling.
    let export;
    let io_allowed;
    // Option haggling.
    loop {
        let mut h = [0u8; 16];
        read_exact(r, &mut h, "option header")?;
        let header = p::parse_option_header(&h)?;
        if header.length > p::MAX_OPTION_BYTES {
            return Err(ConnectionError::OptionTooLong {
                option: header.option,
                length: header.length,
            });
        }
        let mut data = vec![0u8; header.length as usize];
        read_exact(r, &mut data, "option data")?;
        // FORCEDTLS: before TLS, only STARTTLS and ABORT are answered.
        if tls_mode == tls::TlsMode::Require
            && !tls_on
            && header.option != p::OPT_STARTTLS
            && header.option != p::OPT_ABORT
        {
            if header.option == p::OPT_EXPORT_NAME {
                return Err(ConnectionError::TlsRequired(
                    String::from_utf8_lossy(&data).into_owned(),
                ));
            }
            send(
                w,
                &p::option_reply(
                    header.option,
                    p::REP_ERR_TLS_REQD,
                    b"this server requires TLS: start it with NBD_OPT_STARTTLS",
                ),
            )?;
            w.flush().map_err(write_error)?;
            continue;
        }
        match header.option {
            p::OPT_STARTTLS => {
                let refusal: Option<(u32, &[u8])> = match &device.options.tls {
                    None => Some((
                        p::REP_ERR_POLICY,
                        b"TLS is not configured on this server (ftlab serve --tls-cert)",
                    )),
                    Some(t) if t.mode == tls::TlsMode::Off => Some((
                        p::REP_ERR_POLICY,
                        b"TLS is switched off on this server (--tls off)",
                    )),
                    Some(_) if tls_on => Some((p::REP_ERR_INVALID, b"TLS is on already")),
                    Some(_) if !data.is_empty() => {
                        Some((p::REP_ERR_INVALID, b"STARTTLS takes no data"))
                    }
                    Some(_) => None,
                };
                if let Some((error, message)) = refusal {
                    send(w, &p::option_reply(header.option, error, message))?;
                } else {
                    let setup = device.options.tls.as_ref().expect("checked above");
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    w.flush().map_err(write_error)?;
                    // A client should wait for the ACK, but what it sent on is TLS already.
                    let early = r.buffer().to_vec();
                    std::io::BufRead::consume(r, early.len());
                    let slot = r.get_ref().inner.slot.clone();
                    let raw_w = &mut w.get_mut().inner;
                    match tls::start(setup, &slot, &early, r.get_mut(), raw_w) {
                        Ok(established) => {
                            tls_on = true;
                            principal.names.extend(established.names);
                            device.audit(
                                "tls",
                                serde_json::json!({
                                    "principal": principal.describe(),
                                    "address": peer.address,
                                    "version": established.version,
                                    "cipher": established.cipher,
                                }),
                            );
                        }
                        Err(why) => {
                            device.audit(
                                "tls_refused",
                                serde_json::json!({
                                    "principal": principal.describe(),
                                    "address": peer.address,
                                    "reason": why,
                                }),
                            );
                            return Err(ConnectionError::Tls(why));
                        }
                    }
                    continue;
                }
            }
            p::OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                let Some(named) = device.export_named(&name) else {
                    return Err(ConnectionError::UnknownExport(name.into_owned()));
                };
                // This old option has no error reply: a denied client is disconnected.
                io_allowed = device.io_allowed(principal, named);
                if io_allowed == 0 {
                    return Err(ConnectionError::Denied(name.into_owned()));
                }
                export = named;
                send(w, &device.exports[export.export].size_bytes.to_be_bytes())?;
                send(
                    w,
                    &device.transmission_flags(structured, export).to_be_bytes(),
                )?;
                if !no_zeroes {
                    send(w, &[0u8; 124])?;
                }
                break;
            }
            p::OPT_ABORT => {
                // The spec lets the client close without waiting for this ACK: a failed send
                // is no error.
                let _ = send(w, &p::option_reply(header.option, p::REP_ACK, &[]));
                let _ = w.flush();
                return Ok(None);
            }
            p::OPT_LIST => {
                if !data.is_empty() {
                    send(
                        w,
                        &p::option_reply(header.option, p::REP_ERR_INVALID, b"LIST takes no data"),
                    )?;
                } else {
                    // Each export, then each on every snapshot and clone.
                    let volumes = device.volumes();
                    let on = std::iter::once(None).chain(volumes.iter().skip(1).map(Some));
                    for v in on {
                        for e in &device.exports {
                            let name = match v {
                                None => e.spec.name.clone(),
                                Some(v) => format!("{}@{}", e.spec.name, v.name),
                            };
                            if !device.allows(principal, "list", &name) {
                                continue;
                            }
                            let mut d = (name.len() as u32).to_be_bytes().to_vec();
                            d.extend_from_slice(name.as_bytes());
                            send(w, &p::option_reply(header.option, p::REP_SERVER, &d))?;
                        }
                    }
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                }
            }
            p::OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    structured = true;
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                } else {
                    send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            b"STRUCTURED_REPLY takes no data",
                        ),
                    )?;
                }
            }
            p::OPT_LIST_META_CONTEXT | p::OPT_SET_META_CONTEXT => {
                let set = header.option == p::OPT_SET_META_CONTEXT;
                match p::parse_meta_context(&data) {
                    Err(e) => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            e.to_string().as_bytes(),
                        ),
                    )?,
                    // Block status replies are structured: the spec asks for them first.
                    Ok(_) if !structured => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            b"negotiate structured replies first",
                        ),
                    )?,
                    Ok(m) if !name_ok(&m.name) => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_UNKNOWN,
                            format!("no export `{}`", m.name).as_bytes(),
                        ),
                    )?,
                    Ok(m) => {
                        // LIST with no query lists every context, and "base:" every one of
                        // that namespace; SET selects exact names (and replaces an earlier SET).
                        let matched = if set {
                            m.queries.iter().any(|q| q == p::BASE_ALLOCATION)
                        } else {
                            m.queries.is_empty()
                                || m.queries
                                    .iter()
                                    .any(|q| q == p::BASE_ALLOCATION || q == "base:")
                        };
                        if set {
                            allocation = matched;
                        }
                        if matched {
                            // LIST gives id 0: the ids mean something only after SET.
                            let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
                            let mut d = id.to_be_bytes().to_vec();
                            d.extend_from_slice(p::BASE_ALLOCATION.as_bytes());
                            send(w, &p::option_reply(header.option, p::REP_META_CONTEXT, &d))?;
                        }
                        send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    }
                }
            }
            p::OPT_INFO | p::OPT_GO => match p::parse_go(&data) {
                Err(e) => send(
                    w,
                    &p::option_reply(header.option, p::REP_ERR_INVALID, e.to_string().as_bytes()),
                )?,
                Ok(go) if !name_ok(&go.name) => send(
                    w,
                    &p::option_reply(
                        header.option,
                        p::REP_ERR_UNKNOWN,
                        format!("no export `{}`", go.name).as_bytes(),
                    ),
                )?,
                Ok(go)
                    if device.io_allowed(
                        principal,
                        device.export_named(&go.name).expect("checked by name_ok"),
                    ) == 0 =>
                {
                    send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_POLICY,
                            format!(
                                "the access policy allows {} nothing on `{}`",
                                principal.describe(),
                                go.name
                            )
                            .as_bytes(),
                        ),
                    )?
                }
                Ok(go) => {
                    let named = device.export_named(&go.name).expect("checked by name_ok");
                    let info = p::info_export(
                        device.exports[named.export].size_bytes,
                        device.transmission_flags(structured, named),
                    );
                    send(w, &p::option_reply(header.option, p::REP_INFO, &info))?;
                    // Any byte range works (partial pages are read-modify-writes); whole
                    // pages are what the device prefers.
                    let bs = p::info_block_size(1, device.page_bytes as u32, p::MAX_REQUEST_BYTES);
                    send(w, &p::option_reply(header.option, p::REP_INFO, &bs))?;
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    if header.option == p::OPT_GO {
                        export = named;
                        io_allowed = device.io_allowed(principal, named);
                        break;
                    }
                }
            },
            _ => send(
                w,
                &p::option_reply(header.option, p::REP_ERR_UNSUP, b"not supported by ftlab"),
            )?,
        }
        w.flush().map_err(write_error)?;
    }
    w.flush().map_err(write_error)?;
    Ok(Some((
        Negotiated {
            export,
            io_allowed,
            structured,
            allocation,
        },
        principal.clone(),
    )))
}

/// A connection's read side whose every read waits at most until `deadline`, while one is set
/// (the handshake's). The socket's timeout is set before each read to the time left, so a client
/// trickling a byte at a time cannot stretch the deadline.
struct Deadlined<R> {
    inner: R,
    deadline: Option<Instant>,
}

impl<R: Incoming> Read for Deadlined<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.inner.set_read_timeout(Some(left))?;
        }
        self.inner.read(buf)
    }
}

impl<R: Incoming> Incoming for Deadlined<R> {
    fn bytes_waiting(&self) -> bool {
        self.inner.bytes_waiting()
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }
}

/// Threads per connection, each reading and executing requests in turn: enough to keep both
/// cores busy.
const WORKERS_PER_CONNECTION: usize = 2;
/// A request counts as alone (and may use the store's thread pool) only after this many requests
/// in a row were read alone: a client with several requests in flight is often briefly alone
/// (its next request still on the way), and the pool's hand-offs then cost more than they save.
const QUIET_REQUESTS: u32 = 8;

/// Whole pages from which a request alone in flight goes to the store as one parallel batch.
const BATCH_PAGES: usize = 8;

/// Reads requests until DISC or end of stream and executes them, several in flight at once
/// (NBD replies carry the request's cookie, so they may leave in any order); hands each reply to
/// `deliver` with how long to hold it and the count of requests read and not yet delivered,
/// which `deliver` decrements. Returns once every request read has been answered.
///
/// Leader/follower, as nbdkit's threads: each worker takes the reader, reads one request and its
/// payload, lets go, executes it and delivers the reply. A dedicated reader thread handing
/// requests to workers over a channel cost a thread wake-up per request, which for 4 KiB
/// requests was a fifth of the server's time.
///
/// Each request is charged to the connection's `share` of the memory budget before its payload
/// or reply exists, and `deliver` drops the charge once the reply has left.
fn transmission<'d, R: Incoming + Send>(
    device: &'d Device,
    share: &'d budget::ConnectionShare,
    principal: &'d policy::Principal,
    negotiated: Negotiated,
    r: &mut BufReader<R>,
    deliver: impl Fn(
            Vec<u8>,
            Duration,
            Timing,
            &AtomicUsize,
            budget::Charge<'d>,
        ) -> Result<(), ConnectionError>
        + Sync,
) -> Result<(), ConnectionError> {
    // (reader, done, requests read alone in a row).
    let reader = Mutex::new((r, false, 0u32));
    let in_flight = AtomicUsize::new(0);
    let failed: Mutex<Option<ConnectionError>> = Mutex::new(None);
    let fail = |e: ConnectionError| {
        failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    };
    std::thread::scope(|scope| {
        for _ in 0..WORKERS_PER_CONNECTION {
            scope.spawn(|| {
                let mut payload = Vec::new();
                loop {
                    let (request, charge, alone, read_at) = {
                        let mut guard = reader.lock().unwrap_or_else(|p| p.into_inner());
                        let (r, done, quiet) = &mut *guard;
                        if *done {
                            return;
                        }
                        match read_request(r, &mut payload, &device.budget, share) {
                            Ok(Some((request, charge))) => {
                                let in_flight = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                                // Asked only where the answer is used (a syscall).
                                let big =
                                    request.length as usize >= BATCH_PAGES * device.page_bytes;
                                let alone_now = in_flight == 1
                                    && !(big
                                        && (!r.buffer().is_empty() || r.get_ref().bytes_waiting()));
                                *quiet = if alone_now {
                                    quiet.saturating_add(1)
                                } else {
                                    0
                                };
                                // A nonzero count already says this request is alone.
                                (request, charge, *quiet >= QUIET_REQUESTS, Instant::now())
                            }
                            Ok(None) => {
                                *done = true;
                                return;
                            }
                            Err(e) => {
                                *done = true;
                                fail(e);
                                return;
                            }
                        }
                    };
                    let length = match request.command {
                        p::CMD_WRITE => request.length as usize,
                        _ => 0,
                    };
                    let reply = answer(
                        device,
                        principal,
                        negotiated,
                        &request,
                        &payload[..length],
                        alone,
                    );
                    // An idle connection keeps no large buffer (its charge is returned with the
                    // reply; this memory would otherwise stay with the connection).
                    if payload.capacity() > KEEP_PAYLOAD_BYTES {
                        payload = Vec::new();
                    }
                    let timing = Timing {
                        read_at,
                        op: match request.command {
                            p::CMD_READ => Some(Op::Read),
                            p::CMD_WRITE | p::CMD_WRITE_ZEROES => Some(Op::Write),
                            p::CMD_TRIM => Some(Op::Trim),
                            p::CMD_FLUSH => Some(Op::Flush),
                            _ => None,
                        },
                    };
                    if let Err(e) = deliver(reply.0, reply.1, timing, &in_flight, charge) {
                        reader.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
                        fail(e);
                        return;
                    }
                }
            });
        }
    });
    failed
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(Ok(()), Err)
}

/// The next request, its payload (of a write) at the front of `payload`, and what it is charged
/// (its payload or reply bytes, charged before they are read or made: `budget`); None at DISC or
/// end of stream.
fn read_request<'d, R: Read>(
    r: &mut BufReader<R>,
    payload: &mut Vec<u8>,
    budget: &'d budget::InflightBudget,
    share: &'d budget::ConnectionShare,
) -> Result<Option<(p::Request, budget::Charge<'d>)>, ConnectionError> {
    let mut h = [0u8; 28];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(read_error(e, "request")),
    }
    let request = p::parse_request(&h)?;
    let data_bytes = match request.command {
        p::CMD_DISC => return Ok(None),
        p::CMD_WRITE if request.length > p::MAX_REQUEST_BYTES => {
            return Err(ConnectionError::WriteTooLong(request.length))
        }
        p::CMD_WRITE => request.length,
        // A longer read is refused, with no data.
        p::CMD_READ if request.length <= p::MAX_REQUEST_BYTES => request.length,
        p::CMD_BLOCK_STATUS => 8 * MAX_STATUS_DESCRIPTORS as u32,
        _ => 0,
    };
    // May wait: while it does, this connection reads nothing more.
    let charge = budget.charge(
        share,
        u64::from(data_bytes) + budget::REQUEST_OVERHEAD_BYTES,
    );
    if request.command == p::CMD_WRITE {
        // The buffer is reused request after request (and never cleared): a fresh megabyte
        // per request would come from mmap and cost the kernel a page clear per 4 KiB. It grows
        // piece by piece as the bytes arrive, so a header alone costs no memory.
        let length = request.length as usize;
        let mut at = 0;
        while at < length {
            let end = (at + PAYLOAD_PIECE_BYTES).min(length);
            if payload.len() < end {
                payload.resize(end, 0);
            }
            read_exact(r, &mut payload[at..end], "write payload")?;
            at = end;
        }
    }
    Ok(Some((request, charge)))
}

/// Executes one request: the reply bytes and how long to hold them. With structured replies
/// negotiated, a read's data goes in one final OFFSET_DATA chunk and every error in an ERROR
/// chunk carrying a message; other successes keep the simple reply, as the spec allows. A read's
/// data is written behind room for its reply header, so the reply is that one buffer (charged to
/// the request before it exists: `budget`).
fn answer(
    device: &Device,
    principal: &policy::Principal,
    negotiated: Negotiated,
    request: &p::Request,
    payload: &[u8],
    alone: bool,
) -> (Vec<u8>, Duration) {
    let structured = negotiated.structured;
    if request.command == p::CMD_BLOCK_STATUS && !device.draining.load(Ordering::SeqCst) {
        // Allowed only with the context negotiated (so structured replies too).
        let status = if negotiated.allocation {
            device.block_status(request, negotiated.export)
        } else {
            Err(p::EINVAL)
        };
        let reply = match status {
            Ok(descriptors) => {
                p::block_status_reply(request.cookie, ALLOCATION_CONTEXT_ID, &descriptors)
            }
            Err(errno) => error_reply(device, structured, request, errno),
        };
        return (reply, Duration::ZERO);
    }
    // Structured: the chunk header and the data's offset; simple: the reply header.
    let head = if structured { 20 + 8 } else { 16 };
    let mut out = Vec::new();
    // The maximum block size bounds payloads (a read's reply; a longer write never gets here).
    // TRIM and WRITE_ZEROES carry none and may be longer, as the spec lets clients send them:
    // mkfs discards the whole device in one request, and refusing it kept that trim from the
    // FTL model.
    let result = if device.draining.load(Ordering::SeqCst) {
        Err(p::ESHUTDOWN)
    } else if device.failure().is_some() {
        Err(p::EIO)
    } else if request.command == p::CMD_READ && request.length > p::MAX_REQUEST_BYTES {
        Err(p::EINVAL)
    } else if policy::io_bit(request.command) & negotiated.io_allowed == 0 {
        // Decided again, for the audit line and its reason.
        let name = device.target_name(negotiated.export);
        let action = policy::IO_ACTIONS
            .iter()
            .find(|(_, bit)| bit & policy::io_bit(request.command) != 0)
            .map_or("read", |(a, _)| a);
        device.allows(principal, action, &name);
        Err(p::EPERM)
    } else {
        if request.command == p::CMD_READ {
            out.reserve_exact(head + request.length as usize);
            out.resize(head, 0);
        }
        // Unwind safety: after a panic nothing of the device is executed again (`failure`),
        // and only its counters and store are read, for the statistics and the image.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            device.execute(request, payload, &mut out, alone, negotiated.export)
        }))
        .unwrap_or_else(|panic| Err(device.fail(request, &*panic)))
    };
    match result {
        Ok(latency_ns) => {
            let hold_ns = match device.options.latency {
                Latency::None => 0.0,
                Latency::Real => latency_ns as f64,
                Latency::Scaled(x) => latency_ns as f64 * x,
            };
            let reply = match (structured, request.command) {
                (true, p::CMD_READ) if out.len() == head => p::structured_reply_header(
                    p::REPLY_FLAG_DONE,
                    p::REPLY_TYPE_NONE,
                    request.cookie,
                    0,
                )
                .to_vec(),
                (true, p::CMD_READ) => {
                    let h = p::structured_reply_header(
                        p::REPLY_FLAG_DONE,
                        p::REPLY_TYPE_OFFSET_DATA,
                        request.cookie,
                        (8 + out.len() - head) as u32,
                    );
                    out[..20].copy_from_slice(&h);
                    out[20..28].copy_from_slice(&request.offset.to_be_bytes());
                    out
                }
                (false, p::CMD_READ) => {
                    out[..16].copy_from_slice(&p::simple_reply_header(0, request.cookie));
                    out
                }
                _ => p::simple_reply_header(0, request.cookie).to_vec(),
            };
            (reply, Duration::from_nanos(hold_ns as u64))
        }
        Err(errno) => (
            error_reply(device, structured, request, errno),
            Duration::ZERO,
        ),
    }
}

/// The reply to a request that failed with `errno`: an ERROR chunk with a message when
/// structured replies were negotiated, a simple reply otherwise.
fn error_reply(device: &Device, structured: bool, request: &p::Request, errno: Errno) -> Vec<u8> {
    if structured {
        p::structured_error(
            request.cookie,
            errno,
            &error_message(request, errno, device.failure()),
        )
    } else {
        p::simple_reply_header(errno, request.cookie).to_vec()
    }
}

/// What a structured error chunk tells the human behind the client.
fn error_message(request: &p::Request, errno: u32, failure: Option<&str>) -> String {
    let failed;
    let what = match (errno, failure) {
        (p::EINVAL, _) => "invalid request (out of range, too long, or an unknown command)",
        (p::ENOSPC, _) => "no space: beyond the device, or the page store is at --mem-limit",
        (p::EIO, Some(why)) => {
            failed = format!("the device has failed: {why}");
            &failed
        }
        (p::EIO, None) => "I/O error in the page store",
        (p::ESHUTDOWN, _) => "the server is shutting down",
        _ => "error",
    };
    format!(
        "ftlab: {} at offset {} length {}: {what}",
        p::command_name(request.command),
        request.offset,
        request.length
    )
}

/// When a request was read and which operation it was (None: a command that is not one),
/// for the client latency.
#[derive(Clone, Copy, Debug)]
struct Timing {
    read_at: Instant,
    op: Option<Op>,
}

/// A reply held until `at` (latency emulation); `seq` orders replies due at the same instant.
struct Due<'d> {
    at: Instant,
    seq: u64,
    reply: Vec<u8>,
    timing: Timing,
    /// Held until the reply has been written, then returned (dropped with the `Due`).
    _charge: budget::Charge<'d>,
}

impl PartialEq for Due<'_> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due<'_> {}
impl PartialOrd for Due<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Writes each reply when it is due (earliest first), until the sender is gone and every
/// reply is out.
fn deliver_when_due<W: Write>(
    device: &Device,
    rx: std::sync::mpsc::Receiver<Due<'_>>,
    mut w: BufWriter<W>,
) -> Result<BufWriter<W>, ConnectionError> {
    use std::cmp::Reverse;
    use std::sync::mpsc::RecvTimeoutError;
    let mut due: std::collections::BinaryHeap<Reverse<Due>> = std::collections::BinaryHeap::new();
    let mut written = Vec::new();
    let mut seq = 0u64;
    let mut open = true;
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
            let Reverse(d) = due.pop().expect("peeked");
            send(&mut w, &d.reply)?;
            written.push(d.timing);
            drop(d);
        }
        if !written.is_empty() {
            w.flush().map_err(write_error)?;
            device.replied(written.drain(..));
        }
        let next = due
            .peek()
            .map(|Reverse(d)| d.at.saturating_duration_since(now));
        if !open {
            match next {
                None => return Ok(w),
                Some(wait) => {
                    std::thread::sleep(wait);
                    continue;
                }
            }
        }
        let received = match next {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(mut d) => {
                seq += 1;
                d.seq = seq;
                due.push(Reverse(d));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
    }
}

/// Where a file is written before it is renamed over `path` (`--image`, `--stats`): `path` plus
/// `.tmp`, so that it never touches another of the user's files (`disk.img` -> `disk.img.tmp`,
/// not `disk.tmp`).
pub fn tmp_path_beside(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the FTL refuses reaches the client as the error the NBD spec gives for it (it was
    /// EINVAL for everything).
    #[test]
    fn ftl_errors_become_the_nbd_errors_the_spec_gives() {
        let out = ftlab_core::ftl::FtlError::OutOfRange {
            offset_bytes: 0,
            length_bytes: 1,
            capacity_bytes: 0,
        };
        assert_eq!(ftl_errno(&out, Op::Write), p::ENOSPC);
        assert_eq!(ftl_errno(&out, Op::Read), p::EINVAL);
        let stream = ftlab_core::ftl::FtlError::NoSuchHandle {
            handle: 3,
            handles: 1,
        };
        assert_eq!(ftl_errno(&stream, Op::Write), p::EINVAL);
    }
}
