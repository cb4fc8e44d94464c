//! A durable device's directory (`ftlab_store::durable`) as the device uses it: group commit
//! at FLUSH and FUA, recovery (the model's requests replayed), checkpoints and the cleaner,
//! and the volumes (snapshots and clones) made and deleted on it.

use crate::options::log_segment_bytes;
use crate::CommandKind;
use crate::{
    Device, DeviceError, DeviceOptions, Durability, IoError, Placement, State, VolumeError,
};
use ftlab_core::request::{Op, Request as FtlRequest};
use ftlab_sim::ConfiguredFtl;
use ftlab_store::durable::{DataDir, DirOptions, PackedModel, VolumeKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The device directory of a durable device (`ftlab_store::durable`), and what recovery found
/// at start.
pub(crate) struct Durable {
    pub(crate) data: Mutex<DataDir>,
    /// The last record known durable (its sequence number).
    pub(crate) synced_seq: AtomicU64,
    pub(crate) syncs: AtomicU64,
    /// Held by the one FLUSH syncing the log (`sync`), outside `data`'s lock.
    pub(crate) sync_turn: Mutex<()>,
    pub(crate) mode: Durability,
    pub(crate) dir: std::path::PathBuf,
    /// A checkpoint is written once this many bytes were appended since the last.
    pub(crate) checkpoint_every_bytes: u64,
    pub(crate) recovered_records: u64,
    pub(crate) replayed_requests: u64,
    pub(crate) checkpoint_seq: u64,
    pub(crate) dropped_bytes: u64,
    pub(crate) dropped_why: Option<String>,
    /// Why the model's archive was not whole at start (`Opened::model_damage`): the model was
    /// rebuilt from what survived, and its report is not an uninterrupted run's.
    pub(crate) model_damage: Option<String>,
    /// Reads answered EIO because a page's record does not verify, and the pages told in the
    /// log so far (each once; at most `DAMAGED_TOLD` of them, then only counted).
    pub(crate) damaged_reads: AtomicU64,
    pub(crate) damaged_told: Mutex<Vec<(u16, u64)>>,
    /// The configuration's fingerprint (xxh3 of its JSON), saved with the model: a model saved
    /// under another configuration is not restored.
    pub(crate) config_hash: u64,
    /// Whether the model's saved state was restored at start (then only the requests after it
    /// were replayed).
    pub(crate) model_restored: bool,
    /// Decompressed pages of snapshots and clones (read from the log).
    pub(crate) cache: Mutex<ftlab_store::cache::PageCache>,
    /// Changes refused for a full disk or a broken log, as told in the log.
    pub(crate) refusals: crate::refusals::Refusals,
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

/// Damaged pages named in the log at most: a disk gone bad must not flood it.
const DAMAGED_TOLD: usize = 64;

impl Durable {
    /// A read of `volume`'s page `lpn` failed on its record (`why`): counted for `--stats`
    /// and the metrics, and named once in the log, with what to do.
    pub(crate) fn damaged_read(&self, volume: u16, lpn: u64, why: &ftlab_store::log::LogError) {
        self.damaged_reads.fetch_add(1, Ordering::Relaxed);
        let mut told = self.damaged_told.lock().unwrap_or_else(|p| p.into_inner());
        if told.len() >= DAMAGED_TOLD || told.contains(&(volume, lpn)) {
            return;
        }
        told.push((volume, lpn));
        let of = if volume == 0 {
            "the device".to_string()
        } else {
            let name = self
                .lock()
                .volumes()
                .into_iter()
                .find(|v| v.id == volume)
                .map_or_else(|| format!("volume {volume}"), |v| format!("`{}`", v.name));
            name
        };
        eprintln!(
            "ftlab: page {lpn} of {of} cannot be read ({why}): answered EIO{}; stop the server \
             and run `ftlab check --repair {}` to zero it, or `ftlab image export \
             --skip-damaged` to salvage the rest",
            if told.len() == DAMAGED_TOLD {
                " (further damaged pages are only counted: `durable.damaged_reads`)"
            } else {
                ""
            },
            self.dir.display()
        );
    }

    /// The directory, to append to: a read-only device refuses every change before it gets
    /// here.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, DataDir> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a client is told of a failed append: `ENOSPC` for a full disk (it clears when
    /// space returns: the log resumes by itself), EIO for anything else; what was not logged
    /// is not acknowledged. Told in the log when it starts something (`Refusals`).
    pub(crate) fn refused(&self, e: &ftlab_store::log::LogError) -> IoError {
        self.refusals.refused(&self.dir, e)
    }

    /// An append's result, as the client is told it.
    pub(crate) fn appended(
        &self,
        r: Result<(), ftlab_store::log::LogError>,
    ) -> Result<(), IoError> {
        match r {
            Ok(()) => {
                self.refusals.accepted(&self.dir);
                Ok(())
            }
            Err(e) => Err(self.refused(&e)),
        }
    }

    pub(crate) fn page(
        &self,
        data: &mut DataDir,
        volume: u16,
        lpn: u64,
        page: &[u8],
    ) -> Result<(), IoError> {
        self.appended(data.write_page(volume, lpn, page))
    }

    pub(crate) fn trim(
        &self,
        data: &mut DataDir,
        volume: u16,
        lpn: u64,
        pages: u64,
    ) -> Result<(), IoError> {
        self.appended(data.trim(volume, lpn, pages))
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

    /// Makes every record appended so far durable. One sync at a time: a flush that waited
    /// for another and finds its records synced by it (group commit) returns at once. The
    /// `fdatasync` runs without the directory's lock, so that writes go on being appended
    /// meanwhile, as a file system takes writes while another thread's fsync runs; holding it
    /// stopped every write for each FLUSH's sync.
    pub(crate) fn sync(&self) -> Result<(), IoError> {
        let _one_sync = self.sync_turn.lock().unwrap_or_else(|p| p.into_inner());
        let (seq, ticket) = {
            let mut data = self.lock();
            if data.read_only() || data.last_seq() <= self.synced_seq.load(Ordering::Acquire) {
                return Ok(());
            }
            data.commit_begin().map_err(|e| self.refused(&e))?
        };
        let synced = ticket.sync();
        self.lock()
            .commit_end(synced)
            .map_err(|e| self.refused(&e))?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.synced_seq.fetch_max(seq, Ordering::AcqRel);
        Ok(())
    }
}

/// `Durable::save_model`, before there is a `Durable`.
fn model_bytes(config_hash: u64, s: &crate::State) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&config_hash.to_le_bytes());
    out.extend_from_slice(&s.clock_ns.to_le_bytes());
    out.extend_from_slice(&s.ftl.save(&s.recorder));
    out
}

/// How long the model's saved state's header is: the configuration's fingerprint and the
/// model's clock.
const MODEL_HEADER_BYTES: usize = 16;

impl Durable {
    /// The model's state as saved with a checkpoint: the configuration's fingerprint, the
    /// model's clock, then the FTL and the recorder (`ConfiguredFtl::save`).
    pub(crate) fn save_model(&self, s: &crate::State) -> Vec<u8> {
        model_bytes(self.config_hash, s)
    }

    /// `Device::maintain`'s work. The model's lock is taken before the directory's, as a
    /// request takes them: the saved model and the log agree on which requests it took.
    pub(crate) fn maintain(
        &self,
        state: &Mutex<crate::State>,
    ) -> Option<Result<Maintained, String>> {
        // On a disk short of space a checkpoint and the cleaner are what make room, whatever
        // was logged since the last (`Maintainer` spaces the tries out when they free nothing).
        let low_on_space = {
            let data = self.lock();
            if data.read_only() {
                return None;
            }
            let low = data.low_on_space() || self.refusals.full();
            if !low && data.since_checkpoint_bytes() < self.checkpoint_every_bytes {
                return None;
            }
            low
        };
        let started = Instant::now();
        // The model's lock only while it is serialised, the directory's not while it is
        // compressed: requests wait for neither longer than they must.
        let (model, covered) = {
            let s = state.lock().unwrap_or_else(|p| p.into_inner());
            let covered = self.lock().model_requests();
            (self.save_model(&s), covered)
        };
        let packed = PackedModel::pack(&model);
        drop(model);
        let mut data = self.lock();
        // Short of space, segments up to nine tenths live are worth their copies.
        let max_live_fraction = if low_on_space { 0.9 } else { 0.5 };
        let result = data
            .checkpoint_with_model(&packed, covered)
            .and_then(|_| data.clean(max_live_fraction));
        // Everything before the checkpoint is durable now.
        let seq = data.last_seq();
        self.synced_seq.fetch_max(seq, Ordering::AcqRel);
        Some(match result {
            Ok(cleaned) => Ok(Maintained {
                line: format!(
                    "{}: checkpoint at record {seq}, {cleaned} segment(s) cleaned, in {:.0} ms",
                    self.dir.display(),
                    started.elapsed().as_secs_f64() * 1e3
                ),
                fruitless: low_on_space && cleaned == 0,
            }),
            Err(e) => Err(format!("{}: checkpoint failed: {e}", self.dir.display())),
        })
    }
}

/// What a checkpoint and the cleaner did.
pub(crate) struct Maintained {
    /// For the log.
    pub(crate) line: String,
    /// Short of space, and nothing was freed: the next try waits longer.
    pub(crate) fruitless: bool,
}

/// How the maintainer spaces out tries that fail, or that free nothing on a disk short of space
/// (each packs the whole model), and which of them it tells: the first failure, then a line a
/// minute at most, then the success that ends them.
#[derive(Default)]
struct Tries {
    /// Failed or fruitless tries in a row.
    in_a_row: u32,
    failed: u32,
    told_at: Option<Instant>,
}

/// Tries are this far apart at first, then twice as far each time, up to `LONGEST_WAIT`.
const FIRST_WAIT: Duration = Duration::from_millis(200);
const LONGEST_WAIT: Duration = Duration::from_secs(10);
/// A failure that goes on is told again after this.
const RETELL_AFTER: Duration = Duration::from_secs(60);

impl Tries {
    fn wait(&self) -> Duration {
        (FIRST_WAIT * (1u32 << self.in_a_row.min(6))).min(LONGEST_WAIT)
    }

    /// The result of a try; returns a line for the log, if any.
    fn outcome(&mut self, result: Result<Maintained, String>, log_done: bool) -> Option<String> {
        match result {
            Ok(done) => {
                self.in_a_row = if done.fruitless { self.in_a_row + 1 } else { 0 };
                let failed = std::mem::take(&mut self.failed);
                self.told_at = None;
                if failed > 0 {
                    Some(format!("{} (after {failed} failed tries)", done.line))
                } else {
                    log_done.then_some(done.line)
                }
            }
            Err(line) => {
                self.in_a_row += 1;
                self.failed += 1;
                let now = Instant::now();
                let tell = self
                    .told_at
                    .is_none_or(|at| now.duration_since(at) >= RETELL_AFTER);
                if !tell {
                    return None;
                }
                self.told_at = Some(now);
                Some(if self.failed == 1 {
                    line
                } else {
                    format!("{line} ({} tries failed so far)", self.failed)
                })
            }
        }
    }
}

/// The thread that runs a durable device's checkpoints and cleaner (`Maintenance::Background`),
/// stopped and joined when the device is dropped.
pub(crate) struct Maintainer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Maintainer {
    pub(crate) fn spawn(
        durable: Arc<Durable>,
        state: Arc<Mutex<crate::State>>,
        log_done: bool,
    ) -> std::io::Result<Maintainer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ftlab-maintain".into())
            .spawn(move || {
                let (flag, wake) = &*stopping;
                let mut stopped = flag.lock().unwrap_or_else(|p| p.into_inner());
                let mut tries = Tries::default();
                while !*stopped {
                    stopped = wake
                        .wait_timeout(stopped, tries.wait())
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *stopped {
                        break;
                    }
                    drop(stopped);
                    if let Some(line) = durable
                        .maintain(&state)
                        .and_then(|r| tries.outcome(r, log_done))
                    {
                        eprintln!("ftlab: {line}");
                    }
                    stopped = flag.lock().unwrap_or_else(|p| p.into_inner());
                }
            })?;
        Ok(Maintainer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Maintainer {
    fn drop(&mut self) {
        let (flag, wake) = &*self.stop;
        *flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
        config: &ftlab_core::config::Config,
        geometry: &ftlab_core::geometry::Geometry,
        options: &DeviceOptions,
    ) -> Result<(Durable, u64), DeviceError> {
        let config_hash = twox_hash::XxHash3_64::oneshot(
            serde_json::to_string(config)
                .expect("a configuration serialises")
                .as_bytes(),
        );
        let log_error = |e: ftlab_store::log::LogError| DeviceError::Log(e.to_string());
        let page_bytes = geometry.page_size_bytes as usize;
        let (data, opened) = DataDir::open(
            dir,
            &DirOptions {
                pages: geometry.logical_pages,
                page_bytes,
                read_only: options.read_only,
                segment_bytes: log_segment_bytes(geometry.logical_pages * page_bytes as u64),
            },
        )
        .map_err(log_error)?;
        let mut clock_ns = 0;
        // The model's saved state first, when it was saved under this configuration; then the
        // requests after it.
        let mut model_damage = opened.model_damage;
        let mut model_restored = false;
        if let Some(saved) = &opened.model_state {
            let restored = match saved.split_at_checked(MODEL_HEADER_BYTES) {
                Some((header, body)) if header[..8] == config_hash.to_le_bytes() => {
                    ConfiguredFtl::load(config, geometry, body).map(|(ftl, recorder)| {
                        state.ftl = ftl;
                        state.recorder = recorder;
                        clock_ns = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
                        state.clock_ns = clock_ns;
                        model_restored = true;
                    })
                }
                Some(_) => Err("it was saved under another configuration".into()),
                None => Err("it is too short".into()),
            };
            if let Err(why) = restored {
                let note = format!(
                    "the model's saved state is not restored ({why}): the model starts anew from \
                     the requests after it"
                );
                model_damage = Some(match model_damage {
                    Some(d) => format!("{d}; {note}"),
                    None => note,
                });
            }
        }
        for (k, r) in opened.requests.iter().enumerate() {
            let op = match r.op {
                model_op::READ => Op::Read,
                model_op::WRITE => Op::Write,
                model_op::TRIM => Op::Trim,
                model_op::FLUSH => Op::Flush,
                model_op::DRAIN => {
                    state.ftl.flush(r.arrival_ns);
                    clock_ns = r.arrival_ns;
                    state.clock_ns = clock_ns;
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
        // A model rebuilt from damaged saved requests is saved at once: the next start
        // restores it rather than rebuilding another.
        let mut data = data;
        if model_damage.is_some() && !options.read_only {
            let covered = data.model_requests();
            let packed = PackedModel::pack(&model_bytes(config_hash, state));
            data.checkpoint_with_model(&packed, covered)
                .map_err(log_error)?;
        }
        let synced = data.last_seq();
        Ok((
            Durable {
                data: Mutex::new(data),
                synced_seq: AtomicU64::new(synced),
                syncs: AtomicU64::new(0),
                sync_turn: Mutex::new(()),
                mode: options.durability,
                dir: dir.to_path_buf(),
                checkpoint_every_bytes: options.checkpoint_every_bytes.unwrap_or_else(|| {
                    crate::default_checkpoint_every_bytes(
                        geometry.logical_pages * geometry.page_size_bytes as u64,
                    )
                }),
                recovered_records: opened.replayed_records,
                replayed_requests: opened.requests.len() as u64,
                checkpoint_seq: opened.checkpoint_seq,
                dropped_bytes: opened.dropped_bytes,
                dropped_why: opened.dropped_why,
                model_damage,
                config_hash,
                model_restored,
                damaged_reads: AtomicU64::new(0),
                damaged_told: Mutex::default(),
                refusals: Default::default(),
                cache: Mutex::new(ftlab_store::cache::PageCache::new(
                    options.cache_policy,
                    (options.cache_bytes / page_bytes as u64) as usize,
                )),
            },
            clock_ns,
        ))
    }

    /// With a writable durable device: a checkpoint when `checkpoint_every_bytes` were logged
    /// since the last, then the cleaner (segments at most half live). The device's own thread
    /// calls it (`Maintenance::Background`); it holds the directory's lock while it works.
    /// Returns a line for the log when it did something: `Ok` what it did, `Err` what failed.
    pub fn maintain(&self) -> Option<Result<String, String>> {
        self.durable
            .as_ref()
            .filter(|_| !self.options.read_only)?
            .maintain(&self.state)
            .map(|r| r.map(|done| done.line))
    }

    /// What recovery found, for the log at start: records replayed, bytes dropped from a
    /// torn tail with the reason, and a damaged model archive.
    pub fn recovery_summary(&self) -> Option<String> {
        let d = self.durable.as_ref()?;
        let mut line = format!(
            "{}: replayed {} log records after the checkpoint (sequence {}){} and {} model \
             requests",
            d.dir.display(),
            d.recovered_records,
            d.checkpoint_seq,
            if d.model_restored {
                ", restored the FTL model's saved state"
            } else {
                ""
            },
            d.replayed_requests
        );
        if let Some(why) = &d.dropped_why {
            line += &format!(
                "; dropped a {}-byte torn tail after the last whole commit ({why})",
                d.dropped_bytes
            );
        }
        if let Some(why) = &d.model_damage {
            line += &format!(
                "; WARNING: the FTL model's saved requests are damaged ({why}): the model was \
                 rebuilt from what verifies, so its report differs from an uninterrupted run's; \
                 every page of data is served as written"
            );
        }
        Some(line)
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

    /// Deletes a snapshot or clone; the cleaner frees the records only it held. One a
    /// connection serves (`use_target`) is refused: its later requests would fail, and its id,
    /// once free, may be another volume's.
    pub fn delete_volume(&self, name: &str) -> Result<(), VolumeError> {
        let d = self.writable_durable()?;
        // The users' lock first, then the directory's (as `use_target`).
        let users = self.volume_users.lock().unwrap_or_else(|p| p.into_inner());
        let id = d.lock().volume_named(name).map(|(id, _)| id);
        if let Some(&connections) = id.and_then(|id| users.get(&id)).filter(|&&n| n > 0) {
            return Err(VolumeError::InUse {
                name: name.to_string(),
                connections,
            });
        }
        d.lock().delete_volume(name)?;
        drop(users);
        d.synced_seq
            .fetch_max(d.lock().last_seq(), Ordering::AcqRel);
        Ok(())
    }

    /// Marks `target`'s snapshot or clone in use while the guard lives (a connection serving
    /// it): it is not deleted meanwhile. None when it no longer exists.
    pub fn use_target(&self, target: crate::Target) -> Option<VolumeUse<'_>> {
        if target.volume == ftlab_store::durable::DEVICE_VOLUME {
            return Some(VolumeUse {
                device: self,
                volume: None,
            });
        }
        let mut users = self.volume_users.lock().unwrap_or_else(|p| p.into_inner());
        let exists = self
            .durable
            .as_ref()?
            .lock()
            .volumes()
            .iter()
            .any(|v| v.id == target.volume);
        if !exists {
            return None;
        }
        *users.entry(target.volume).or_default() += 1;
        Some(VolumeUse {
            device: self,
            volume: Some(target.volume),
        })
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

/// A snapshot or clone in use by a connection (`Device::use_target`), until dropped.
pub struct VolumeUse<'a> {
    device: &'a Device,
    volume: Option<u16>,
}

impl Drop for VolumeUse<'_> {
    fn drop(&mut self) {
        if let Some(v) = self.volume {
            let mut users = self
                .device
                .volume_users
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = users.get_mut(&v) {
                *n -= 1;
                if *n == 0 {
                    users.remove(&v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(fruitless: bool) -> Result<Maintained, String> {
        Ok(Maintained {
            line: "checkpoint".into(),
            fruitless,
        })
    }

    /// A failing checkpoint is told once (then once a minute), tried ever less often up to
    /// the longest wait, and the success that ends it says how many failed; a disk short of
    /// space where a checkpoint frees nothing is tried less often too.
    #[test]
    fn failed_tries_are_told_once_and_spaced_out() {
        let mut t = Tries::default();
        assert_eq!(t.wait(), FIRST_WAIT);
        assert_eq!(
            t.outcome(Err("disk full".into()), false).as_deref(),
            Some("disk full")
        );
        let mut waits = vec![t.wait()];
        for _ in 0..20 {
            assert_eq!(t.outcome(Err("disk full".into()), false), None);
            waits.push(t.wait());
        }
        assert_eq!(waits[0], FIRST_WAIT * 2);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*waits.last().unwrap(), LONGEST_WAIT);
        assert_eq!(
            t.outcome(done(false), false).as_deref(),
            Some("checkpoint (after 21 failed tries)")
        );
        assert_eq!(t.wait(), FIRST_WAIT);
        assert_eq!(t.outcome(done(false), false), None);
        assert_eq!(t.outcome(done(false), true).as_deref(), Some("checkpoint"));
        assert_eq!(t.outcome(done(true), false), None);
        assert_eq!(t.wait(), FIRST_WAIT * 2);
    }
}
