//! A durable device's directory (`ftlab_store::durable`) as the device uses it: group commit
//! at FLUSH and FUA, recovery (the model's requests replayed), checkpoints and the cleaner,
//! and the volumes (snapshots and clones) made and deleted on it.

use crate::options::LOG_SEGMENT_BYTES;
use crate::CommandKind;
use crate::{
    Device, DeviceError, DeviceOptions, Durability, IoError, Placement, State, VolumeError,
};
use ftlab_core::request::{Op, Request as FtlRequest};
use ftlab_store::durable::{DataDir, DirOptions, VolumeKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The device directory of a durable device (`ftlab_store::durable`), and what recovery found
/// at start.
pub(crate) struct Durable {
    pub(crate) data: Mutex<DataDir>,
    /// The last record known durable (its sequence number).
    pub(crate) synced_seq: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) mode: Durability,
    pub(crate) dir: std::path::PathBuf,
    /// A checkpoint is written once this many bytes were appended since the last.
    pub(crate) checkpoint_every_bytes: u64,
    pub(crate) recovered_records: u64,
    pub(crate) replayed_requests: u64,
    pub(crate) checkpoint_seq: u64,
    pub(crate) dropped_bytes: u64,
    pub(crate) dropped_why: Option<String>,
    /// Decompressed pages of snapshots and clones (read from the log).
    pub(crate) cache: Mutex<ftlab_store::cache::PageCache>,
}

use ftlab_store::durable::model_op;

/// The model's op code in the log.
pub(crate) fn model_code(op: Op) -> u8 {
    match op {
        Op::Read => model_op::READ,
        Op::Write => model_op::WRITE,
        Op::Trim => model_op::TRIM,
        Op::Flush => model_op::FLUSH,
    }
}

/// What a client is told of a failed append: `ENOSPC` for a full disk (it clears when space
/// returns: the log resumes by itself), EIO for anything else.
pub(crate) fn log_error(e: &ftlab_store::log::LogError) -> IoError {
    if e.is_no_space() {
        IoError::NoSpace
    } else {
        IoError::Io
    }
}

impl Durable {
    /// The directory, to append to: a read-only device refuses every change before it gets
    /// here.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, DataDir> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A failed append is the request's error (`ENOSPC` when the disk is full, else EIO): what
    /// was not logged is not acknowledged.
    pub(crate) fn page(
        data: &mut DataDir,
        volume: u16,
        lpn: u64,
        page: &[u8],
    ) -> Result<(), IoError> {
        data.write_page(volume, lpn, page)
            .map_err(|e| log_error(&e))
    }

    pub(crate) fn trim(
        data: &mut DataDir,
        volume: u16,
        lpn: u64,
        pages: u64,
    ) -> Result<(), IoError> {
        data.trim(volume, lpn, pages).map_err(|e| log_error(&e))
    }

    /// Durable before a request is answered: a FLUSH, an FUA write, or with `always` any
    /// change.
    pub(crate) fn sync_if_due(&self, command: CommandKind, fua: bool) -> Result<(), IoError> {
        let due = match self.mode {
            Durability::Flush => fua || command == CommandKind::Flush,
            Durability::Always => fua || command != CommandKind::Read,
            Durability::Never => false,
        };
        if due {
            self.sync()?;
        }
        Ok(())
    }

    /// Makes every record appended so far durable. A flush that finds its records already
    /// synced by another (group commit) returns at once.
    pub(crate) fn sync(&self) -> Result<(), IoError> {
        let mut data = self.lock();
        if data.read_only() || data.last_seq() <= self.synced_seq.load(Ordering::Acquire) {
            return Ok(());
        }
        let seq = data.commit().map_err(|e| log_error(&e))?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced_seq.store(seq, Ordering::Release);
        Ok(())
    }
}

impl Device {
    /// Opens the device directory `dir` (created when absent; its pages stay in the log, read
    /// through the cache), and replays every request the FTL model saw, in order and at its
    /// arrival time, so the model is what it was (the same report as without a crash).
    /// Returns the directory and the model's clock.
    pub(crate) fn recover(
        dir: &std::path::Path,
        state: &mut State,
        geometry: &ftlab_core::geometry::Geometry,
        options: &DeviceOptions,
    ) -> Result<(Durable, u64), DeviceError> {
        let log_error = |e: ftlab_store::log::LogError| DeviceError::Log(e.to_string());
        let page_bytes = geometry.page_size_bytes as usize;
        let (data, opened) = DataDir::open(
            dir,
            &DirOptions {
                pages: geometry.logical_pages,
                page_bytes,
                read_only: options.read_only,
                segment_bytes: LOG_SEGMENT_BYTES,
            },
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
            state.submit(request, 0).map_err(|e| {
                DeviceError::Log(format!(
                    "{}: request {k} of the model ({op:?} at byte {}) fails its replay (errno {}): \
                     another configuration than the one it ran with?",
                    dir.display(),
                    r.offset_bytes,
                    e.errno()
                ))
            })?;
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

    /// Makes a snapshot (read-only) or clone (writable) of the device or of snapshot or
    /// clone `from`, named `name`: no data copied (docs/serve.md, "Snapshots and clones").
    pub fn create_volume(
        &self,
        from: Option<&str>,
        name: &str,
        clone: bool,
    ) -> Result<u16, VolumeError> {
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
    pub fn delete_volume(&self, name: &str) -> Result<(), VolumeError> {
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

    fn writable_durable(&self) -> Result<&Durable, VolumeError> {
        match &self.durable {
            None => Err(VolumeError::NotDurable),
            Some(_) if self.options.read_only => Err(VolumeError::ReadOnly),
            Some(d) => Ok(d),
        }
    }
}
