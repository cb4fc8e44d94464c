//! The live device: ftlab's FTL model in front of the bytes a client stores, for any front end
//! (the NBD server in `ftlab-nbd`, the SQLite VFS in `ftlab-sqlite`). Every request goes
//! through the FTL core (so WAF, GC and latency are accounted as in replay) and its bytes live
//! in the compressed page store, or with `--data` in a durable log (`ftlab_store::durable`).
//!
//! Owns: the device's options, its exports (namespaces) and volumes, the data and model phases
//! of a request (`execute`), group commit of a durable device, images, statistics, the access
//! policy in force and the audit log. Does not know: sockets, NBD or any wire format (a
//! front end turns its requests into a [`Command`] and the [`IoError`] back into its own
//! codes), FTL internals (it calls `Ftl::submit`), or how the store compresses.

mod access;
pub mod budget;
mod command;
pub mod control;
pub mod dictionary;
mod durable;
mod error;
mod execute;
mod exports;
mod image;
mod options;
pub mod policy;
mod refusals;
mod stats;

pub use command::{Allocation, Command, CommandKind, IoError, LocalCommand};
pub use error::{DeviceError, VolumeError};
pub use exports::Target;
pub use ftlab_core::request::Placement;
pub use ftlab_sim::placement::PlacementRanges;
pub use ftlab_sim::trace::RecordFormat;
pub use options::{
    default_checkpoint_every_bytes, DeviceOptions, Durability, ExportSpec, Latency, Maintenance,
    BATCH_PAGES, DEFAULT_MAX_INFLIGHT_BYTES, MAX_REQUEST_BYTES,
};
pub use stats::Late;

use durable::Durable;
pub use durable::VolumeUse;
use exports::Export;
use ftlab_core::config::Config;
use ftlab_core::request::{Op, Request as FtlRequest};
use ftlab_sim::report::{OpHistograms, Recorder};
use ftlab_sim::ConfiguredFtl;
use ftlab_store::PageStore;
use ftlab_store::StoreConfig;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

struct State {
    ftl: ConfiguredFtl,
    /// The model's clock: the arrival of the last request it took (a drain's included).
    clock_ns: u64,
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
    fn submit(&mut self, request: FtlRequest, unix_start_ns: u64) -> Result<u64, IoError> {
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
        self.clock_ns = request.arrival_ns;
        self.recorder.record(&request, request.arrival_ns, done_ns);
        Ok(done_ns)
    }
}

/// The emulated SSD: the page store (thread-safe per page; partial-page read-modify-writes
/// serialised by their own lock) and the FTL model behind the device lock, applied in the order
/// requests reach it.
pub struct Device {
    /// With a writable durable device (`Maintenance::Background`): the thread that checkpoints
    /// and cleans; first, so it is stopped first when the device is dropped.
    _maintainer: Option<durable::Maintainer>,
    /// Shared with the maintenance thread, which saves the model at checkpoints.
    state: std::sync::Arc<Mutex<State>>,
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
    /// Denials audited in full once a minute per principal and action (`access.rs`).
    denials: Mutex<access::DenialWindows>,
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
    /// With latency emulation: replies that left after the model's completion (`stats::Late`).
    late: Mutex<stats::Late>,
    /// The resolved configuration, for the statistics.
    config: Config,
    exports: Vec<Export>,
    /// With `data`: the device directory.
    durable: Option<std::sync::Arc<Durable>>,
    /// Connections serving each snapshot or clone (`use_target`): one in use is not deleted.
    volume_users: Mutex<std::collections::HashMap<u16, u32>>,
    /// The model's clock at start: where the recovered requests left it (0 without `data`).
    clock_base_ns: u64,
    /// Memory of requests in flight, over all connections.
    budget: budget::InflightBudget,
}

/// The error the NBD spec (and NVMe) gives for what the FTL refused: a write beyond the end is
/// "no space", any other request out of range or naming no stream is invalid.
fn ftl_errno(e: &ftlab_core::ftl::FtlError, op: Op) -> IoError {
    match (e, op) {
        (ftlab_core::ftl::FtlError::OutOfRange { .. }, Op::Write) => IoError::NoSpace,
        (ftlab_core::ftl::FtlError::OutOfRange { .. }, _) => IoError::Invalid,
        (
            ftlab_core::ftl::FtlError::NoSuchHandle { .. }
            | ftlab_core::ftl::FtlError::NoSuchReclaimGroup { .. },
            _,
        ) => IoError::Invalid,
    }
}

/// A page-store failure: a full store (its memory limit) is "no space left", anything else an
/// I/O error.
fn store_errno(e: ftlab_store::StoreError) -> IoError {
    match e {
        ftlab_store::StoreError::MemLimit { .. } => IoError::NoSpace,
        _ => IoError::Io,
    }
}

impl Device {
    pub fn new(config: &Config, options: DeviceOptions) -> Result<Device, DeviceError> {
        let geometry = config.geometry()?;
        ftlab_core::memory::MemoryEstimate::of(config, &geometry)
            .check(ftlab_core::memory::available().as_ref())?;
        let page_bytes = geometry.page_size_bytes as usize;
        if options.max_inflight_bytes < budget::MIN_INFLIGHT_BYTES {
            return Err(DeviceError::InflightBudget(options.max_inflight_bytes));
        }
        let inflight = budget::InflightBudget::new(options.max_inflight_bytes);
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
            clock_ns: 0,
            requests: 0,
            record: None,
            record_format: options.record_format,
            record_error: None,
            recorded: 0,
            recorder: Recorder::without_series(),
        };
        let (durable, clock_base_ns) = match &options.data {
            Some(dir) => {
                let (d, clock) = Self::recover(dir, &mut state, config, &geometry, &options)?;
                (Some(std::sync::Arc::new(d)), clock)
            }
            None => (None, 0),
        };
        // After the replay: the record file holds what this run's clients send.
        state.record = record;
        let state = std::sync::Arc::new(Mutex::new(state));
        let maintainer = match (&durable, options.maintenance) {
            (Some(d), Maintenance::Background { log_done }) if !options.read_only => Some(
                durable::Maintainer::spawn(d.clone(), state.clone(), log_done).map_err(
                    |cause| DeviceError::File {
                        path: d.dir.clone(),
                        cause,
                    },
                )?,
            ),
            _ => None,
        };
        Ok(Device {
            _maintainer: maintainer,
            durable,
            volume_users: Mutex::default(),
            clock_base_ns,
            rmw: Mutex::new(()),
            volume_rmw: Mutex::new(()),
            state,
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
            denials: Mutex::default(),
            panic_next_request: AtomicBool::new(false),
            client_latency: Mutex::new(OpHistograms::default()),
            late: Mutex::new(stats::Late::default()),
            config: config.clone(),
            budget: inflight,
            exports,
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
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

    /// Marks the device failed: executing `command` panicked with `panic` (a front end catches
    /// the unwind around [`Device::execute`]). Returns the command's answer, an I/O error.
    pub fn fail(&self, command: &Command, panic: &(dyn std::any::Any + Send)) -> IoError {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        let _ = self.failure.set(format!(
            "internal error (a bug in ftlab) executing {} at offset {} length {}: {why}",
            command.kind.name(),
            command.offset,
            command.length
        ));
        IoError::Io
    }

    /// Whether `begin_shutdown` was called: a front end answers what it reads from then on
    /// with its "shutting down" error.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// How replies are to be timed (a front end holds each for the latency `execute` returns).
    pub fn latency(&self) -> Latency {
        self.options.latency
    }

    /// The FTL's page: the size a front end advertises as preferred.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Memory of requests in flight, over all of a front end's connections.
    pub fn budget(&self) -> &budget::InflightBudget {
        &self.budget
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
                data.request(ftlab_store::durable::ModelRequest {
                    op: ftlab_store::durable::model_op::DRAIN,
                    offset_bytes: 0,
                    length_bytes: 0,
                    arrival_ns: now,
                    reclaim_group: 0,
                    handle: 0,
                })
                .map_err(failed)?;
                s.clock_ns = now;
                // The model saved with it, so the next start replays nothing; the cleaner too:
                // a user who opens and closes the device often (the SQLite VFS) may never log
                // enough between for the background checkpoint.
                let covered = data.model_requests();
                let packed = ftlab_store::durable::PackedModel::pack(&d.save_model(&s));
                data.checkpoint_with_model(&packed, covered)
                    .and_then(|_| data.clean(0.5))
                    .map_err(failed)?;
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
        self.ns_at(Instant::now())
    }

    /// The model's clock at `at` (an instant before the device started counts as its start).
    fn ns_at(&self, at: Instant) -> u64 {
        self.clock_base_ns + at.saturating_duration_since(self.started).as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the FTL refuses reaches the client as the error the NBD spec gives for it (it was
    /// EINVAL for everything; `ftlab-nbd` maps each `IoError` to the spec's code).
    #[test]
    fn ftl_errors_become_the_nbd_errors_the_spec_gives() {
        let out = ftlab_core::ftl::FtlError::OutOfRange {
            offset_bytes: 0,
            length_bytes: 1,
            capacity_bytes: 0,
        };
        assert_eq!(ftl_errno(&out, Op::Write), IoError::NoSpace);
        assert_eq!(ftl_errno(&out, Op::Read), IoError::Invalid);
        let stream = ftlab_core::ftl::FtlError::NoSuchHandle {
            handle: 3,
            handles: 1,
        };
        assert_eq!(ftl_errno(&stream, Op::Write), IoError::Invalid);
    }
}
